"""GroupedMLP with the SM90 CuTeDSL kernels at the GEMM sites the dispatcher gives them (an
H100/H200 with cutlass-dsl; skipped elsewhere with the reason): against the oracle within the
bounds of tests/layer/test_mlp_triton_path, deterministic, CUDA-graph capture with changing routing,
weight gradients added into main_grad, the cross-check clean."""

from __future__ import annotations

import pytest
import torch

import gmlp
from gmlp.debug import cross_check
from gmlp.dispatch.paths import Path, system_reason
from tests.support.layer_checks import SPLITS, check_against_oracle

GEMM_SITES = ("fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad")


def _require_sm90() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 GPU (H100/H200)")
    reason = system_reason(Path.CUTEDSL, torch.device("cuda"))
    if reason is not None:
        pytest.skip(f"CuTeDSL cannot run here: {reason}")


pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_plan_takes_the_sm90_kernels(recipe):
    _require_sm90()
    plan = gmlp.GroupedMLP(4, 256, 256, recipe=recipe, device="cuda").plan(torch.zeros(512, 256, device="cuda"))
    for site in GEMM_SITES:
        assert plan.path(site) is Path.CUTEDSL, plan.explain()


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "qgeglu", "srelu"])
@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_sm90_path_matches_oracle(activation, recipe, bias):
    _require_sm90()
    check_against_oracle(SPLITS, 64, 96, activation, recipe, bias, gemm_path=Path.CUTEDSL)


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_sm90_path_matches_oracle_at_layer_scale(recipe):
    """Many k-tiles, partial n-tiles (F = 736), skewed experts with an empty one and odd sizes."""
    _require_sm90()
    check_against_oracle([1500, 0, 611, 37, 1024, 300, 129, 999], 1024, 736, "swiglu", recipe, bias=True,
                         gemm_path=Path.CUTEDSL)


def _step(mlp, x, split_sizes, probs, dy):
    """y and every gradient of one forward + backward from fresh leaves."""
    mlp.zero_grad()
    x, probs = x.clone().requires_grad_(), probs.clone().requires_grad_()
    y = mlp(x, split_sizes, probs)
    y.backward(dy)
    return [y, x.grad, probs.grad, *(p.grad.clone() for p in mlp.parameters())]


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_sm90_path_is_deterministic(recipe):
    _require_sm90()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(8, 512, 384, bias=True, recipe=recipe, device="cuda")
    split_sizes = torch.tensor([700, 0, 129, 1, 300, 64, 256, 600], device="cuda")
    tokens = int(split_sizes.sum())
    x = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    probs, dy = torch.rand(tokens, device="cuda"), torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    first, second = _step(mlp, x, split_sizes, probs, dy), _step(mlp, x, split_sizes, probs, dy)
    for index, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), index


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_sm90_path_replays_a_cuda_graph_over_changing_routing(recipe):
    """One capture of forward + backward, replayed after the routing (split_sizes, in place)
    changed: bit for bit the eager step of that routing, empty experts included."""
    _require_sm90()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(4, 256, 256, recipe=recipe, device="cuda")
    tokens = 640
    routings = [[160, 160, 160, 160], [0, 600, 1, 39], [640, 0, 0, 0]]
    split_sizes = torch.tensor(routings[0], device="cuda")
    x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # compile and warm the allocator outside the capture
        mlp(x, split_sizes).backward(dy)
    graph = torch.cuda.CUDAGraph()
    x.grad = None  # the captured backward writes a new dx into the graph's memory at each replay
    mlp.zero_grad(set_to_none=False)  # and adds into these weight gradients (zeroed before each replay)
    with torch.cuda.graph(graph):
        y = mlp(x, split_sizes)
        y.backward(dy)
    graph_dx = x.grad
    for routing in routings:
        split_sizes.copy_(torch.tensor(routing))
        mlp.zero_grad(set_to_none=False)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [y.clone(), graph_dx.clone(), mlp.w1.grad.clone(), mlp.w2.grad.clone()]
        mlp.zero_grad(set_to_none=False)
        x_eager = x.detach().clone().requires_grad_()
        eager_y = mlp(x_eager, split_sizes)
        eager_y.backward(dy)
        eager = (eager_y, x_eager.grad, mlp.w1.grad, mlp.w2.grad)
        for name, got, want in zip(("y", "dx", "dw1", "dw2"), replayed, eager):
            assert torch.equal(got, want), (routing, name)


def test_sm90_path_adds_weight_gradients_into_main_grad():
    """The SM90 weight-gradient kernel adds its fp32 sums into main_grad: two steps from zero give
    twice one step's fp32 gradient, bit for bit."""
    _require_sm90()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, accumulate_main_grad=True, recipe=None, device="cuda")
    assert mlp.plan(torch.zeros(1, device="cuda")).path("fc1 wgrad") is Path.CUTEDSL
    for param in mlp.parameters():
        param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device="cuda")
    split_sizes = torch.tensor(SPLITS, device="cuda")
    x = torch.randn(sum(SPLITS), 64, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(sum(SPLITS), 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        mlp(x, split_sizes).backward(dy)
    from gmlp.layer.steps import OpRunner, grouped_mlp_backward, grouped_mlp_forward

    run = OpRunner(mlp.plan(x, split_sizes))
    _, saved = grouped_mlp_forward(run, x, split_sizes, None, mlp.w1.detach(), None, mlp.w2.detach(), None,
                                   mlp.activation, mlp.recipe)
    once = grouped_mlp_backward(run, dy, saved, mlp.activation, mlp.recipe)
    for name, one_step in (("w1", once.dw1), ("w2", once.dw2)):
        assert torch.equal(getattr(mlp, name).main_grad, one_step * 2), name


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_cross_check_is_clean_at_a_larger_shape(recipe):
    """CuTeDSL against Triton at every GEMM site it takes, within the derived bounds."""
    _require_sm90()
    torch.manual_seed(0)
    splits = [1500, 0, 611, 37, 1024, 300, 129, 999]
    mlp = gmlp.GroupedMLP(len(splits), 1024, 768, bias=True, recipe=recipe, device="cuda")
    x = torch.randn(sum(splits), 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(sum(splits), device="cuda", requires_grad=True)
    with cross_check(action="raise"):
        mlp(x, torch.tensor(splits, device="cuda"), probs).sum().backward()
