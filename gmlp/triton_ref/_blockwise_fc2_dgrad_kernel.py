"""Triton kernel: grouped FC2 dgrad of the FP8 blockwise recipe with the fused activation backward.

One program computes a (128-row expert tile, 128 columns f) tile of ``da = Q_row(dy) @ W2_g``,
W2_g^T given as the transposed 128 x 128 tiles of W2 (``FP8BlockwiseTensor.transpose``), each
128-wide block of H one promoted fp8 dot (``_blockwise_tiles``). The epilogue reads the saved
``c`` (gate and up columns f and F + f), writes its share of ``dprobs = sum_f da * act(c)`` (one
partial sum per program column, added up in a fixed order by the launcher) and ``dh = act'(c)``
applied to ``da * probs`` as Q_row(dh) and Q_col(dh) in the gradient format, the gate block and
the up block of each row one 1 x 128 block each (``_blockwise_epilogue``); with BIAS_GRAD, the
tile's column sums of the fp32 dh.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._activations import dprobs_and_activation_backward
from gmlp.triton_ref._blockwise_epilogue import store_blockwise_both_ways, store_unused_column_block
from gmlp.triton_ref._blockwise_tiles import load_token_block, promoted_dot
from gmlp.triton_ref._grouping import group_tile, output_tile


@triton.jit
def fc2_dgrad_blockwise_kernel(
    dy_ptr, dy_scale_ptr,  # Q_row(dy): (T, H) fp8, scales (H/128, DY_SCALE_STRIDE) fp32
    w_ptr, w_scale_ptr,  # W2^T (E, F, H) fp8 in 128 x 128 tiles, scales (E, F/128, H/128)
    c_ptr,  # (T, N1) bf16 saved pre-activation
    probs_ptr,  # (T,)
    row_start_ptr, tile_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    dprobs_partial_ptr,  # (T, F/128) fp32
    dh_tile_sums_ptr,  # (max tiles, N1) fp32 column sums of dh per 128-row tile (BIAS_GRAD)
    dh_ptr, dh_scale_ptr,  # Q_row(dh): (T, N1) fp8, scales (N1/128, DH_SCALE_STRIDE)
    dh_col_ptr, dh_col_scale_ptr,  # Q_col(dh): (N1, DH_COL_DATA_STRIDE) fp8 (block-aligned), scales (N1, DH_COL_SCALE_STRIDE)
    NUM_ROWS, HIDDEN, FFN, DY_SCALE_STRIDE, DH_SCALE_STRIDE, DH_COL_SCALE_STRIDE, DH_COL_DATA_STRIDE, W_STRIDE_E,
    W_STRIDE_N,
    GATED: tl.constexpr, HAS_PROBS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    ACTIVATION: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr,
    FMAX: tl.constexpr, INPUT_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, N_FASTEST: tl.constexpr,
):
    BLOCK: tl.constexpr = 128
    N1 = 2 * FFN if GATED else FFN
    tile, n_tile, n_tiles = output_tile(N_FASTEST)
    first_row, end_row, _, _, group = group_tile(tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, True,
                                                 NUM_ROWS)
    if end_row <= first_row:  # a tile past the last expert: its Q_col(dh) blocks are unused (zeros, 1.0)
        for half in tl.static_range(2 if GATED else 1):  # the gate's columns, then the up's
            store_unused_column_block(half * (FFN // BLOCK) + n_tile, tile, dh_col_ptr, dh_col_scale_ptr,
                                      DH_COL_SCALE_STRIDE, DH_COL_DATA_STRIDE)
        return
    rows = first_row + tl.arange(0, BLOCK)
    row_mask = rows < end_row
    n = n_tile * BLOCK + tl.arange(0, BLOCK)  # columns f of da

    # da = dy @ W2_g over H, promoted every 128
    w_expert = w_ptr + group.to(tl.int64) * W_STRIDE_E
    w_rows = n.to(tl.int64) * W_STRIDE_N
    k_blocks = HIDDEN // BLOCK
    w_scales = w_scale_ptr + (group * (FFN // BLOCK) + n_tile) * k_blocks
    da = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for kb in range(0, k_blocks):
        dy_tile, dy_scale = load_token_block(dy_ptr, dy_scale_ptr, rows, row_mask, kb, HIDDEN, DY_SCALE_STRIDE)
        da = promoted_dot(da, dy_tile, dy_scale, w_expert, w_rows, kb, tl.load(w_scales + kb))

    # epilogue: dprobs partial sums, dh quantized both ways, its column sums
    c_rows = c_ptr + rows[:, None].to(tl.int64) * N1
    gate = tl.load(c_rows + n[None, :], mask=row_mask[:, None], other=0.0).to(tl.float32)
    up = tl.load(c_rows + FFN + n[None, :], mask=row_mask[:, None], other=0.0).to(tl.float32) if GATED else gate
    d_gate, d_up = dprobs_and_activation_backward(gate, up, da, row_mask[:, None], rows, row_mask, probs_ptr,
                                                  dprobs_partial_ptr, n_tiles, n_tile, GATED, HAS_PROBS, ACTIVATION,
                                                  LIMIT, ALPHA, OFFSET)
    d_gate = tl.where(row_mask[:, None], d_gate, 0.0)  # rows past the expert's end stay out of its blocks
    store_blockwise_both_ways(d_gate, rows, row_mask, n_tile, tile, dh_ptr, dh_scale_ptr, DH_SCALE_STRIDE, dh_col_ptr,
                              dh_col_scale_ptr, DH_COL_SCALE_STRIDE, DH_COL_DATA_STRIDE, N1, FMAX, INPUT_MAX, POWER_OF_TWO,
                              True, True)
    if BIAS_GRAD:  # per-tile column sums of the fp32 dh; the launcher adds each expert's tiles in order
        sums_row = dh_tile_sums_ptr + tile.to(tl.int64) * N1
        tl.store(sums_row + n, tl.sum(d_gate, axis=0))
    if GATED:
        d_up = tl.where(row_mask[:, None], d_up, 0.0)
        store_blockwise_both_ways(d_up, rows, row_mask, FFN // BLOCK + n_tile, tile, dh_ptr, dh_scale_ptr,
                                  DH_SCALE_STRIDE, dh_col_ptr, dh_col_scale_ptr, DH_COL_SCALE_STRIDE, DH_COL_DATA_STRIDE, N1,
                                  FMAX, INPUT_MAX, POWER_OF_TWO, True, True)
        if BIAS_GRAD:
            tl.store(sums_row + FFN + n, tl.sum(d_up, axis=0))
