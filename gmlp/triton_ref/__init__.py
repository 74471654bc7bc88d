"""Triton kernels: the readable reference and the fallback that runs wherever Triton runs.

- ``quantize``: fused one-pass MXFP8 quantize (kernel in ``_quantize_kernel``);
- ``swizzle``: compact <-> swizzled scale layouts (kernel in ``_swizzle_kernel``);
- ``_mxfp8_math``: the spec's per-block math as Triton device functions;
- ``_interpreter_fixes``: makes Triton's interpreter cast to fp8 as the GPU does.
"""

import os

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    from gmlp.triton_ref import _interpreter_fixes

    _interpreter_fixes.install()
