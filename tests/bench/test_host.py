"""``python -m gmlp.bench host`` on a tiny layer on the CPU, and the benches' environment record: what they
measure and report, never how fast (beyond the structural fact that a cache hit costs less than the plan
it saves)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

import pytest
import torch

import gmlp
from gmlp.bench import common, host, host_profile, host_report, host_timing

SHAPE = (2, 64, 128, 128)  # experts, tokens, hidden, ffn (multiples of 128: the FP8 blockwise recipe's blocks)
SHAPE_NAME = "2,64,128,128"
CPU = torch.device("cpu")
FAST = {"iters": 2, "repeats": 2, "plan_iters": 20, "warmup": 1}
PROFILE_STEPS = 3
GMLP = pathlib.Path(gmlp.__file__).resolve().parent


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
    """Every recipe on the default path (here the torch one) and on the Triton path, which the
    dispatcher refuses on a CPU without the interpreter (TRITON_INTERPRET=0 while planning: the
    dispatch reads it at each call), with a profile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "0")
        return host.run([(SHAPE_NAME, SHAPE)], host.RECIPES, ("default", "triton"), CPU, **FAST,
                        profile_steps=PROFILE_STEPS)


def gmlp_rows(results: dict, path: str) -> dict[str, dict]:
    (entry,) = results["shapes"]
    return {recipe: paths[path] for recipe, paths in entry["recipes"].items()}


def test_results_have_every_figure_per_shape_recipe_and_path(results):
    assert results["bench"] == "host" and results["paths"] == ["default", "triton"]
    for key in ("device", "torch", "triton", "commit", "date", "gmlp_path", "note", "torch_threads"):
        assert results[key], key
    (entry,) = results["shapes"]
    assert entry["name"] == SHAPE_NAME
    assert tuple(entry[key] for key in host_report.SHAPE_KEYS) == SHAPE
    assert set(entry["recipes"]) == {"mxfp8", "bf16", "fp8-blockwise"}
    for name, row in gmlp_rows(results, "default").items():
        assert (row["recipe"], row["path"]) == (name, "default")
        figures = ("fwd_bwd_host_ms", "fwd_host_ms", "plan_ms", "plan_uncached_ms", "plan_per_step_ms", "first_step_s")
        for key in figures:
            assert isinstance(row[key], float) and row[key] > 0, (name, key)
        assert len(row["fwd_bwd_host"]["samples"]) == FAST["repeats"]
        assert row["device_ms"] is None and row["host_syncs_per_step"] is None  # no device on the CPU
        assert row["sleep_ended_early"] is None
        assert row["plan_calls_per_step"] == 2 and row["plan_per_step_ms"] == 2 * row["plan_ms"]
        assert row["plans_made_per_step"] == 0  # a warm step plans nothing: the plan is cached
        assert set(row["plan_paths"].values()) == {"torch"}
        assert ("quantize x" in row["plan_paths"]) == (name != "bf16")
        assert row["reduce_overhead"] == {"reason": "needs CUDA (CUDA graphs)"}
        assert row["profile"]["steps"] == PROFILE_STEPS
    json.dumps(results)  # JSON as it is


def test_a_forced_path_that_cannot_run_records_the_fallback_error_and_the_environment_is_restored(results):
    for name, row in gmlp_rows(results, "triton").items():
        assert row["reason"].startswith("FallbackError: GMLP_BACKEND=triton: "), name
        assert "need a CUDA GPU" in row["reason"]
        assert "fwd_bwd_host_ms" not in row and "fwd_bwd_host_over_torch" not in row
    assert os.environ["GMLP_BACKEND"] == "torch"  # as the module's fixture set it


def test_forced_backend_restores_an_unset_variable(monkeypatch):
    monkeypatch.delenv("GMLP_BACKEND")
    with host.forced_backend("triton"):
        assert os.environ["GMLP_BACKEND"] == "triton"
    assert "GMLP_BACKEND" not in os.environ
    with host.forced_backend("default"):
        assert "GMLP_BACKEND" not in os.environ


def test_the_baseline_row_and_the_ratios_of_gmlp_over_torch(results):
    """torch._grouped_mm runs on this CPU (torch 2.13): the baseline has figures; where it fails, a
    reason and no ratios (the next test)."""
    (entry,) = results["shapes"]
    baseline = entry["torch_eager"]
    assert "reason" not in baseline, baseline.get("reason")
    assert baseline["fwd_bwd_host_ms"] > 0 and baseline["fwd_host_ms"] > 0
    assert baseline["reduce_overhead"] == {"reason": "needs CUDA (CUDA graphs)"}
    for row in gmlp_rows(results, "default").values():
        assert row["fwd_bwd_host_over_torch"] == pytest.approx(row["fwd_bwd_host_ms"] / baseline["fwd_bwd_host_ms"])
        assert row["fwd_host_over_torch"] == pytest.approx(row["fwd_host_ms"] / baseline["fwd_host_ms"])


def test_a_baseline_that_cannot_run_says_why_and_the_ratios_are_none(monkeypatch):
    def unsupported(*args, **kwargs):
        raise NotImplementedError("no bf16 grouped GEMM on this device")

    monkeypatch.setattr(torch, "_grouped_mm", unsupported)  # gmlp's torch path does not call it
    result = host.run([(SHAPE_NAME, SHAPE)], ("bf16",), ("default",), CPU, **FAST)
    (entry,) = result["shapes"]
    assert entry["torch_eager"] == {
        "reason": "torch._grouped_mm (bf16) on cpu: NotImplementedError: no bf16 grouped GEMM on this device"}
    row = entry["recipes"]["bf16"]["default"]
    assert row["fwd_bwd_host_ms"] > 0
    assert row["fwd_bwd_host_over_torch"] is None and row["fwd_host_over_torch"] is None


def test_shape_presets_and_lists():
    assert host.PRESETS == {"torchtitan-debug": (64, 65536, 256, 768), "small": (8, 2048, 1024, 1024),
                            "qwen3": (128, 65536, 2048, 768)}
    assert host.parse_shapes("small; qwen3;1,2,3,4") == [
        ("small", (8, 2048, 1024, 1024)), ("qwen3", (128, 65536, 2048, 768)), ("1,2,3,4", (1, 2, 3, 4))]


@pytest.mark.parametrize("text", ["1,2,3", "small,qwen3", "a,b,c,d", "8,0,256,256", "nope", ""])
def test_a_bad_shape_is_a_parser_error_naming_it(text, capsys):
    with pytest.raises(SystemExit) as exit_:
        host.main(["--shapes", f"small;{text}"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "argument --shapes: each ';'-separated shape must be a preset (torchtitan-debug, small, qwen3)" in error
    assert f"got {text!r}" in error


@pytest.mark.parametrize("option, value", [("--paths", "default,cuda"), ("--recipes", "fp8")])
def test_a_bad_name_is_a_parser_error(option, value, capsys):
    with pytest.raises(SystemExit):
        host.main([option, value])
    assert f"argument {option}: expected comma-separated names of" in capsys.readouterr().err


def test_the_profile_categories_sum_to_the_profiled_total(results):
    (entry,) = results["shapes"]
    profiles = {side: row["profile"] for side, row in host_report.sides(entry) if "profile" in row}
    assert set(profiles) == {"torch eager", "mxfp8 default", "bf16 default", "fp8-blockwise default"}
    for side, profile in profiles.items():
        categories = profile["categories_us"]
        assert list(categories) == list(host_profile.CATEGORIES), side
        assert all(value >= 0 for value in categories.values()), (side, categories)
        assert sum(categories.values()) == pytest.approx(profile["total_us"], abs=1e-3 * len(categories)), side
        assert 0 < profile["total_us"] <= 1.1 * profile["profiled_wall_us"], side  # self times fit in the wall time
        assert profile["calls"] > 0 and 0 < len(profile["top"]) <= host_profile.TOP
        assert [entry["us"] for entry in profile["top"]] == sorted((entry["us"] for entry in profile["top"]),
                                                                   reverse=True)
    for side in ("mxfp8 default", "bf16 default", "fp8-blockwise default"):
        profile, row = profiles[side], entry["recipes"][side.split()[0]]["default"]
        assert profile["unprofiled_host_us"] == pytest.approx(row["fwd_bwd_host_ms"] * 1e3, abs=1e-3)
        assert profile["backward_seen"] is True  # a CPU backward runs in the calling thread
        for name in ("planning", "saved state", "autograd", "torch ops and allocations", "argument checks"):
            assert profile["categories_us"][name] > 0, (side, name)
    assert "backward_seen" not in profiles["torch eager"]


def gmlp_file(module: str) -> str:
    return str(GMLP / module)


@pytest.mark.parametrize("filename, function, expected", [
    (gmlp_file("dispatch/plan_cache.py"), "cached_plan", "planning"),
    (gmlp_file("dispatch/providers/adapters.py"), "twin", "planning"),
    (gmlp_file("layer/state.py"), "flatten", "saved state"),
    (gmlp_file("cutedsl/sm90/_launch.py"), "run", "CuTeDSL launches"),
    (gmlp_file("cutedsl/sm90/_launch.py"), "check_tma_bases", "argument checks"),
    (gmlp_file("contract/operands.py"), "expert_operand", "argument checks"),
    (gmlp_file("mxfp8/problem.py"), "validate_quantize_args", "argument checks"),
    (gmlp_file("layer/module.py"), "_check_inputs", "argument checks"),
    (gmlp_file("layer/autograd.py"), "validate_split_sizes", "argument checks"),
    (gmlp_file("layer/steps.py"), "grouped_mlp_forward", "other gmlp Python"),
    (gmlp_file("bench/mlp.py"), "training_step", "other"),
    ("/venv/lib/python3.12/site-packages/torch/autograd/graph.py", "_engine_run_backward", "autograd"),
    ("/venv/lib/python3.12/site-packages/torch/_tensor.py", "backward", "autograd"),
    ("~", "<method 'run_backward' of 'torch._C._EngineBase' objects>", "autograd"),
    ("~", "<built-in method apply>", "autograd"),
    ("~", "<built-in method torch.empty>", "torch ops and allocations"),
    ("~", "<method 'to' of 'torch._C.TensorBase' objects>", "torch ops and allocations"),
    ("/venv/lib/python3.12/site-packages/torch/_ops.py", "__call__", "torch ops and allocations"),
    ("/venv/lib/python3.12/site-packages/nvidia_cutlass_dsl/dsl_packages/cutlass/cutlass_dsl/tvm_ffi_provider.py",
     "__call__", "CuTeDSL launches"),
    ("/venv/lib/python3.12/site-packages/tvm_ffi/core.py", "__call__", "CuTeDSL launches"),
    ("/venv/lib/python3.12/site-packages/cudnn/grouped_gemm/api.py", "execute", "CuTeDSL launches"),
    ("/venv/lib/python3.12/site-packages/triton/runtime/jit.py", "run", "Triton launches"),
    ("~", "<built-in method __triton_launcher.launch>", "Triton launches"),
    ("/usr/lib/python3.12/typing.py", "cast", "other"),
    ("~", "<built-in method builtins.isinstance>", "other"),
])
def test_a_profile_entry_falls_in_the_category_its_rule_names(filename, function, expected):
    assert host_profile.category(filename, function) == expected


def test_a_profile_counts_each_step_and_its_calls():
    """Known work: one Python function called twice per step, over 4 steps in loops of 3 and 1."""
    def helper() -> None:
        sum(range(1000))

    def step() -> None:
        helper()
        helper()

    profile = host_profile.profile_steps(step, 4, CPU, iters=3, sleep_ms=0.0, unprofiled_host_ms=0.01,
                                         gmlp_side=False)
    (entry,) = [entry for entry in profile["top"] if entry["function"].endswith("(helper)")]
    assert entry["calls"] == 2 and entry["category"] == "other"
    assert profile["steps"] == 4 and profile["unprofiled_host_us"] == 10.0 and profile["sleep_ended_early"] is None


@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
def test_a_cache_hit_makes_no_plan(recipe):
    """What the cache saves, counted, not timed (a timing margin flaked on two loaded cores): the
    first step of a shape class builds its plan once, forward and backward; the next step none."""
    case = host.ShapeCase(SHAPE, CPU)
    step = case.step(case.gmlp_run(recipe))
    assert host.plans_made(step, CPU) == 1
    assert host.plans_made(step, CPU) == 0


def test_a_recipe_that_cannot_take_the_shape_is_a_row_with_its_reason():
    case = host.ShapeCase((2, 16, 32, 32), CPU)
    settings = host.Settings(device=CPU, iters=1, repeats=1, plan_iters=1, warmup=0, profile_steps=0)
    row = host.gmlp_row(case, "fp8-blockwise", "default", settings)
    assert row == {"recipe": "fp8-blockwise", "path": "default",
                   "reason": "the fp8-blockwise recipe cannot take this shape (H and F must be multiples of 128)"}


def test_the_cached_plan_is_the_forwards():
    """The timed call is a cache hit on the plan the forward made."""
    from gmlp.dispatch import plan_cache

    case = host.ShapeCase(SHAPE, CPU)
    case.step(case.gmlp_run("bf16"))()
    calls = host.plan_calls(case.layers["bf16"], case.x)
    count = len(plan_cache._plans)
    assert calls["plan"]() is calls["plan"]()
    assert len(plan_cache._plans) == count
    assert calls["plan_uncached"]().decisions.keys() == calls["plan"]().decisions.keys()


def test_main_writes_json_prints_the_profile_and_compares(tmp_path, capsys):
    argv = ["--shapes", SHAPE_NAME, "--recipes", "bf16", "--iters", "1", "--repeats", "1", "--plan-iters", "5",
            "--warmup", "0", "--profile", "--profile-steps", "2"]
    host.main([*argv, "--out", str(tmp_path / "before")])
    (before,) = (tmp_path / "before").glob("host-*.json")
    host.main([*argv, "--before", str(before), "--out", str(tmp_path / "after")])
    (written,) = (tmp_path / "after").glob("host-*.json")
    after = json.loads(written.read_text())
    assert after["complete"] is True and after["paths"] == ["default"]  # the CPU's default
    (entry,) = after["shapes"]
    assert set(entry["recipes"]) == {"bf16"} and set(entry["recipes"]["bf16"]) == {"default"}
    ratios = after["compared_to"]["after_over_before"]
    assert set(ratios) == {f"{SHAPE_NAME} torch eager", f"{SHAPE_NAME} bf16 default"}
    assert set(ratios[f"{SHAPE_NAME} bf16 default"]) == {"fwd_bwd_host_ms", "fwd_host_ms", "plan_per_step_ms",
                                                         "fwd_bwd_host_saved_ms"}
    out = capsys.readouterr().out
    assert "fwd+bwd host" in out and "after / before" in out and "reduce-overhead needs CUDA" in out
    assert "| planning |" in out and "bf16 default: top" in out and "cProfile" in out


def test_compare_matches_shape_recipe_and_path_and_reads_the_json_before_shapes(results):
    """An earlier run of another shape compares with nothing; one of the bench before --shapes (one
    shape, rows by recipe) compares as the default path's rows."""
    row = gmlp_rows(results, "default")["bf16"]
    legacy = {"commit": "abc", "device": "cpu", "shape": dict(zip(host_report.SHAPE_KEYS, SHAPE)),
              "recipes": {"bf16": {"fwd_bwd_host_ms": 2 * row["fwd_bwd_host_ms"], "fwd_host_ms": None}}}
    compared = host_report.compare(results, legacy)
    assert compared["commit"] == "abc"
    assert compared["after_over_before"] == {f"{SHAPE_NAME} bf16 default": {
        "fwd_bwd_host_ms": pytest.approx(0.5), "fwd_bwd_host_saved_ms": pytest.approx(row["fwd_bwd_host_ms"])}}
    other_shape = {**legacy, "shape": {**legacy["shape"], "tokens": 128}}
    assert host_report.compare(results, other_shape)["after_over_before"] == {}


def test_the_table_has_a_line_per_side_and_mode(results):
    lines = host_report.table(results).splitlines()
    for side in ("torch eager", "mxfp8 default", "bf16 default"):
        assert sum(line.startswith(f"{side} ") for line in lines) == 2, side  # eager and reduce-overhead
    (triton,) = [line for line in lines if line.startswith("mxfp8 triton")]
    assert "FallbackError: GMLP_BACKEND=triton" in triton


def git_head(folder: pathlib.Path) -> str | None:
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
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


def test_the_environment_records_the_gmlp_settings_a_run_had(monkeypatch):
    """A run under another tuned table or a forced path says so: every GMLP_* variable, and only those."""
    for name in [name for name in os.environ if name.startswith("GMLP_")]:
        monkeypatch.delenv(name)
    assert common.environment(CPU)["gmlp_settings"] == {}
    monkeypatch.setenv("GMLP_SM90_TUNED", "/tmp/before.json")
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    monkeypatch.setenv("NOT_GMLP_X", "1")
    assert common.environment(CPU)["gmlp_settings"] == {"GMLP_BACKEND": "triton", "GMLP_SM90_TUNED": "/tmp/before.json"}


def test_a_cold_cache_run_starts_from_an_empty_compile_cache_and_the_record_says_so(tmp_path, monkeypatch):
    kept = tmp_path / "cutedsl"
    kept.mkdir()
    (kept / "fc1forwardsm90-0123.o").write_bytes(b"x")
    monkeypatch.setenv("GMLP_CACHE_DIR", str(tmp_path))
    assert common.environment(CPU)["compile_cache"] == {"directory": str(kept), "enabled": True, "entries": 1}
    common.use_cold_cache(False)
    assert os.environ["GMLP_CACHE_DIR"] == str(tmp_path)
    common.use_cold_cache(True)
    cold = common.environment(CPU)["compile_cache"]
    assert cold["entries"] == 0 and not cold["directory"].startswith(str(tmp_path))
    assert "gmlp-cold-cache-" in cold["directory"]


class FakeCuda:
    """torch.cuda's calls that the CUDA timing makes, on the host: events read the clock when
    recorded, a sleep is remembered, and the sleep's end is ``sleep_over`` (what an event recorded
    after it answers)."""

    def __init__(self, sleep_over: bool):
        self.sleep_over, self.sleeps, self.mode = sleep_over, [], 0
        fake = self

        class Event:
            def __init__(self, enable_timing: bool):
                assert enable_timing
                self.at = None

            def record(self) -> None:
                self.at = time.perf_counter()

            def query(self) -> bool:
                return fake.sleep_over

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return (end.at - self.at) * 1e3

        self.Event = Event

    def install(self, monkeypatch) -> None:
        for name, value in (("Event", self.Event), ("synchronize", lambda device=None: None),
                            ("_sleep", self.sleeps.append), ("get_sync_debug_mode", lambda: self.mode),
                            ("set_sync_debug_mode", lambda mode: setattr(self, "mode", mode))):
            monkeypatch.setattr(torch.cuda, name, value)


@pytest.mark.parametrize("sleep_over", [False, True])
def test_the_cuda_timing_holds_the_stream_while_the_host_issues_each_loop(sleep_over, monkeypatch):
    """The CUDA branch on a simulated device: a sleep before every loop, long enough for the loop
    (a multiple of the synchronized loop's wall time), and the flag when the sleep ended first."""
    cuda = FakeCuda(sleep_over)
    cuda.install(monkeypatch)
    calls = []
    figures = host_timing.step_figures(lambda: calls.append("step"), lambda: calls.append("forward"),
                                       torch.device("cuda"), iters=3, repeats=2)
    # the synchronized loops, the held loops of steps and of forwards, one step counting syncs, one
    # counting launches where this torch's profiler records CUDA activities (not a CPU build's)
    cuda_profiler = torch.profiler.ProfilerActivity.CUDA in torch.profiler.supported_activities()
    assert calls.count("step") == 2 * 3 + 2 * 3 + 1 + cuda_profiler and calls.count("forward") == 2 * 3
    assert figures["launches_per_step"] == (0 if cuda_profiler else None)
    assert len(cuda.sleeps) == 4 and min(cuda.sleeps) >= host_timing.CYCLES_PER_MS  # at least 1 ms
    assert figures["sleep_ended_early"] is sleep_over
    assert len(figures["fwd_bwd_host"]["samples"]) == 2 and figures["fwd_host_ms"] > 0
    assert figures["device_ms"] >= 0 and figures["device_wall_ms"] >= 0 and figures["host_syncs_per_step"] == 0
    profile = host_profile.profile_steps(lambda: calls.append("profiled"), 5, torch.device("cuda"), iters=2,
                                         sleep_ms=2.0, unprofiled_host_ms=1.0, gmlp_side=False)
    assert calls.count("profiled") == 5 and len(cuda.sleeps) == 4 + 3  # loops of 2, 2 and 1
    assert cuda.sleeps[-1] == 2 * host_timing.CYCLES_PER_MS and profile["sleep_ended_early"] is sleep_over


def test_reduce_overhead_records_a_failed_compile_and_times_one_that_runs(monkeypatch):
    """On a simulated device: the exception of a compile that fails is the row's reason (the run
    goes on); a step that runs (here the eager one, standing in for the compiled) gets the CUDA
    figures; --no-compile and the CPU give their reasons."""
    FakeCuda(sleep_over=False).install(monkeypatch)
    case = host.ShapeCase(SHAPE, CPU)
    settings = host.Settings(torch.device("cuda"), iters=2, repeats=2, warmup=0)

    def failing_compile():
        raise RuntimeError("inductor could not lower _grouped_mm\nthe rest of its traceback")

    assert host.reduce_overhead(case, failing_compile, settings) == {
        "reason": "torch.compile(mode='reduce-overhead'): RuntimeError: inductor could not lower _grouped_mm\n"
                  "the rest of its traceback"}
    row = host.reduce_overhead(case, case.torch_run, settings)
    assert row["fwd_bwd_host_ms"] > 0 and row["sleep_ended_early"] is False and row["cudagraph_skips"] == 0
    assert "fwd_host_ms" not in row and "profile" not in row
    assert host.reduce_overhead(case, case.torch_run, host.Settings(torch.device("cuda"), 2, 2, compile=False)) == {
        "reason": "not run (--no-compile)"}
    assert host.reduce_overhead(case, case.torch_run, host.Settings(CPU, 2, 2)) == {
        "reason": "needs CUDA (CUDA graphs)"}


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None, gmlp.FP8BlockwiseRecipe()],
                         ids=["mxfp8", "bf16", "fp8-blockwise"])
def test_stubbed_ops_give_the_real_ops_shapes(recipe):
    """``--paths stub``: a layer step with every op stubbed returns what the real step returns
    (outputs and gradients of the same shapes and dtypes) and leaves the real ops in place after."""
    from gmlp.bench.host_stubs import stubbed_ops
    from gmlp.layer import steps

    real = steps.implementation
    size = 128 if isinstance(recipe, gmlp.FP8BlockwiseRecipe) else 64  # its 128-element blocks
    mlp = gmlp.GroupedMLP(4, size, size, recipe=recipe, bias=True)
    split_sizes = torch.tensor([10, 0, 22, 32])
    x = torch.randn(64, size, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(64, requires_grad=True)

    def step():
        for leaf in (x, probs, *mlp.parameters()):
            leaf.grad = None
        y = mlp(x, split_sizes, probs)
        y.backward(torch.ones_like(y))
        return [(tuple(t.shape), t.dtype) for t in (y, x.grad, probs.grad, *(p.grad for p in mlp.parameters()))]

    want = step()
    with stubbed_ops():
        assert steps.implementation is not real
        got = step()
    assert steps.implementation is real and got == want
