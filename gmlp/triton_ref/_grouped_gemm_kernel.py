"""Triton kernel: grouped GEMM ``out[rows of g] = A[rows of g] @ B_g^T (+ bias_g)``.

Serves FC2 forward (A = Q_row(a), B_g = W2_g from Q_row(W2)) and FC1 dgrad (A = Q_row(dh),
B_g = W1_g^T read in place from Q_col(W1); see ``operands.ExpertOperand``). Operands are bf16, or fp8 with compact rowwise
scales dequantized to bf16 on load (``_fc1_kernel``); fp32 accumulation; bf16 output.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._fc1_kernel import _load_operand
from gmlp.triton_ref._grouping import group_tile, output_tile


@triton.jit
def grouped_gemm_kernel(
    a_ptr, a_scale_ptr,  # (T, K) bf16, or fp8 with compact scales (T, K/32)
    b_ptr, b_scale_ptr,  # B_g (N, K) per expert: bf16, or fp8 with compact scales (operands.ExpertOperand)
    bias_ptr,  # (E, N)
    row_start_ptr, tile_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.groups)
    out_ptr,  # (T, N) bf16
    NUM_ROWS, N, K,
    B_STRIDE_E, B_STRIDE_N, B_STRIDE_K, BS_STRIDE_E, BS_STRIDE_N, BS_STRIDE_K,  # B's data and scale strides
    QUANTIZED: tl.constexpr, HAS_BIAS: tl.constexpr,
    NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    N_FASTEST: tl.constexpr,  # grid order (_grouping.output_tile)
):
    tl.static_assert(BLOCK_K % 32 == 0, f"{BLOCK_K=} must be a multiple of 32")
    BLOCK_M: tl.constexpr = 128  # one expert-aligned tile
    tile, n_tile, n_tiles = output_tile(N_FASTEST)
    first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, True, NUM_ROWS)
    if end_row <= first_row:
        return  # a tile past the last expert
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < end_row
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    b_expert = b_ptr + group.to(tl.int64) * B_STRIDE_E
    bs_expert = b_scale_ptr + group.to(tl.int64) * BS_STRIDE_E
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a_tile = _load_operand(a_ptr, a_scale_ptr, rows, row_mask, k0, K, K, 1, K // 32, 1, QUANTIZED, BLOCK_M, BLOCK_K)
        b_tile = _load_operand(b_expert, bs_expert, n, n_mask, k0, K, B_STRIDE_N, B_STRIDE_K, BS_STRIDE_N, BS_STRIDE_K,
                               QUANTIZED, BLOCK_N, BLOCK_K)
        acc = tl.dot(a_tile, tl.trans(b_tile), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + group * N + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + n[None, :], acc.to(tl.bfloat16),
             mask=row_mask[:, None] & n_mask[None, :])
