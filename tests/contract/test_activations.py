"""Each activation's derivative against autograd of its forward, in float64."""

from __future__ import annotations

import pytest
import torch

from gmlp.contract.activations import GEGLU, QGEGLU, SRELU, SWIGLU, Activation, ActivationKind, activation_from


@pytest.mark.parametrize("activation", [SWIGLU, GEGLU, QGEGLU, SRELU, Activation(ActivationKind.QGEGLU, limit=1.5, alpha=1.0, offset=0.5)],
                         ids=lambda a: f"{a.name}-{a.limit}")
def test_backward_matches_autograd(activation):
    width = 48 if activation.gated else 24
    h = (torch.randn(64, width, dtype=torch.float64) * 4).requires_grad_()
    grad = torch.randn(64, 24, dtype=torch.float64)
    (expected,) = torch.autograd.grad(activation.forward(h), h, grad)
    torch.testing.assert_close(activation.backward(h.detach(), grad), expected, rtol=1e-12, atol=1e-12)


def test_qgeglu_clamps():
    h = torch.tensor([[10.0, -10.0], [1.0, 10.0]], dtype=torch.float64)  # [gate | up] with F = 1
    out = QGEGLU.forward(h)
    limit = QGEGLU.limit
    clamped_gate = torch.tensor([limit, 1.0], dtype=torch.float64)
    expected = clamped_gate * torch.sigmoid(QGEGLU.alpha * clamped_gate) * (torch.tensor([-limit, limit], dtype=torch.float64) + 1)
    torch.testing.assert_close(out[:, 0], expected)


def test_names_and_errors():
    assert activation_from("swiglu") is not None and activation_from("srelu").gated is False
    with pytest.raises(ValueError, match=r"activation must be one of .*'relu'"):
        activation_from("relu")
    with pytest.raises(ValueError, match="even last dimension"):
        SWIGLU.forward(torch.zeros(2, 3))
