"""Per-op dispatch of the layer, on the CPU with simulated GPUs and packages: every kind of
reason, one warning per (op, path, activation, reason), none when unset, strict mode, forced
backends, and decisions that do not depend on the diagnostic settings."""

from __future__ import annotations

import dataclasses
import importlib
import re
import warnings

import pytest
import torch

import gmlp
import gmlp.cutedsl
from gmlp.contract.activations import activation_from
from gmlp.contract.gate_up import GateUpLayout
from gmlp.contract.problem import LayerProblem
from gmlp.contract.reasons import ReasonKind
from gmlp.cutedsl.sm90 import support as sm90_support
from gmlp.dispatch import paths
from gmlp.dispatch.paths import FallbackError, FallbackWarning, Path
from gmlp.dispatch.plan_cache import layer_problem
from gmlp.dispatch.plan import plan_layer
from gmlp.dispatch.sites import Op
from gmlp.dispatch.providers.cutedsl_sm100 import composition_reason
from gmlp.triton_ref.fc1 import fc1_forward
from gmlp.triton_ref.fc2_dgrad import fc2_dgrad
from tests.support.backends import kernel_device

# what a cutlass-dsl release that renamed an API looks like to the CuTeDSL kernels
RENAMED_API = ("cannot import name 'make_fake_compact_tensor' from 'cutlass.cute.runtime' "
               "(/opt/venv/lib/python3.12/site-packages/cutlass/cute/runtime.py)")
GEMM_SITES = ("fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad")
# the FP8 blockwise recipe's ops with an SM90 kernel (the quantizes run on Triton)
SM90_BLOCKWISE_KERNELS = (Op.BLOCKWISE_FC1, Op.BLOCKWISE_GEMM, Op.BLOCKWISE_FC2_DGRAD, Op.BLOCKWISE_WGRAD)


CACHED_ANSWERS = (paths._device_system_reason, gmlp.cutedsl.import_error, sm90_support.import_error)


@pytest.fixture(autouse=True)
def fresh_dispatch(monkeypatch):
    """Cached system answers and the warned set start empty and are cleared after each test."""
    for cached in CACHED_ANSWERS:
        cached.cache_clear()
    monkeypatch.setattr(paths, "_warned", set())
    for name in ("GMLP_WARN_FALLBACK", "GMLP_STRICT", "GMLP_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    yield
    for cached in CACHED_ANSWERS:
        cached.cache_clear()


def _problem(recipe=gmlp.MXFP8Recipe(), dtype=torch.bfloat16, activation="swiglu", hidden=128, bias=False
             ) -> LayerProblem:
    mlp = gmlp.GroupedMLP(4, hidden, 128, activation=activation, recipe=recipe, dtype=dtype, bias=bias)
    return mlp._layer_problem(torch.zeros(96, hidden, dtype=dtype))


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
    assert reason.endswith("nvidia-cutlass-dsl not installed: pip install 'gmlp[cutedsl]'")  # which extra


def test_old_package_reason(monkeypatch):
    device = _gpu(monkeypatch, (10, 0))
    monkeypatch.setattr(gmlp.system.versions, "package_version",
                        lambda name: "4.4.2" if name == "nvidia-cutlass-dsl" else "3.6.0")
    reason = str(dict(_plan(device).decisions["quantize x"].skipped)[Path.CUTEDSL])
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
            _plan(device)  # one quantize site, six quantize-dequantize sites, two GEMM sites of each of two ops, twice
        first = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
        _plan(device, activation="srelu")  # another activation: its own warnings
        second = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)][len(first):]
    ops = ["quantize_mxfp8", "quantize_dequantize_mxfp8", "dequantize_mxfp8", "fc1_forward", "grouped_gemm",
           "fc2_dgrad", "grouped_wgrad"]
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
    with pytest.raises(FallbackError, match=r"strict mode: quantize_dequantize_mxfp8 \(swiglu\) at qdq w1 took the torch "
                                             r"path, below the cutedsl floor \(strict=True\); "
                                             r"not cutedsl: \[system\].*not triton: \[system\] tensors are on cpu"):
        mlp(torch.zeros(8, 64).bfloat16(), torch.tensor([4, 4]))
    monkeypatch.setenv("GMLP_STRICT", "1")
    with pytest.raises(FallbackError):
        gmlp.GroupedMLP(2, 64, 64)(torch.zeros(8, 64).bfloat16(), torch.tensor([4, 4]))


@pytest.mark.parametrize("capability", [(9, 0), (8, 9), (8, 0)], ids=["sm90", "sm89", "sm80"])
def test_strict_floors_on_gpus(monkeypatch, capability):
    """Simulated GPUs: the cutedsl floor (strict=True) raises at the first op without a CuTeDSL
    kernel (on SM90 the MXFP8 layer's quantize-dequantize, every op on SM89); the triton floor
    passes wherever Triton runs every op, and raises on SM80, where it does not, with the reason."""
    device = _gpu(monkeypatch, capability)
    problem = _problem()
    with pytest.raises(FallbackError, match=r"strict mode: quantize_dequantize_mxfp8 \(swiglu\) at qdq w1 took the "
                                             r"(triton|torch) path, below the cutedsl floor \(strict=True\); "
                                             r"not cutedsl: "):
        plan_layer(problem, device, strict=True)
    if capability == (8, 0):
        with pytest.raises(FallbackError, match=r"qdq w1 took the torch path, below the triton floor "
                                                 r"\(strict='triton'\); not cutedsl: .*; "
                                                 r"not triton: \[system\] compute capability 8.0 < 8.9"):
            plan_layer(problem, device, strict="triton")
        return

    def paths(strict):
        return {decision.path for decision in plan_layer(problem, device, strict=strict).decisions.values()}

    assert Path.TORCH not in paths("triton") and Path.TRITON in paths("triton")
    monkeypatch.setenv("GMLP_STRICT", "triton")
    assert paths(None) == paths("triton")


def test_forced_backends(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton can run; torch is forced anyway
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    plan = gmlp.GroupedMLP(2, 64, 64).plan(torch.zeros(8, 64))
    assert {d.path for d in plan.decisions.values()} == {Path.TORCH}
    device = _gpu(monkeypatch, (9, 0))
    monkeypatch.setenv("GMLP_BACKEND", "cutedsl")
    _broken_cutedsl(monkeypatch, ImportError(RENAMED_API))
    with pytest.raises(FallbackError, match=r"GMLP_BACKEND=cutedsl: quantize_dequantize_mxfp8 \(swiglu\) at qdq w1 "
                                             r"cannot run on cutedsl: \[system\] gmlp.cutedsl.quantize failed to import"):
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


def _odd_sized_bf16_step(backend: str | None, monkeypatch):
    """The plan and the input and weight gradients of a bf16 step with H = F = 100 (not multiples
    of 32), on the path the dispatcher picks or on ``backend``."""
    if backend is not None:
        monkeypatch.setenv("GMLP_BACKEND", backend)
    device = kernel_device()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(num_experts=2, hidden_size=100, ffn_hidden_size=100, recipe=None, device=device)
    x = torch.randn(12, 100, device=device).bfloat16().requires_grad_()
    split_sizes, probs = torch.tensor([5, 7], device=device), torch.rand(12, device=device)
    explained = mlp.explain(x)
    mlp(x, split_sizes, probs).sum().backward()
    monkeypatch.delenv("GMLP_BACKEND", raising=False)
    return mlp.plan(x), explained, (x.grad, mlp.w1.grad, mlp.w2.grad)


def test_triton_launcher_shape_rules_are_planned_around(monkeypatch):
    """A bf16 layer with H = F = 100 plans FC1 and FC2 dgrad on torch with the Triton launchers'
    own shape rule (``gmlp.triton_ref.shapes``), the other GEMM sites on Triton (any sizes), and
    its step runs and matches the torch path; the launchers raise with the same text."""
    if paths.system_reason(Path.TRITON, kernel_device()) is not None:
        pytest.skip(f"triton cannot run here: {paths.system_reason(Path.TRITON, kernel_device())}")
    plan, explained, grads = _odd_sized_bf16_step(None, monkeypatch)
    shape_reasons = {}
    for site in GEMM_SITES:
        decision = plan.decisions[site]
        if site in ("fc1", "fc2 dgrad"):
            reason = dict(decision.skipped)[Path.TRITON]
            assert decision.path is Path.TORCH and reason.kind is ReasonKind.SHAPE, (site, decision)
            assert str(reason) in explained
            shape_reasons[site] = reason.message
        else:
            assert decision.path is Path.TRITON, (site, decision)
    assert "H=100, F=100" in shape_reasons["fc1"] and "F=100" in shape_reasons["fc2 dgrad"]
    _, _, want = _odd_sized_bf16_step("torch", monkeypatch)
    for got_grad, want_grad in zip(grads, want):
        torch.testing.assert_close(got_grad.float(), want_grad.float(), rtol=2e-2, atol=2e-2)

    x, split_sizes = torch.zeros(12, 100).bfloat16(), torch.tensor([5, 7])
    with pytest.raises(ValueError, match=re.escape(shape_reasons["fc1"])):
        fc1_forward(x, torch.zeros(2, 200, 100).bfloat16(), split_sizes, ffn_hidden_size=100,
                    activation=activation_from("swiglu"), recipe=None)
    with pytest.raises(ValueError, match=re.escape(shape_reasons["fc2 dgrad"])):
        fc2_dgrad(x, torch.zeros(2, 100, 100).bfloat16(), torch.zeros(12, 200).bfloat16(), split_sizes,
                  activation=activation_from("swiglu"), recipe=None)


def _with_cutedsl():
    if gmlp.cutedsl.import_error() is not None:
        pytest.skip(f"cutlass-dsl does not import here: {gmlp.cutedsl.import_error()}")


def test_sm90_takes_its_kernels_site_by_site(monkeypatch):
    """On SM90 with cutlass-dsl every GEMM site of a bf16 or MXFP8 layer takes its SM90 kernel,
    checked against Triton (MXFP8: on dequantized operands, FC1 quantizing its outputs in the
    epilogue and FC2 dgrad its dh)."""
    _with_cutedsl()
    device = _gpu(monkeypatch, (9, 0))
    for activation in ("swiglu", "geglu", "qgeglu", "srelu"):
        for recipe in (None, gmlp.MXFP8Recipe(), gmlp.MXFP8Recipe(grad_format=gmlp.ElementFormat.E5M2,
                                                                   scale_mode=gmlp.ScaleMode.FLOOR)):
            plan = _plan(device, activation=activation, recipe=recipe, bias=True)
            assert not plan.sm100
            for site in GEMM_SITES:
                assert plan.path(site) is Path.CUTEDSL and plan.references[site] is Path.TRITON, (activation, site)
            assert plan.path("bias grad") is Path.TRITON
    mxfp8 = _plan(device)
    assert mxfp8.path("dequantize") is Path.TRITON and mxfp8.path("quantize x") is Path.CUTEDSL
    # parameters the bf16 GEMMs cannot take: a recipe reason for CuTeDSL as for Triton
    fp32 = _plan(device, recipe=None, dtype=torch.float32)
    for site in GEMM_SITES:
        assert dict(fp32.decisions[site].skipped)[Path.CUTEDSL].kind is ReasonKind.RECIPE, site


def test_sm90_shape_and_import_reasons(monkeypatch):
    """A problem an SM90 kernel cannot take (too many experts for its tile search) falls back to
    Triton with the kernel's shape reason; a kernel module that fails to import is a system reason
    that names it, and the quantizes keep their CuTeDSL kernel."""
    _with_cutedsl()
    device = _gpu(monkeypatch, (9, 0))
    many = dataclasses.replace(_problem(recipe=None), experts=5000)
    plan = plan_layer(many, device, strict=None)
    for site in ("fc1", "fc2", "fc2 dgrad", "fc1 dgrad"):
        reason = dict(plan.decisions[site].skipped)[Path.CUTEDSL]
        assert plan.path(site) is Path.TRITON and reason.kind is ReasonKind.SHAPE and "E=5000" in str(reason), site
    assert plan.path("fc1 wgrad") is Path.CUTEDSL  # output tiles per expert: no search

    real = importlib.import_module

    def import_module(name, *args):
        if name == "gmlp.cutedsl.sm90.wgrad":
            raise ImportError(RENAMED_API)
        return real(name, *args)

    monkeypatch.setattr(sm90_support.importlib, "import_module", import_module)
    sm90_support.import_error.cache_clear()
    plan = _plan(device, recipe=None)
    for site in GEMM_SITES:
        reason = dict(plan.decisions[site].skipped)[Path.CUTEDSL]
        assert plan.path(site) is Path.TRITON and reason.kind is ReasonKind.SYSTEM, site
        assert "gmlp.cutedsl.sm90.wgrad failed to import" in str(reason) and RENAMED_API in str(reason)
    assert _plan(device).path("quantize x") is Path.CUTEDSL


def _with_sm100_packages():
    from gmlp.cutedsl.sm100 import cudnn_kernels

    cudnn_kernels.import_error.cache_clear()
    if cudnn_kernels.import_error() is not None or gmlp.cutedsl.import_error() is not None:
        pytest.skip(f"the CuTeDSL packages do not import here: {cudnn_kernels.import_error()}")
    return cudnn_kernels


def test_sm100_takes_the_fused_composition(monkeypatch):
    """On SM100 with the packages, every GEMM site takes CuTeDSL (the SM100 composition), nothing
    is dequantized, and the quantizes run on CuTeDSL too."""
    _with_sm100_packages()
    plan = _plan(_gpu(monkeypatch, (10, 0)))
    assert plan.sm100 and "dequantize" not in plan.decisions
    assert {site: d.path for site, d in plan.decisions.items()} == {site: Path.CUTEDSL for site in plan.decisions}
    assert set(plan.decisions) == {"quantize x", "quantize w1", "quantize w2", "quantize dy", *GEMM_SITES}
    assert "the layer's GEMMs run as one Blackwell (SM100) composition" in plan.explain()
    for activation in ("qgeglu", "srelu"):
        assert _plan(_gpu(monkeypatch, (10, 0)), activation=activation).sm100, activation
    hopper = _plan(_gpu(monkeypatch, (9, 0)))
    assert not hopper.sm100 and hopper.path("dequantize") is Path.TRITON
    # the quantizes are judged as the composition calls them (padded rows, E + 1 groups, swizzled),
    # and fall back on their own
    problem = _problem()
    padded_x = problem.sm100_quantize_problems["quantize x"]
    assert (padded_x.num_rows, padded_x.num_experts, padded_x.swizzle) == ((96 + 4 * 255) // 256 * 256, 5, True)
    huge = dataclasses.replace(padded_x, num_rows=2**31 - 256)
    problem = dataclasses.replace(problem, sm100_quantize_problems={**problem.sm100_quantize_problems, "quantize x": huge})
    plan = plan_layer(problem, _gpu(monkeypatch, (10, 0)), strict=None)
    assert plan.sm100 and plan.path("quantize x") is Path.TRITON
    assert dict(plan.decisions["quantize x"].skipped)[Path.CUTEDSL].kind is ReasonKind.SHAPE
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    forced = _plan(_gpu(monkeypatch, (10, 0)))
    assert not forced.sm100 and forced.path("fc1") is Path.TRITON and "dequantize" in forced.decisions


@pytest.mark.parametrize("problem_args,kind,text", [
    (dict(activation="geglu"), ReasonKind.ACTIVATION, "no tanh-GELU GeGLU"),
    (dict(recipe=gmlp.MXFP8Recipe(grad_format=gmlp.ElementFormat.E5M2)), ReasonKind.RECIPE, "E5M2 gradients"),
    (dict(recipe=gmlp.MXFP8Recipe(scale_mode=gmlp.ScaleMode.FLOOR)), ReasonKind.RECIPE, "FLOOR scales"),
    (dict(recipe=None), ReasonKind.RECIPE, "bf16 (recipe=None)"),
    (dict(bias=True), ReasonKind.RECIPE, "biases"),
    (dict(hidden=96), ReasonKind.SHAPE, "H a multiple of 128"),
], ids=["geglu", "e5m2-grads", "floor-scales", "bf16", "bias", "hidden-96"])
def test_sm100_reasons(monkeypatch, problem_args, kind, text):
    """What keeps the GEMM sites off the SM100 composition: the same reason at every one (they
    take it together), and they take Triton."""
    _with_sm100_packages()
    plan = plan_layer(_problem(**problem_args), _gpu(monkeypatch, (10, 0)), strict=None)
    assert not plan.sm100
    for site in GEMM_SITES:
        reason = dict(plan.decisions[site].skipped)[Path.CUTEDSL]
        assert plan.path(site) is Path.TRITON and reason.kind is kind and text in str(reason), (site, reason)


def test_sm100_import_failure_is_the_reason(monkeypatch):
    cudnn_kernels = _with_sm100_packages()
    device = _gpu(monkeypatch, (10, 0))
    real = cudnn_kernels.importlib.import_module

    def import_module(name, *args):
        if name.startswith("cudnn.gemm.cutedsl.grouped"):
            raise ImportError(RENAMED_API)
        return real(name, *args)

    monkeypatch.setattr(cudnn_kernels.importlib, "import_module", import_module)
    cudnn_kernels.import_error.cache_clear()
    try:
        plan = _plan(device)
    finally:
        cudnn_kernels.import_error.cache_clear()
    reason = str(dict(plan.decisions["fc1"].skipped)[Path.CUTEDSL])
    assert not plan.sm100 and RENAMED_API in reason and "nvidia-cudnn-frontend" in reason
    assert plan.path("quantize x") is Path.CUTEDSL  # the quantize does not need cuDNN frontend


def test_the_module_runs_the_sm100_composition_when_planned(monkeypatch, tmp_path):
    """GroupedMLP hands a plan that takes the SM100 composition to it, forward and backward
    (its kernels replaced by the torch twins; the quantizes by the torch path). The step
    builders read cuDNN frontend's dprob slot count, so its package must import."""
    _with_sm100_packages()
    from gmlp.cutedsl.sm100 import layer
    from gmlp.dispatch import plan_cache
    from tests.support.sm100_twins import TorchKernels, as_sm100_plan

    mlp = gmlp.GroupedMLP(2, 128, 128)
    torch_plan = plan_cache.plan_layer
    monkeypatch.setenv("GMLP_BACKEND", "torch")

    def sm100_plan(problem, device, *, strict):
        return as_sm100_plan(torch_plan(problem, device, strict=strict))

    monkeypatch.setattr(plan_cache, "plan_layer", sm100_plan)  # the plan the layer's ops make
    twins = TorchKernels(mlp.activation)
    monkeypatch.setattr(layer, "launch_kernel", twins)
    x = torch.randn(40, 128, dtype=torch.bfloat16, requires_grad=True)
    y = mlp(x, torch.tensor([30, 10]), weight_cache="update")
    y.sum().backward()
    assert twins.sites == ["fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad"]
    assert x.grad is not None and mlp.w1.grad is not None and mlp.w2.grad is not None
    # the kept weights (W1 quantized gate/up interleaved) serve the next micro-batch unchanged
    monkeypatch.setattr(layer, "interleave_gate_up", None)  # not called again
    assert torch.equal(mlp(x, torch.tensor([30, 10]), weight_cache="reuse"), y)


@pytest.mark.parametrize("layout", [GateUpLayout.SEPARATE, GateUpLayout.INTERLEAVED], ids=lambda layout: layout.value)
def test_w1_stored_apart_runs_every_site_on_the_cutedsl_gemms(monkeypatch, layout):
    """W1's gate and up stored apart (``gmlp.contract.gate_up``): on SM90 every GEMM site runs its
    CuTeDSL kernel, the three W1 sites on the views in place; W1's values are made by the Triton
    quantize-dequantize (rows 2H apart read in place); SM100 refuses the composition."""
    _with_cutedsl()
    mlp = gmlp.GroupedMLP(4, 128, 128, recipe=gmlp.MXFP8Recipe())
    config = dataclasses.replace(mlp._config(None, None), gate_up=layout)
    problem = layer_problem(config, 96, 4, 128, 128, torch.bfloat16, torch.bfloat16, torch.device("cpu"))
    assert problem.gate_up is layout
    plan = plan_layer(problem, _gpu(monkeypatch, (9, 0)), strict=None)
    for site in GEMM_SITES:
        assert plan.path(site) is Path.CUTEDSL, site
    for site in ("qdq w1", "qdq w1^T"):
        assert plan.path(site) is Path.TRITON, site
        assert "no CuTeDSL quantize-dequantize" in str(dict(plan.decisions[site].skipped)[Path.CUTEDSL])
        w1_values = problem.quantize_problems[site]
        assert w1_values.num_rows == 4 * 128  # gate and up quantized apart: E * F rows
        assert w1_values.row_stride == (256 if layout is GateUpLayout.INTERLEAVED else 128)
    assert "interleaves W1's (E, 2F, H) halves" in str(composition_reason(problem))


@pytest.mark.parametrize("capability", [(9, 0), (10, 0)], ids=["sm90", "sm100"])
def test_blockwise_recipe_sites_without_a_cutedsl_kernel_say_why(monkeypatch, capability):
    """On Hopper and Blackwell (simulated) the FP8 blockwise recipe's sites take Triton, each with
    CuTeDSL's reason (no blockwise kernel of the op; on SM100 the recipe; or the system's where
    cutlass-dsl does not import here), except on SM90 the GEMM sites, which have an SM90 kernel
    (FC1, FC2, FC2 dgrad, FC1 dgrad, the weight gradients); strict mode refuses at the first Triton site, and a forced
    CuTeDSL backend says why."""
    from gmlp.dispatch.sites import BLOCKWISE_SITES

    device = _gpu(monkeypatch, capability)
    plan = _plan(device, recipe=gmlp.FP8BlockwiseRecipe())
    assert plan.blockwise and not plan.sm100
    assert set(plan.decisions) == {name for name, site in BLOCKWISE_SITES.items() if not site.bias_only}
    cutedsl_imports = gmlp.cutedsl.import_error() is None
    for site, decision in plan.decisions.items():
        op = BLOCKWISE_SITES[site].op
        if cutedsl_imports and capability == (9, 0) and op in SM90_BLOCKWISE_KERNELS:
            assert decision.path is Path.CUTEDSL, site
            continue
        assert decision.path is Path.TRITON, site
        reason = dict(decision.skipped)[Path.CUTEDSL]
        if not cutedsl_imports:
            continue
        if op not in SM90_BLOCKWISE_KERNELS:
            assert reason.kind is ReasonKind.RECIPE and "no CuTeDSL kernel of the FP8 blockwise recipe's" in str(reason)
        else:
            assert "FP8 blockwise recipe" in str(reason), (site, reason)
    with pytest.raises(FallbackError, match=r"strict mode: quantize_weights_fp8_blockwise \(swiglu\) at quantize w1 "
                                             r"took the triton path, below the cutedsl floor \(strict=True\)"):
        plan_layer(_problem(recipe=gmlp.FP8BlockwiseRecipe()), device, strict=True)
    monkeypatch.setenv("GMLP_BACKEND", "cutedsl")
    with pytest.raises(FallbackError, match=r"GMLP_BACKEND=cutedsl: quantize_weights_fp8_blockwise \(swiglu\) at "
                                             r"quantize w1 cannot run on cutedsl"):
        _plan(device, recipe=gmlp.FP8BlockwiseRecipe())


@pytest.mark.skipif(gmlp.cutedsl.import_error() is not None, reason="cutlass-dsl does not import here")
@pytest.mark.parametrize("grad_format", ["e4m3", "e5m2"])
def test_blockwise_gemm_sites_take_cutedsl_on_hopper(monkeypatch, grad_format):
    """FC1, FC2, FC2 dgrad, FC1 dgrad (E5M2 dy and dh included) and the weight gradients take the
    SM90 kernels; the quantizes stay on Triton."""
    from gmlp.dispatch.sites import BLOCKWISE_SITES

    device = _gpu(monkeypatch, (9, 0))
    plan = _plan(device, recipe=gmlp.FP8BlockwiseRecipe(grad_format=grad_format))
    taken = {site for site, decision in plan.decisions.items() if decision.path is Path.CUTEDSL}
    assert taken == {name for name, site in BLOCKWISE_SITES.items() if site.op in SM90_BLOCKWISE_KERNELS}
    assert taken == {"fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc1 wgrad", "fc2 wgrad"}
