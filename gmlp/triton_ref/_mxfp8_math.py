"""Triton device functions of the MXFP8 spec (``gmlp.mxfp8``), shared by every Triton kernel.

Each function mirrors one step of the spec; kernels call these rather than restating the math.
"""

import triton
import triton.language as tl

# Float32 bit patterns used by the spec.
_SUBNORMAL_2_POW_MINUS_127 = tl.constexpr(0x00400000)  # 2**-127, the multiplier of scale byte 254
_QUIET_NAN = tl.constexpr(0x7FC00000)


@triton.jit
def block_amax(magnitude, axis: tl.constexpr):
    """max |x| along ``axis`` of fp32 magnitudes, NaN ignored, starting at 0 (the spec's amax).

    tl.max and tl.maximum lower to max.f32, IEEE maxNum, which returns the other operand when
    one is NaN; the final max with 0 turns an all-NaN block's NaN into 0.
    """
    return tl.maximum(tl.max(magnitude, axis=axis), 0.0)


@triton.jit
def e8m0_from_amax(amax, RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr):
    """E8M0 byte (as int32) of fp32 block maxima; RCEIL unless FLOOR_MODE."""
    if FLOOR_MODE:
        biased_exponent = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
        e = tl.minimum(tl.maximum(biased_exponent - EMAX, 0), 254)
        e = tl.where(amax == 0.0, 0, e)
        e = tl.where(biased_exponent == 0xFF, 254, e)  # +Inf (amax is never NaN)
    else:
        v = amax * RECIPROCAL_MAX
        bits = v.to(tl.int32, bitcast=True)
        exponent = (bits >> 23) & 0xFF
        mantissa = bits & 0x7FFFFF
        # Ceil of log2: round up unless v is a power of two, saturate at 254, and let subnormals
        # at or below 2**-127 give 0.
        round_up = (mantissa > 0) & (exponent != 0xFE) & ((exponent != 0) | (mantissa > 0x400000))
        e = exponent + round_up.to(tl.int32)
        e = tl.where(exponent == 0xFF, 0xFE, e)  # +Inf (NaN cannot occur: amax ignores NaN)
    return e


@triton.jit
def quantize_multiplier(e):
    """fp32 2**(127 - e) of E8M0 bytes e (int32): 254 gives the subnormal 2**-127."""
    bits = tl.where(e == 254, _SUBNORMAL_2_POW_MINUS_127, (254 - e) << 23)
    bits = tl.where(e == 255, _QUIET_NAN, bits)
    return bits.to(tl.float32, bitcast=True)
