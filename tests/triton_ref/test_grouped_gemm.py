"""The Triton grouped GEMM (FC2 forward, FC1 dgrad) against its reference twin.

Tolerance as in tests/triton_ref/test_fc1.py: the fp32 accumulation order moves a result by at most
delta = K * 2**-24 * max sum_k |a_k b_k|, and the bf16 output may then round one step
(at most 2**-7 |v|) away from the reference's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gmlp.contract.reference import expert_matrices, grouped_gemm_ref
from gmlp.debug.compare import gemm_delta
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from tests.support.backends import SMALL_GEMM, kernel_device, triton_op


@pytest.fixture
def grouped_gemm():
    return triton_op("grouped_gemm", "grouped_gemm")


def expert_weights(experts: int, n: int, k: int, transposed: bool, device) -> torch.Tensor:
    """B_g (N, K) per expert in one of the forms the GEMMs read: stacked rows (E, N, K), or,
    transposed, a transposed view of a weight W (E, K, N) with B_g = W_g^T."""
    if not transposed:
        return (torch.randn(experts, n, k, device=device) / 8).bfloat16()
    return (torch.randn(experts, k, n, device=device) / 8).bfloat16().transpose(1, 2)


@pytest.mark.parametrize("transposed", [False, True], ids=["stacked", "transposed-weight"])
@pytest.mark.parametrize("n,k,bias", [(64, 96, True), (96, 64, False), (40, 32, False)], ids=["fc2-like", "dgrad-like", "odd-n"])
def test_grouped_gemm_matches_reference(grouped_gemm, transposed, n, k, bias):
    device = kernel_device()
    splits = [0, 37, 64, 1, 90]
    split_sizes = torch.tensor(splits, device=device)
    a = torch.randn(sum(splits), k, device=device).bfloat16()
    b = expert_weights(len(splits), n, k, transposed, device)
    bias_values = (torch.randn(len(splits), n, device=device) * 0.1).bfloat16() if bias else None
    got = grouped_gemm(a, b, split_sizes, bias=bias_values, tiling=SMALL_GEMM)
    want = grouped_gemm_ref(a, b, split_sizes, bias=bias_values)
    magnitude = max((a.float().abs() @ b[g].float().abs().t()).max().item() for g in range(len(splits)))
    delta = gemm_delta(magnitude, k)
    assert got.shape == want.shape == (sum(splits), n) and got.dtype == torch.bfloat16
    assert bool(((got.float() - want.float()).abs() <= 2.0**-7 * want.float().abs() + delta).all())


def test_grouped_gemm_refuses_mxfp8_operands(grouped_gemm):
    """MXFP8 operands are dequantized before the GEMM; handing one over is a clear error."""
    device = kernel_device()
    a = quantize_mxfp8_ref(torch.randn(8, 64, device=device).bfloat16(), rowwise=True, swizzle=False).rowwise
    with pytest.raises(TypeError, match=r"a must be a contiguous bf16 matrix \(MXFP8 operands are dequantized first"):
        grouped_gemm(a, torch.zeros(2, 4, 64, device=device).bfloat16(), torch.tensor([4, 4], device=device))


@pytest.mark.parametrize("n_fastest", [False, True], ids=["rows-fastest", "columns-fastest"])
def test_launch_order_does_not_change_the_result(grouped_gemm, n_fastest):
    """Both grid orders compute every tile once, the same way: bitwise equal results."""
    device = kernel_device()
    splits = [0, 37, 64, 1, 90]
    a = torch.randn(sum(splits), 64, device=device).bfloat16()
    b = (torch.randn(len(splits), 96, 64, device=device) / 8).bfloat16()
    split_sizes = torch.tensor(splits, device=device)
    tiling = dataclasses.replace(SMALL_GEMM, n_fastest=n_fastest)
    assert torch.equal(grouped_gemm(a, b, split_sizes, tiling=tiling), grouped_gemm(a, b, split_sizes, tiling=SMALL_GEMM))


def test_grouped_gemm_rejects_mismatched_operands(grouped_gemm):
    device = kernel_device()
    with pytest.raises(ValueError, match=r"b must hold 2 experts' \(N, K=64\) matrices, got \(4, 32\)"):
        grouped_gemm(torch.zeros(8, 64, device=device).bfloat16(), torch.zeros(2, 4, 32, device=device).bfloat16(),
                     torch.tensor([4, 4], device=device))


def test_expert_matrices_forms_agree():
    """The transposed forms give the same B_g as the stacked ones, bf16 exactly and Q_col as Q_row
    of the per-expert transposes (same blocks, since K is a multiple of 32)."""
    w = (torch.randn(3, 64, 96) / 8).bfloat16()  # W (E, K, N): B_g = W_g^T (N, K)
    stacked = w.transpose(1, 2).contiguous()
    assert torch.equal(expert_matrices(w.transpose(1, 2), 3), expert_matrices(stacked, 3))
    q_col = quantize_mxfp8_ref(w.reshape(-1, 96), rowwise=False, columnwise=True, swizzle=False).columnwise
    q_row = quantize_mxfp8_ref(stacked.reshape(-1, 64), rowwise=True, swizzle=False).rowwise
    assert torch.equal(expert_matrices(q_col, 3), expert_matrices(q_row, 3))


def test_expert_matrices_of_gate_up_forms():
    """W1 as its gate and up views, and W1^T as two operands side by side along K, give the
    values of the (E, 2F, H) halves and of their transpose."""
    from gmlp.contract.gate_up import GateUpLayout, gate_up_views

    gate, up = ((torch.randn(3, 32, 64) / 8).bfloat16() for _ in range(2))
    halves = torch.cat([gate, up], 1)
    assert torch.equal(expert_matrices(gate_up_views(GateUpLayout.SEPARATE, gate, up), 3), expert_matrices(halves, 3))
    pair = (gate.transpose(1, 2), up.transpose(1, 2))
    assert torch.equal(expert_matrices(pair, 3), expert_matrices(halves.transpose(1, 2), 3))


def test_invalid_tilings_are_refused_when_made():
    from gmlp.triton_ref.quantize import QuantizeConfig
    from gmlp.triton_ref.tuning import GemmTiling, WgradTiling

    with pytest.raises(ValueError, match="block_n and block_k must be multiples of 32"):
        GemmTiling(block_n=48, block_k=64, num_warps=4, num_stages=3)
    with pytest.raises(ValueError, match="block_t must be a multiple of 16"):
        WgradTiling(block_m=64, block_n=64, block_t=24, num_warps=4, num_stages=3)
    with pytest.raises(ValueError, match="invalid quantize config"):
        QuantizeConfig(chunks_per_program=0)


@pytest.mark.parametrize("ffn,block_k", [(48, 32), (64, 32), (40, 64)], ids=["straddling", "aligned", "inside-one-tile"])
def test_operands_side_by_side_along_k_give_the_single_operands_bits(grouped_gemm, ffn, block_k):
    """FC1 dgrad with W1's gate and up stored apart: B_g = [gate_g^T | up_g^T] as two transposed
    views, bit for bit the GEMM of one (E, H, 2F) operand, whether a k-tile straddles the seam
    (F = 48, 32-wide tiles), ends on it (F = 64) or holds all of both (F = 40, 64-wide tiles)."""
    device = kernel_device()
    splits = [37, 0, 130]
    split_sizes = torch.tensor(splits, device=device)
    hidden, experts = 40, len(splits)
    dh = torch.randn(sum(splits), 2 * ffn, device=device).bfloat16()
    gate, up = ((torch.randn(experts, ffn, hidden, device=device) / 8).bfloat16() for _ in range(2))
    tiling = dataclasses.replace(SMALL_GEMM, block_k=block_k)
    want = grouped_gemm(dh, torch.cat([gate, up], 1).transpose(1, 2), split_sizes, tiling=tiling)
    got = grouped_gemm(dh, (gate.transpose(1, 2), up.transpose(1, 2)), split_sizes, tiling=tiling)
    assert torch.equal(got, want)


def test_side_by_side_operands_must_fit_a(grouped_gemm):
    device = kernel_device()
    a, split_sizes = torch.zeros(4, 64, device=device).bfloat16(), torch.tensor([4], device=device)
    halves = [torch.zeros(1, 16, 32, device=device).bfloat16(), torch.zeros(1, 16, 24, device=device).bfloat16()]
    with pytest.raises(ValueError, match=r"side by side along K, got \(16, 32\) and \(16, 24\) each"):
        grouped_gemm(a, tuple(halves), split_sizes)
