"""First dispatcher checks: reasons for every skipped path, forced backends, strict mode, warnings."""

from __future__ import annotations

import inspect
import re
import warnings

import pytest
import torch

import gmlp
from gmlp.contract.reasons import ReasonKind
from gmlp.dispatch.paths import FallbackError, FallbackWarning, Path


def test_cpu_plan_explains_every_skipped_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    decision = gmlp.plan_quantize(torch.zeros(64, 64))
    assert decision.path is Path.TORCH
    skipped = dict(decision.skipped)
    assert set(skipped) == {Path.CUTEDSL, Path.TRITON}
    assert all(reason.kind is ReasonKind.SYSTEM for reason in skipped.values())
    assert "CUDA GPU" in str(skipped[Path.TRITON]) and "TRITON_INTERPRET=1" in str(skipped[Path.TRITON])
    assert "not cutedsl" in decision.explain()


def test_interpreter_makes_triton_the_cpu_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gmlp.plan_quantize(torch.zeros(64, 64)).path is Path.TRITON


def test_strict_raises_with_the_reasons(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(FallbackError, match=r"strict mode: quantize_mxfp8 took the torch path, below the cutedsl floor "
                                             r"\(strict=True\); not cutedsl: \[system\]"):
        gmlp.quantize_mxfp8(torch.zeros(64, 64), strict=True)
    monkeypatch.setenv("GMLP_STRICT", "1")
    with pytest.raises(FallbackError, match=r"below the cutedsl floor \(GMLP_STRICT='1'\)"):
        gmlp.quantize_mxfp8(torch.zeros(64, 64))


@pytest.mark.parametrize("interpret", ["0", "1"])
def test_strict_triton_raises_only_for_an_op_on_torch(monkeypatch, interpret):
    """On a CPU, CuTeDSL never runs: strict=True (the cutedsl floor) raises at every op, while the
    triton floor raises only where Triton cannot run either (no interpreter), saying why."""
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    x = torch.zeros(64, 64)
    with pytest.raises(FallbackError, match=r"below the cutedsl floor \(strict=True\)"):
        gmlp.plan_quantize(x, strict=True)
    if interpret == "1":
        assert gmlp.plan_quantize(x, strict="triton").path is Path.TRITON
        monkeypatch.setenv("GMLP_STRICT", "Triton")
        assert gmlp.plan_quantize(x).path is Path.TRITON
        return
    with pytest.raises(FallbackError, match=r"strict mode: quantize_mxfp8 took the torch path, below the triton floor "
                                             r"\(strict='triton'\); not cutedsl: .*; not triton: \[system\] tensors are on "
                                             r"cpu; the Triton kernels need a CUDA GPU \(or TRITON_INTERPRET=1"):
        gmlp.plan_quantize(x, strict="triton")
    monkeypatch.setenv("GMLP_STRICT", "triton")
    with pytest.raises(FallbackError, match=r"below the triton floor \(GMLP_STRICT='triton'\)"):
        gmlp.plan_quantize(x)
    assert gmlp.plan_quantize(x, strict=False).path is Path.TORCH  # the argument wins over the variable


@pytest.mark.parametrize("strict", ["torch", "Triton", 1, "yes"])
def test_a_bad_strict_argument_is_named_with_the_accepted_values(strict):
    match = (r"strict must be None \(GMLP_STRICT\), True, False or one of \('cutedsl', 'triton'\) .*got "
             + re.escape(repr(strict)))
    with pytest.raises(ValueError, match=match):
        gmlp.plan_quantize(torch.zeros(64, 64), strict=strict)
    with pytest.raises(ValueError, match=match):
        gmlp.GroupedMLP(2, 64, 64, strict=strict)


def test_a_bad_strict_variable_is_named_even_without_a_fallback(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GMLP_BACKEND", "torch")  # forced: no fallback to judge
    monkeypatch.setenv("GMLP_STRICT", "torch")
    with pytest.raises(ValueError, match=r"GMLP_STRICT='torch': expected one of cutedsl, triton, 1/0"):
        gmlp.plan_quantize(torch.zeros(64, 64))


def test_forced_backend(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GMLP_BACKEND", "cutedsl")
    with pytest.raises(FallbackError, match=r"GMLP_BACKEND=cutedsl: quantize_mxfp8 cannot run on cutedsl: \[system\]"):
        gmlp.quantize_mxfp8(torch.zeros(64, 64))
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    assert gmlp.plan_quantize(torch.zeros(64, 64)).path is Path.TORCH
    monkeypatch.setenv("GMLP_BACKEND", "fastest")
    with pytest.raises(ValueError, match=r"GMLP_BACKEND='fastest': expected one of cutedsl, triton, torch"):
        gmlp.quantize_mxfp8(torch.zeros(64, 64))


def test_fallback_warns_once_per_reason_and_only_when_asked(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("GMLP_WARN_FALLBACK", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gmlp.quantize_mxfp8(torch.zeros(64, 64))
    monkeypatch.setenv("GMLP_WARN_FALLBACK", "1")
    monkeypatch.setattr("gmlp.dispatch.paths._warned", set())
    with pytest.warns(FallbackWarning) as record:
        for _ in range(3):
            gmlp.quantize_mxfp8(torch.zeros(64, 64))
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages  # one per skipped path, not one per call
    assert any("not triton" in m and "took torch" in m for m in messages)


@pytest.mark.parametrize("value", ["0", "no", "NO", "off", "false", ""])
def test_strict_false_spellings_are_not_strict(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GMLP_STRICT", value)
    assert gmlp.quantize_mxfp8(torch.zeros(64, 64)).rowwise is not None  # fell back to torch, no error


@pytest.mark.parametrize("value", ["yes", "On", "TRUE"])
def test_strict_true_spellings_are_strict(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GMLP_STRICT", value)
    with pytest.raises(FallbackError, match="strict mode"):
        gmlp.quantize_mxfp8(torch.zeros(64, 64))


@pytest.mark.parametrize("name", ["GMLP_STRICT", "GMLP_WARN_FALLBACK"])
def test_unknown_boolean_spelling_raises(monkeypatch, name):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ValueError, match=rf"{name}='maybe': expected one of (cutedsl, triton, )?1/0, true/false, yes/no, "
                                         r"on/off"):
        gmlp.quantize_mxfp8(torch.zeros(64, 64))


def test_interpreter_true_spelling_makes_triton_the_cpu_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "true")
    assert gmlp.plan_quantize(torch.zeros(64, 64)).path is Path.TRITON


def test_fallback_warnings_point_at_the_callers_line(monkeypatch):
    """A FallbackWarning is raised deep in the layer (forward op, plan cache); it names the user's
    line (here, this file), not a gmlp or torch file."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GMLP_WARN_FALLBACK", "1")
    monkeypatch.setattr("gmlp.dispatch.paths._warned", set())
    mlp = gmlp.GroupedMLP(2, 64, 64)
    x, split_sizes = torch.zeros(8, 64, dtype=torch.bfloat16), torch.tensor([3, 5])
    with pytest.warns(FallbackWarning) as record:
        mlp(x, split_sizes)  # the line the warnings must name
    call_line = inspect.currentframe().f_lineno - 1
    assert {(w.filename, w.lineno) for w in record} == {(__file__, call_line)}
    with pytest.warns(FallbackWarning) as record:
        gmlp.quantize_mxfp8(torch.zeros(64, 32, dtype=torch.bfloat16), columnwise=True)
    assert {(w.filename, w.lineno) for w in record} == {(__file__, inspect.currentframe().f_lineno - 1)}


def test_each_op_is_its_module_in_every_kernel_package():
    """``Op.X`` is implemented by ``<package>.x`` with the launcher ``Op.X.value`` (the op's name in
    plans and cross-check settings), in the Triton package and, for the GEMMs, in the SM90 one."""
    import importlib

    from gmlp.cutedsl.sm90 import support
    from gmlp.dispatch.sites import GEMM_OPS, Op

    for op in Op:
        module = importlib.import_module(f"gmlp.triton_ref.{op.module}")
        assert callable(getattr(module, op.launcher)), op
    if support.import_error() is None:
        for op in GEMM_OPS:
            assert callable(getattr(importlib.import_module(f"gmlp.cutedsl.sm90.{op.module}"), op.launcher)), op
    assert callable(getattr(importlib.import_module(f"gmlp.cutedsl.{Op.QUANTIZE.module}"), Op.QUANTIZE.launcher))
