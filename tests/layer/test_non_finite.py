"""Non-finite inputs propagate on every recipe and path: a row of x holding an Inf, a NaN, or a
finite value whose products overflow (3e38) gives a non-finite output row, a non-finite dx row
and dprobs, and non-finite weight gradients for its expert, while every other row and expert
stays finite (forward and backward agree with each other and with the bf16 layer's behaviour),
and the cross-check finds each kernel path equal to the next path down, non-finite values included.

The FP8 blockwise recipe is where this needed care: TransformerEngine's quantize kernel turns a
block holding an Inf into a finite one (the Inf saturated to +-fmax), which hid an overflow
upstream from the loss; gmlp's spec takes its Python reference's non-finite block instead
(``gmlp.fp8_blockwise.spec``)."""

from __future__ import annotations

import math

import pytest
import torch

import gmlp
from gmlp.debug import cross_check
from gmlp.dispatch.paths import Path
from tests.support.backends import kernel_device
from tests.support.cases import parametrize_quick

EXPERTS, HIDDEN, FFN = 2, 128, 128  # the blockwise recipe's smallest sizes (multiples of 128)
SPLITS = [5, 7]
POISONED_ROW, POISONED_COLUMN = 3, 17  # in expert 0
RECIPES = {"bf16": None, "mxfp8": gmlp.MXFP8Recipe(), "fp8-blockwise": gmlp.FP8BlockwiseRecipe(),
           "fp8-blockwise-e5m2-fp32-scales": gmlp.FP8BlockwiseRecipe("e5m2", False)}
POISONS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "overflowing-3e38": 3e38}


def _module(recipe) -> gmlp.GroupedMLP:
    torch.manual_seed(0)
    return gmlp.GroupedMLP(EXPERTS, HIDDEN, FFN, recipe=recipe, device=kernel_device())


def _step(mlp: gmlp.GroupedMLP, poison: float):
    """y and the gradients of x and probs of one forward + backward with
    x[POISONED_ROW, POISONED_COLUMN] = poison (the weights' gradients are left in ``mlp``)."""
    device = kernel_device()
    generator = torch.Generator().manual_seed(1)
    tokens = sum(SPLITS)
    x = torch.randn(tokens, HIDDEN, generator=generator)
    x[POISONED_ROW, POISONED_COLUMN] = poison
    x = x.to(device, torch.bfloat16).requires_grad_()
    probs = torch.rand(tokens, generator=generator).to(device).requires_grad_()
    dy = torch.randn(tokens, HIDDEN, generator=generator).to(device, torch.bfloat16)
    with cross_check(action="raise"):  # the paths agree on the non-finite values too (same infinities, NaNs)
        y = mlp(x, torch.tensor(SPLITS, device=device), probs)
        y.backward(dy)
    return y.detach(), x.grad, probs.grad


def _pin(monkeypatch, path: str, mlp: gmlp.GroupedMLP) -> None:
    """Pin the kernels' path: "torch" and "triton" through GMLP_BACKEND; "cutedsl" is the default
    plan on an SM90 GPU with the CuTeDSL kernels (their GEMMs; the quantizes stay on Triton)."""
    if path != "cutedsl":
        monkeypatch.setenv("GMLP_BACKEND", path)
    fc1 = mlp.plan(torch.zeros(1, HIDDEN, device=kernel_device(), dtype=torch.bfloat16)).path("fc1")
    if fc1 is not Path(path):
        pytest.skip(f"fc1 runs on {fc1.value} here, not {path}")


@pytest.mark.filterwarnings("ignore::gmlp.debug.CrossCheckWarning")  # the torch path: nothing to compare with
@parametrize_quick("poison", list(POISONS.values()), ids=list(POISONS))
@parametrize_quick("recipe", list(RECIPES.values()), ids=list(RECIPES), keep=4)
@parametrize_quick("path", ["torch", "triton", "cutedsl"], keep=3)
def test_a_non_finite_row_stays_non_finite_forward_and_backward(monkeypatch, path, recipe, poison):
    """An Inf or NaN in a row: its y, dx and dprobs and its expert's weight gradients are not
    finite. A finite 3e38 overflows in the activation (h ~ 1e37, gate times up): y and dprobs
    (the sum of dy's products with that activation) and the weight gradients are not finite; dx
    may be (the activation's derivative stays finite: the bf16 layer's dx row is ~1e36), so it is
    not asserted. Every other row and expert stays finite."""
    mlp = _module(recipe)
    _pin(monkeypatch, path, mlp)
    y, dx, dprobs = _step(mlp, poison)
    rows = {"y": y, "dprobs": dprobs} if math.isfinite(poison) else {"y": y, "dx": dx, "dprobs": dprobs}
    for name, value in rows.items():
        assert not bool(value[POISONED_ROW].isfinite().all()), f"the poisoned row's {name} is finite"
    others = torch.arange(sum(SPLITS), device=y.device) != POISONED_ROW
    for name, value in {"y": y, "dx": dx, "dprobs": dprobs}.items():
        assert bool(value[others].isfinite().all()), f"{name} of a row without the poison is not finite"
    for name in ("w1", "w2"):
        grad = getattr(mlp, name).grad
        assert not bool(grad[0].isfinite().all()), f"{name}.grad of the poisoned row's expert is finite"
        assert bool(grad[1].isfinite().all()), f"{name}.grad of the other expert is not finite"
