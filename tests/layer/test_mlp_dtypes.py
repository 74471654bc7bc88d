"""Parameter and input dtypes, and deferred (meta-device) construction of GroupedMLP."""

from __future__ import annotations

import pytest
import torch

import gmlp
from tests.support.cases import parametrize_quick


def _inputs(dtype: torch.dtype, hidden: int = 64):
    x = torch.randn(20, hidden, dtype=dtype, requires_grad=True)
    probs = torch.rand(20, dtype=dtype, requires_grad=True)
    return x, torch.tensor([7, 0, 13]), probs


@parametrize_quick("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16-recipe", "mxfp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.float64])
def test_outputs_and_gradients_have_their_tensors_dtypes(recipe, dtype):
    if recipe is not None and dtype in (torch.float16, torch.float64):
        with pytest.raises(TypeError, match=r"quantized recipe \(MXFP8, FP8 blockwise\) takes bfloat16 or float32 parameters"):
            gmlp.GroupedMLP(3, 64, 64, recipe=recipe, dtype=dtype)
        return
    mlp = gmlp.GroupedMLP(3, 64, 64, recipe=recipe, dtype=dtype)
    x, split_sizes, probs = _inputs(dtype)
    y = mlp(x, split_sizes, probs)
    assert y.dtype == dtype and torch.isfinite(y).all()
    y.sum().backward()
    assert (x.grad.dtype, probs.grad.dtype, mlp.w1.grad.dtype, mlp.w2.grad.dtype) == (dtype,) * 4


def test_mxfp8_refuses_parameters_cast_after_construction():
    mlp = gmlp.GroupedMLP(3, 64, 64).half()
    x, split_sizes, _ = _inputs(torch.float16)
    with pytest.raises(TypeError, match="got torch.float16"):
        mlp(x, split_sizes)


def test_unquantized_float64_layer_is_exact():
    """recipe=None with float64 parameters computes in float64 (no bf16 rounding anywhere):
    it equals the unquantized float64 reference to rounding."""
    mlp = gmlp.GroupedMLP(3, 32, 32, recipe=None, dtype=torch.float64)
    x, split_sizes, probs = _inputs(torch.float64, hidden=32)
    y = mlp(x, split_sizes, probs)
    want, _ = gmlp.contract.reference.unquantized_mlp_fp64(x, split_sizes, probs, mlp.w1, None, mlp.w2, None, mlp.activation)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)


@parametrize_quick("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16-recipe", "mxfp8"])
def test_meta_device_construction_then_materialization(recipe):
    torch.manual_seed(1)
    built = gmlp.GroupedMLP(3, 64, 64, recipe=recipe, bias=True)
    deferred = gmlp.GroupedMLP(3, 64, 64, recipe=recipe, bias=True, device="meta")
    with torch.device("meta"):
        in_context = gmlp.GroupedMLP(3, 64, 64, recipe=recipe, bias=True)
    assert all(p.is_meta for module in (deferred, in_context) for p in module.parameters())
    deferred.to_empty(device="cpu")
    torch.manual_seed(1)
    deferred.reset_parameters()
    for (name, a), (_, b) in zip(built.named_parameters(), deferred.named_parameters()):
        assert torch.equal(a, b), name
    x, split_sizes, probs = _inputs(torch.bfloat16)
    assert torch.equal(deferred(x, split_sizes, probs), built(x, split_sizes, probs))
