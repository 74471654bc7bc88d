"""GroupedMLP and its oracle: against fp64 autograd of the unquantized model, and the module wiring."""

from __future__ import annotations

import copy

import pytest
import torch

import gmlp
from gmlp.contract.activations import Activation, ActivationKind, activation_from
from gmlp.contract.reference import grouped_mlp_backward_ref, grouped_mlp_forward_ref, unquantized_mlp_fp64
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from tests.support.tolerances import BF16_UNIT, relative_rms_bound, relative_rms_error, unit_roundoff

E4M3_UNIT = unit_roundoff(ElementFormat.E4M3)
SPLITS = [0, 37, 64, 1, 90]  # an empty expert, odd sizes
HIDDEN, FFN = 64, 96


def make_inputs(activation: Activation, bias: bool, with_probs: bool, seed: int = 0):
    torch.manual_seed(seed)
    split_sizes = torch.tensor(SPLITS)
    tokens = sum(SPLITS)
    fc1 = (2 if activation.gated else 1) * FFN
    x = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
    w1 = (torch.randn(len(SPLITS), fc1, HIDDEN) / HIDDEN**0.5).to(torch.bfloat16)
    w2 = (torch.randn(len(SPLITS), HIDDEN, FFN) / FFN**0.5).to(torch.bfloat16)
    b1 = (torch.randn(len(SPLITS), fc1) * 0.1).to(torch.bfloat16) if bias else None
    b2 = (torch.randn(len(SPLITS), HIDDEN) * 0.1).to(torch.bfloat16) if bias else None
    probs = torch.rand(tokens) if with_probs else None
    dy = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
    return x, split_sizes, probs, w1, b1, w2, b2, dy


ACTIVATIONS = ["swiglu", "geglu", "qgeglu", "srelu", Activation(ActivationKind.QGEGLU, limit=0.5, alpha=1.0, offset=0.25)]


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-tight-clamp")
@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), gmlp.MXFP8Recipe(grad_format=ElementFormat.E5M2), None],
                         ids=["mxfp8-e4m3", "mxfp8-e5m2-grads", "bf16"])
@pytest.mark.parametrize("bias,with_probs", [(False, True), (True, False)], ids=["probs", "bias"])
def test_oracle_against_fp64_autograd(activation, recipe, bias, with_probs):
    activation = activation_from(activation)
    x, split_sizes, probs, w1, b1, w2, b2, dy = make_inputs(activation, bias, with_probs)
    # implementation
    y, saved = grouped_mlp_forward_ref(x, split_sizes, probs, w1, b1, w2, b2, activation, recipe)
    grads = grouped_mlp_backward_ref(dy, saved, activation, recipe)
    # reference
    y64, leaves = unquantized_mlp_fp64(x, split_sizes, probs, w1, b1, w2, b2, activation)
    y64.backward(dy.double())
    x64, probs64, w1_64, b1_64, w2_64, b2_64 = leaves
    # expected error: one rounding per quantized operand on each result's path (tests/support/tolerances)
    act = E4M3_UNIT if recipe is not None else BF16_UNIT
    grad = unit_roundoff(recipe.grad_format) if recipe is not None else BF16_UNIT
    checks = {
        "y": (y, y64, [act, act, act, act, BF16_UNIT]),
        "dx": (grads.dx, x64.grad, [grad, act, BF16_UNIT, grad, act, BF16_UNIT]),
        "dw1": (grads.dw1, w1_64.grad, [grad, act, BF16_UNIT, grad, act]),
        "dw2": (grads.dw2, w2_64.grad, [grad, act, act, act]),
    }
    if with_probs:
        checks["dprobs"] = (grads.dprobs, probs64.grad, [grad, act, BF16_UNIT, act, act])
    if bias:
        checks["db1"] = (grads.db1, b1_64.grad, [grad, act, BF16_UNIT])
        checks["db2"] = (grads.db2, b2_64.grad, [BF16_UNIT])
    if activation.kind is ActivationKind.QGEGLU and activation.limit < 1:
        # act' jumps from 1 to 0 at the clamp, so a rounding of h (bf16 c, quantized operands)
        # flips it for every element within one rounding of the limit: the backward through act'
        # has no rounding-sized bound there. The jump itself is tested exactly in
        # test_activations; here only the results that do not go through act' are compared.
        checks = {name: check for name, check in checks.items() if name in ("y", "dw2", "dprobs")}
    errors = {name: relative_rms_error(got, want) for name, (got, want, _) in checks.items()}
    bounds = {name: relative_rms_bound(*units) for name, (_, _, units) in checks.items()}
    assert all(errors[n] <= bounds[n] for n in checks), f"relative RMS errors {errors} exceed {bounds}"
    # the empty expert's weights get exactly zero gradient
    assert not grads.dw1[0].any() and not grads.dw2[0].any()


def _module_and_inputs(activation="swiglu", bias=True, recipe=gmlp.MXFP8Recipe(), **kwargs):
    torch.manual_seed(1)
    mlp = gmlp.GroupedMLP(len(SPLITS), HIDDEN, FFN, activation=activation, bias=bias, recipe=recipe, **kwargs)
    x = torch.randn(sum(SPLITS), HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(sum(SPLITS), requires_grad=True)
    return mlp, x, torch.tensor(SPLITS), probs


def test_module_gradients_are_the_oracles(monkeypatch):
    monkeypatch.setenv("GMLP_BACKEND", "torch")  # the autograd wiring around the oracle, bit for bit
    mlp, x, split_sizes, probs = _module_and_inputs()
    dy = torch.randn(x.shape, dtype=torch.bfloat16)
    mlp(x, split_sizes, probs).backward(dy)
    y, saved = grouped_mlp_forward_ref(x.detach(), split_sizes, probs.detach(), mlp.w1.detach(), mlp.b1.detach(),
                                       mlp.w2.detach(), mlp.b2.detach(), mlp.activation, mlp.recipe)
    grads = grouped_mlp_backward_ref(dy, saved, mlp.activation, mlp.recipe)
    for name, got, want in (("x", x.grad, grads.dx), ("probs", probs.grad, grads.dprobs), ("w1", mlp.w1.grad, grads.dw1),
                            ("b1", mlp.b1.grad, grads.db1), ("w2", mlp.w2.grad, grads.dw2), ("b2", mlp.b2.grad, grads.db2)):
        assert got.dtype == (torch.float32 if name == "probs" else torch.bfloat16), name
        assert torch.equal(got, want.to(got.dtype)), name


def test_main_grad_accumulates_in_fp32(monkeypatch):
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    mlp, x, split_sizes, probs = _module_and_inputs(accumulate_main_grad=True)
    for param in mlp.parameters():
        param.main_grad = torch.zeros(param.shape, dtype=torch.float32)
    dy = torch.randn(x.shape, dtype=torch.bfloat16)
    for _ in range(2):
        mlp(x, split_sizes, probs).backward(dy)
    y, saved = grouped_mlp_forward_ref(x.detach(), split_sizes, probs.detach(), mlp.w1.detach(), mlp.b1.detach(),
                                       mlp.w2.detach(), mlp.b2.detach(), mlp.activation, mlp.recipe)
    once = grouped_mlp_backward_ref(dy, saved, mlp.activation, mlp.recipe)
    assert mlp.w1.grad is None and torch.equal(mlp.w1.main_grad, once.dw1 * 2)
    assert torch.equal(mlp.b2.main_grad, once.db2 * 2)


@pytest.mark.slow
def test_deterministic_and_state_dict_round_trip():
    mlp, x, split_sizes, probs = _module_and_inputs(activation="geglu")
    clone = gmlp.GroupedMLP(len(SPLITS), HIDDEN, FFN, activation="geglu", bias=True)
    clone.load_state_dict(copy.deepcopy(mlp.state_dict()))
    assert set(mlp.state_dict()) == {"w1", "w2", "b1", "b2"}
    assert tuple(mlp.w1.shape) == (len(SPLITS), 2 * FFN, HIDDEN) and tuple(mlp.w2.shape) == (len(SPLITS), HIDDEN, FFN)
    assert torch.equal(mlp(x, split_sizes, probs), clone(x, split_sizes, probs))


@pytest.mark.parametrize("call,error,match", [
    (lambda m, x, s, p: m(x.float(), s, p), TypeError, r"dtype torch.bfloat16, got x.dtype=torch.float32"),
    (lambda m, x, s, p: m(x[:, :32], s, p), ValueError, r"\(T, hidden_size=64\)"),
    (lambda m, x, s, p: m(x, s[:3], p), ValueError, r"split_sizes must have shape \(5,\)"),
    (lambda m, x, s, p: m(x, s.float(), p), TypeError, r"int32/int64"),
    (lambda m, x, s, p: m(x, s, p[:5]), ValueError, r"probs must have shape \(192,\) \(one per row of x\), got \(5,\)"),
    (lambda m, x, s, p: m(x, s, p.to("meta")), ValueError, r"probs must be on x's device cpu, got probs.device=.*meta"),
    (lambda m, x, s, p: m(x, s, p.tolist()), TypeError, r"probs must be None or a floating-point tensor .* got list"),
    (lambda m, x, s, p: m(x, s, (p > 0.5).int()), TypeError, r"probs must be None or a floating-point tensor .* got torch.int32"),
])
def test_bad_inputs(call, error, match):
    mlp, x, split_sizes, probs = _module_and_inputs()
    with pytest.raises(error, match=match):
        call(mlp, x, split_sizes, probs)


def test_bad_construction():
    with pytest.raises(ValueError, match="multiples of 32"):
        gmlp.GroupedMLP(4, 48, 64)
    with pytest.raises(TypeError, match=r"num_experts must be a positive int, got True \(bool\)"):
        gmlp.GroupedMLP(True, 64, 64)  # a bool is an int to Python, not a size
    with pytest.raises(TypeError, match=r"hidden_size must be a positive int, got 64.0 \(float\)"):
        gmlp.GroupedMLP(4, 64.0, 64)
    with pytest.raises(ValueError, match=r"ffn_hidden_size must be a positive int, got 0"):
        gmlp.GroupedMLP(4, 64, 0)
    with pytest.raises(ValueError, match="activation must be one of"):
        gmlp.GroupedMLP(4, 64, 64, activation="gelu")
    with pytest.raises(ValueError, match="accumulate_main_grad=True needs w1.main_grad"):
        mlp, x, split_sizes, probs = _module_and_inputs(accumulate_main_grad=True)
        mlp(x, split_sizes, probs)


def test_recipes_take_the_enums_values():
    """Settings files and command lines give strings: the enums' values are accepted, in any case."""
    assert gmlp.MXFP8Recipe(scale_mode="floor", grad_format="E5M2") == gmlp.MXFP8Recipe(ScaleMode.FLOOR,
                                                                                          ElementFormat.E5M2)
    with pytest.raises(ValueError, match=r"scale_mode must be one of \['rceil', 'floor'\] .* got 'round'"):
        gmlp.MXFP8Recipe(scale_mode="round")
    with pytest.raises(TypeError, match=r"grad_format must be a gmlp.ElementFormat or one of \['e4m3', 'e5m2'\], got 8"):
        gmlp.MXFP8Recipe(grad_format=8)


def test_quantize_takes_the_enums_values():
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    by_name = gmlp.quantize_mxfp8_ref(x, element_format="e5m2", scale_mode="floor")
    by_member = gmlp.quantize_mxfp8_ref(x, element_format=ElementFormat.E5M2, scale_mode=ScaleMode.FLOOR)
    assert by_name.rowwise.element_format is ElementFormat.E5M2 and by_name.rowwise.scale_mode is ScaleMode.FLOOR
    assert torch.equal(by_name.rowwise.data.view(torch.uint8), by_member.rowwise.data.view(torch.uint8))
    assert torch.equal(by_name.rowwise.scales, by_member.rowwise.scales)
    dispatched = gmlp.quantize_mxfp8(x, element_format="e5m2", scale_mode="floor")
    assert torch.equal(dispatched.rowwise.scales, by_member.rowwise.scales)
    with pytest.raises(ValueError, match=r"element_format must be one of \['e4m3', 'e5m2'\]"):
        gmlp.quantize_mxfp8(x, element_format="e3m4")


@pytest.mark.parametrize("recipe", [gmlp.MXFP8Recipe(), None], ids=["mxfp8", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_meta_inputs_give_meta_outputs(recipe, bias):
    """Model tracing and deferred init (FSDP2, torchtitan) call the layer on meta tensors: the
    shapes and dtypes come out, forward and backward, and nothing is read on the host (a meta
    tensor has no values: a host read would raise)."""
    mlp = gmlp.GroupedMLP(len(SPLITS), HIDDEN, FFN, bias=bias, recipe=recipe, device="meta")
    tokens = sum(SPLITS)
    x = torch.empty(tokens, HIDDEN, dtype=torch.bfloat16, device="meta", requires_grad=True)
    probs = torch.empty(tokens, dtype=torch.float32, device="meta", requires_grad=True)
    split_sizes = torch.empty(len(SPLITS), dtype=torch.int64, device="meta")
    y = mlp(x, split_sizes, probs)
    assert y.is_meta and y.shape == (tokens, HIDDEN) and y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.is_meta and x.grad.shape == x.shape and x.grad.dtype == x.dtype
    assert probs.grad.is_meta and probs.grad.shape == probs.shape and probs.grad.dtype == probs.dtype
    for name, param in mlp.named_parameters():
        assert param.grad.is_meta and param.grad.shape == param.shape and param.grad.dtype == param.dtype, name
    with pytest.raises(ValueError, match="weight_cache='update' with meta tensors"):
        mlp(x, split_sizes, probs, weight_cache="update")


def test_an_op_error_names_the_layer_tensor_it_is_about():
    """The ops name their own parameters ("x"); raised inside the layer, the error says at which
    op, so that the tensor is known (here the gradient dy, whose values are made at 'qdq dy')."""
    from gmlp.layer.steps import OpRunner

    mlp, x, split_sizes, _ = _module_and_inputs()
    run = OpRunner(mlp.plan(x, split_sizes))
    dy = torch.randn(x.shape[1], x.shape[0], dtype=torch.bfloat16).t()  # (T, H), not row-major
    with pytest.raises(ValueError, match=r"^gmlp layer, at its 'qdq dy' op: x must have contiguous rows"):
        run("qdq dy", dy, rowwise=True, columnwise=False, split_sizes=split_sizes, element_format=ElementFormat.E4M3,
            scale_mode=ScaleMode.RCEIL)
