"""Bad input to quantize_mxfp8: an error naming the argument, what was expected and what was given."""

from __future__ import annotations

import pytest
import torch

import gmlp
from gmlp.mxfp8.spec import e8m0_to_float
from tests.support.backends import KERNEL_PATHS, kernel_device, quantize_launcher


def _all_entry_points():
    return [gmlp.quantize_mxfp8, gmlp.quantize_mxfp8_ref]


@pytest.mark.parametrize("quantize", _all_entry_points(), ids=["dispatched", "ref"])
@pytest.mark.parametrize("make_input,kwargs,error,match", [
    (lambda: torch.randn(64, 64, dtype=torch.float16), {}, TypeError, r"bfloat16 or float32.*float16"),
    (lambda: torch.randn(64, 64).to(torch.int32), {}, TypeError, r"x must be bfloat16 or float32"),
    (lambda: torch.randn(64, 48), {}, ValueError, r"multiple of 32, got K=48"),
    (lambda: torch.randn(64), {}, ValueError, r"2-D.*\(64,\)"),
    (lambda: torch.randn(64, 128).t(), {}, ValueError, r"contiguous"),
    (lambda: torch.randn(64, 64), dict(rowwise=False, columnwise=False), ValueError, r"at least one of rowwise"),
    (lambda: torch.randn(64, 64), dict(split_sizes=[32, 32]), TypeError, r"split_sizes must be an integer torch.Tensor"),
    (lambda: torch.randn(64, 64), dict(split_sizes=torch.tensor([32.0, 32.0])), TypeError, r"int32 or int64"),
    (lambda: torch.randn(64, 64), dict(split_sizes=torch.tensor([[64]])), ValueError, r"shape \(E,\)"),
    (lambda: torch.randn(64, 64), dict(split_sizes=torch.tensor([], dtype=torch.int64)), ValueError, r"E >= 1"),
    (lambda: torch.randn(64, 64), dict(element_format="e4m4"), ValueError, r"element_format must be one of \['e4m3', 'e5m2'\]"),
    (lambda: torch.randn(64, 64), dict(scale_mode=1), TypeError, r"scale_mode must be a gmlp.ScaleMode or one of"),
])
def test_bad_arguments(quantize, make_input, kwargs, error, match):
    with pytest.raises(error, match=match):
        quantize(make_input(), **kwargs)


@pytest.mark.parametrize("quantize", _all_entry_points(), ids=["dispatched", "ref"])
@pytest.mark.parametrize("splits,match", [([40, -8, 32], r"non-negative"), ([10, 20], r"sum to x's row count 64, got sum=30")])
def test_split_values_checked_on_cpu(quantize, splits, match):
    with pytest.raises(ValueError, match=match):
        quantize(torch.randn(64, 64), split_sizes=torch.tensor(splits))


@pytest.mark.gpu
@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
@pytest.mark.parametrize("splits", [[40, -8, 32], [10, 20], [64, 64]])
def test_invalid_split_values_poison_gpu_results(path, splits, monkeypatch):
    launcher = quantize_launcher(path)
    monkeypatch.delenv("GMLP_VALIDATE", raising=False)
    split_sizes = torch.tensor(splits, device="cuda")
    q = launcher(torch.randn(64, 64, device="cuda"), rowwise=True, columnwise=True, split_sizes=split_sizes)
    for t in (q.rowwise, q.columnwise):
        assert bool((t.scales == 0xFF).all()), "invalid split sizes must make every scale NaN"
        assert torch.isnan(e8m0_to_float(t.scales)).all()
    monkeypatch.setenv("GMLP_VALIDATE", "1")
    with pytest.raises(ValueError, match=r"split_sizes must"):
        launcher(torch.randn(64, 64, device="cuda"), split_sizes=split_sizes)


@pytest.mark.gpu
def test_split_sizes_on_wrong_device():
    with pytest.raises(ValueError, match=r"split_sizes must be on x's device"):
        gmlp.quantize_mxfp8(torch.randn(64, 64, device="cuda"), split_sizes=torch.tensor([64]))


@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
def test_kernels_validate_like_the_reference(path):
    launcher = quantize_launcher(path)
    with pytest.raises(ValueError, match=r"multiple of 32, got K=40"):
        launcher(torch.randn(64, 40, device=kernel_device()))
