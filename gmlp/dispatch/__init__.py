"""Which path runs each op, and why not a faster one: above the kernels, below the layer.

- ``sites``: the vocabulary: the layer's ops and the sites where they run;
- ``providers``: who runs the ops on each path and architecture (torch, Triton, CuTeDSL on sm_90a
  and on sm_100a), each answering the same three questions: can this system run it, can it run
  this problem, and the op itself;
- ``paths``: the paths (cutedsl, triton, torch), the table of their providers, the system
  checks, strict mode, forced backends and fallback warnings;
- ``plan``: the layer's plan (a path per site, with the reasons) and the function each site runs;
- ``plan_cache``: the layer's call settings as one string and the plan cached per shape class;
- ``quantize``: the public, dispatched ``quantize_mxfp8``;
- ``caller``: warnings attributed to the user's line.
"""
