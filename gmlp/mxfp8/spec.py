"""The MXFP8 format: the bit-exact specification in plain PyTorch.

This module is the single source of truth for what every kernel (Triton, CuTeDSL) must produce,
bit for bit. It is written for clarity, runs on any device (CPU included), and is the oracle of
the quantization tests. Layout index math for swizzled and grouped scales lives in
``gmlp.mxfp8.scale_layout``; this module only says how one block of 32 values becomes one E8M0 scale
byte and 32 fp8 elements.

A block is 32 consecutive values along the contraction dimension. Its scale is an E8M0 byte
``e`` (the value ``2**(e - 127)``); its elements are ``fp8(x * 2**(127 - e))``.

Scale computation, RCEIL (default)::

    amax = max |x| over the block, fp32, NaN ignored, starting at 0
    v    = amax * fp32(1 / max_normal)            # E4M3: 1/448, E5M2: 1/57344
    e    = ceil(log2(v)) from v's bits             # NaN -> 255, +Inf -> 254, 0 -> 0,
                                                   # at or below 2**-127 -> 0, saturating at 254

Scale computation, FLOOR (OCP MX spec)::

    e = clamp(floor(log2(amax)) - emax + 127, 0, 254)   # emax: E4M3 8, E5M2 15; amax 0 -> 0

Element cast: ``x * s`` with ``s = 2**(127 - e)`` as an fp32 (e = 254 gives the subnormal
2**-127, e = 255 gives NaN), rounded to nearest even, saturating to +-max_normal. NaN becomes the
canonical NaN byte 0x7F whatever its sign; zeros keep their sign.
"""

from __future__ import annotations

import enum
from typing import TypeVar

import torch

__all__ = [
    "BLOCK_SIZE",
    "ElementFormat",
    "ScaleMode",
    "enum_member",
    "NAN_BYTE",
    "nan_ignoring_amax",
    "e8m0_from_amax",
    "quantize_multiplier",
    "e8m0_to_float",
    "cast_to_element",
    "quantize_blocks",
]

BLOCK_SIZE = 32
"""Elements sharing one E8M0 scale, along the contraction dimension."""

NAN_BYTE = 0x7F
"""Canonical NaN of both fp8 formats (E4M3: S.1111.111, E5M2: S.11111.11), sign bit clear.
This is what the GPU's ``cvt.rn.satfinite`` conversion writes for any NaN input."""


class ElementFormat(enum.Enum):
    """fp8 element formats of MXFP8."""

    E4M3 = "e4m3"
    """float8_e4m3fn: max normal 448, emax 8. Activations and weights; default for gradients."""
    E5M2 = "e5m2"
    """float8_e5m2: max normal 57344, emax 15. Wider range, 2 mantissa bits; optional for
    gradients."""

    @property
    def torch_dtype(self) -> torch.dtype:
        return {ElementFormat.E4M3: torch.float8_e4m3fn, ElementFormat.E5M2: torch.float8_e5m2}[self]

    @property
    def max_normal(self) -> float:
        return {ElementFormat.E4M3: 448.0, ElementFormat.E5M2: 57344.0}[self]

    @property
    def mantissa_bits(self) -> int:
        return {ElementFormat.E4M3: 3, ElementFormat.E5M2: 2}[self]

    @property
    def min_normal_exponent(self) -> int:
        """log2 of the smallest normal value (E4M3: 2**-6, E5M2: 2**-14)."""
        return {ElementFormat.E4M3: -6, ElementFormat.E5M2: -14}[self]

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two the format represents (log2 of 256 or 32768)."""
        return {ElementFormat.E4M3: 8, ElementFormat.E5M2: 15}[self]


class ScaleMode(enum.Enum):
    """How a block's E8M0 scale is derived from its amax."""

    RCEIL = "rceil"
    """``e = ceil(log2(amax * fp32(1/max_normal)))``: the smallest scale that keeps every element
    within range (up to the reciprocal's rounding, absorbed by saturation). What cuBLAS,
    TransformerEngine and the SM100 kernels use; the default, and what fused paths must match."""
    FLOOR = "floor"
    """``e = floor(log2(amax)) - emax + 127`` (OCP MX v1.0): keeps amax's leading bit aligned to
    the format's top binade; elements above max_normal saturate."""


Member = TypeVar("Member", bound=enum.Enum)


def enum_member(kind: type[Member], value: Member | str, argument: str) -> Member:
    """``value`` as a member of ``kind``: the member itself, or its value as a string in any case
    (``"floor"``, ``"E5M2"``: what configuration files and command lines give).

    Raises ValueError (an unknown string) or TypeError (anything else) naming ``argument``.
    """
    if isinstance(value, kind):
        return value
    accepted = [member.value for member in kind]
    if isinstance(value, str):
        for member in kind:
            if member.value == value.strip().lower():
                return member
        raise ValueError(f"{argument} must be one of {accepted} or a gmlp.{kind.__name__}, got {value!r}")
    raise TypeError(f"{argument} must be a gmlp.{kind.__name__} or one of {accepted}, got {value!r}")


def nan_ignoring_amax(blocks: torch.Tensor) -> torch.Tensor:
    """Max of |x| over the last dimension in fp32, NaN ignored (fmaxf semantics), from 0."""
    magnitudes = blocks.float().abs()
    magnitudes = torch.where(torch.isnan(magnitudes), torch.zeros_like(magnitudes), magnitudes)
    return magnitudes.amax(dim=-1)


def _float_bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def e8m0_from_amax(amax: torch.Tensor, element_format: ElementFormat, scale_mode: ScaleMode) -> torch.Tensor:
    """E8M0 scale bytes (uint8) for fp32 block maxima ``amax`` (>= 0 or NaN)."""
    amax = amax.float()
    if scale_mode is ScaleMode.RCEIL:
        reciprocal = torch.tensor(1.0 / element_format.max_normal, dtype=torch.float32)
        v = amax * reciprocal
        bits = _float_bits(v)
        exponent = (bits >> 23) & 0xFF
        mantissa = bits & 0x7FFFFF
        # Round up to the next power of two unless v is one already, except at the top (254
        # saturates) and for subnormals at or below 2**-127 (they round to the byte 0).
        round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
        e = exponent + round_up.to(torch.int32)
        e = torch.where(torch.isinf(v), torch.full_like(e, 0xFE), e)
        e = torch.where(torch.isnan(v), torch.full_like(e, 0xFF), e)
    elif scale_mode is ScaleMode.FLOOR:
        biased_exponent = (_float_bits(amax) >> 23) & 0xFF  # floor(log2) + 127 for normals
        e = torch.clamp(biased_exponent - element_format.emax, 0, 254)
        e = torch.where(amax == 0, torch.zeros_like(e), e)
        e = torch.where(torch.isinf(amax), torch.full_like(e, 0xFE), e)
        e = torch.where(torch.isnan(amax), torch.full_like(e, 0xFF), e)
    else:
        raise ValueError(f"unknown scale mode: {scale_mode=}")
    return e.to(torch.uint8)


def quantize_multiplier(e: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**(127 - e)`` for E8M0 bytes ``e``: 255 -> NaN, 254 -> 2**-127 (a subnormal)."""
    e = e.to(torch.int32)
    bits = torch.where(e == 254, torch.full_like(e, 0x00400000), (254 - e) << 23)
    bits = torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits)
    return bits.view(torch.float32)


def e8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """fp32 value ``2**(e - 127)`` of E8M0 bytes: 0 -> 2**-127 (subnormal), 255 -> NaN."""
    e = e.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, 0x00400000), e << 23)
    bits = torch.where(e == 255, torch.full_like(e, 0x7FC00000), bits)
    return bits.view(torch.float32)


def cast_to_element(v: torch.Tensor, element_format: ElementFormat) -> torch.Tensor:
    """Round fp32 ``v`` to the fp8 format: nearest even, saturating, NaN -> 0x7F."""
    limit = element_format.max_normal
    # Clamping first is exact: every value beyond +-max_normal rounds to max_normal (or beyond,
    # which saturation maps back), so clamp-then-round equals round-then-saturate.
    saturated = torch.clamp(v.float(), -limit, limit)
    q = saturated.to(element_format.torch_dtype).view(torch.uint8)
    q = torch.where(torch.isnan(v), torch.full_like(q, NAN_BYTE), q)
    return q.view(element_format.torch_dtype)


def quantize_blocks(
    blocks: torch.Tensor, element_format: ElementFormat, scale_mode: ScaleMode
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``blocks`` (..., 32) into fp8 elements (..., 32) and E8M0 scales (...)."""
    if blocks.shape[-1] != BLOCK_SIZE:
        raise ValueError(f"blocks must have {BLOCK_SIZE} values in the last dimension, got {tuple(blocks.shape)}")
    scales = e8m0_from_amax(nan_ignoring_amax(blocks), element_format, scale_mode)
    multiplier = quantize_multiplier(scales).unsqueeze(-1)
    data = cast_to_element(blocks.float() * multiplier, element_format)
    return data, scales
