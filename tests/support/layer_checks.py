"""The whole layer against its oracle, on the path the plan takes: the check the layer tests of
every path share.

Both approximate the same exact layer: the oracle within the bounds of tests/layer/test_mlp.py (one
rounding per quantized operand, ``tests.support.tolerances``). Two such results differ by at most
twice that bound, the triangle inequality; in practice they differ far less (the kernels reproduce
the oracle's quantization points, only the fp32 accumulation order differs).
"""

from __future__ import annotations

import pytest
import torch

import gmlp
from gmlp.contract.reference import grouped_mlp_backward_ref, grouped_mlp_forward_ref
from gmlp.dispatch.paths import Path
from gmlp.mxfp8.spec import ElementFormat
from tests.support.backends import kernel_device
from tests.support.tolerances import BF16_UNIT, relative_rms_bound, relative_rms_error, unit_roundoff

__all__ = ["SPLITS", "check_against_oracle"]

SPLITS = [0, 37, 64, 1, 90]


def check_against_oracle(splits: list[int], hidden: int, ffn: int, activation: str, recipe, bias: bool,
                         sm100: bool = False, gemm_path: Path = Path.TRITON) -> None:
    """Run the module on the path the plan takes (``gemm_path`` at FC2, else skipped; with
    ``sm100`` the SM100 composition, which must be what the plan takes), forward and backward,
    and compare every output with the oracle within the bounds of the module docstring."""
    device = kernel_device()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(splits), hidden, ffn, activation=activation, bias=bias, recipe=recipe, device=device)
    if bias:
        with torch.no_grad():
            mlp.b1.normal_(0, 0.1)
            mlp.b2.normal_(0, 0.1)
    plan = mlp.plan(torch.zeros(1, device=device))
    if sm100:
        assert plan.sm100, plan.explain()
    elif plan.path("fc2") is not gemm_path:
        pytest.skip(f"the {gemm_path.value} GEMMs do not run here:\n{plan.explain()}")
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(sum(splits), hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(sum(splits), device=device, requires_grad=True)
    dy = torch.randn(sum(splits), hidden, device=device, dtype=torch.bfloat16)
    # implementation
    y = mlp(x, split_sizes, probs)
    y.backward(dy)
    # reference
    b1, b2 = (None, None) if not bias else (mlp.b1.detach(), mlp.b2.detach())
    want_y, saved = grouped_mlp_forward_ref(x.detach(), split_sizes, probs.detach(), mlp.w1.detach(), b1,
                                            mlp.w2.detach(), b2, mlp.activation, recipe)
    want = grouped_mlp_backward_ref(dy, saved, mlp.activation, recipe)
    # expected error (module docstring); weight gradients reach autograd in bf16: one more rounding
    act = unit_roundoff(ElementFormat.E4M3) if recipe is not None else BF16_UNIT
    grad = unit_roundoff(recipe.grad_format) if recipe is not None else BF16_UNIT
    checks = {
        "y": (y, want_y, 2 * relative_rms_bound(act, act, act, act, BF16_UNIT)),
        "dx": (x.grad, want.dx, 2 * relative_rms_bound(grad, act, BF16_UNIT, grad, act, BF16_UNIT)),
        "dprobs": (probs.grad, want.dprobs, 2 * relative_rms_bound(grad, act, BF16_UNIT, act, act)),
        "dw1": (mlp.w1.grad, want.dw1, 2 * relative_rms_bound(grad, act, BF16_UNIT, grad, act, BF16_UNIT)),
        "dw2": (mlp.w2.grad, want.dw2, 2 * relative_rms_bound(grad, act, act, act, BF16_UNIT)),
    }
    if bias:
        checks["db1"] = (mlp.b1.grad, want.db1, 2 * relative_rms_bound(grad, act, BF16_UNIT, BF16_UNIT))
        checks["db2"] = (mlp.b2.grad, want.db2, 2 * relative_rms_bound(BF16_UNIT, BF16_UNIT))
    errors = {name: relative_rms_error(got, ref) for name, (got, ref, _) in checks.items()}
    assert all(errors[name] <= bound for name, (_, _, bound) in checks.items()), errors
