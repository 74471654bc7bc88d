"""Which path runs each op, and why not a faster one: above the kernels, below the layer.

- ``paths``: the paths (cutedsl, triton, torch), the system checks, strict mode, forced
  backends and fallback warnings;
- ``sites``: the layer's op sites, each op's implementation per path, the per-problem reasons
  and the layer's plan;
- ``plan_cache``: the layer's call settings as one string and the plan cached per shape class;
- ``quantize``: the public, dispatched ``quantize_mxfp8``;
- ``caller``: warnings attributed to the user's line.
"""
