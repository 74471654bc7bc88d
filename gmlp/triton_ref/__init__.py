"""Triton kernels: the readable reference and the fallback that runs wherever Triton runs.

- ``quantize``: fused one-pass MXFP8 quantize (kernel in ``_quantize_kernel``);
- ``swizzle``: compact <-> swizzled scale layouts (kernel in ``_swizzle_kernel``);
- ``_mxfp8_math``: the spec's per-block math as Triton device functions.
"""
