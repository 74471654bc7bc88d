"""Triton kernel: grouped FC2 dgrad with the fused activation backward (dataflow steps 5-6).

One program computes a (128-row expert tile, BLOCK_N) tile of ``da = dy @ W2_g`` (B operand:
B_g = W2_g^T, a transposed view of W2 read in place, ``operands.ExpertOperand``; bf16 operands,
MXFP8 ones dequantized beforehand), then in the epilogue reads the saved
``c`` (gate and up columns n and F + n), and writes its share of ``dprobs = sum_f da * act(c)``
(one partial sum per program column, added up deterministically by the launcher) and
``dh = act'(c)`` applied to ``da * probs``: bf16, or Q_row(dh) and Q_col(dh) in the gradient
format from the same registers; with BIAS_GRAD, also the tile's column sums of the fp32 dh.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._activations import dprobs_and_activation_backward
from gmlp.triton_ref._epilogue import store_quantized_both_ways
from gmlp.triton_ref._grouping import group_tile, output_tile
from gmlp.triton_ref._tiles import load_tile


@triton.jit
def fc2_dgrad_kernel(
    dy_ptr,  # (T, H) bf16
    w2t_ptr,  # W2_g^T (F, H) per expert, bf16 (operands.ExpertOperand)
    c_ptr,  # (T, N1) bf16 saved pre-activation
    probs_ptr,  # (T,)
    row_start_ptr, tile_start_ptr, block_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    dprobs_partial_ptr,  # (T, n_tiles) fp32
    dh_tile_sums_ptr,  # (max tiles, N1) fp32 column sums of dh per 128-row tile (BIAS_GRAD)
    dh_ptr, dh_scale_ptr, dh_col_ptr, dh_col_scale_ptr,  # dh: (T, N1) bf16 | Q_row + Q_col in the gradient format
    NUM_ROWS, HIDDEN, FFN, NUM_COL_BLOCKS,
    W_STRIDE_E, W_STRIDE_N, W_STRIDE_K,  # W2^T's strides: expert, row, column
    QUANTIZED: tl.constexpr,  # dh is written as Q_row(dh) and Q_col(dh) (else bf16)
    GATED: tl.constexpr, HAS_PROBS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    ACTIVATION: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr,
    RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr,
    NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    N_FASTEST: tl.constexpr,  # grid order (_grouping.output_tile)
):
    tl.static_assert(BLOCK_N % 32 == 0 and BLOCK_K % 32 == 0, f"{BLOCK_N=} and {BLOCK_K=} must be multiples of 32")
    BLOCK_M: tl.constexpr = 128
    N1 = 2 * FFN if GATED else FFN
    tile, n_tile, n_tiles = output_tile(N_FASTEST)
    first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, True, NUM_ROWS)
    if end_row <= first_row:
        return
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < end_row
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < FFN
    mask = row_mask[:, None] & n_mask[None, :]

    # da = dy @ W2_g over H
    w_expert = w2t_ptr + group.to(tl.int64) * W_STRIDE_E
    da = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        a_tile = load_tile(dy_ptr, rows, row_mask, k0, HIDDEN, HIDDEN, 1, BLOCK_K)
        b_tile = load_tile(w_expert, n, n_mask, k0, HIDDEN, W_STRIDE_N, W_STRIDE_K, BLOCK_K)
        da = tl.dot(a_tile, tl.trans(b_tile), da)

    # epilogue: dprobs partial sums, dh
    c_rows = c_ptr + rows[:, None].to(tl.int64) * N1
    gate = tl.load(c_rows + n[None, :], mask=mask, other=0.0).to(tl.float32)
    up = tl.load(c_rows + FFN + n[None, :], mask=mask, other=0.0).to(tl.float32) if GATED else gate
    d_gate, d_up = dprobs_and_activation_backward(gate, up, da, mask, rows, row_mask, probs_ptr, dprobs_partial_ptr,
                                                  n_tiles, n_tile, GATED, HAS_PROBS, ACTIVATION, LIMIT, ALPHA, OFFSET)

    if BIAS_GRAD:
        # per-tile column sums of the fp32 dh; the launcher adds each expert's tiles in order
        sums_row = dh_tile_sums_ptr + tile.to(tl.int64) * N1
        tl.store(sums_row + n, tl.sum(tl.where(mask, d_gate, 0.0), axis=0), mask=n_mask)
        if GATED:
            tl.store(sums_row + FFN + n, tl.sum(tl.where(mask, d_up, 0.0), axis=0), mask=n_mask)
    if not QUANTIZED:
        dh_rows = dh_ptr + rows[:, None].to(tl.int64) * N1
        tl.store(dh_rows + n[None, :], d_gate.to(tl.bfloat16), mask=mask)
        if GATED:
            tl.store(dh_rows + FFN + n[None, :], d_up.to(tl.bfloat16), mask=mask)
    else:
        local_blocks = (tile - group_tile_start) * 4 + tl.arange(0, BLOCK_M // 32)
        group_block_start = tl.load(block_start_ptr + group)
        group_blocks = tl.load(block_start_ptr + group + 1) - group_block_start
        n0 = n_tile * BLOCK_N
        store_quantized_both_ways(d_gate, rows, row_mask, n0, 0, FFN, dh_ptr, dh_scale_ptr, dh_col_ptr, dh_col_scale_ptr,
                         NUM_ROWS, N1, NUM_COL_BLOCKS, local_blocks, group_block_start, group_blocks,
                         RECIPROCAL_MAX, EMAX, FLOOR_MODE, BLOCK_M, BLOCK_N)
        if GATED:
            store_quantized_both_ways(d_up, rows, row_mask, n0, FFN, FFN, dh_ptr, dh_scale_ptr, dh_col_ptr, dh_col_scale_ptr,
                             NUM_ROWS, N1, NUM_COL_BLOCKS, local_blocks, group_block_start, group_blocks,
                             RECIPROCAL_MAX, EMAX, FLOOR_MODE, BLOCK_M, BLOCK_N)
