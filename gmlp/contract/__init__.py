"""The contract every backend shares, above the format: what each op computes and says.

- ``reference``: the oracle: each op of the layer in plain PyTorch (the torch path's
  implementations, which every kernel must match) and their output types, and the whole
  dataflow composed from them;
- ``activations``: the gated activations and their parameters;
- ``gate_up``: the layouts of W1's gate and up halves, read in place;
- ``reasons``: why a path cannot run an op (a ``Reason`` of four kinds).

The kernels (``gmlp.triton_ref``, ``gmlp.cutedsl``) import these; nothing here imports a kernel.
"""
