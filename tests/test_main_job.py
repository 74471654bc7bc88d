"""``python -m gmlp`` (the main job on its embedded default) and ``python -m gmlp doctor``: what a
new user runs first. The demo's figures are the same run after run and it ends with one PASS or
FAIL line; the doctor reports every package gmlp may use, with how to install a missing one; a
layer's plan says each reason once; ``cache`` reports, clears and (on a GPU) warms the compile
cache."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import gmlp
import gmlp.__main__ as main_job
from gmlp.dispatch.paths import Path, _device_system_reason, system_reason


def _demo_output(capsys) -> tuple[int, str]:
    status = main_job.demo()
    return status, capsys.readouterr().out


@pytest.mark.slow  # two demo runs; the failing demo below runs one
def test_the_demo_is_reproducible_and_ends_with_pass(monkeypatch, capsys):
    monkeypatch.setenv("GMLP_BACKEND", "torch")  # the layer on the torch path: quick; quantize kernels still checked
    torch.manual_seed(1234)  # whatever the global RNG holds before, the figures are the demo's own
    first_status, first = _demo_output(capsys)
    torch.rand(7)
    second_status, second = _demo_output(capsys)
    assert first_status == second_status == 0
    assert first == second
    assert first.rstrip().splitlines()[-1].startswith("gmlp demo: PASS (")
    # the cross-check's report: on torch every op is listed as not compared, and the count is its
    sites = len(main_job.GroupedMLP(main_job.DEMO_EXPERTS, main_job.DEMO_HIDDEN, main_job.DEMO_FFN).plan(
        torch.zeros(1, main_job.DEMO_HIDDEN)).decisions)
    assert f"cross-check: 0 ops compared (0 calls, 0 mismatching elements), {sites} not compared\nnot compared:" in first
    assert first.rstrip().endswith(f"0 of {sites} ops cross-checked)")


def test_the_demo_ends_with_fail_when_a_check_fails(monkeypatch, capsys):
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    monkeypatch.setattr(main_job, "DEMO_ERROR_BOUND", 1e-6)  # no quantized layer is that close
    status, out = _demo_output(capsys)
    assert status == 1
    assert "TOO LARGE" in out
    assert out.rstrip().splitlines()[-1].startswith("gmlp demo: FAIL (0 quantize mismatches, 5 layer checks failed")


def test_a_layer_plan_says_each_reason_once():
    mlp = gmlp.GroupedMLP(4, 64, 64, bias=True)
    text = mlp.explain(torch.zeros(16, 64, dtype=torch.bfloat16))
    reasons = [line for line in text.splitlines() if line.lstrip().startswith("not ")]
    assert len(reasons) == len(set(reasons))
    cutedsl = str(system_reason(Path.CUTEDSL, torch.device("cpu")))
    assert text.count(cutedsl) == 1 and f"not cutedsl (every op): {cutedsl}" in text
    assert "GEMM sites" not in text and "gmlp.layer.steps" not in text  # no internal names


def test_the_doctor_reports_every_package_and_how_to_install_a_missing_one(monkeypatch, capsys):
    installed = {"torch": "2.13.0", "triton": "3.6.0"}
    monkeypatch.setattr(main_job, "package_version", lambda name: installed.get(name, "not installed"))
    assert main_job.doctor() == 0
    lines = {}  # the first line of each name: the package's (the paths' lines follow, "torch" among them)
    for line in capsys.readouterr().out.splitlines():
        lines.setdefault(line.split(":")[0].strip(), line)
    for name in ("numpy", "torchtitan", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend"):
        assert "not installed; pip install" in lines[name], lines[name]
    assert "gmlp[cutedsl]" in lines["nvidia-cutlass-dsl"] and "gmlp[torchtitan]" in lines["torchtitan"]
    assert lines["torch"].endswith(": 2.13.0")


def test_the_doctor_reports_each_gmlp_variable_set_and_an_invalid_one_without_crashing(monkeypatch, capsys):
    for name in [name for name in os.environ if name.startswith("GMLP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("GMLP_STRICT", "triton")  # the doctor's plans report, never raise
    assert main_job.doctor() == 0
    out = capsys.readouterr().out
    assert "environment: 2 gmlp variables set" in out
    assert "GMLP_STRICT=triton: raise FallbackError where an op runs below the path named" in out
    assert "TRITON_INTERPRET=1: Triton's own: run the Triton kernels in Triton's interpreter" in out
    assert "plan for a sample layer:" in out
    monkeypatch.setenv("GMLP_SM90_CONFIG", "fc3.store=tma")
    monkeypatch.setenv("GMLP_STIRCT", "1")
    assert main_job.doctor() == 1
    out = capsys.readouterr().out
    assert ("GMLP_SM90_CONFIG=fc3.store=tma: INVALID: environment variable GMLP_SM90_CONFIG='fc3.store=tma': "
            "'fc3.store=tma' names op 'fc3'") in out
    assert "GMLP_STIRCT=1: unknown: gmlp reads no variable of this name (misspelt GMLP_STRICT?)" in out
    assert out.rstrip().splitlines()[-1] == ("paths and plans not shown: fix GMLP_SM90_CONFIG first (a layer's first "
                                             "call raises the same error)")


def test_the_interpreter_without_numpy_is_a_reason(monkeypatch):
    """A core install lacking numpy (installed without dependencies) falls back with the install command."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numpy" else real(name, *a))
    _device_system_reason.cache_clear()
    try:
        reason = _device_system_reason(Path.TRITON, "cpu", None, True)
    finally:
        _device_system_reason.cache_clear()
    assert reason is not None and "Triton's interpreter needs numpy" in str(reason) and "pip install numpy" in str(reason)



def test_the_cache_command_reports_and_clears_the_compile_cache(tmp_path, monkeypatch, capsys):
    kept = tmp_path / "cutedsl"
    kept.mkdir()
    for name in ("fc1forwardsm90-0123.o", "groupedgemmsm90-4567.o"):
        (kept / name).write_bytes(b"x" * 1024)
    monkeypatch.setenv("GMLP_CACHE_DIR", str(tmp_path))
    assert main_job.main(["cache"]) == 0
    report = capsys.readouterr().out
    assert str(kept) in report and "2 compiled kernels" in report and "fc1forwardsm90-0123.o" in report
    assert main_job.main(["cache", "clear"]) == 0
    assert "removed 2 compiled kernels" in capsys.readouterr().out and not list(kept.iterdir())
    monkeypatch.setenv("GMLP_COMPILE_CACHE", "0")
    main_job.main(["cache", "info"])
    assert "off (GMLP_COMPILE_CACHE=0)" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer: a GPU warms the cache")
def test_cache_warm_without_a_gpu_says_why_it_cannot(capsys):
    assert main_job.main(["cache", "warm"]) == 1
    assert main_job.main(["cache", "warm", "--recipes", "fp8_blockwise,bf16"]) == 1  # every recipe is taken
    assert "no CUDA GPU here" in capsys.readouterr().out


@pytest.mark.parametrize("argv, expected", [(["doctor", "clear"], "an action of the cache command"),
                                            (["cache", "warm", "--shape", "8,64"], "four positive integers"),
                                            (["cache", "warm", "--recipes", "fp4"],
                                             "--recipes takes mxfp8, bf16, fp8_blockwise")])
def test_bad_cache_arguments_are_named(argv, expected, capsys):
    with pytest.raises(SystemExit):
        main_job.main(argv)
    assert expected in capsys.readouterr().err
