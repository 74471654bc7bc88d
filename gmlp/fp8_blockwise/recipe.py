"""``FP8BlockwiseRecipe``: the layer's settings for the FP8 blockwise recipe."""

from __future__ import annotations

from dataclasses import dataclass

from gmlp.mxfp8.spec import ElementFormat, enum_member

__all__ = ["FP8BlockwiseRecipe"]


@dataclass(frozen=True)
class FP8BlockwiseRecipe:
    """FP8 training with 128-element blocks (DeepSeek-V3's recipe, TransformerEngine's
    ``Float8BlockScaling`` scales): x, W and the activations in E4M3, gradients in
    ``grad_format``; token operands in 1 x 128 blocks for the forward and dgrad GEMMs and 128 x 1
    blocks per expert for the weight gradients, weights in 128 x 128 tiles; fp32 scales,
    powers of two unless ``power_of_two_scales`` is False. Hidden and FFN sizes must be multiples
    of 128 (``gmlp.fp8_blockwise`` has the format)."""

    grad_format: ElementFormat = ElementFormat.E4M3
    power_of_two_scales: bool = True

    def __post_init__(self):
        # frozen: a string is replaced by its member through object.__setattr__
        object.__setattr__(self, "grad_format", enum_member(ElementFormat, self.grad_format, "grad_format"))
        if not isinstance(self.power_of_two_scales, bool):
            raise TypeError(f"power_of_two_scales must be a bool, got {self.power_of_two_scales!r}")
