"""gmlp's experts inside training engines (optional extras): ``gmlp.integrations.torchtitan``."""
