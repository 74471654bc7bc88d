"""Per-op dispatch of the layer, on the CPU with simulated GPUs and packages: every kind of
reason, one warning per (op, path, activation, reason), none when unset, strict mode, forced
backends, and decisions that do not depend on the diagnostic settings."""

from __future__ import annotations

import dataclasses
import importlib
import warnings

import pytest
import torch

import gmlp
import gmlp.cutedsl
# Imported now, under conftest's TRITON_INTERPRET setting: the tests below pretend a GPU with
# TRITON_INTERPRET=0, and a Triton module first imported then would build compiled-mode kernels
# that the interpreted tests after them cannot run.
import gmlp.triton_ref.quantize  # noqa: F401
from gmlp import dispatch
from gmlp.dispatch import FallbackError, FallbackWarning, Path
from gmlp.layer_ops import LayerProblem, plan_layer
from gmlp.reasons import ReasonKind

# what a cutlass-dsl release that renamed an API looks like to the CuTeDSL kernels
RENAMED_API = ("cannot import name 'make_fake_compact_tensor' from 'cutlass.cute.runtime' "
               "(/opt/venv/lib/python3.12/site-packages/cutlass/cute/runtime.py)")
GEMM_SITES = ("fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad")


@pytest.fixture(autouse=True)
def fresh_dispatch(monkeypatch):
    """Cached system answers and the warned set start empty and are cleared after each test."""
    for cached in (dispatch._device_system_reason, gmlp.cutedsl.import_error):
        cached.cache_clear()
    monkeypatch.setattr(dispatch, "_warned", set())
    for name in ("GMLP_WARN_FALLBACK", "GMLP_STRICT", "GMLP_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    yield
    for cached in (dispatch._device_system_reason, gmlp.cutedsl.import_error):
        cached.cache_clear()


def _problem(recipe=gmlp.MXFP8Recipe(), dtype=torch.bfloat16, activation="swiglu") -> LayerProblem:
    mlp = gmlp.GroupedMLP(4, 64, 64, activation=activation, recipe=recipe, dtype=dtype)
    e5m2 = recipe is not None and recipe.grad_format is gmlp.ElementFormat.E5M2
    return LayerProblem(dtype, recipe is not None, False, activation, e5m2, mlp._quantize_problems(torch.zeros(96, 64)))


def _gpu(monkeypatch, capability: tuple[int, int]) -> torch.device:
    """Pretend a CUDA GPU of ``capability`` is there (only the dispatcher asks)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    return torch.device("cuda")


def _broken_cutedsl(monkeypatch, error: Exception) -> None:
    real = importlib.import_module

    def import_module(name, *args):
        if name == "gmlp.cutedsl.quantize":
            raise error
        return real(name, *args)

    monkeypatch.setattr(gmlp.cutedsl.importlib, "import_module", import_module)


def _plan(device, activation="swiglu", **problem_args):
    return plan_layer(_problem(activation=activation, **problem_args), device, strict=None)


def test_compute_capability_reasons(monkeypatch):
    plan = _plan(_gpu(monkeypatch, (8, 0)))
    for site, decision in plan.decisions.items():
        assert decision.path is Path.TORCH, site
        reasons = dict(decision.skipped)
        assert reasons[Path.TRITON].kind is ReasonKind.SYSTEM and "compute capability 8.0 < 8.9" in str(reasons[Path.TRITON])
        assert "sm_90a (Hopper) and sm_100a (Blackwell)" in str(reasons[Path.CUTEDSL])


def test_missing_package_reason_names_it(monkeypatch):
    device = _gpu(monkeypatch, (9, 0))
    _broken_cutedsl(monkeypatch, ModuleNotFoundError("No module named 'cutlass'"))
    plan = _plan(device)
    quantize = plan.decisions["quantize x"]
    assert quantize.path is Path.TRITON
    reason = str(dict(quantize.skipped)[Path.CUTEDSL])
    assert "nvidia-cutlass-dsl" in reason and "ModuleNotFoundError: No module named 'cutlass'" in reason


def test_old_package_reason(monkeypatch):
    device = _gpu(monkeypatch, (10, 0))
    monkeypatch.setattr(gmlp.versions, "package_version",
                        lambda name: "4.4.2" if name == "nvidia-cutlass-dsl" else "3.6.0")
    reason = str(dict(_plan(device).decisions["quantize w1"].skipped)[Path.CUTEDSL])
    assert "nvidia-cutlass-dsl 4.4.2 is older than 4.8.1" in reason


def test_recipe_reason_for_parameters_the_gemms_cannot_take(monkeypatch):
    plan = _plan(_gpu(monkeypatch, (9, 0)), recipe=None, dtype=torch.float32)
    for site in GEMM_SITES:
        reason = dict(plan.decisions[site].skipped)[Path.TRITON]
        assert reason.kind is ReasonKind.RECIPE and "torch.float32" in str(reason), site


def test_one_warning_per_op_path_activation_and_reason(monkeypatch):
    device = _gpu(monkeypatch, (9, 0))
    _broken_cutedsl(monkeypatch, ImportError(RENAMED_API))
    monkeypatch.setenv("GMLP_WARN_FALLBACK", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            _plan(device)  # four quantize sites, two GEMM sites of each of two ops, twice
        first = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
        _plan(device, activation="srelu")  # another activation: its own warnings
        second = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)][len(first):]
    ops = ["quantize_mxfp8", "dequantize_mxfp8", "fc1_forward", "grouped_gemm", "fc2_dgrad", "grouped_wgrad"]
    assert sorted(m.split(" ")[0] for m in first) == sorted(ops), first
    quantize = next(m for m in first if m.startswith("quantize_mxfp8 (swiglu) at quantize x"))
    assert RENAMED_API in quantize and "nvidia-cutlass-dsl" in quantize and "took triton" in quantize
    assert len(second) == len(ops) and all("(srelu)" in m for m in second)


def test_no_warning_unless_asked_and_the_same_decisions(monkeypatch):
    device = _gpu(monkeypatch, (9, 0))
    _broken_cutedsl(monkeypatch, ImportError(RENAMED_API))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = _plan(device)
    monkeypatch.setenv("GMLP_WARN_FALLBACK", "1")
    with pytest.warns(FallbackWarning):
        loud = _plan(device)
    assert {s: d.path for s, d in quiet.decisions.items()} == {s: d.path for s, d in loud.decisions.items()}


def test_strict_raises_at_the_first_fallback(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    mlp = gmlp.GroupedMLP(2, 64, 64, strict=True)
    with pytest.raises(FallbackError, match=r"strict mode: quantize_mxfp8 \(swiglu\) at quantize x took the torch path; "
                                             r"not cutedsl: \[system\].*not triton: \[system\] tensors are on cpu"):
        mlp(torch.zeros(8, 64).bfloat16(), torch.tensor([4, 4]))
    monkeypatch.setenv("GMLP_STRICT", "1")
    with pytest.raises(FallbackError):
        gmlp.GroupedMLP(2, 64, 64)(torch.zeros(8, 64).bfloat16(), torch.tensor([4, 4]))


def test_forced_backends(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton can run; torch is forced anyway
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    plan = gmlp.GroupedMLP(2, 64, 64).plan(torch.zeros(8, 64))
    assert {d.path for d in plan.decisions.values()} == {Path.TORCH}
    device = _gpu(monkeypatch, (9, 0))
    monkeypatch.setenv("GMLP_BACKEND", "cutedsl")  # only the quantize has CuTeDSL kernels on SM90
    _broken_cutedsl(monkeypatch, ImportError(RENAMED_API))
    with pytest.raises(FallbackError, match=r"GMLP_BACKEND=cutedsl: quantize_mxfp8 \(swiglu\) at quantize x cannot "
                                             r"run on cutedsl: \[system\] gmlp.cutedsl.quantize failed to import"):
        _plan(device)
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    assert {d.path for d in _plan(device).decisions.values()} == {Path.TRITON}


def test_shape_reason(monkeypatch):
    """A quantize too large for the CuTeDSL kernel's 32-bit indices takes Triton, with a shape reason."""
    if gmlp.cutedsl.import_error() is not None:
        pytest.skip(f"cutlass-dsl does not import here: {gmlp.cutedsl.import_error()}")
    device = _gpu(monkeypatch, (9, 0))
    problem = _problem()
    huge = dataclasses.replace(problem.quantize_problems["quantize x"], num_rows=2**31 - 64)
    problem = dataclasses.replace(problem, quantize_problems={**problem.quantize_problems, "quantize x": huge})
    decision = plan_layer(problem, device, strict=None).decisions["quantize x"]
    reason = dict(decision.skipped)[Path.CUTEDSL]
    assert decision.path is Path.TRITON and reason.kind is ReasonKind.SHAPE and "32-bit indices" in str(reason)


def test_sm100_reasons_for_the_fused_gemms(monkeypatch):
    """On SM100 the GEMM steps would take cuDNN frontend's kernels: an activation they lack is an
    activation reason, their import failure a system reason with its text."""
    from gmlp.cutedsl import cudnn_kernels

    cudnn_kernels.import_error.cache_clear()
    if cudnn_kernels.import_error() is not None or gmlp.cutedsl.import_error() is not None:
        pytest.skip(f"the CuTeDSL packages do not import here: {cudnn_kernels.import_error()}")
    device = _gpu(monkeypatch, (10, 0))
    geglu = _plan(device, activation="geglu")
    for site in ("fc1", "fc2 dgrad"):
        reason = dict(geglu.decisions[site].skipped)[Path.CUTEDSL]
        assert reason.kind is ReasonKind.ACTIVATION and "no tanh-GELU GeGLU" in str(reason), site
    assert dict(geglu.decisions["fc2"].skipped)[Path.CUTEDSL].kind is ReasonKind.SYSTEM
    e5m2 = _plan(device, recipe=gmlp.MXFP8Recipe(grad_format=gmlp.ElementFormat.E5M2))
    for site in ("fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad"):
        reason = dict(e5m2.decisions[site].skipped)[Path.CUTEDSL]
        assert reason.kind is ReasonKind.RECIPE and "E5M2 gradients" in str(reason), site
    assert "E5M2" not in str(dict(e5m2.decisions["fc2"].skipped)[Path.CUTEDSL])
    assert _plan(device).decisions["quantize x"].path is Path.CUTEDSL  # the quantize runs there
    real = cudnn_kernels.importlib.import_module

    def import_module(name, *args):
        if name.startswith("cudnn.gemm.cutedsl.grouped"):
            raise ImportError(RENAMED_API)
        return real(name, *args)

    monkeypatch.setattr(cudnn_kernels.importlib, "import_module", import_module)
    cudnn_kernels.import_error.cache_clear()
    try:
        reason = str(dict(_plan(device).decisions["fc1"].skipped)[Path.CUTEDSL])
    finally:
        cudnn_kernels.import_error.cache_clear()
    assert RENAMED_API in reason and "nvidia-cudnn-frontend" in reason
