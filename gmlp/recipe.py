"""Quantization recipes of the grouped MLP."""

from __future__ import annotations

from dataclasses import dataclass

from gmlp.mxfp8 import ElementFormat, ScaleMode

__all__ = ["MXFP8Recipe"]


@dataclass(frozen=True)
class MXFP8Recipe:
    """MXFP8 training: activations and weights in E4M3, gradients in ``grad_format``.

    Where the operands are quantized is fixed by the dataflow (docs/design.md); the recipe chooses
    the scale rounding and the gradients' element format. ``GroupedMLP(recipe=None)`` runs the
    same flow in bf16 without quantization.
    """

    scale_mode: ScaleMode = ScaleMode.RCEIL
    grad_format: ElementFormat = ElementFormat.E4M3

    def __post_init__(self):
        if not isinstance(self.scale_mode, ScaleMode):
            raise TypeError(f"scale_mode must be a gmlp.ScaleMode, got {self.scale_mode!r}")
        if not isinstance(self.grad_format, ElementFormat):
            raise TypeError(f"grad_format must be a gmlp.ElementFormat, got {self.grad_format!r}")
