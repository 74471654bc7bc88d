"""Triton device functions of the MXFP8 spec (``gmlp.mxfp8.spec``), shared by every Triton kernel.

Each function mirrors one step of the spec; kernels call these rather than restating the math.
"""

import triton
import triton.language as tl

# Float32 bit patterns used by the spec.
_SUBNORMAL_2_POW_MINUS_127 = tl.constexpr(0x00400000)  # 2**-127, the multiplier of scale byte 254


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
        e = tl.where(biased_exponent == 0xFF, 254, e)  # +Inf (amax is never NaN)
    else:
        # Ceil of log2 from v's bits in two integer ops: adding 0x7FFFFF carries into the
        # exponent exactly when the mantissa is non-zero; min() saturates at 254 (+Inf too);
        # v <= 2**-127 (bits <= 0x400000) gives 0. v is never NaN: amax ignores NaN.
        bits = (amax * RECIPROCAL_MAX).to(tl.int32, bitcast=True)
        e = tl.where(bits <= 0x400000, 0, tl.minimum((bits + 0x7FFFFF) >> 23, 254))
    return e


@triton.jit
def quantize_multiplier(e):
    """fp32 2**(127 - e) of E8M0 bytes e (int32, at most 254: amax is never NaN); 254 gives the
    subnormal 2**-127."""
    bits = tl.where(e == 254, _SUBNORMAL_2_POW_MINUS_127, (254 - e) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0_to_float(e):
    """fp32 2**(e - 127) of E8M0 bytes e (int32 < 255): 0 gives the subnormal 2**-127."""
    bits = tl.where(e == 0, _SUBNORMAL_2_POW_MINUS_127, e << 23)
    return bits.to(tl.float32, bitcast=True)
