"""The SM100 (Blackwell) composition: the layer's six GEMM sites as cuDNN frontend's fused
block-scaled grouped kernels, fed with gmlp's MXFP8 tensors (docs/design.md, section 9).

Module map:
- ``cudnn_kernels``: the kernel class of each fused step, whether they import with the installed
  cutlass-dsl (``import_error``, the dispatcher's reason) and the versions pinned together;
- ``layout``: the padded layout (every expert starts at a multiple of 256 rows) and the gate/up
  interleaving in 32-column blocks;
- ``steps``: each step's ``KernelCall`` (the kernel's tensors and options) from gmlp's MXFP8
  tensors, checked against the kernel's contract;
- ``layer``: the forward and backward (``sm100_forward``, ``sm100_backward``) and the default
  launcher (``CompiledKernels``: build, check, compile once per call signature);
- ``views``: each finished step seen as gmlp's op at its site, for the cross-check.

Importing this package imports none of them: ``gmlp.layer.autograd`` imports ``layer`` (and so the others)
at its own import, ``gmlp.dispatch.sites`` and ``gmlp.dispatch.plan_cache`` import ``cudnn_kernels`` and
``layout`` inside the functions that need them. None of them imports cutlass-dsl or cuDNN
frontend at import time: ``cudnn_kernels`` imports the kernel classes when asked for one.
"""
