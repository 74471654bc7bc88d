"""The contract every backend shares, above the format: what each op computes and says.

- ``reference``: the oracle: each op of the layer in plain PyTorch (the torch path's
  implementations, which every kernel must match), and the whole dataflow composed from them;
- ``outputs``: the ops' output types (FC1, FC2 dgrad, the layer's gradients);
- ``operands``: the launchers' checks of their bf16 operands;
- ``activations``: the gated activations and their parameters;
- ``gate_up``: the layouts of W1's gate and up halves, read in place;
- ``problem``: ``LayerProblem``, what a provider is asked about one layer call;
- ``reasons``: why a path cannot run an op (a ``Reason`` of four kinds; every "why not" is one);
- ``weight_reuse``: a weight's quantization kept by one forward for the next.

Floor 2, on the format (``gmlp.mxfp8``): the kernels (``gmlp.triton_ref``, ``gmlp.cutedsl``)
import these; nothing here imports a kernel or anything above.
"""
