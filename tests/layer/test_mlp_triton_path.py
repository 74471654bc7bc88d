"""GroupedMLP on the Triton kernels against the oracle, within the bounds of
``tests.support.layer_checks.check_against_oracle``."""

from __future__ import annotations

import pytest
import torch

import gmlp
from gmlp.dispatch.paths import Path
from gmlp.mxfp8.spec import ElementFormat
from tests.support.backends import kernel_device, triton_op
from tests.support.cases import parametrize_quick
from tests.support.layer_checks import SPLITS, check_against_oracle

@parametrize_quick("activation", ["swiglu", "geglu", "qgeglu", "srelu"])
@parametrize_quick("recipe", [gmlp.MXFP8Recipe(), gmlp.MXFP8Recipe(grad_format=ElementFormat.E5M2), None],
                   ids=["mxfp8", "mxfp8-e5m2-grads", "bf16"])
@parametrize_quick("bias", [True, False], ids=["bias", "no-bias"])
def test_triton_path_matches_oracle(monkeypatch, activation, recipe, bias):
    monkeypatch.setenv("GMLP_BACKEND", "triton")  # on SM90 the CuTeDSL kernels would take the GEMMs
    check_against_oracle(SPLITS, 64, 96, activation, recipe, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_triton_path_matches_oracle_at_layer_scale(monkeypatch, recipe):
    """Shapes past every tile of the tuned tilings (gmlp.triton_ref.tuning): many K steps, partial
    N tiles (F = 736), skewed experts with an empty one and odd sizes."""
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    check_against_oracle([1500, 0, 611, 37, 1024, 300, 129, 999], 1024, 736, "swiglu", recipe, bias=True)


@pytest.mark.parametrize("dtype,recipe", [(torch.float32, None), (torch.float64, None)],
                         ids=["fp32-unquantized", "fp64-unquantized"])  # MXFP8 refuses other dtypes when built
def test_parameters_the_triton_kernels_cannot_take_fall_back_with_a_reason(dtype, recipe):
    mlp = gmlp.GroupedMLP(2, 64, 64, recipe=recipe, dtype=dtype)
    plan = mlp.plan(torch.zeros(1, device=kernel_device()))
    for site in ("fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad"):
        decision = plan.decisions[site]
        assert decision.path is Path.TORCH, site
        assert any(path is Path.TRITON and str(dtype) in str(reason) for path, reason in decision.skipped), plan.explain()


@pytest.mark.slow
def test_triton_path_is_deterministic(monkeypatch):
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    device = kernel_device()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, device=device)
    if mlp.plan(torch.zeros(1, device=device)).path("fc1") is not Path.TRITON:
        pytest.skip("the Triton path does not run here")
    split_sizes = torch.tensor(SPLITS, device=device)
    x = torch.randn(sum(SPLITS), 64, device=device, dtype=torch.bfloat16)
    probs = torch.rand(sum(SPLITS), device=device)
    dy = torch.randn(sum(SPLITS), 64, device=device, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        inputs = [x.clone().requires_grad_(), probs.clone().requires_grad_()]
        mlp.zero_grad()
        y = mlp(inputs[0], split_sizes, inputs[1])
        y.backward(dy)
        runs.append([y, inputs[0].grad, inputs[1].grad, mlp.w1.grad.clone(), mlp.w2.grad.clone()])
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.slow
def test_triton_path_adds_weight_gradients_into_main_grad(monkeypatch):
    """With accumulate_main_grad, the weight-gradient kernel adds the fp32 sums straight into
    main_grad: two steps from zero give twice one step's fp32 gradient, bit for bit."""
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    device = kernel_device()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, bias=True, accumulate_main_grad=True, device=device)
    if mlp.plan(torch.zeros(1, device=device)).path("fc1") is not Path.TRITON:
        pytest.skip("the Triton path does not run here")
    for param in mlp.parameters():
        param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=device)
    split_sizes = torch.tensor(SPLITS, device=device)
    x = torch.randn(sum(SPLITS), 64, device=device, dtype=torch.bfloat16)
    dy = torch.randn(sum(SPLITS), 64, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        mlp(x, split_sizes).backward(dy)
    from gmlp.layer.steps import OpRunner, grouped_mlp_backward, grouped_mlp_forward

    run = OpRunner(mlp.plan(x, split_sizes))
    _, saved = grouped_mlp_forward(run, x, split_sizes, None, mlp.w1.detach(), mlp.b1.detach(), mlp.w2.detach(),
                                   mlp.b2.detach(), mlp.activation, mlp.recipe)
    once = grouped_mlp_backward(run, dy, saved, mlp.activation, mlp.recipe)
    assert once.dw1.dtype == torch.float32 and mlp.w1.grad is None and mlp.b1.grad is None
    for name, one_step in (("w1", once.dw1), ("w2", once.dw2), ("b1", once.db1), ("b2", once.db2)):
        assert torch.equal(getattr(mlp, name).main_grad, one_step * 2), name


@pytest.mark.gpu
def test_forward_and_backward_capture_in_a_cuda_graph(monkeypatch):
    """No host sync anywhere: the whole step captures in a CUDA graph and replays correctly."""
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, device="cuda")
    assert mlp.plan(torch.zeros(1, device="cuda")).path("fc1") is Path.TRITON
    split_sizes = torch.tensor(SPLITS, device="cuda")
    x = torch.randn(sum(SPLITS), 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(sum(SPLITS), 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # warm up (compilation, allocator) outside the capture
        mlp(x, split_sizes).backward(dy)
    eager_y, eager_dx = mlp(x, split_sizes).detach().clone(), None
    x.grad = None
    mlp(x, split_sizes).backward(dy)
    eager_dx = x.grad.clone()
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        y = mlp(x, split_sizes)
        y.backward(dy)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager_y) and torch.equal(x.grad, eager_dx)


@pytest.mark.slow
def test_strided_inputs_equal_their_contiguous_copies():
    """Router outputs are often strided views (a column of (T, k) scores, a transposed x): the
    layer gives the kernels contiguous tensors, so y and every gradient are those of the
    contiguous inputs, bit for bit; the launchers refuse strided probs instead of misreading them."""
    device = kernel_device()
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, recipe=None, device=device)
    split_sizes, tokens = torch.tensor(SPLITS, device=device), sum(SPLITS)
    scores = torch.rand(tokens, 2, device=device)
    x_t = torch.randn(64, tokens, device=device, dtype=torch.bfloat16)
    dy = torch.randn(tokens, 64, device=device, dtype=torch.bfloat16)
    results = []
    for x_value, probs_value in ((x_t.t(), scores[:, 1]), (x_t.t().contiguous(), scores[:, 1].contiguous())):
        x, probs = x_value.detach().requires_grad_(), probs_value.detach().requires_grad_()
        mlp.zero_grad()
        y = mlp(x, split_sizes, probs)
        y.backward(dy)
        results.append([y, x.grad, probs.grad, mlp.w1.grad.clone(), mlp.w2.grad.clone()])
    for name, strided, contiguous in zip(("y", "dx", "dprobs", "dw1", "dw2"), *results):
        assert torch.equal(strided, contiguous), name
    from gmlp.contract.activations import activation_from
    from gmlp.triton_ref.fc1 import fc1_forward

    with pytest.raises(ValueError, match=r"probs must be a contiguous float \(96,\) tensor, got .* \(not contiguous\)"):
        fc1_forward(x_t.t().contiguous()[:96], mlp.w1.detach(), torch.tensor([96, 0, 0, 0, 0], device=device),
                    ffn_hidden_size=64, activation=activation_from("swiglu"), recipe=None, probs=scores[:96, 0])


@parametrize_quick("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
def test_a_step_computes_the_expert_offsets_once(monkeypatch, recipe):
    """Host time: the device prefix sums of the split sizes (about 20 small launches) are computed
    once per forward + backward and handed to every op, the quantizes of x and dy included."""
    import sys

    from gmlp.mxfp8 import routing
    from gmlp.triton_ref import expert_groups

    monkeypatch.setenv("GMLP_BACKEND", "triton")
    device = kernel_device()
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, recipe=recipe, device=device)
    if mlp.plan(torch.zeros(1, device=device)).path("fc1") is not Path.TRITON:
        pytest.skip("the Triton path does not run here")
    calls = []

    def counting(original):
        def count(*args, **kwargs):
            calls.append(original.__name__)
            return original(*args, **kwargs)
        return count

    # every module that imported one of the two ways to compute them by name
    for original in (routing.device_groups, expert_groups.expert_groups):
        for module in list(sys.modules.values()):
            if module is not None and module.__name__.startswith("gmlp") and \
                    getattr(module, original.__name__, None) is original:
                monkeypatch.setattr(module, original.__name__, counting(original))
    tokens = sum(SPLITS)
    x = torch.randn(tokens, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(tokens, device=device, requires_grad=True)
    mlp(x, torch.tensor(SPLITS, device=device), probs).backward(torch.randn_like(x))
    assert calls == ["expert_groups"]  # one Triton launch where the Triton kernels run


@pytest.mark.slow
def test_a_step_poisons_no_scales_its_split_check_covers(monkeypatch):
    """Host time: the layer checks its split sizes before any kernel reads them (a host error, or a
    device-side assert that stops the stream first), so its quantizes poison no scales (a masked
    fill per scale tensor); a quantize given unchecked groups still does."""
    from gmlp.mxfp8 import buffers

    monkeypatch.setenv("GMLP_BACKEND", "triton")
    device = kernel_device()
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, recipe=gmlp.MXFP8Recipe(), device=device)
    if mlp.plan(torch.zeros(1, device=device)).path("quantize x") is not Path.TRITON:
        pytest.skip("the Triton path does not run here")
    fills, original = [], buffers.poison_scales_if_invalid

    def recording(scales, groups):
        fills.append(groups is not None and not groups.checked)
        return original(scales, groups)

    monkeypatch.setattr(buffers, "poison_scales_if_invalid", recording)
    tokens = sum(SPLITS)
    x = torch.randn(tokens, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    mlp(x, torch.tensor(SPLITS, device=device)).backward(torch.randn_like(x))
    assert fills and not any(fills)  # every scale tensor of the step: no fill
    quantize = triton_op("quantize", "quantize_mxfp8")
    quantize(x.detach(), columnwise=True, swizzle=False, split_sizes=torch.tensor(SPLITS, device=device))
    assert any(fills)  # its own groups: unchecked
