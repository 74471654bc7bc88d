"""``python -m gmlp.bench host`` on a tiny layer on the CPU: what it measures and reports, never how fast
(beyond the structural fact that a cache hit costs less than the plan it saves)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from gmlp.bench import host

SHAPE = (2, 64, 32, 32)  # experts, tokens, hidden, ffn
CPU = torch.device("cpu")
FAST = dict(iters=2, repeats=2, plan_iters=20, warmup=1)


@pytest.fixture(scope="module", autouse=True)
def torch_path():
    """The torch path, as the bench has on a CPU without TRITON_INTERPRET=1 (conftest sets it, and
    the interpreter would take most of these tests' time). Forced by GMLP_BACKEND, read at each
    call: TRITON_INTERPRET stays as it is, since Triton and gmlp.triton_ref read it at import."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GMLP_BACKEND", "torch")
        yield


@pytest.fixture(scope="module")
def results():
    return host.run(SHAPE, host.RECIPES, CPU, **FAST)


def test_results_have_every_figure_per_recipe(results):
    assert results["mode"] == "cached" and results["bench"] == "host"
    for key in ("device", "torch", "triton", "commit", "date", "gmlp_path", "note"):
        assert results[key], key
    assert results["shape"] == dict(experts=2, tokens=64, hidden=32, ffn=32)
    assert set(results["recipes"]) == {"mxfp8", "bf16"}
    for name, row in results["recipes"].items():
        assert row["recipe"] == name and row["mode"] == "cached"
        for key in ("fwd_bwd_host_ms", "fwd_host_ms", "plan_ms", "plan_uncached_ms", "plan_per_step_ms"):
            assert isinstance(row[key], float) and row[key] > 0, (name, key)
        assert len(row["fwd_bwd_host"]["samples"]) == FAST["repeats"]
        assert row["device_ms"] is None and row["host_syncs_per_step"] is None  # no device on the CPU
        assert row["plan_calls_per_step"] == 2 and row["plan_per_step_ms"] == 2 * row["plan_ms"]
        assert row["plans_made_per_step"] == 0  # a warm step plans nothing: the plan is cached
        assert set(row["plan_paths"].values()) == {"torch"}
        assert ("quantize x" in row["plan_paths"]) == (name == "mxfp8")
    json.dumps(results)  # JSON as it is


@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
def test_a_cache_hit_makes_no_plan(recipe):
    """What the cache saves, counted, not timed (a timing margin flaked on two loaded cores): the
    first step of a shape class builds its plan once, forward and backward; the next step none."""
    case = host.Case(recipe, *SHAPE, CPU)
    assert host.plans_made(case, "cached") == 1
    assert host.plans_made(case, "cached") == 0


def test_planning_as_the_old_forward_did():
    """Mode ``uncached-old`` (what an old checkout without gmlp.dispatch.plan_cache measures) on this
    checkout: ``mlp.plan`` each call; the forward here still plans nothing."""
    row = host.bench_recipe("mxfp8", SHAPE, CPU, mode="uncached-old", **FAST)
    assert row["mode"] == "uncached-old" and row["plan_calls_per_step"] == 1
    assert "plan_uncached_ms" not in row and row["plan_ms"] > 0
    assert row["plans_made_per_step"] == 0  # counted where the old forward planned (gmlp.layer.module)


def test_the_cached_plan_is_the_forwards(results):
    """The timed call is a cache hit on the plan the forward made."""
    from gmlp.dispatch import plan_cache

    case = host.Case("bf16", *SHAPE, CPU)
    case.step()
    _, calls = host.plan_calls(case)
    count = len(plan_cache._plans)
    assert calls["plan"]() is calls["plan"]()
    assert len(plan_cache._plans) == count
    assert calls["plan_uncached"]().decisions.keys() == calls["plan"]().decisions.keys()


def test_main_writes_json_and_compares(tmp_path, capsys):
    argv = ["--shape", ",".join(map(str, SHAPE)), "--recipes", "bf16", "--iters", "1", "--repeats", "1",
            "--plan-iters", "5", "--warmup", "0"]
    host.main([*argv, "--out", str(tmp_path / "before.json")])
    host.main([*argv, "--before", str(tmp_path / "before.json"), "--out", str(tmp_path)])
    (written,) = tmp_path.glob("host-*.json")
    after = json.loads(written.read_text())
    assert set(after["recipes"]) == {"bf16"}
    assert set(after["compared_to"]["after_over_before"]["bf16"]) >= {"fwd_bwd_host_ms", "plan_per_step_ms"}
    out = capsys.readouterr().out
    assert "mode cached" in out and "fwd+bwd host" in out and "after / before" in out


@pytest.mark.slow
def test_runs_as_a_file_with_gmlp_from_the_path(tmp_path):
    """``python gmlp/bench/host.py`` (how an old checkout is measured): gmlp from PYTHONPATH."""
    root = pathlib.Path(host.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, str(root / "gmlp" / "bench" / "host.py"), "--shape", ",".join(map(str, SHAPE)),
                    "--recipes", "bf16", "--iters", "1", "--repeats", "1", "--plan-iters", "5", "--warmup", "0",
                    "--device", "cpu", "--out", str(out)], check=True, env=env, cwd=tmp_path, capture_output=True)
    results = json.loads(out.read_text())
    assert results["gmlp_path"] == str(root) and results["mode"] == "cached"
