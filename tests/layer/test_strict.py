"""Strict mode's floor on a CPU (``GroupedMLP(strict=...)``): with Triton's interpreter every op of
an MXFP8 layer runs on Triton, so ``strict="triton"`` (no op below the Triton path) trains, while
``strict=True`` (no op below CuTeDSL, which needs a GPU) raises at the first op."""

from __future__ import annotations

import pytest
import torch

import gmlp
from gmlp.dispatch.paths import FallbackError


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer: on a GPU the paths are the device's")
def test_strict_triton_trains_an_mxfp8_layer_on_the_interpreter_where_strict_true_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("GMLP_BACKEND", raising=False)
    torch.manual_seed(0)
    x = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
    split_sizes = torch.tensor([5, 11])
    mlp = gmlp.GroupedMLP(2, 32, 32, recipe=gmlp.MXFP8Recipe(), strict="triton")
    mlp(x, split_sizes).backward(torch.randn(16, 32, dtype=torch.bfloat16))
    assert x.grad is not None and mlp.w1.grad is not None and mlp.w2.grad is not None
    assert torch.isfinite(x.grad.float()).all() and torch.isfinite(mlp.w1.grad.float()).all()
    mlp.strict = True
    with pytest.raises(FallbackError, match=r"strict mode: .* took the triton path, below the cutedsl floor "
                                             r"\(strict=True\); not cutedsl: \[system\] tensors are on cpu"):
        mlp(x, split_sizes)
