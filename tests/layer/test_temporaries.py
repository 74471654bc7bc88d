"""The layer keeps no bf16 copy of an MXFP8 operand past the GEMM that reads it: a dequantized
weight is as large as its gradient, so one left alive raises the step's peak memory by that much
(on the H200 the MXFP8 layer's peak was 2.5x torch's bf16 layer's while the dequantized weights
lived to the end of the backward). Checked on the torch path, whose ops run in the same order."""

from __future__ import annotations

import weakref

import pytest
import torch

import gmlp
import gmlp.layer.steps
from gmlp.dispatch.sites import GEMM_OPS, SITES, Op
from tests.support.sm90 import on_sm90

GEMM_SITES = {name for name, site in SITES.items() if site.op in GEMM_OPS}


def _storages(values) -> set[int]:
    return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}


@pytest.fixture
def live_copies_per_gemm(monkeypatch):
    """``_track_copies`` on the torch path."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    return _track_copies(monkeypatch)


def _track_copies(monkeypatch):
    """site -> the bf16 operand values (the dequantize's and the quantize-dequantize's outputs) alive
    during that GEMM's call that it does not read."""
    copies: list[weakref.ref] = []
    stale: dict[str, list[tuple[int, ...]]] = {}
    real = gmlp.layer.steps.implementation

    def tracking(site, path, capability=None):
        run = real(site, path, capability)

        def call(*args, **kwargs):
            if site.name in GEMM_SITES:
                read = _storages([*args, *kwargs.values()])
                alive = [ref() for ref in copies if ref() is not None]
                stale[site.name] = [tuple(t.shape) for t in alive if t.untyped_storage().data_ptr() not in read]
            result = run(*args, **kwargs)
            if site.op is Op.DEQUANTIZE:
                copies.append(weakref.ref(result))
            if site.op is Op.QUANTIZE_DEQUANTIZE:
                copies.extend(weakref.ref(t) for t in (result.rowwise, result.columnwise) if t is not None)
            return result
        return call

    monkeypatch.setattr(gmlp.layer.steps, "implementation", tracking)
    return stale


def test_no_dequantized_copy_outlives_its_gemm(live_copies_per_gemm):
    _check_no_stale_copies(live_copies_per_gemm, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_no_dequantized_copy_outlives_its_gemm_on_the_sm90_paths(monkeypatch):
    """The same on the paths an H200 runs (the SM90 CuTeDSL kernels, the Triton quantize-dequantize)."""
    _check_no_stale_copies(_track_copies(monkeypatch), torch.device("cuda"))


def _check_no_stale_copies(live_copies_per_gemm, device):
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(3, 64, 96, recipe=gmlp.MXFP8Recipe(), device=device)
    x = torch.randn(80, 64, dtype=torch.bfloat16, requires_grad=True, device=device)
    mlp(x, torch.tensor([50, 0, 30], device=device)).square().sum().backward()
    assert set(live_copies_per_gemm) == GEMM_SITES  # every GEMM site ran and was checked
    assert all(not shapes for shapes in live_copies_per_gemm.values()), live_copies_per_gemm


@pytest.fixture
def alive_at_each_op(monkeypatch):
    """``_track_alive`` on the torch path."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    return _track_alive(monkeypatch)


def _track_alive(monkeypatch):
    """(site -> names of the tracked tensors alive when that op of the backward is called, the
    weakrefs by name): the forward's saved Q_col(x), c and Q_col(a) (bf16: c and a), the backward's
    Q_col(dh), and the bf16 values each quantize-dequantize makes for one GEMM (named by its site:
    "w1", "w2", "dy" rowwise, "w2^T", "w1^T", "dy^T" columnwise), recorded from the ops' outputs."""
    refs: dict[str, weakref.ref] = {}
    alive: dict[str, set[str]] = {}
    real = gmlp.layer.steps.implementation

    def tracking(site, path, capability=None):
        run = real(site, path, capability)

        def call(*args, **kwargs):
            if site.name in ("fc1 dgrad", "fc2 wgrad", "fc1 wgrad"):
                alive[site.name] = {name for name, ref in refs.items() if ref() is not None}
            result = run(*args, **kwargs)
            if site.name == "quantize x":
                refs["Q_col(x)"] = weakref.ref(result.columnwise.data)
            if site.name.startswith("qdq "):
                values = result.rowwise if result.rowwise is not None else result.columnwise
                refs[site.name.removeprefix("qdq ")] = weakref.ref(values)
            if site.name == "fc2 dgrad" and result.dh_columnwise is not None:
                refs["Q_col(dh)"] = weakref.ref(result.dh_columnwise.data)
            if site.name == "fc1":
                refs["c"] = weakref.ref(result.c)
                refs["a"] = weakref.ref(result.a if result.a is not None else result.a_columnwise.data)
            return result
        return call

    monkeypatch.setattr(gmlp.layer.steps, "implementation", tracking)
    return alive, refs


@pytest.mark.parametrize("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16", "mxfp8"])
def test_the_backwards_quantized_inputs_are_dropped_before_each_weight_gradient(alive_at_each_op, recipe):
    """Each GEMM's bf16 values (the weights' and dy's, made by one quantize-dequantize pass) live
    only while that GEMM runs; Q_col(dh), made in the backward, is gone once FC1 wgrad's bf16
    copies are made (before its output is allocated), and dh with it before FC2 wgrad (the last,
    at the step's peak) allocates its output. The forward keeps no form of the weights, and its
    saved activations go after their last reader (the eager autograd Function lets go of them)."""
    _check_alive_at_each_op(*alive_at_each_op, recipe, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16", "mxfp8"])
def test_the_backwards_quantized_inputs_are_dropped_on_the_sm90_paths(monkeypatch, recipe):
    """The same on the paths an H200 runs (the SM90 CuTeDSL kernels where they apply)."""
    _check_alive_at_each_op(*_track_alive(monkeypatch), recipe, torch.device("cuda"))


def _check_alive_at_each_op(alive, refs, recipe, device):
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(3, 64, 96, recipe=recipe, device=device)
    x = torch.randn(80, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    mlp(x, torch.tensor([50, 0, 30], device=device)).square().sum().backward()
    forward = {"c", "a"} | ({"Q_col(x)"} if recipe is not None else set())
    # the forward's c goes after FC2 dgrad, Q_col(x) once FC1 wgrad's copy is made, Q_col(a) once
    # FC2 wgrad's is (bf16: a is FC2 wgrad's operand itself)
    if recipe is None:  # x and the weights are the layer's inputs, dy and dh plain tensors: not tracked
        assert set(refs) == forward
        assert alive == {"fc1 dgrad": {"a"}, "fc1 wgrad": {"a"}, "fc2 wgrad": {"a"}}
    else:  # each GEMM's values are alive while it runs (its argument), and not after
        assert set(refs) == forward | {"Q_col(dh)", "w1", "w2", "dy", "w2^T", "w1^T", "dy^T"}
        assert alive == {"fc1 dgrad": {"Q_col(x)", "a", "Q_col(dh)", "w1^T"}, "fc1 wgrad": {"a"},
                         "fc2 wgrad": {"dy^T"}}
