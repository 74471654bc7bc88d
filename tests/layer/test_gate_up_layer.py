"""The layer with W1's gate and up stored apart (``gmlp.contract.gate_up``: torchtitan's two (E, F, H)
weights, or its interleaved (E, F, 2, H) one) gives the bits of gmlp's (E, 2F, H) halves with
the same values: y, dx, dprobs, dW2, and the gradients of gate and up equal the halves of dW1.
On the torch path (the spec's GEMMs in fp64) and on the Triton kernels (the interpreter on the
CPU), bf16 and MXFP8, the latter with the cross-check on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gmlp
from gmlp.contract.gate_up import GateUpLayout
from gmlp.cutedsl import import_error
from gmlp.debug import cross_check
from gmlp.layer import autograd
from tests.support.backends import kernel_device
from tests.support.cases import parametrize_quick, stored_gate_up
from tests.support.sm90 import on_sm90

SPLITS = [37, 0, 59]
E, H, F = len(SPLITS), 64, 96


def _step(mlp: gmlp.GroupedMLP, layout: GateUpLayout, x, split_sizes, probs, dy, main_grad: bool = False):
    """y and the gradients (dx, dprobs, dgate, dup, dw2) of one step with W1 stored as ``layout``."""
    gate, up = (t.detach().clone() for t in mlp.w1.chunk(2, dim=1))
    stored = stored_gate_up(layout, gate, up)
    w2 = mlp.w2.detach().clone()
    leaves = [t.requires_grad_() for t in (x.clone(), probs.clone(), *stored, w2)]
    if main_grad:
        for t in leaves[2:]:
            t.main_grad = torch.full(t.shape, 0.5, device=t.device)
    config = dataclasses.replace(mlp._config(None, None), gate_up=layout, accumulate_main_grad=main_grad)
    w3 = leaves[3] if layout is GateUpLayout.SEPARATE else None
    y = autograd.grouped_mlp(leaves[0], split_sizes, leaves[1], leaves[2], None, leaves[-1], None, config, w3=w3)[0]
    y.backward(dy)
    grads = [t.main_grad if main_grad else t.grad for t in leaves[2:]]
    if layout is GateUpLayout.HALVES:
        dgate, dup = grads[0].chunk(2, dim=1)
    elif layout is GateUpLayout.INTERLEAVED:
        dgate, dup = grads[0].unbind(2)
    else:
        dgate, dup = grads[0], grads[1]
    return y, leaves[0].grad, leaves[1].grad, dgate, dup, grads[-1]


def _inputs(device: torch.device):
    """x, probs, split_sizes and dy of one step on ``device``."""
    x, probs = torch.randn(sum(SPLITS), H).bfloat16(), torch.rand(sum(SPLITS))
    split_sizes, dy = torch.tensor(SPLITS), torch.randn(sum(SPLITS), H).bfloat16()
    return tuple(t.to(device) for t in (x, probs, split_sizes, dy))


@parametrize_quick("layout", [GateUpLayout.SEPARATE, GateUpLayout.INTERLEAVED], ids=lambda layout: layout.value)
@parametrize_quick("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16", "mxfp8"])
@pytest.mark.parametrize("backend", ["torch", "triton", pytest.param("default", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not on_sm90() or import_error() is not None,
                                        reason="needs an sm_90 GPU (H100/H200) and cutlass-dsl")])])
def test_layouts_give_the_halves_bits(monkeypatch, layout, recipe, backend):
    """"default" on an SM90 GPU: every site on the CuTeDSL kernels, the W1 sites reading and
    writing the views in place (``gmlp.cutedsl.sm90.support.site_reason``)."""
    if backend == "default":
        monkeypatch.delenv("GMLP_BACKEND", raising=False)
    else:
        monkeypatch.setenv("GMLP_BACKEND", backend)
    device = kernel_device() if backend != "torch" else torch.device("cpu")
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(E, H, F, recipe=recipe, device=device)
    x, probs, split_sizes, dy = _inputs(device)
    with cross_check(action="raise"):
        want = _step(mlp, GateUpLayout.HALVES, x, split_sizes, probs, dy)
        got = _step(mlp, layout, x, split_sizes, probs, dy)
    for name, mine, ref in zip(("y", "dx", "dprobs", "dgate", "dup", "dw2"), got, want):
        assert torch.equal(mine, ref), name


@parametrize_quick("layout", [GateUpLayout.SEPARATE, GateUpLayout.INTERLEAVED], ids=lambda layout: layout.value)
def test_main_grads_of_gate_and_up(monkeypatch, layout):
    """accumulate_main_grad adds dW1's gate and up rows into each weight's fp32 main_grad."""
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    torch.manual_seed(1)
    device = kernel_device()
    mlp = gmlp.GroupedMLP(E, H, F, recipe=None, device=device)
    x, probs, split_sizes, dy = _inputs(device)
    want = _step(mlp, GateUpLayout.HALVES, x, split_sizes, probs, dy, main_grad=True)
    got = _step(mlp, layout, x, split_sizes, probs, dy, main_grad=True)
    for name, mine, ref in zip(("dgate", "dup", "dw2"), got[3:], want[3:]):
        assert torch.equal(mine, ref), name


def test_a_layout_the_weights_do_not_fit_is_refused():
    mlp = gmlp.GroupedMLP(E, H, F, recipe=None)
    x, split_sizes = torch.zeros(sum(SPLITS), H).bfloat16(), torch.tensor(SPLITS)
    separate = dataclasses.replace(mlp._config(None, None), gate_up=GateUpLayout.SEPARATE)
    with pytest.raises(ValueError, match="w3 .* SEPARATE layout only, got layout SEPARATE and w3=None"):
        autograd.grouped_mlp(x, split_sizes, None, mlp.w1, None, mlp.w2, None, separate)
    with pytest.raises(ValueError, match="w3 .*SEPARATE only, and the layer's layout is HALVES"):
        autograd.grouped_mlp(x, split_sizes, None, mlp.w1, None, mlp.w2, None, mlp._config(None, None), w3=mlp.w1)


@parametrize_quick("recipe", [None, gmlp.MXFP8Recipe()], ids=["bf16", "mxfp8"])
def test_separate_gate_and_up_compile_without_graph_breaks(monkeypatch, recipe):
    """The ops' fake implementations know the layouts' saved state: torch.compile(fullgraph=True)
    of a step with two (E, F, H) weights gives eager's outputs and gradients."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    torch.manual_seed(2)
    mlp = gmlp.GroupedMLP(E, H, F, recipe=recipe)
    config = dataclasses.replace(mlp._config(None, None), gate_up=GateUpLayout.SEPARATE).encode()
    x, split_sizes = torch.randn(sum(SPLITS), H).bfloat16(), torch.tensor(SPLITS)

    def step(gate, up, w2):
        return autograd.grouped_mlp(x, split_sizes, None, gate, None, w2, None, config, w3=up)[0].float().square().sum()

    results = []
    for run in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        leaves = [t.detach().clone().requires_grad_() for t in (*mlp.w1.chunk(2, dim=1), mlp.w2)]
        loss = run(*leaves)
        loss.backward()
        results.append([loss, *(t.grad for t in leaves)])
    torch._dynamo.reset()
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


def test_unevenly_spaced_gate_rows_are_refused_by_the_quantize():
    """MXFP8 quantizes gate and up in place as (E * F, H) matrices: views whose experts are not
    F rows apart (the halves of another tensor passed as SEPARATE) are refused, not copied."""
    mlp = gmlp.GroupedMLP(E, H, F)
    config = dataclasses.replace(mlp._config(None, None), gate_up=GateUpLayout.SEPARATE)
    x, split_sizes = torch.zeros(sum(SPLITS), H).bfloat16(), torch.tensor(SPLITS)
    gate, up = mlp.w1.detach().chunk(2, dim=1)
    with pytest.raises(ValueError, match=r"W1's gate weights must be evenly spaced rows"):
        autograd.grouped_mlp(x, split_sizes, None, gate, None, mlp.w2, None, config, w3=up)
