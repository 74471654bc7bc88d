"""The Triton FC2 dgrad of the FP8 blockwise recipe (grouped GEMM promoted every 128, fused
activation backward, dprobs, Q(dh) both ways, db1) against its reference twin.

Where the GEMM is exact (small integers times powers of two), da is the reference's to the bit,
and with srelu (dh = da * probs * 2 * relu(c), the same rounded products in both) so are dh and
its quantizations: checked bit for bit. Elsewhere da differs from the fp64 one by the GEMM's
summation error (``test_blockwise_gemm``'s bound), dh by that times the activation's slope, and
each dequantized element of Q(dh) is within one fp8 step either side plus the format's smallest
step at the block's scale plus that error; dprobs and db1 are fp32 sums in the kernel's order.
"""

from __future__ import annotations

import pytest
import torch

from gmlp.contract.activations import activation_from
from gmlp.contract.blockwise_reference import fc2_dgrad_blockwise_ref
from gmlp.debug.compare import activation_slope
from gmlp.fp8_blockwise.gemm import grouped_gemm_blockwise_ref
from gmlp.fp8_blockwise.reference import (
    quantize_fp8_blockwise_ref,
    quantize_weights_fp8_blockwise_ref,
)
from gmlp.fp8_blockwise.tensor import absolute
from gmlp.mxfp8.spec import ElementFormat
from tests.support.backends import kernel_device, triton_op
from tests.support.blockwise import on_device, summation_error

SPLITS = [0, 1, 127, 128, 129, 0]


@pytest.fixture
def fc2_dgrad():
    return triton_op("blockwise_fc2_dgrad", "fc2_dgrad_blockwise")




def _run(fc2_dgrad, dy, w2t, c, probs, activation, grad_format):
    device = kernel_device()
    split_sizes = torch.tensor(SPLITS)
    kwargs = dict(activation=activation, grad_format=grad_format, bias_grad=True)
    want = fc2_dgrad_blockwise_ref(dy, w2t, c, split_sizes, probs=probs, **kwargs)
    got = fc2_dgrad(on_device(dy, device), on_device(w2t, device), c.to(device), split_sizes.to(device),
                    probs=None if probs is None else probs.to(device), **kwargs)
    return got, want


@pytest.mark.parametrize("grad_format", ["e4m3", "e5m2"])
def test_exact_gemm_gives_the_reference_bit_for_bit(fc2_dgrad, grad_format):
    generator = torch.Generator().manual_seed(0)
    tokens, hidden, ffn, experts = sum(SPLITS), 256, 256, len(SPLITS)
    dy = quantize_fp8_blockwise_ref(torch.randint(-7, 8, (tokens, hidden), generator=generator).bfloat16(),
                                    element_format=grad_format).rowwise
    w2 = torch.randint(-7, 8, (experts, hidden, ffn), generator=generator).bfloat16()
    w2t = quantize_weights_fp8_blockwise_ref(w2).transpose()
    c = torch.randint(-8, 9, (tokens, ffn), generator=generator).bfloat16()
    probs = torch.rand(tokens, generator=generator)
    got, want = _run(fc2_dgrad, dy, w2t, c, probs, activation_from("srelu"), grad_format)
    for axis in ("dh_rowwise", "dh_columnwise"):
        g, w = getattr(got, axis), getattr(want, axis)
        assert g.data.dtype == ElementFormat(grad_format).torch_dtype
        assert torch.equal(g.data.view(torch.uint8).cpu(), w.data.view(torch.uint8)), axis
        assert torch.equal(g.scale_inv.view(torch.int32).cpu(), w.scale_inv.view(torch.int32)), axis


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "qgeglu", "srelu"])
def test_within_the_derived_bound(fc2_dgrad, activation):
    activation = activation_from(activation)
    generator = torch.Generator().manual_seed(1)
    tokens, hidden, ffn, experts = sum(SPLITS), 256, 128, len(SPLITS)
    n1 = (2 if activation.gated else 1) * ffn
    dy = torch.randn(tokens, hidden, generator=generator)
    dy[:, 128:] *= 16  # each k-block's scales apart
    q_dy = quantize_fp8_blockwise_ref(dy.bfloat16()).rowwise
    w2 = torch.randn(experts, hidden, ffn, generator=generator) / 16
    w2[:, 128:] /= 8
    q_w2t = quantize_weights_fp8_blockwise_ref(w2.bfloat16()).transpose()
    c = (torch.randn(tokens, n1, generator=generator) * 2).bfloat16()
    probs = torch.rand(tokens, generator=generator)
    got, want = _run(fc2_dgrad, q_dy, q_w2t, c, probs, activation, "e4m3")
    gpu = kernel_device().type == "cuda"
    split_sizes = torch.tensor(SPLITS)
    magnitude = grouped_gemm_blockwise_ref(absolute(q_dy), absolute(q_w2t), split_sizes, out_dtype=torch.float64)
    delta_da = (magnitude * summation_error(hidden, gpu)).float()
    da_abs = magnitude.float()  # |da| <= the sum of |products|
    act = activation.forward(c.float()).abs()
    # dprobs: da's error times |act|, plus the fp32 sum's over F terms
    dprobs_bound = (delta_da * act).sum(1) + ffn * 2.0**-24 * 2 * (da_abs * act).sum(1)
    assert ((got.dprobs.cpu() - want.dprobs).abs() <= dprobs_bound).all()
    slope = activation_slope(c.float(), activation)
    slope = torch.cat([slope, slope], 1) if activation.gated else slope
    delta_dh = slope * torch.cat([delta_da, delta_da], 1)[:, :n1] * probs[:, None]
    for axis in ("dh_rowwise", "dh_columnwise"):
        g, w = getattr(got, axis), getattr(want, axis)
        values, reference = g.dequantize().cpu(), w.dequantize()
        step = 2.0**-9 * torch.maximum(g.element_scales().cpu(), w.element_scales()) * 2
        assert ((values - reference).abs() <= 2.0**-3 * reference.abs() + step + delta_dh * 1.2).all(), axis
    dh_magnitude = (slope * da_abs.repeat(1, n1 // ffn) * probs[:, None]).split(SPLITS)
    bound = torch.stack([part.sum(0) for part in dh_magnitude])
    delta_db1 = torch.stack([part.sum(0) for part in delta_dh.split(SPLITS)])
    assert ((got.db1.cpu() - want.db1).abs() <= max(SPLITS) * 2.0**-24 * 2 * bound + delta_db1 * 1.2 + 1e-30).all()
