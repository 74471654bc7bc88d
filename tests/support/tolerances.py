"""Error bounds derived from the formats, in one place.

A value rounded to nearest with m mantissa bits has a relative error of at most u = 2**-(m+1);
with the error spread uniformly over +-u, its RMS is u / sqrt(3). Errors of independent roundings
add in quadrature, and a dot product averages its terms' errors, so the relative RMS error of a
result that went through roundings of units u_i is about sqrt(sum u_i**2) / sqrt(3). The bounds below
allow 3 times that: loose enough for any correct implementation, far below the O(1) error of a
dataflow mistake (a missing probs factor, a wrong transpose, a gradient for the wrong expert).
"""

from __future__ import annotations

import math

import torch

from gmlp.mxfp8.spec import ElementFormat

BF16_UNIT = 2.0**-8  # 7 stored mantissa bits
MARGIN = 3.0


def unit_roundoff(element_format: ElementFormat) -> float:
    return 2.0 ** -(element_format.mantissa_bits + 1)


def relative_rms_bound(*units: float) -> float:
    """Bound on ||got - want|| / ||want|| for a result that went through one rounding per unit."""
    return MARGIN * math.sqrt(sum(u * u for u in units)) / math.sqrt(3)


def relative_rms_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def within_steps(got: torch.Tensor, want: torch.Tensor, relative_step: float, delta: float) -> bool:
    """|got - want| <= relative_step * |want| + delta everywhere: one rounding step of want's
    format (relative_step bounds a step relative to the value) plus an absolute delta."""
    got, want = got.detach().float(), want.detach().float()
    return bool(((got - want).abs() <= relative_step * want.abs() + delta).all())
