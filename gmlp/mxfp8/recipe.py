"""Quantization recipes of the grouped MLP."""

from __future__ import annotations

from dataclasses import dataclass

from gmlp.mxfp8.spec import ElementFormat, ScaleMode, enum_member

__all__ = ["MXFP8Recipe"]


@dataclass(frozen=True)
class MXFP8Recipe:
    """MXFP8 training: activations and weights in E4M3, gradients in ``grad_format``.

    Where the operands are quantized is fixed by the dataflow (docs/design.md); the recipe chooses
    the scale rounding and the gradients' element format, each given as the enum or its value
    (``MXFP8Recipe(scale_mode="floor", grad_format="e5m2")``). ``GroupedMLP(recipe=None)`` runs
    the same flow in bf16 without quantization.
    """

    scale_mode: ScaleMode = ScaleMode.RCEIL
    grad_format: ElementFormat = ElementFormat.E4M3

    def __post_init__(self):
        # frozen: the strings are replaced by their members through object.__setattr__
        object.__setattr__(self, "scale_mode", enum_member(ScaleMode, self.scale_mode, "scale_mode"))
        object.__setattr__(self, "grad_format", enum_member(ElementFormat, self.grad_format, "grad_format"))
