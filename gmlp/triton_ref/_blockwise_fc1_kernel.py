"""Triton kernel: grouped FC1 of the FP8 blockwise recipe with the fused forward epilogue.

One program computes a (128-row expert tile, 128 activation columns) tile: the gate and up
columns of ``h = Q_row(x) @ W1_g^T (+ b1)`` in two fp32 accumulators, each 128-wide block of H
one fp8 dot promoted with its two scales (``_blockwise_tiles.promoted_dot``). The epilogue writes
``c = bf16(h)`` and ``a = act(h) * probs`` as Q_row(a) and Q_col(a) from the same registers:
128 activation columns are exactly one 1 x 128 block of each row, and the expert-aligned tile's
128 tokens exactly one 128 x 1 block of each column (``_blockwise_epilogue``).
"""

import triton
import triton.language as tl

from gmlp.triton_ref._activations import glu_forward, srelu_forward
from gmlp.triton_ref._blockwise_epilogue import store_blockwise_both_ways, store_unused_column_block
from gmlp.triton_ref._blockwise_tiles import load_token_block, promoted_dot
from gmlp.triton_ref._grouping import group_tile, output_tile


@triton.jit
def fc1_blockwise_kernel(
    x_ptr, x_scale_ptr,  # Q_row(x): (T, H) fp8, scales (H/128, X_SCALE_STRIDE) fp32
    w_ptr, w_scale_ptr,  # W1 (E, N1, H) fp8 in 128 x 128 tiles ([gate; up] halves), scales (E, N1/128, H/128)
    b1_ptr,  # (E, N1)
    probs_ptr,  # (T,)
    row_start_ptr, tile_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    c_ptr,  # (T, N1) bf16
    a_ptr, a_scale_ptr,  # Q_row(a): (T, F) fp8, scales (F/128, A_SCALE_STRIDE)
    a_col_ptr, a_col_scale_ptr,  # Q_col(a): (F, A_COL_DATA_STRIDE) fp8 (block-aligned), scales (F, A_COL_SCALE_STRIDE)
    NUM_ROWS, HIDDEN, FFN, X_SCALE_STRIDE, A_SCALE_STRIDE, A_COL_SCALE_STRIDE, A_COL_DATA_STRIDE, W_STRIDE_E,
    W_STRIDE_N,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_PROBS: tl.constexpr,
    ACTIVATION: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr,
    FMAX: tl.constexpr, INPUT_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, N_FASTEST: tl.constexpr,
):
    BLOCK: tl.constexpr = 128
    N1 = 2 * FFN if GATED else FFN
    tile, n_tile, n_tiles = output_tile(N_FASTEST)
    first_row, end_row, _, _, group = group_tile(tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, True,
                                                 NUM_ROWS)
    lanes = tl.arange(0, BLOCK)
    if end_row <= first_row:  # a tile past the last expert: its Q_col(a) blocks are unused (zeros, 1.0)
        store_unused_column_block(n_tile, tile, a_col_ptr, a_col_scale_ptr, A_COL_SCALE_STRIDE, A_COL_DATA_STRIDE)
        return
    rows = first_row + lanes
    row_mask = rows < end_row
    n = n_tile * BLOCK + lanes  # activation columns f; the up rows of W1 are F + f
    w_expert = w_ptr + group.to(tl.int64) * W_STRIDE_E
    k_blocks = HIDDEN // BLOCK
    gate_scales = w_scale_ptr + (group * (N1 // BLOCK) + n_tile) * k_blocks  # this tile row's k-blocks
    up_scales = w_scale_ptr + (group * (N1 // BLOCK) + FFN // BLOCK + n_tile) * k_blocks
    gate_rows = n.to(tl.int64) * W_STRIDE_N  # offsets of W1_g's gate rows n and up rows F + n
    up_rows = (FFN + n).to(tl.int64) * W_STRIDE_N

    # main loop: h over H, promoted every 128
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for kb in range(0, k_blocks):
        x_tile, x_scale = load_token_block(x_ptr, x_scale_ptr, rows, row_mask, kb, HIDDEN, X_SCALE_STRIDE)
        acc = promoted_dot(acc, x_tile, x_scale, w_expert, gate_rows, kb, tl.load(gate_scales + kb))
        if GATED:
            acc_up = promoted_dot(acc_up, x_tile, x_scale, w_expert, up_rows, kb, tl.load(up_scales + kb))

    # epilogue: bias, saved c = bf16(h), a = act(h) * probs quantized both ways
    if HAS_BIAS:
        acc += tl.load(b1_ptr + group * N1 + n).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b1_ptr + group * N1 + FFN + n).to(tl.float32)[None, :]
    c_rows = c_ptr + rows[:, None].to(tl.int64) * N1
    tl.store(c_rows + n[None, :], acc.to(tl.bfloat16), mask=row_mask[:, None])
    if GATED:
        tl.store(c_rows + FFN + n[None, :], acc_up.to(tl.bfloat16), mask=row_mask[:, None])
        act = glu_forward(acc, acc_up, ACTIVATION, LIMIT, ALPHA, OFFSET)
    else:
        act = srelu_forward(acc)
    if HAS_PROBS:
        act *= tl.load(probs_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    act = tl.where(row_mask[:, None], act, 0.0)  # rows past the expert's end stay out of its blocks
    store_blockwise_both_ways(act, rows, row_mask, n_tile, tile, a_ptr, a_scale_ptr, A_SCALE_STRIDE, a_col_ptr,
                              a_col_scale_ptr, A_COL_SCALE_STRIDE, A_COL_DATA_STRIDE, FFN, FMAX, INPUT_MAX, POWER_OF_TWO,
                              True, True)
