"""The Triton FC1 of the FP8 blockwise recipe (grouped GEMM promoted every 128, fused activation,
probs and Q(a) both ways) against its reference twin.

Where the GEMM is exact (small integers times powers of two: every partial sum is an integer
below 2**24 times one power of two), h is the reference's to the bit, and with srelu (one
rounded product) so are a and its quantizations: checked bit for bit. Elsewhere the kernel's h
differs from the fp64 one by its summation error (``test_blockwise_gemm``'s bound) and a by that
times the activation's slope; c is then within one bf16 step of the reference plus that error, and
each dequantized element of Q(a) within one E4M3 step either side (2**-3 of the value) plus the
format's smallest step at the block's scale, plus the error carried through.
"""

from __future__ import annotations

import pytest
import torch

from gmlp.contract.activations import activation_from
from gmlp.contract.blockwise_reference import fc1_forward_blockwise_ref
from gmlp.debug.compare import activation_slope
from gmlp.fp8_blockwise.gemm import grouped_gemm_blockwise_ref
from gmlp.fp8_blockwise.reference import (
    quantize_fp8_blockwise_ref,
    quantize_weights_fp8_blockwise_ref,
)
from gmlp.fp8_blockwise.tensor import absolute
from tests.support.backends import kernel_device, triton_op
from tests.support.blockwise import on_device, summation_error

SPLITS = [0, 1, 127, 128, 129, 0]
E4M3_SMALLEST_STEP = 2.0**-9


@pytest.fixture
def fc1():
    return triton_op("blockwise_fc1", "fc1_forward_blockwise")




def _run(fc1, x, w1, splits, activation, ffn, bias, probs):
    device = kernel_device()
    split_sizes = torch.tensor(splits)
    kwargs = dict(ffn_hidden_size=ffn, activation=activation)
    want = fc1_forward_blockwise_ref(x, w1, split_sizes, b1=bias, probs=probs, **kwargs)
    got = fc1(on_device(x, device), on_device(w1, device), split_sizes.to(device),
              b1=None if bias is None else bias.to(device), probs=None if probs is None else probs.to(device), **kwargs)
    return got, want


@pytest.mark.parametrize("with_extras", [True, False], ids=["bias-probs", "plain"])
def test_exact_gemm_gives_the_reference_bit_for_bit(fc1, with_extras):
    generator = torch.Generator().manual_seed(0)
    tokens, hidden, ffn, experts = sum(SPLITS), 256, 256, len(SPLITS)
    x = torch.randint(-7, 8, (tokens, hidden), generator=generator).bfloat16()
    w1 = torch.randint(-7, 8, (experts, ffn, hidden), generator=generator).bfloat16()
    bias = torch.randint(-64, 64, (experts, ffn), generator=generator).bfloat16() if with_extras else None
    probs = torch.rand(tokens, generator=generator) if with_extras else None
    q_x = quantize_fp8_blockwise_ref(x).rowwise
    got, want = _run(fc1, q_x, quantize_weights_fp8_blockwise_ref(w1), SPLITS, activation_from("srelu"), ffn, bias,
                     probs)
    assert torch.equal(got.c.cpu(), want.c)
    for axis in ("a_rowwise", "a_columnwise"):
        g, w = getattr(got, axis), getattr(want, axis)
        assert torch.equal(g.data.view(torch.uint8).cpu(), w.data.view(torch.uint8)), axis
        assert torch.equal(g.scale_inv.view(torch.int32).cpu(), w.scale_inv.view(torch.int32)), axis


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "qgeglu", "srelu"])
def test_within_the_derived_bound(fc1, activation):
    activation = activation_from(activation)
    generator = torch.Generator().manual_seed(1)
    tokens, hidden, ffn, experts = sum(SPLITS), 256, 128, len(SPLITS)
    n1 = (2 if activation.gated else 1) * ffn
    x = torch.randn(tokens, hidden, generator=generator).bfloat16()
    w1 = torch.randn(experts, n1, hidden, generator=generator) / 16
    w1[:, ffn:] *= 8  # gate and up tiles with scales apart
    w1[:, :, 128:] /= 4  # and each k-block's
    w1 = w1.bfloat16()
    bias = (torch.randn(experts, n1, generator=generator) / 4).bfloat16()
    probs = torch.rand(tokens, generator=generator)
    q_x, q_w = quantize_fp8_blockwise_ref(x).rowwise, quantize_weights_fp8_blockwise_ref(w1)
    got, want = _run(fc1, q_x, q_w, SPLITS, activation, ffn, bias, probs)
    gpu = kernel_device().type == "cuda"
    magnitude = grouped_gemm_blockwise_ref(absolute(q_x), absolute(q_w), torch.tensor(SPLITS),
                                           out_dtype=torch.float64).float()
    delta_h = magnitude * summation_error(hidden, gpu)  # test_blockwise_gemm's bound
    c_error = (got.c.cpu().float() - want.c.float()).abs()
    assert (c_error <= 2.0**-8 * want.c.float().abs() * 2 + delta_h * 1.01).all()
    # first order: |d act| <= slope * (|d gate| + |d up|), the slope bounded over the interval h lies in
    slope = activation_slope(want.c.float().abs() + delta_h, activation)
    delta_a = slope * (sum(delta_h.chunk(2, dim=1)) if activation.gated else delta_h)
    for axis in ("a_rowwise", "a_columnwise"):
        g, w = getattr(got, axis), getattr(want, axis)
        values, reference = g.dequantize().cpu(), w.dequantize()
        step = E4M3_SMALLEST_STEP * torch.maximum(g.element_scales().cpu(), w.element_scales()) * 2
        assert ((values - reference).abs() <= 2.0**-3 * reference.abs() + step + delta_a * 1.2).all(), axis
