"""Triton kernels: the readable reference and the fallback that runs wherever Triton runs.

Floor 3, on the format and the contract, which are all it imports besides itself; the
dispatcher's Triton provider (``gmlp.dispatch.providers.triton_path``) loads its launchers.

Launchers (public, each the twin of a reference in ``gmlp.mxfp8.reference`` / ``gmlp.contract.reference``),
kernels in the ``_``-prefixed module beside them:

- ``quantize``: fused one-pass MXFP8 quantize (``_quantize_kernel``);
- ``fc1``: grouped FC1 + activation + probs, c and a (``_fc1_kernel``);
- ``grouped_gemm``: FC2 forward and FC1 dgrad (``_grouped_gemm_kernel``);
- ``fc2_dgrad``: FC2 dgrad + activation backward, dprobs, dh (``_fc2_dgrad_kernel``);
- ``wgrad``: weight gradients over each expert's tokens (``_wgrad_kernel``);
- ``segment_sum``: per-expert bias gradients (``_segment_sum_kernel``);
- ``dequantize``: MXFP8 back to bf16, rowwise or columnwise (``_dequantize_kernel``);
- ``blockwise_quantize``: FP8 blockwise quantize of token operands (both ways, one pass) and of
  weight tiles (``_blockwise_quantize_kernel``; twins of ``gmlp.fp8_blockwise.reference``).

Device functions shared by kernels: ``_mxfp8_math`` (the spec's per-block math),
``_blockwise_math`` (the blockwise spec's scale), ``_activations``
(the activations' formulas), ``_grouping`` (expert-aligned tiles, swizzled index), ``_epilogue``
(a tile quantized both ways). ``_interpreter_fixes`` makes Triton's interpreter compute what the
GPU does (fp8 and bf16 casts, bf16 dots, no floating-point warnings); it is installed at import when TRITON_INTERPRET is true
(``gmlp.system.env.setting``: a value that is no boolean spelling raises here rather than leaving Triton
interpreting without the fixes).

Shape rules of the GEMM launchers, shared with the dispatcher: ``shapes``.
"""

from gmlp.system.env import setting

if setting("TRITON_INTERPRET"):
    from gmlp.triton_ref import _interpreter_fixes

    _interpreter_fixes.install()
