"""The FP8 blockwise format (128-element blocks, fp32 scales): the bit-exact specification in
plain PyTorch, any device.

The DeepSeek-V3 recipe as TransformerEngine's ``Float8BlockScaling`` quantizer computes it, bit
for bit. A block is 128 values along the contraction dimension (1 x 128 or 128 x 1) or a
128 x 128 tile of a weight; it holds fp8 elements and one fp32 ``scale_inv``::

    amax = max |x| over the block, fp32, NaN ignored, from 0
    s    = 1                              if amax is 0 (or NaN)
         = fp32(fmax / amax)              otherwise, rounded to nearest (fmax: E4M3 448, E5M2 57344);
                                          0 when amax is +Inf
    s    = largest finite input value     if that quotient overflowed (amax below fmax / FLT_MAX)
    s    = 2**floor(log2 s)               with power-of-two scales (the default): s's bits & 0xFF800000
    q    = fp8(fp32(x * s))               nearest even, saturating to +-fmax, NaN -> 0x7F
    scale_inv = fp32(1 / s)               nearest; 2**-127 (subnormal) when s = 2**127, +Inf when s = 0

so that ``x ~= q * scale_inv``. On finite blocks this is TransformerEngine's kernel bit for bit.
A block holding an Inf is where TransformerEngine's Python reference and its kernel differ; this
follows the reference: s = 0, so the Inf elements become NaN (``Inf * 0``), the others zeros, and
``scale_inv = Inf``: the block dequantizes to NaN and every GEMM reading it gives a non-finite
result, as bf16 and MXFP8 do. (TE's kernel takes s = 1 there and saturates the Inf to +-fmax: a
finite block, so an overflow upstream vanishes from the loss.)

Which values form a block, and where each ``scale_inv`` lives, is ``gmlp.fp8_blockwise.layout``'s.
"""

from __future__ import annotations

import torch

from gmlp.mxfp8.spec import ElementFormat, cast_to_element, nan_ignoring_amax

__all__ = ["BLOCK", "SUPPORTED_INPUT_DTYPES", "scale_from_amax", "scale_inverse", "quantize_blocks"]

BLOCK = 128
"""Values along one side of a block (1 x 128, 128 x 1, 128 x 128)."""

SUPPORTED_INPUT_DTYPES = (torch.bfloat16, torch.float32)

_EXPONENT_MASK = -0x800000  # 0xFF800000 as an int32: sign and exponent of an fp32, mantissa cleared


def scale_from_amax(amax: torch.Tensor, element_format: ElementFormat, power_of_two: bool,
                    input_dtype: torch.dtype) -> torch.Tensor:
    """fp32 multipliers ``s`` of blocks whose fp32 maxima are ``amax`` (>= 0 or NaN), quantized
    from ``input_dtype`` values (its largest finite value stands in for an overflowed quotient)."""
    if input_dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"input_dtype must be one of {SUPPORTED_INPUT_DTYPES}, got {input_dtype}")
    amax = amax.float()
    quotient = torch.full_like(amax, element_format.max_normal) / amax  # IEEE division: rounded to nearest
    quotient = torch.where(torch.isinf(quotient), torch.full_like(amax, torch.finfo(input_dtype).max), quotient)
    degenerate = (amax == 0) | torch.isnan(amax)  # amax = +Inf is not: its quotient 0 makes the block NaN
    s = torch.where(degenerate, torch.ones_like(amax), quotient)
    if power_of_two:  # s is 0 or a positive normal here: clearing its mantissa leaves 0 or 2**floor(log2 s)
        s = (s.contiguous().view(torch.int32) & _EXPONENT_MASK).view(torch.float32)
    return s


def scale_inverse(s: torch.Tensor) -> torch.Tensor:
    """fp32 ``1 / s`` rounded to nearest, subnormal results kept (the stored ``scale_inv``)."""
    return torch.ones_like(s) / s


def quantize_blocks(blocks: torch.Tensor, element_format: ElementFormat, power_of_two: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``blocks`` (..., L), one block per row of L values (128, or 128 * 128 for a
    weight tile flattened), into fp8 elements (..., L) and fp32 ``scale_inv`` (...)."""
    if blocks.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"blocks must be one of {SUPPORTED_INPUT_DTYPES}, got {blocks.dtype}")
    s = scale_from_amax(nan_ignoring_amax(blocks), element_format, power_of_two, blocks.dtype)
    data = cast_to_element(blocks.float() * s.unsqueeze(-1), element_format)
    return data, scale_inverse(s)
