"""The SM100 composition on the CPU: real tensors from gmlp's quantize, every kernel call accepted
by the kernel's own ``check_support`` (under ``simulated_sm100``), then run by its torch twin
(``tests/support/sm100_twins.py``), against the oracle.

The twins read and write the kernels' layouts, so this runs the composition's plumbing (padding,
gate/up interleaving, scale views, offsets, which tensor goes where) end to end. The bounds are
those of the Triton path's module test (``tests/layer/test_mlp_triton_path.py``): two approximations
of the same exact layer, each within the oracle's bound. Whether the real kernels compute what
their documentation says is for a Blackwell run (``tests/cutedsl/sm100/test_gpu.py``).
"""

from __future__ import annotations

import inspect

import pytest
import torch

import gmlp
from gmlp.contract.activations import activation_from
from gmlp.contract.reference import grouped_mlp_backward_ref, grouped_mlp_forward_ref
from gmlp.cutedsl.sm100 import cudnn_kernels, layer
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat
from tests.support.blackwell import simulated_sm100
from tests.support.sm100_twins import TorchKernels
from tests.support.tolerances import BF16_UNIT, relative_rms_bound, relative_rms_error, unit_roundoff

pytestmark = pytest.mark.skipif(cudnn_kernels.import_error() is not None,
                                reason=f"cuDNN frontend's kernels do not import: {cudnn_kernels.import_error()}")

SPLITS = [5, 0, 300, 1]  # an empty expert; one of 300 rows spans two 256-row blocks


def _quantize(site: str, x: torch.Tensor, **kwargs):
    del site
    return quantize_mxfp8_ref(x, **kwargs)


class CheckedTwins(TorchKernels):
    """Each call first passes its kernel's own argument checks (and its launch arguments bind to
    the kernel's ``execute``), then its twin runs."""

    def __init__(self, activation, dump_dir):
        super().__init__(activation)
        self.dump_dir = dump_dir

    def __call__(self, site, call):
        kernel = call.kernel()
        with simulated_sm100(self.dump_dir):
            assert kernel.check_support(), f"{site}: {call.step} refused gmlp's arguments"
        inspect.signature(kernel.execute).bind(**call.execute_kwargs())  # a TypeError names a wrong argument
        super().__call__(site, call)


def _layer_inputs(activation: str, probs: bool = True, hidden: int = 128, ffn: int = 128):
    """(activation, split_sizes, x, probs, w1, w2, dy) of a small layer call over SPLITS."""
    torch.manual_seed(0)
    act = activation_from(activation)
    experts, tokens = len(SPLITS), sum(SPLITS)
    x = torch.randn(tokens, hidden).bfloat16()
    prob = torch.rand(tokens) if probs else None
    w1 = (torch.randn(experts, 2 * ffn if act.gated else ffn, hidden) / hidden**0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, ffn) / ffn**0.5).bfloat16()
    return act, torch.tensor(SPLITS), x, prob, w1, w2, torch.randn(tokens, hidden).bfloat16()


def _run_layer(activation: str, probs: bool, launch):
    act, split_sizes, x, prob, w1, w2, dy = _layer_inputs(activation, probs)
    recipe = gmlp.MXFP8Recipe()
    y, saved = layer.sm100_forward(_quantize, x, split_sizes, prob, w1, None, w2, None, act, recipe, launch=launch)
    grads = layer.sm100_backward(_quantize, dy, saved, act, recipe, launch=launch)
    want_y, want_saved = grouped_mlp_forward_ref(x, split_sizes, prob, w1, None, w2, None, act, recipe)
    want = grouped_mlp_backward_ref(dy, want_saved, act, recipe)
    return (y, grads), (want_y, want)


def _errors_and_bounds(got, want) -> dict[str, tuple[float, float]]:
    (y, grads), (want_y, want_grads) = got, want
    e4m3 = unit_roundoff(ElementFormat.E4M3)
    outputs = {
        "y": (y, want_y, 2 * relative_rms_bound(e4m3, e4m3, e4m3, e4m3, BF16_UNIT)),
        "dx": (grads.dx, want_grads.dx, 2 * relative_rms_bound(e4m3, e4m3, BF16_UNIT, e4m3, e4m3, BF16_UNIT)),
        "dw1": (grads.dw1, want_grads.dw1, 2 * relative_rms_bound(e4m3, e4m3, BF16_UNIT, e4m3, e4m3)),
        "dw2": (grads.dw2, want_grads.dw2, 2 * relative_rms_bound(e4m3, e4m3, e4m3, e4m3)),
    }
    if want_grads.dprobs is not None:
        outputs["dprobs"] = (grads.dprobs, want_grads.dprobs, 2 * relative_rms_bound(e4m3, e4m3, BF16_UNIT, e4m3, e4m3))
    return {name: (relative_rms_error(g, w), bound) for name, (g, w, bound) in outputs.items()}


@pytest.mark.parametrize("activation,probs", [("swiglu", True), ("qgeglu", True), ("srelu", False)])
def test_sm100_composition_matches_the_oracle(activation, probs, tmp_path):
    launch = CheckedTwins(activation_from(activation), tmp_path)
    got, want = _run_layer(activation, probs, launch)
    assert launch.sites == ["fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad"]
    errors = _errors_and_bounds(got, want)
    assert all(error <= bound for error, bound in errors.values()), errors
    if not probs:
        assert got[1].dprobs is None


def test_a_plumbing_mistake_is_caught(monkeypatch):
    """W1 handed over without its gate/up interleaving: y and every gradient through FC1 are off."""
    monkeypatch.setattr(layer, "interleave_gate_up", lambda w: w)
    errors = _errors_and_bounds(*_run_layer("swiglu", True, TorchKernels(activation_from("swiglu"))))
    assert all(errors[name][0] > errors[name][1] for name in ("y", "dx", "dw1")), errors


# --- the cross-check of the SM100 steps ------------------------------------------------------

PLANTED_TOKEN = 100  # a token row of expert 2 (rows 5..304)


def _sm100_runner(split_sizes: torch.Tensor):
    """An OpRunner whose plan runs the quantizes on torch and the GEMM sites as the SM100
    composition, cross-checked (raise) against the torch twins of gmlp's ops."""
    from gmlp.debug.crosscheck import CrossCheck, CrossCheckSettings
    from gmlp.dispatch.paths import Decision, Path
    from gmlp.dispatch.plan import LayerPlan
    from gmlp.dispatch.sites import SITES
    from gmlp.layer.steps import OpRunner

    names = [name for name, site in SITES.items() if site.sm100 is not False and name != "bias grad"]
    decisions = {name: Decision(SITES[name].op.value, Path.TORCH if name.startswith("quantize") else Path.CUTEDSL, ())
                 for name in names}
    references = {name: None if name.startswith("quantize") else Path.TORCH for name in names}
    plan = LayerPlan(decisions, references, sm100=True)
    return OpRunner(plan, CrossCheck(plan, CrossCheckSettings(action="raise"), split_sizes))


def _cross_checked_layer(activation: str, launch) -> None:
    act, split_sizes, x, prob, w1, w2, dy = _layer_inputs(activation)
    run = _sm100_runner(split_sizes)
    main_grads = (torch.randn(w1.shape), torch.randn(w2.shape))  # the fp32 main_grad path: added into
    y, saved = layer.sm100_forward(run, x, split_sizes, prob, w1, None, w2, None, act, gmlp.MXFP8Recipe(),
                                         launch=launch)
    layer.sm100_backward(run, dy, saved, act, gmlp.MXFP8Recipe(), weight_grad_out=main_grads, launch=launch)


@pytest.mark.parametrize("activation", ["swiglu", "qgeglu", "srelu"])
def test_cross_check_of_the_sm100_steps_passes_clean_runs(activation):
    _cross_checked_layer(activation, TorchKernels(activation_from(activation)))


class PlantedTwins(TorchKernels):
    """The twins, with one wrong element in one output of one site: a token row of expert 2 (a
    weight-gradient element of expert 2)."""

    OUTPUTS = {"fc1": "d", "fc2": "d", "fc2 dgrad": "d_col", "fc1 dgrad": "d", "fc2 wgrad": "wgrad",
               "fc1 wgrad": "wgrad"}

    def __init__(self, activation, site):
        super().__init__(activation)
        self.site = site

    def __call__(self, site, call):
        super().__call__(site, call)
        if site != self.site:
            return
        out = call[self.OUTPUTS[site]]
        if out.dim() == 3 and out.shape[0] == call[next(k for k in ("offsets", "padded_offsets") if k in call.tensors)].numel():
            out[2, 3, 5] += 1.0  # a weight gradient (E, M, N)
            return
        row = 256 + PLANTED_TOKEN - 5  # expert 2's padded rows start at 256 (expert 0: 256 rows, expert 1: none)
        value = out.reshape(out.shape[0], -1)
        if value.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            bits = value.view(torch.uint8)
            bits[row, 7] = bits[row, 7] ^ 0x08  # the lowest exponent bit: twice or half the value
        else:
            value[row, 7] += 1.0


@pytest.mark.parametrize("site", list(PlantedTwins.OUTPUTS))
def test_cross_check_of_the_sm100_steps_catches_a_planted_element(site):
    from gmlp.debug.crosscheck import CrossCheckError

    with pytest.raises(CrossCheckError) as caught:
        _cross_checked_layer("swiglu", PlantedTwins(activation_from("swiglu"), site))
    message = str(caught.value)
    assert f"cross-check: {site} " in message and "on cutedsl differs from torch" in message, message
    assert " 1 of " in message, message  # exactly the planted element
    assert "expert 2" in message, message


def test_compiled_kernels_build_once_per_signature_and_refuse_loudly():
    """The production launcher: a kernel object is built, checked and compiled once per call
    signature and executed with the call's arguments; a kernel that refuses its arguments is an
    error that says what to do, not a silent fallback."""
    from gmlp.cutedsl.sm100.steps import KernelCall

    class FakeKernel:
        def __init__(self, supported):
            self.supported, self.compiled, self.executed = supported, 0, []

        def check_support(self):
            return self.supported

        def compile(self):
            self.compiled += 1

        def execute(self, **kwargs):
            self.executed.append(sorted(kwargs))

    built = []

    class Call(KernelCall):
        def kernel(self):
            built.append(FakeKernel(self.options.get("ok", True)))
            return built[-1]

    launch = layer.CompiledKernels()
    tensors = dict(a=torch.zeros(4, 8), padded_offsets=torch.zeros(2, dtype=torch.int32))
    for _ in range(3):
        launch("fc2", Call("grouped_gemm", dict(tensors)))
    launch("fc2", Call("grouped_gemm", dict(tensors, a=torch.zeros(8, 8))))  # another shape: another kernel
    assert len(built) == 2 and [k.compiled for k in built] == [1, 1]
    assert built[0].executed == [["a_tensor", "padded_offsets"]] * 3
    with pytest.raises(RuntimeError, match="refused gmlp's arguments.*GMLP_BACKEND=triton"):
        launch("fc1", Call("fc1_glu", dict(tensors), options=dict(ok=False)))


def test_the_sm100_composition_compiles_without_graph_breaks(monkeypatch):
    """torch.compile(fullgraph=True, dynamic=True) of a layer planned on the SM100 composition
    (kernels: the torch twins; quantizes: the torch path) equals eager bit for bit, forward and
    backward, as the token count and the routing change: its fake implementation is the
    composition itself with allocating quantizes and no launches (``gmlp.layer.autograd``)."""
    from gmlp.dispatch import plan_cache
    from tests.support.sm100_twins import as_sm100_plan

    def sm100_plan(problem, device, *, strict, plan_layer=plan_cache.plan_layer):
        return as_sm100_plan(plan_layer(problem, device, strict=strict))

    monkeypatch.setenv("GMLP_BACKEND", "torch")
    monkeypatch.setattr(plan_cache, "plan_layer", sm100_plan)
    mlp = gmlp.GroupedMLP(2, 128, 128)
    monkeypatch.setattr(layer, "launch_kernel", TorchKernels(mlp.activation))

    def step(module, tokens: int, sizes: list[int]) -> list[torch.Tensor]:
        torch.manual_seed(tokens)
        x = torch.randn(tokens, 128, dtype=torch.bfloat16, requires_grad=True)
        probs = torch.rand(tokens, requires_grad=True)
        mlp.zero_grad(set_to_none=True)
        y = module(x, torch.tensor(sizes), probs)
        y.backward(torch.ones_like(y))
        return [t.detach().clone() for t in (y, x.grad, probs.grad, mlp.w1.grad, mlp.w2.grad)]

    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, dynamic=True, backend="aot_eager")
    for tokens, sizes in ((40, [30, 10]), (40, [0, 40]), (64, [33, 31])):
        for want, got in zip(step(mlp, tokens, sizes), step(compiled, tokens, sizes)):
            assert torch.equal(want, got), (tokens, sizes)
