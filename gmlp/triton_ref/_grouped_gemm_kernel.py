"""Triton kernel: grouped GEMM ``out[rows of g] = A[rows of g] @ B_g^T (+ bias_g)``.

Serves FC2 forward (A = a, B_g = W2_g) and FC1 dgrad (A = dh, B_g = W1_g^T, a transposed view
of W1 read in place; see ``operands.ExpertOperand``). Operands are bf16 (MXFP8 ones are
dequantized beforehand, ``dequantize``); fp32 accumulation; bf16 output.

With SPLIT_K, B_g is two operands side by side along K, [B_g | B2_g] (FC1 dgrad with W1's gate and
up stored apart, ``gmlp.contract.gate_up``): the k-tiles are those of the single operand, the one that
straddles column K1 taking its columns from both, so the result is bit for bit the same.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._grouping import group_tile, output_tile
from gmlp.triton_ref._tiles import load_tile


@triton.jit
def grouped_gemm_kernel(
    a_ptr,  # (T, K) bf16
    b_ptr,  # B_g (N, K) per expert, bf16 (operands.ExpertOperand); with SPLIT_K its first K1 columns
    b2_ptr,  # with SPLIT_K: the other K - K1 columns, (N, K - K1) per expert
    bias_ptr,  # (E, N)
    row_start_ptr, tile_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    out_ptr,  # (T, N) bf16
    NUM_ROWS, N, K, K1,
    B_STRIDE_E, B_STRIDE_N, B_STRIDE_K,  # B's strides: expert, row, column
    B2_STRIDE_E, B2_STRIDE_N, B2_STRIDE_K,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
    NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    N_FASTEST: tl.constexpr,  # grid order (_grouping.output_tile)
):
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if not SPLIT_K:
        for k0 in range(0, K, BLOCK_K):
            a_tile = load_tile(a_ptr, rows, row_mask, k0, K, K, 1, BLOCK_K)
            b_tile = load_tile(b_expert, n, n_mask, k0, K, B_STRIDE_N, B_STRIDE_K, BLOCK_K)
            acc = tl.dot(a_tile, tl.trans(b_tile), acc)
    else:
        b2_expert = b2_ptr + group.to(tl.int64) * B2_STRIDE_E
        first_full = K1 // BLOCK_K * BLOCK_K  # the k-tiles wholly in B, then the straddling one
        for k0 in range(0, first_full, BLOCK_K):
            a_tile = load_tile(a_ptr, rows, row_mask, k0, K, K, 1, BLOCK_K)
            b_tile = load_tile(b_expert, n, n_mask, k0, K1, B_STRIDE_N, B_STRIDE_K, BLOCK_K)
            acc = tl.dot(a_tile, tl.trans(b_tile), acc)
        if first_full < K1:
            a_tile = load_tile(a_ptr, rows, row_mask, first_full, K, K, 1, BLOCK_K)
            cols = first_full + tl.arange(0, BLOCK_K)
            second = cols - K1  # columns of B2 (negative: in B)
            from_b = load_tile(b_expert, n, n_mask, first_full, K1, B_STRIDE_N, B_STRIDE_K, BLOCK_K)
            from_b2 = tl.load(b2_expert + n[:, None].to(tl.int64) * B2_STRIDE_N + second[None, :] * B2_STRIDE_K,
                              mask=n_mask[:, None] & ((second >= 0) & (cols < K))[None, :], other=0.0)
            b_tile = tl.where((cols < K1)[None, :], from_b, from_b2)
            acc = tl.dot(a_tile, tl.trans(b_tile), acc)
        for k0 in range(first_full + BLOCK_K if first_full < K1 else first_full, K, BLOCK_K):  # wholly in B2
            a_tile = load_tile(a_ptr, rows, row_mask, k0, K, K, 1, BLOCK_K)
            b_tile = load_tile(b2_expert, n, n_mask, k0 - K1, K - K1, B2_STRIDE_N, B2_STRIDE_K, BLOCK_K)
            acc = tl.dot(a_tile, tl.trans(b_tile), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + group * N + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + n[None, :], acc.to(tl.bfloat16),
             mask=row_mask[:, None] & n_mask[None, :])
