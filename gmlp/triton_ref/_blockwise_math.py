"""Triton device function of the FP8 blockwise spec (``gmlp.fp8_blockwise.spec``): a block's
multiplier and stored inverse from its amax, shared by every blockwise Triton kernel.

Both divisions run in fp64 and are rounded once more to fp32: for a quotient of two fp32 values
that gives the correctly rounded fp32 quotient (53 bits >= 2 * 24 + 2), as the spec's fp32 IEEE
division does, and it neither flushes a subnormal amax nor a subnormal ``1 / s`` (2**-127 for
s = 2**127), which fp32 division in Triton may (its libdevice division is built flushing).
"""

import triton
import triton.language as tl

_EXPONENT_MASK = tl.constexpr(-0x800000)  # 0xFF800000 as an int32: an fp32's sign and exponent


@triton.jit
def blockwise_scale(amax, FMAX: tl.constexpr, INPUT_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr):
    """(s, scale_inv) fp32 of fp32 block maxima ``amax`` (>= 0, NaN already ignored)."""
    quotient = (FMAX / amax.to(tl.float64)).to(tl.float32)
    quotient = tl.where(quotient == float("inf"), INPUT_MAX, quotient)  # amax below FMAX / FLT_MAX
    s = tl.where(amax == 0, 1.0, quotient)  # amax = inf: s = 0, scale_inv = inf (the spec's non-finite block)
    if POWER_OF_TWO:  # s is 0 or a positive normal: clearing the mantissa leaves 0 or 2**floor(log2 s)
        s = (s.to(tl.int32, bitcast=True) & _EXPONENT_MASK).to(tl.float32, bitcast=True)
    scale_inv = (1.0 / s.to(tl.float64)).to(tl.float32)
    return s, scale_inv
