"""GroupedMLP's autograd as PyTorch's own (gmlp.layer.autograd: register_autograd, save_for_backward): the
saved state follows autograd's rules (freed after a backward, kept with retain_graph), torch.func
and vmap give what PyTorch gives for a custom op, and gradcheck holds in float64 on the torch path."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

import gmlp
from tests.support.cases import parametrize_quick

RECIPES = [None, gmlp.MXFP8Recipe()]
RECIPE_IDS = ["bf16", "mxfp8"]
SPLITS = [10, 0, 14]  # T = 24, an empty expert


def _module_and_inputs(recipe):
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(len(SPLITS), 64, 64, recipe=recipe)
    x = torch.randn(sum(SPLITS), 64, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(sum(SPLITS), requires_grad=True)
    dy = torch.randn(sum(SPLITS), 64, dtype=torch.bfloat16)
    return mlp, x, torch.tensor(SPLITS), probs, dy


def _grads(mlp, x, probs):
    return [t.grad.clone() for t in (x, probs, mlp.w1, mlp.w2)]


@parametrize_quick("recipe", RECIPES, ids=RECIPE_IDS)
def test_second_backward_without_retain_graph_is_pytorchs_error(recipe):
    mlp, x, split_sizes, probs, dy = _module_and_inputs(recipe)
    y = mlp(x, split_sizes, probs)
    y.backward(dy)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward(dy)


@parametrize_quick("recipe", RECIPES, ids=RECIPE_IDS)
def test_retain_graph_keeps_the_state_for_a_second_backward(recipe):
    mlp, x, split_sizes, probs, dy = _module_and_inputs(recipe)
    y = mlp(x, split_sizes, probs)
    y.backward(dy, retain_graph=True)
    once = _grads(mlp, x, probs)
    y.backward(dy)  # accumulates: twice the same gradients (doubling is exact)
    for name, got, first in zip(("x", "probs", "w1", "w2"), _grads(mlp, x, probs), once):
        assert first.any(), name
        assert torch.equal(got, 2 * first), name


@parametrize_quick("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16", "mxfp8"])
def test_torch_func_grad_equals_autograd(recipe):
    """torch.func.grad runs through the layer's autograd.Function (its backward calls the
    backward op on the tensors under functorch's wrappers) and gives autograd's gradient."""
    mlp, x, split_sizes, probs, _ = _module_and_inputs(recipe)
    grad = torch.func.grad(lambda inputs: mlp(inputs, split_sizes, probs.detach()).float().sum())(x.detach())
    leaf = x.detach().clone().requires_grad_()
    mlp(leaf, split_sizes, probs.detach()).float().sum().backward()
    assert torch.equal(grad, leaf.grad)


def test_vmap_and_jvp_are_clear_errors():
    mlp, x, split_sizes, probs, _ = _module_and_inputs(None)
    batch = torch.stack([x.detach(), x.detach().flip(0)])
    with pytest.raises(NotImplementedError, match="no batching rule for torch.func.vmap"):
        torch.func.vmap(lambda inputs: mlp(inputs, split_sizes, probs.detach()))(batch)
    with pytest.raises(RuntimeError, match="jvp"):  # forward-mode AD: not implemented, never a silent zero
        torch.func.jvp(lambda inputs: mlp(inputs, split_sizes, probs.detach()), (x.detach(),), (torch.ones_like(x),))


@pytest.mark.slow  # about 1300 perturbed layer calls a case: 9 s each on an idle 2-core machine
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_gradcheck_float64_on_the_torch_path(monkeypatch, bias):
    """recipe=None computes in the parameters' dtype on the torch path: float64 passes gradcheck
    for x, probs and the parameters."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    torch.manual_seed(0)
    splits = [4, 0, 2]  # T = 6, an empty expert
    mlp = gmlp.GroupedMLP(len(splits), 8, 8, bias=bias, recipe=None, dtype=torch.float64)
    split_sizes = torch.tensor(splits)
    x = torch.randn(sum(splits), 8, dtype=torch.float64, requires_grad=True)
    probs = torch.rand(sum(splits), dtype=torch.float64, requires_grad=True)
    names = ["w1", "w2"] + (["b1", "b2"] if bias else [])
    params = []
    for name in names:
        param = getattr(mlp, name).detach().clone()
        if name.startswith("b"):
            param.normal_(0, 0.5)  # zero-initialised: give the biases values
        params.append(param.requires_grad_())

    def layer(x, probs, *params):
        return functional_call(mlp, dict(zip(names, params)), (x, split_sizes, probs))

    assert layer(x, probs, *params).dtype == torch.float64
    assert torch.autograd.gradcheck(layer, (x, probs, *params))


def test_an_eager_call_binds_no_signature(monkeypatch):
    """Host time: an eager call enters autograd without ``Function.apply``'s per-call
    ``inspect.signature`` of forward (every argument is given positionally), and still records
    the backward: the gradients are autograd's."""
    import inspect

    mlp, x, split_sizes, probs, dy = _module_and_inputs(None)
    mlp(x, split_sizes, probs)  # the first call (planning, caches) may inspect what it likes
    calls, signature = [], inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *args, **kwargs: calls.append(args) or signature(*args, **kwargs))
    y = mlp(x, split_sizes, probs)
    assert calls == [] and y.grad_fn is not None
    y.backward(dy)
    assert x.grad is not None and probs.grad is not None and mlp.w1.grad is not None


@parametrize_quick("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_activation_checkpointing_gives_the_same_gradients(recipe, reentrant):
    """``torch.utils.checkpoint`` recomputes the forward in the backward (its saved tensors are
    the recomputation's): the plain call's gradients, bit for bit."""
    mlp, x, split_sizes, probs, dy = _module_and_inputs(recipe)
    mlp(x, split_sizes, probs).backward(dy)
    plain = _grads(mlp, x, probs)
    for t in (x, probs, mlp.w1, mlp.w2):
        t.grad = None
    torch.utils.checkpoint.checkpoint(mlp, x, split_sizes, probs, use_reentrant=reentrant).backward(dy)
    for name, got, want in zip(("x", "probs", "w1", "w2"), _grads(mlp, x, probs), plain):
        assert torch.equal(got, want), name
