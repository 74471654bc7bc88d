"""The Triton FC1 kernel (grouped GEMM + fused epilogue) against its reference twin.

Tolerance: the kernel accumulates in fp32 in its own order, the reference in fp64 (rounded
once); the two h differ by at most delta_h = H * 2**-24 * max sum_k |x_k w_k|. Through the
activation that becomes delta_a = delta_h * L, with L = 2 * max|h| + 2 a bound on |d act / d h|
for these activations over |h| <= max|h| (and probs <= 1). So c and bf16 a may differ from the
reference by one rounding step of their format plus that delta, and quantized a by one fp8 step
(or one E8M0 step of the scale, where a block's amax sits at a power of two) plus that delta.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gmlp.contract.activations import Activation, ActivationKind, activation_from
from gmlp.contract.gate_up import GateUpLayout, gate_up_views
from gmlp.contract.reference import fc1_forward_ref
from gmlp.debug.compare import gemm_delta
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from tests.support.backends import SMALL_GEMM, assert_outputs_bitwise_equal, kernel_device, triton_op
from tests.support.cases import parametrize_quick, stored_gate_up
from tests.support.tolerances import within_steps


@pytest.fixture
def fc1_forward():
    return triton_op("fc1", "fc1_forward")



ACTIVATIONS = ["swiglu", "geglu", "qgeglu", "srelu", Activation(ActivationKind.QGEGLU, limit=0.5)]


@parametrize_quick("activation", ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("recipe", [None, MXFP8Recipe()], ids=["bf16", "mxfp8"])
@parametrize_quick("bias,with_probs", [(True, True), (False, False)], ids=["bias-probs", "plain"])
def test_fc1_matches_reference(fc1_forward, activation, recipe, bias, with_probs):
    activation = activation_from(activation)
    device = kernel_device()
    splits = [0, 37, 64, 1, 90]
    tokens, hidden, ffn = sum(splits), 64, 96
    fc1_outputs = (2 if activation.gated else 1) * ffn
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1 = (torch.randn(len(splits), fc1_outputs, hidden, device=device) / 8).bfloat16()
    b1 = (torch.randn(len(splits), fc1_outputs, device=device) * 0.1).bfloat16() if bias else None
    probs = torch.rand(tokens, device=device) if with_probs else None
    if recipe is not None:  # MXFP8 operands as the layer hands them over: Q_row values, dequantized
        x = quantize_mxfp8_ref(x, rowwise=True, swizzle=False).rowwise.dequantize().bfloat16()
        w1 = quantize_mxfp8_ref(w1.reshape(-1, hidden), rowwise=True, swizzle=False).rowwise.dequantize().bfloat16()
        w1 = w1.view(len(splits), fc1_outputs, hidden)
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, recipe=recipe, b1=b1, probs=probs)
    got = fc1_forward(x, w1, split_sizes, tiling=SMALL_GEMM, **kwargs)
    # the other launch order computes every tile the same way
    assert_outputs_bitwise_equal(
        got, fc1_forward(x, w1, split_sizes, tiling=dataclasses.replace(SMALL_GEMM, n_fastest=not SMALL_GEMM.n_fastest), **kwargs))
    want = fc1_forward_ref(x, w1, split_sizes, **kwargs)
    # accumulation-order bound (module docstring)
    magnitude = max((x.float().abs() @ w1[g].float().abs().t()).max().item() for g in range(len(splits)))
    delta_h = gemm_delta(magnitude, hidden)
    delta_a = delta_h * (2 * want.c.float().abs().max().item() + 2)
    assert got.c.shape == want.c.shape and got.c.dtype == torch.bfloat16
    assert within_steps(got.c, want.c, 2.0**-7, delta_h)  # a bf16 step is at most 2**-7 |v|
    if recipe is None:
        assert within_steps(got.a, want.a, 2.0**-7, delta_a)
        return
    for axis in ("a_rowwise", "a_columnwise"):
        mine, ref = getattr(got, axis), getattr(want, axis)
        assert mine.data.shape == ref.data.shape and mine.scales.shape == ref.scales.shape, axis
        scale_steps = (mine.scales.int() - ref.scales.int()).abs()
        assert int(scale_steps.max()) <= 1, f"{axis}: a scale differs by more than one power of two"
        # one fp8 step (2**-3 relative for E4M3 normals), or one scale step: factor 2
        assert within_steps(mine.dequantize(), ref.dequantize(), 1.0 if scale_steps.any() else 2.0**-3, delta_a), axis


@pytest.mark.parametrize("layout", list(GateUpLayout), ids=lambda layout: layout.value)
@parametrize_quick("recipe", [None, MXFP8Recipe()], ids=["bf16", "mxfp8"])
def test_fc1_reads_every_gate_up_layout_in_place(fc1_forward, layout, recipe):
    """W1's gate and up in any ``gmlp.contract.gate_up`` layout, read through strided views: outputs bit for
    bit those of gmlp's (E, 2F, H) halves with the same values."""
    device = kernel_device()
    splits = [37, 0, 91]
    tokens, hidden, ffn, experts = sum(splits), 64, 96, len(splits)
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    gate, up = ((torch.randn(experts, ffn, hidden, device=device) / 8).bfloat16() for _ in range(2))
    stored = stored_gate_up(layout, gate, up)
    views = gate_up_views(layout, *stored)
    storage = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert storage(views.gate) == storage(stored[0]) and storage(views.up) == storage(stored[-1])  # views, no copy
    kwargs = dict(ffn_hidden_size=ffn, activation=activation_from("swiglu"), recipe=recipe, probs=torch.rand(tokens, device=device))
    want = fc1_forward(x, torch.cat([gate, up], 1), split_sizes, tiling=SMALL_GEMM, **kwargs)
    assert_outputs_bitwise_equal(fc1_forward(x, views, split_sizes, tiling=SMALL_GEMM, **kwargs), want)


@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
def test_fc1_reads_a_transposed_w1_in_place(fc1_forward, activation):
    """W1 stored transposed, (E, H, N1), and passed as its (E, N1, H) view (last stride N1, not 1):
    bit for bit the outputs of the contiguous W1 with the same values."""
    activation = activation_from(activation)
    device = kernel_device()
    splits = [37, 0, 91]
    tokens, hidden, ffn, experts = sum(splits), 64, 96, len(splits)
    n1 = (2 if activation.gated else 1) * ffn
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1_t = (torch.randn(experts, hidden, n1, device=device) / 8).bfloat16().transpose(1, 2)
    assert w1_t.stride(-1) == n1
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, recipe=None, tiling=SMALL_GEMM)
    assert_outputs_bitwise_equal(fc1_forward(x, w1_t, split_sizes, **kwargs),
                                 fc1_forward(x, w1_t.contiguous(), split_sizes, **kwargs))


def test_fc1_refuses_gate_up_views_it_cannot_read(fc1_forward):
    device = kernel_device()
    x, split_sizes = torch.zeros(4, 64, device=device).bfloat16(), torch.tensor([4], device=device)
    views = gate_up_views(GateUpLayout.SEPARATE, *(torch.zeros(1, 32, 64, device=device).bfloat16() for _ in range(2)))
    with pytest.raises(ValueError, match="not gated"):
        fc1_forward(x, views, split_sizes, ffn_hidden_size=32, activation=activation_from("srelu"), recipe=None)
    with pytest.raises(ValueError, match=r"\(48, 64\) matrices, got \(32, 64\)"):
        fc1_forward(x, views, split_sizes, ffn_hidden_size=48, activation=activation_from("swiglu"), recipe=None)
