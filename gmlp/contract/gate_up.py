"""Where FC1's gate and up weights live: the layouts gmlp reads W1 in, as strided views.

A gated FC1 multiplies x by two per-expert (F, H) matrices, gate and up. gmlp's own parameter
stacks them as the halves of one (E, 2F, H) tensor; engines keep them otherwise (torchtitan:
two (E, F, H) parameters ``w1_EFD`` and ``w3_EFD``, or one (E, F, 2, H) ``w13`` whose rows
alternate gate and up). Every layout is read through the same pair of (E, F, H) views, each
with its own strides, so no layout costs a copy of the weights. The numerics do not depend on
the layout: each GEMM sees the same gate and up values, and the saved pre-activation ``c``
keeps gmlp's [gate | up] column halves.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from gmlp.contract.operands import describe

__all__ = ["GateUpLayout", "GateUp", "gate_up_views"]


class GateUpLayout(Enum):
    """How a gated FC1's gate and up weights are stored."""

    HALVES = "halves"  # one (E, 2F, H) tensor: gate rows [0, F), up rows [F, 2F) (gmlp's parameter)
    INTERLEAVED = "interleaved"  # one (E, F, 2, H) tensor: gate [:, :, 0], up [:, :, 1] (torchtitan's w13)
    SEPARATE = "separate"  # two (E, F, H) tensors, gate and up (torchtitan's w1_EFD and w3_EFD)

    @property
    def storage(self) -> str:
        """How the layout stores them, in words (for the dispatcher's reasons)."""
        return {GateUpLayout.HALVES: "as the halves of one (E, 2F, H) tensor",
                GateUpLayout.INTERLEAVED: "interleaved ((E, F, 2, H))", GateUpLayout.SEPARATE: "as two tensors"}[self]


@dataclass(frozen=True)
class GateUp:
    """The gate and up weights of every expert as two (E, F, H) views of any strides whose
    last one is 1 (a row of H is contiguous), on one device, of one dtype."""

    gate: torch.Tensor
    up: torch.Tensor

    def __post_init__(self):
        for name, view in (("gate", self.gate), ("up", self.up)):
            if not isinstance(view, torch.Tensor) or view.dim() != 3:
                raise TypeError(f"GateUp.{name} must be an (E, F, H) tensor, got {describe(view)}")
            if view.shape[-1] > 1 and view.stride(-1) != 1:
                raise ValueError(f"GateUp.{name} must have contiguous rows (last stride 1), got strides {view.stride()}")
        if self.gate.shape != self.up.shape or self.gate.dtype != self.up.dtype or self.gate.device != self.up.device:
            raise ValueError(f"GateUp.gate and GateUp.up must match in shape, dtype and device, got "
                             f"{describe(self.gate)} on {self.gate.device} and {describe(self.up)} on {self.up.device}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, F, H): experts, ffn and hidden sizes."""
        return tuple(self.gate.shape)


def gate_up_views(layout: GateUpLayout, w1: torch.Tensor, w3: torch.Tensor | None = None) -> GateUp:
    """The gate and up views of ``w1`` (and ``w3``, the up weights, for ``SEPARATE`` only) as
    ``layout`` stores them; no data is copied."""
    if not isinstance(layout, GateUpLayout):
        raise TypeError(f"layout must be a GateUpLayout, got {type(layout).__name__}")
    if (w3 is not None) != (layout is GateUpLayout.SEPARATE):
        raise ValueError(f"w3 (the up weights) is given with the SEPARATE layout only, got layout {layout.name} and "
                         f"w3={'a tensor' if w3 is not None else 'None'}")
    expected = {GateUpLayout.HALVES: "(E, 2F, H)", GateUpLayout.INTERLEAVED: "(E, F, 2, H)",
                GateUpLayout.SEPARATE: "(E, F, H)"}[layout]
    ndim = 4 if layout is GateUpLayout.INTERLEAVED else 3
    if not isinstance(w1, torch.Tensor) or w1.dim() != ndim or (layout is GateUpLayout.INTERLEAVED and w1.shape[2] != 2) \
            or (layout is GateUpLayout.HALVES and w1.shape[1] % 2):
        raise ValueError(f"w1 in the {layout.name} layout must be {expected}, got {describe(w1)}")
    if layout is GateUpLayout.HALVES:
        ffn = w1.shape[1] // 2
        return GateUp(w1[:, :ffn], w1[:, ffn:])
    if layout is GateUpLayout.INTERLEAVED:
        return GateUp(w1[:, :, 0], w1[:, :, 1])
    return GateUp(w1, w3)
