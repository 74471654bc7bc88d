"""``GroupedMLP(..., weight_cache=...)``: quantized weights kept by one forward and reused by the
next ones (micro-batches of one gradient-accumulation step), on the torch path (the cache lives
above the paths: the same for Triton and CuTeDSL)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gmlp
from tests.support.site_calls import count_site_calls


@pytest.fixture
def quantize_calls(monkeypatch):
    """Counts the op calls per site (the torch path forced)."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    return count_site_calls(monkeypatch)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(40, 64, dtype=torch.bfloat16), torch.tensor([30, 0, 10])


def test_reused_weights_give_the_same_outputs_without_quantizing_again(quantize_calls):
    mlp = gmlp.GroupedMLP(3, 64, 64)
    x, split_sizes = _inputs()
    fresh = mlp(x, split_sizes)
    assert quantize_calls["qdq w1"] == quantize_calls["qdq w2"] == 1
    updated = mlp(x, split_sizes, weight_cache="update")
    reused = [mlp(x, split_sizes, weight_cache="reuse") for _ in range(2)]
    assert quantize_calls["qdq w1"] == quantize_calls["qdq w2"] == 2  # not in the reusing forwards
    assert quantize_calls["quantize x"] == 4
    for y in (updated, *reused):
        assert torch.equal(y, fresh)
    x.requires_grad_()
    mlp(x, split_sizes, weight_cache="reuse").sum().backward()  # the backward reads the kept W^T values
    assert x.grad is not None and mlp.w1.grad is not None


def test_the_cache_keeps_the_dgrads_values_too(quantize_calls):
    """With a weight cache the forward makes (or reuses) W^T's values as well and no backward makes
    them, so gradient accumulation pays each weight's two passes once per optimizer step; the
    gradients are bit for bit those without a cache."""
    mlp = gmlp.GroupedMLP(3, 64, 64)
    x, split_sizes = _inputs()
    x.requires_grad_()

    def gradients(**kwargs) -> list[torch.Tensor]:
        mlp.zero_grad()
        x.grad = None
        mlp(x, split_sizes, **kwargs).square().sum().backward()
        return [t.grad.clone() for t in (x, mlp.w1, mlp.w2)]

    want = gradients()
    assert quantize_calls["qdq w1^T"] == quantize_calls["qdq w2^T"] == 1  # without a cache: in the backward
    quantize_calls.clear()
    got = [gradients(weight_cache="update"), *(gradients(weight_cache="reuse") for _ in range(2))]
    assert {site: quantize_calls[site] for site in ("qdq w1", "qdq w2", "qdq w1^T", "qdq w2^T")} == dict.fromkeys(
        ("qdq w1", "qdq w2", "qdq w1^T", "qdq w2^T"), 1)  # the "update" forward's, once
    for grads in got:
        for name, mine, reference in zip(("dx", "dw1", "dw2"), grads, want):
            assert torch.equal(mine, reference), name


def test_reuse_is_refused_without_matching_kept_weights(quantize_calls):
    mlp = gmlp.GroupedMLP(3, 64, 64)
    x, split_sizes = _inputs()
    with pytest.raises(ValueError, match="no quantized weights were kept"):
        mlp(x, split_sizes, weight_cache="reuse")
    mlp(x, split_sizes, weight_cache="update")
    mlp.w1 = nn.Parameter(mlp.w1.detach().clone())  # another storage
    with pytest.raises(ValueError, match="no quantized weights were kept"):
        mlp(x, split_sizes, weight_cache="reuse")
    mlp(x, split_sizes, weight_cache="update")
    mlp.release_quantized_weights()
    with pytest.raises(ValueError, match="no quantized weights were kept"):
        mlp(x, split_sizes, weight_cache="reuse")
    with pytest.raises(ValueError, match="must be None, 'update' or 'reuse'"):
        mlp(x, split_sizes, weight_cache="yes")
    # both quantized recipes take a weight cache (the FP8 blockwise one: tests/layer/test_blockwise_layer.py)
    with pytest.raises(ValueError, match=r"needs a quantized recipe \(gmlp.MXFP8Recipe or gmlp.FP8BlockwiseRecipe\), "
                                         "got recipe=None"):
        gmlp.GroupedMLP(3, 64, 64, recipe=None)(x, split_sizes, weight_cache="update")


@pytest.mark.parametrize("change", ["optimizer step", "copy_", "load_state_dict"])
def test_reuse_after_an_in_place_change_of_the_weights_is_refused(change, quantize_calls):
    """An optimizer step between micro-batches (a missed "update") would reuse stale quantized
    weights; the weights' version counters show it, and the error names the parameter."""
    mlp = gmlp.GroupedMLP(3, 64, 64)
    x, split_sizes = _inputs()
    mlp(x, split_sizes, weight_cache="update").sum().backward()
    mlp(x, split_sizes, weight_cache="reuse")  # nothing changed: reused
    if change == "optimizer step":
        torch.optim.SGD([mlp.w2], lr=0.1).step()
    elif change == "copy_":
        with torch.no_grad():
            mlp.w2.copy_(torch.zeros_like(mlp.w2))
    else:  # copies into every parameter: w1 is named first
        mlp.load_state_dict({**mlp.state_dict(), "w2": torch.zeros_like(mlp.w2)})
    changed = "w1" if change == "load_state_dict" else "w2"
    with pytest.raises(ValueError, match=rf"weight_cache='reuse': {changed} was changed in place since the forward "
                                         r"with weight_cache='update' quantized it"):
        mlp(x, split_sizes, weight_cache="reuse")
    fresh = mlp(x, split_sizes)
    assert torch.equal(mlp(x, split_sizes, weight_cache="update"), fresh)  # quantized again: current weights
    assert torch.equal(mlp(x, split_sizes, weight_cache="reuse"), fresh)
