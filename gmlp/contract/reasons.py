"""Why a path cannot run an op: the reason type shared by every backend and the dispatcher."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ReasonKind", "Reason"]


class ReasonKind(enum.Enum):
    SYSTEM = "system"
    """No GPU, compute capability, a package missing or too old, kernels failing to import or compile."""
    RECIPE = "recipe"
    """Element format, scale mode or gradient format the path does not implement."""
    ACTIVATION = "activation"
    """Activation function the path does not implement."""
    SHAPE = "shape"
    """A dimension, dtype or alignment the kernel does not take."""


@dataclass(frozen=True)
class Reason:
    """One reason a path cannot run an op; ``message`` names the values involved."""

    kind: ReasonKind
    message: str

    def __str__(self) -> str:
        return f"[{self.kind.value}] {self.message}"
