"""An empty batch (T = 0: an idle expert-parallel rank, a micro-batch routed elsewhere) runs
forward and backward on every recipe and path, whatever form its gradient takes.

The gradient of ``y.sum()`` is an expanded tensor (strides (0, 0)); an empty tensor's strides
address nothing, so every layout check must let it through."""

from __future__ import annotations

import pytest
import torch

import gmlp
from tests.support.backends import kernel_device
from tests.support.cases import parametrize_quick

EXPERTS, HIDDEN, FFN = 4, 64, 32
RECIPES = {"bf16": None, "mxfp8": gmlp.MXFP8Recipe(),
           "mxfp8-floor-e5m2": gmlp.MXFP8Recipe(scale_mode="floor", grad_format="e5m2")}
# None: the path the dispatcher takes (CuTeDSL on a Hopper GPU where it runs)
BACKENDS = ["torch", "triton", None]


def _gradient(form: str, y: torch.Tensor) -> torch.Tensor | None:
    """dy in the given form; None: backward of y.sum(), whose gradient autograd expands."""
    if form == "sum":
        return None
    if form == "zeros":
        return torch.zeros_like(y)
    assert form == "transposed"  # a non-contiguous (T, H) view: strides (1, T)
    return torch.zeros(y.shape[1], y.shape[0], dtype=y.dtype, device=y.device).t()


@pytest.mark.parametrize("form", ["sum", "zeros", "transposed"])
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b or "dispatched")
@parametrize_quick("recipe", RECIPES, keep=2, ids=str)
def test_an_empty_batch_runs_forward_and_backward(recipe, backend, form, monkeypatch):
    device = kernel_device()
    if backend is None and device.type == "cpu":
        pytest.skip("on a CPU the dispatched path is the Triton interpreter, run as 'triton'")
    if backend is not None:
        monkeypatch.setenv("GMLP_BACKEND", backend)
    mlp = gmlp.GroupedMLP(EXPERTS, HIDDEN, FFN, bias=True, recipe=RECIPES[recipe], device=device)
    x = torch.randn(0, HIDDEN, dtype=torch.bfloat16, device=device, requires_grad=True)
    probs = torch.rand(0, device=device, requires_grad=True)
    split_sizes = torch.zeros(EXPERTS, dtype=torch.int32, device=device)
    y = mlp(x, split_sizes, probs)
    assert y.shape == (0, HIDDEN) and y.dtype == torch.bfloat16
    dy = _gradient(form, y)
    if dy is None:
        y.sum().backward()
    else:
        y.backward(dy)
    assert x.grad.shape == (0, HIDDEN) and probs.grad.shape == (0,)
    for name, param in mlp.named_parameters():  # no token: every weight and bias gradient is zero
        assert param.grad is not None and param.grad.shape == param.shape, name
        assert not param.grad.any(), name
