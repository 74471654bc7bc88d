"""What this machine and process provide, below everything else: the environment variables gmlp
reads (``env``) and the installed package versions it checks and reports (``versions``)."""
