"""The activation functions of the expert MLP: forward and derivative, one definition each.

Every backend (the torch oracle, Triton, CuTeDSL) takes its activation math from here or is
tested against it. Gated activations read FC1's output ``h`` (T, 2F) as ``[gate | up]`` halves
(``h[:, :F]`` the gate, ``h[:, F:]`` the up projection), matching ``w1`` (E, 2F, H) stored as
[gate; up] halves; they return (T, F). ``srelu`` is not gated: (T, F) -> (T, F).

- swiglu: ``silu(gate) * up``
- geglu: ``gelu_tanh(gate) * up`` (GELU with the tanh approximation, as in TransformerEngine)
- qgeglu: clamped gated quick-GELU (GPT-OSS style): ``g = min(gate, limit)``,
  ``u = clamp(up, -limit, limit)``, ``g * sigmoid(alpha * g) * (u + offset)``
- srelu: ``relu(h) ** 2``
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

__all__ = ["ActivationKind", "Activation", "SWIGLU", "GEGLU", "QGEGLU", "SRELU", "activation_from"]


class ActivationKind(enum.Enum):
    SWIGLU = "swiglu"
    GEGLU = "geglu"
    QGEGLU = "qgeglu"
    SRELU = "srelu"


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


@dataclass(frozen=True)
class Activation:
    """An activation and its parameters (``limit``, ``alpha``, ``offset`` are qgeglu's)."""

    kind: ActivationKind
    limit: float = 7.0
    alpha: float = 1.702
    offset: float = 1.0

    def __post_init__(self):
        if not isinstance(self.kind, ActivationKind):
            raise TypeError(f"kind must be an ActivationKind, got {self.kind!r}")
        if self.kind is ActivationKind.QGEGLU and not (self.limit > 0 and self.alpha > 0):
            raise ValueError(f"qgeglu needs limit > 0 and alpha > 0, got {self.limit=}, {self.alpha=}")

    @property
    def gated(self) -> bool:
        """Whether FC1 has 2F outputs ([gate | up]) for F activations."""
        return self.kind is not ActivationKind.SRELU

    @property
    def name(self) -> str:
        return self.kind.value

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """act(h): (T, 2F) -> (T, F) when gated, (T, F) -> (T, F) otherwise; in h's dtype."""
        if not self.gated:
            return torch.relu(h) ** 2
        gate, up = _halves(h)
        return self._gate_fn(gate) * self._up_fn(up)

    def backward(self, h: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """d(act)/dh applied to ``grad`` (T, F): the gradient with respect to h, h's shape."""
        if not self.gated:
            return grad * 2 * torch.relu(h)
        gate, up = _halves(h)
        d_gate = grad * self._up_fn(up) * self._gate_derivative(gate)
        d_up = grad * self._gate_fn(gate) * self._up_derivative(up)
        return torch.cat([d_gate, d_up], dim=-1)

    # gate nonlinearity g(gate) and its derivative
    def _gate_fn(self, gate: torch.Tensor) -> torch.Tensor:
        if self.kind is ActivationKind.SWIGLU:
            return gate * torch.sigmoid(gate)
        if self.kind is ActivationKind.GEGLU:
            return 0.5 * gate * (1 + torch.tanh(_SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate**3)))
        clamped = torch.clamp(gate, max=self.limit)
        return clamped * torch.sigmoid(self.alpha * clamped)

    def _gate_derivative(self, gate: torch.Tensor) -> torch.Tensor:
        if self.kind is ActivationKind.SWIGLU:
            s = torch.sigmoid(gate)
            return s * (1 + gate * (1 - s))
        if self.kind is ActivationKind.GEGLU:
            inner = _SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate**3)
            t = torch.tanh(inner)
            d_inner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * gate**2)
            return 0.5 * (1 + t) + 0.5 * gate * (1 - t * t) * d_inner
        clamped = torch.clamp(gate, max=self.limit)
        s = torch.sigmoid(self.alpha * clamped)
        derivative = s * (1 + self.alpha * clamped * (1 - s))
        return torch.where(gate > self.limit, torch.zeros_like(derivative), derivative)

    # up projection u(up) and its derivative
    def _up_fn(self, up: torch.Tensor) -> torch.Tensor:
        if self.kind is ActivationKind.QGEGLU:
            return torch.clamp(up, -self.limit, self.limit) + self.offset
        return up

    def _up_derivative(self, up: torch.Tensor) -> torch.Tensor:
        if self.kind is ActivationKind.QGEGLU:
            return ((up >= -self.limit) & (up <= self.limit)).to(up.dtype)
        return torch.ones_like(up)


def _halves(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if h.shape[-1] % 2:
        raise ValueError(f"a gated activation needs an even last dimension [gate | up], got {tuple(h.shape)}")
    half = h.shape[-1] // 2
    return h[..., :half], h[..., half:]


SWIGLU = Activation(ActivationKind.SWIGLU)
GEGLU = Activation(ActivationKind.GEGLU)
QGEGLU = Activation(ActivationKind.QGEGLU)
SRELU = Activation(ActivationKind.SRELU)


def activation_from(value: str | Activation) -> Activation:
    """An ``Activation`` from itself or its name (swiglu, geglu, qgeglu, srelu)."""
    if isinstance(value, Activation):
        return value
    try:
        return Activation(ActivationKind(value))
    except ValueError:
        raise ValueError(f"activation must be one of {[k.value for k in ActivationKind]} or an Activation, got {value!r}") from None
