"""GroupedMLP under torch.compile: the layer is two custom ops (gmlp.layer.autograd), so a compiled module
traces with no graph break, gives the eager result bit for bit (forward and backward), and does
not recompile when the routing or the token count changes. On the CPU the ops run the Triton
kernels in the interpreter (TRITON_INTERPRET=1, tests/conftest.py); the GPU tests run them
compiled, with inductor and with CUDA graphs (mode="reduce-overhead")."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch._dynamo.utils

import gmlp
from gmlp.debug import cross_check
from gmlp.dispatch.paths import Path
from tests.support.backends import kernel_device
from tests.support.cases import parametrize_quick

RECIPES = [None, gmlp.MXFP8Recipe()]
RECIPE_IDS = ["bf16", "mxfp8"]
EXPERTS, HIDDEN, FFN = 3, 64, 64
ROUTINGS = [[10, 0, 14], [0, 20, 12], [5, 35, 0]]  # T = 24, 32, 40; an empty expert in each


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _module(recipe, device="cpu") -> gmlp.GroupedMLP:
    torch.manual_seed(0)
    return gmlp.GroupedMLP(EXPERTS, HIDDEN, FFN, recipe=recipe, device=device)


def _inputs(splits, device="cpu", seed=0):
    """x (bf16) and probs (fp32) leaves, split sizes, dy: the same values for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(splits)
    x = torch.randn(tokens, HIDDEN, generator=generator).to(device, torch.bfloat16).requires_grad_()
    probs = torch.rand(tokens, generator=generator).to(device).requires_grad_()
    dy = torch.randn(tokens, HIDDEN, generator=generator).to(device, torch.bfloat16)
    return x, torch.tensor(splits, device=device), probs, dy


def _step(call, mlp, splits, device="cpu", seed=0, mark_dynamic=False):
    """y, x.grad, probs.grad, w1.grad, w2.grad of one forward + backward through ``call``."""
    x, split_sizes, probs, dy = _inputs(splits, device, seed)
    if mark_dynamic:
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(probs, 0)
    mlp.zero_grad(set_to_none=True)
    y = call(x, split_sizes, probs)
    y.backward(dy)
    return [t.detach().clone() for t in (y, x.grad, probs.grad, mlp.w1.grad, mlp.w2.grad)]


def _assert_bitwise_equal(got, want, what=""):
    for name, a, b in zip(("y", "x.grad", "probs.grad", "w1.grad", "w2.grad"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name)
        assert torch.equal(a, b), f"{what}: {name} differs from eager"


def _graph_breaks() -> dict:
    return dict(torch._dynamo.utils.counters["graph_break"])


@parametrize_quick("dynamic", ["dynamic=True", "mark_dynamic"])
@parametrize_quick("recipe", RECIPES, ids=RECIPE_IDS)
def test_compiled_equals_eager_bitwise_without_recompiling(recipe, dynamic):
    """fullgraph inductor compile (the issue's failures were inductor's: "Promotion for Float8
    Types is not supported"): forward and backward equal eager bit for bit, and T = 24, 32, 40
    with different routings make one graph, compiled once."""
    mlp = _module(recipe)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(mlp, fullgraph=True, backend=counter, dynamic=True if dynamic == "dynamic=True" else None)
    frames_after_first = None
    for seed, splits in enumerate(ROUTINGS):
        want = _step(mlp, mlp, splits, seed=seed)
        got = _step(compiled, mlp, splits, seed=seed, mark_dynamic=dynamic == "mark_dynamic")
        _assert_bitwise_equal(got, want, f"T={sum(splits)} {splits}")
        if frames_after_first is None:
            frames_after_first = counter.frame_count
    # dynamo may call the backend twice for its one frame (it restarts the analysis once when
    # dynamic=True makes the activation's floats symbolic and a cold cache compiles): count graphs
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert counter.frame_count == frames_after_first, "a new token count or routing recompiled"
    if dynamic == "mark_dynamic":
        assert counter.frame_count == 1
    assert not _graph_breaks()
    x, split_sizes, probs, _ = _inputs(ROUTINGS[0])
    explanation = torch._dynamo.explain(mlp)(x, split_sizes, probs)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


@parametrize_quick("recipe", RECIPES, ids=RECIPE_IDS)
def test_a_fresh_module_compiles_fullgraph(recipe):
    """Compiling a module before its first eager call (the usual order) traces as well: nothing
    the module builds on its first call (its op's config string) may break the graph."""
    mlp = _module(recipe)
    x, split_sizes, probs, _ = _inputs(ROUTINGS[0])
    explanation = torch._dynamo.explain(_module(recipe))(x, split_sizes, probs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager", dynamic=True)
    got = _step(compiled, mlp, ROUTINGS[0])
    _assert_bitwise_equal(got, _step(mlp, mlp, ROUTINGS[0]))
    assert not _graph_breaks()


@parametrize_quick("recipe", RECIPES, ids=RECIPE_IDS)
def test_cross_check_runs_inside_a_compiled_call(recipe):
    """The ops run eagerly inside the graph, so the cross-check (a context variable read by the
    op) compares the same ops as in eager mode, and records them in the block's report, and a
    clean run raises nothing: the kernels (Triton, interpreted on the CPU; CuTeDSL on a Hopper
    GPU) against the next path down."""
    device = kernel_device()
    mlp = _module(recipe, device)
    if mlp.plan(torch.zeros(1, HIDDEN, device=device, dtype=torch.bfloat16)).path("fc1") is Path.TORCH:
        pytest.skip("fc1 runs on torch here, the last path (no GPU and no Triton interpreter): nothing to compare it with")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gmlp.debug.CrossCheckWarning)  # an op on its last path: nothing to compare
        with cross_check(action="raise") as eager:
            _step(mlp, mlp, ROUTINGS[0], device)
        compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager", dynamic=True)
        with cross_check(action="raise") as traced:
            _step(compiled, mlp, ROUTINGS[0], device)

    def calls(report):  # (site, paths, calls) of every op compared
        return sorted((r.site, r.path, r.reference, r.calls) for r in report.compared)

    assert eager.compared, "the eager cross-check compared nothing"
    assert calls(traced) == calls(eager) and traced.mismatches == 0
    assert not _graph_breaks()


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph-breaks-allowed"])
@pytest.mark.parametrize("weight_cache", ["update", "reuse"])
@pytest.mark.parametrize("warm", [False, True], ids=["fresh-module", "after-eager-calls"])
def test_weight_cache_under_compile_is_refused_clearly(weight_cache, warm, fullgraph, monkeypatch):
    """gmlp's sentence comes first: in the first lines of Dynamo's error under fullgraph (not
    buried in an "Observed exception" report's debug context), as the error itself without."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    mlp = _module(gmlp.MXFP8Recipe())
    x, split_sizes, probs, _ = _inputs(ROUTINGS[0])
    if warm:  # the module has made its config strings for both settings
        mlp(x, split_sizes, probs, weight_cache="update")
        mlp(x, split_sizes, probs, weight_cache="reuse")
    compiled = torch.compile(mlp, fullgraph=fullgraph, backend="aot_eager")
    sentence = "gmlp: weight_cache under torch.compile: the kept quantized weights live on the module"
    if fullgraph:
        with pytest.raises(torch._dynamo.exc.Unsupported) as error:
            compiled(x, split_sizes, probs, weight_cache=weight_cache)
        assert sentence in "\n".join(str(error.value).splitlines()[:2]), str(error.value)[:2000]
    else:
        with pytest.raises(NotImplementedError, match=f"^{sentence}"):
            compiled(x, split_sizes, probs, weight_cache=weight_cache)


def test_accumulate_main_grad_under_compile_is_refused_clearly(monkeypatch):
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    mlp = gmlp.GroupedMLP(len(ROUTINGS[0]), HIDDEN, FFN, accumulate_main_grad=True)
    x, split_sizes, probs, _ = _inputs(ROUTINGS[0])
    with pytest.raises(torch._dynamo.exc.Unsupported) as error:
        torch.compile(mlp, fullgraph=True, backend="aot_eager")(x, split_sizes, probs)
    assert "gmlp: accumulate_main_grad under torch.compile" in "\n".join(str(error.value).splitlines()[:2])


# opcheck's utilities that pass. MXFP8's outputs hold float8 tensors, on which the CPU has no
# arithmetic, and the other utilities do some (test_schema: torch.allclose of every aten op's
# float8 arguments before and after; test_aot_dispatch_*: sum() of every output).
OPCHECK_UTILS = {
    "bf16": ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static"),
    "mxfp8": ("test_autograd_registration", "test_faketensor"),
}


def _opcheck_args(recipe):
    mlp = _module(recipe)
    x, split_sizes, probs, _ = _inputs(ROUTINGS[0])
    return (x, split_sizes, probs, mlp.w1, None, None, mlp.w2, None, [], mlp._encoded_config(None))


@parametrize_quick("recipe", RECIPES, ids=RECIPE_IDS)
def test_opcheck_forward_op(recipe):
    """The fake implementation agrees with the real op (shapes, dtypes, strides of y and of the
    flattened state), the schema (no mutation, no aliasing) and the autograd registration hold."""
    utils = OPCHECK_UTILS[RECIPE_IDS[RECIPES.index(recipe)]]
    result = torch.library.opcheck(torch.ops.gmlp.grouped_mlp_forward, _opcheck_args(recipe), test_utils=utils)
    assert result == {name: "SUCCESS" for name in utils}, result


@pytest.mark.slow
def test_opcheck_forward_op_with_dynamic_shapes():
    """AOTDispatcher with every size symbolic, weights' included (a functional caller compiled
    with dynamic=True passes the weights as plain inputs)."""
    result = torch.library.opcheck(torch.ops.gmlp.grouped_mlp_forward, _opcheck_args(None),
                                   test_utils="test_aot_dispatch_dynamic")
    assert result == {"test_aot_dispatch_dynamic": "SUCCESS"}, result


# -- GPU: the Triton kernels compiled, inductor and CUDA graphs ------------------------------------


def _cuda_triton_module(recipe, monkeypatch) -> gmlp.GroupedMLP:
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    mlp = _module(recipe, "cuda")
    plan = mlp.plan(torch.zeros(1, HIDDEN, device="cuda", dtype=torch.bfloat16))
    assert plan.path("fc1") is Path.TRITON and not plan.sm100, plan.explain()
    return mlp


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_compiled_equals_eager_bitwise_on_cuda(recipe, monkeypatch):
    mlp = _cuda_triton_module(recipe, monkeypatch)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(mlp, fullgraph=True, backend=counter, dynamic=True)
    frames_after_first = None
    for seed, splits in enumerate(ROUTINGS):
        want = _step(mlp, mlp, splits, "cuda", seed)
        got = _step(compiled, mlp, splits, "cuda", seed)
        _assert_bitwise_equal(got, want, f"T={sum(splits)} {splits}")
        if frames_after_first is None:
            frames_after_first = counter.frame_count
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert counter.frame_count == frames_after_first, "a new token count or routing recompiled"
    assert not _graph_breaks()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_cuda_graphs_with_changing_routing_equal_eager(recipe, monkeypatch):
    """mode="reduce-overhead": the step is recorded as CUDA graphs and replayed; the routing
    changes every step (same T, new split sizes, then a new T) and every step equals eager."""
    mlp = _cuda_triton_module(recipe, monkeypatch)
    compiled = torch.compile(mlp, fullgraph=True, mode="reduce-overhead", dynamic=True)
    steps = [[10, 0, 22], [0, 20, 12], [16, 16, 0], [1, 0, 31], [30, 2, 0], [5, 35, 0], [0, 0, 40], [12, 0, 28]]
    for seed, splits in enumerate(steps):  # the first steps warm up and record; the later ones replay
        want = _step(mlp, mlp, splits, "cuda", seed)
        torch.compiler.cudagraph_mark_step_begin()
        got = _step(compiled, mlp, splits, "cuda", seed)  # cloned before the next step reuses the graph's memory
        _assert_bitwise_equal(got, want, f"step {seed}: T={sum(splits)} {splits}")
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    assert skips == 0, f"inductor ran {skips} graphs without CUDA graphs (TORCH_LOGS=perf_hints says why)"
