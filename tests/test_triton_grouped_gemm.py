"""The Triton grouped GEMM (FC2 forward, FC1 dgrad) against its reference twin.

Tolerance as in test_triton_fc1: the fp32 accumulation order moves a result by at most
delta = K * 2**-24 * max sum_k |a_k b_k|, and the bf16 output may then round one step
(at most 2**-7 |v|) away from the reference's.
"""

from __future__ import annotations

import pytest
import torch

from gmlp.mlp_ref import grouped_gemm_ref
from gmlp.quantize_ref import quantize_mxfp8_ref
from tests.backends import kernel_device, triton_op


@pytest.fixture
def grouped_gemm():
    return triton_op("grouped_gemm", "grouped_gemm")


@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "mxfp8"])
@pytest.mark.parametrize("n,k,bias", [(64, 96, True), (96, 64, False), (40, 32, False)], ids=["fc2-like", "dgrad-like", "odd-n"])
def test_grouped_gemm_matches_reference(grouped_gemm, quantized, n, k, bias):
    device = kernel_device()
    splits = [0, 37, 64, 1, 90]
    split_sizes = torch.tensor(splits, device=device)
    a = torch.randn(sum(splits), k, device=device).bfloat16()
    b = (torch.randn(len(splits), n, k, device=device) / 8).bfloat16()
    bias_values = (torch.randn(len(splits), n, device=device) * 0.1).bfloat16() if bias else None
    a_values, b_values = a.float(), b.float()
    if quantized:
        a = quantize_mxfp8_ref(a, rowwise=True, swizzle=False).rowwise
        b = quantize_mxfp8_ref(b.reshape(-1, k).contiguous(), rowwise=True, swizzle=False).rowwise
        a_values, b_values = a.dequantize(), b.dequantize().reshape(len(splits), n, k)
    got = grouped_gemm(a, b, split_sizes, bias=bias_values, block_n=32, block_k=32)
    want = grouped_gemm_ref(a, b, split_sizes, bias=bias_values)
    magnitude = max((a_values.abs() @ b_values[g].abs().t()).max().item() for g in range(len(splits)))
    delta = k * 2.0**-24 * magnitude
    assert got.shape == want.shape == (sum(splits), n) and got.dtype == torch.bfloat16
    assert bool(((got.float() - want.float()).abs() <= 2.0**-7 * want.float().abs() + delta).all())


def test_grouped_gemm_rejects_mismatched_operands(grouped_gemm):
    device = kernel_device()
    with pytest.raises(ValueError, match=r"b must hold \(E=2\) x \(N, K=64\)"):
        grouped_gemm(torch.zeros(8, 64, device=device).bfloat16(), torch.zeros(2, 4, 32, device=device).bfloat16(),
                     torch.tensor([4, 4], device=device))
