"""``python -m gmlp.bench host`` on a tiny layer on the CPU, and the benches' environment record: what they
measure and report, never how fast (beyond the structural fact that a cache hit costs less than the plan
it saves)."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import torch

from gmlp.bench import common, host

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
    assert results["bench"] == "host"
    for key in ("device", "torch", "triton", "commit", "date", "gmlp_path", "note", "torch_threads"):
        assert results[key], key
    assert results["shape"] == dict(experts=2, tokens=64, hidden=32, ffn=32)
    assert set(results["recipes"]) == {"mxfp8", "bf16"}
    for name, row in results["recipes"].items():
        assert row["recipe"] == name
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
    assert host.plans_made(case) == 1
    assert host.plans_made(case) == 0


def test_the_cached_plan_is_the_forwards(results):
    """The timed call is a cache hit on the plan the forward made."""
    from gmlp.dispatch import plan_cache

    case = host.Case("bf16", *SHAPE, CPU)
    case.step()
    calls = host.plan_calls(case)
    count = len(plan_cache._plans)
    assert calls["plan"]() is calls["plan"]()
    assert len(plan_cache._plans) == count
    assert calls["plan_uncached"]().decisions.keys() == calls["plan"]().decisions.keys()


def test_main_writes_json_and_compares(tmp_path, capsys):
    argv = ["--shape", ",".join(map(str, SHAPE)), "--recipes", "bf16", "--iters", "1", "--repeats", "1",
            "--plan-iters", "5", "--warmup", "0"]
    host.main([*argv, "--out", str(tmp_path / "before")])
    (before,) = (tmp_path / "before").glob("host-*.json")
    host.main([*argv, "--before", str(before), "--out", str(tmp_path / "after")])
    (written,) = (tmp_path / "after").glob("host-*.json")
    after = json.loads(written.read_text())
    assert set(after["recipes"]) == {"bf16"} and after["complete"] is True
    assert set(after["compared_to"]["after_over_before"]["bf16"]) >= {"fwd_bwd_host_ms", "plan_per_step_ms"}
    out = capsys.readouterr().out
    assert "fwd+bwd host" in out and "after / before" in out


def git_head(folder: pathlib.Path) -> str | None:
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_the_environment_names_the_imported_gmlps_checkout_not_the_cwds(tmp_path, monkeypatch):
    """The commit is the imported gmlp's, wherever the bench runs from (here a folder outside git);
    in a copy outside git, "unknown" and dirtiness unknown, unless GMLP_COMMIT names it."""
    root = pathlib.Path(host.__file__).resolve().parents[2]
    head = git_head(root)
    monkeypatch.delenv("GMLP_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    env = common.environment(CPU)
    assert env["gmlp_path"] == str(root) and env["commit"] == (head or "unknown")
    assert isinstance(env["dirty"], bool) if head else env["dirty"] is None
    assert env["device"].startswith("cpu (") and env["torch_threads"] == torch.get_num_threads()
    assert "compute_capability" not in env
    monkeypatch.setenv("GMLP_COMMIT", "0123abc")
    env = common.environment(CPU)
    assert env["commit"] == "0123abc" and env["dirty"] is None
