"""Triton kernel: grouped FC1 with the fused forward epilogue (dataflow steps 1-3 of docs/design.md).

One program computes a (128-row expert tile, BLOCK_N outputs) tile of ``h = x @ W1_g^T (+ b1)``.
Gated activations take BLOCK_N gate columns and the matching BLOCK_N up columns (rows n and F + n
of W1_g, [gate; up] halves) into two accumulators, so the epilogue holds both halves of each
activation. The operands are bf16 (MXFP8 ones are dequantized beforehand, ``dequantize``),
multiplied by tensor-core dots with fp32 accumulation. The epilogue writes ``c = bf16(h)`` and
``a = act(h) * probs``: bf16, or Q_row(a) and Q_col(a) from the same registers.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._activations import glu_forward, srelu_forward
from gmlp.triton_ref._epilogue import store_quantized_both_ways
from gmlp.triton_ref._grouping import group_tile, output_tile
from gmlp.triton_ref._tiles import load_tile


@triton.jit
def fc1_forward_kernel(
    # inputs
    x_ptr,  # (T, H) bf16
    gate_ptr, up_ptr,  # W1_g's gate and up (F, H) per expert (srelu: gate only), bf16 (operands.ExpertOperand)
    b1_ptr,  # (E, N1)
    probs_ptr,  # (T,)
    row_start_ptr, tile_start_ptr, block_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    # outputs
    c_ptr,  # (T, N1) bf16
    a_ptr, a_scale_ptr,  # (T, F) bf16, or Q_row(a): fp8 (T, F) with compact scales (T, F/32)
    a_col_ptr, a_col_scale_ptr,  # Q_col(a): fp8 (F, T) with compact scales (F, n_blocks)
    # sizes and the strides (expert, row, column) of gate and up (gmlp.contract.gate_up: any layout)
    NUM_ROWS, HIDDEN, FFN, NUM_COL_BLOCKS, GATE_STRIDE_E, GATE_STRIDE_N, GATE_STRIDE_K,
    UP_STRIDE_E, UP_STRIDE_N, UP_STRIDE_K,
    # what
    QUANTIZED: tl.constexpr,  # a is written as Q_row(a) and Q_col(a) (else bf16)
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_PROBS: tl.constexpr,
    ACTIVATION: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr,
    # format of a's quantization
    RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr,
    # grouping and tiling
    NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    N_FASTEST: tl.constexpr,  # grid order (_grouping.output_tile)
):
    tl.static_assert(BLOCK_N % 32 == 0 and BLOCK_K % 32 == 0, f"{BLOCK_N=} and {BLOCK_K=} must be multiples of 32")
    BLOCK_M: tl.constexpr = 128  # one expert-aligned tile; its 4 columnwise blocks never cross experts
    N1 = 2 * FFN if GATED else FFN
    tile, n_tile, n_tiles = output_tile(N_FASTEST)
    first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, True, NUM_ROWS)
    if end_row <= first_row:
        return  # a tile past the last expert
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < end_row
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)  # activation columns f
    n_mask = n < FFN
    gate_expert = gate_ptr + group.to(tl.int64) * GATE_STRIDE_E  # rows n of the gate (of W1_g for srelu)
    up_expert = up_ptr + group.to(tl.int64) * UP_STRIDE_E

    # main loop: h = x @ W1_g^T over H
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        a_tile = load_tile(x_ptr, rows, row_mask, k0, HIDDEN, HIDDEN, 1, BLOCK_K)
        w_tile = load_tile(gate_expert, n, n_mask, k0, HIDDEN, GATE_STRIDE_N, GATE_STRIDE_K, BLOCK_K)
        acc = tl.dot(a_tile, tl.trans(w_tile), acc)
        if GATED:
            up_tile = load_tile(up_expert, n, n_mask, k0, HIDDEN, UP_STRIDE_N, UP_STRIDE_K, BLOCK_K)
            acc_up = tl.dot(a_tile, tl.trans(up_tile), acc_up)

    # epilogue: bias, saved c = bf16(h), a = act(h) * probs
    if HAS_BIAS:
        acc += tl.load(b1_ptr + group * N1 + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b1_ptr + group * N1 + FFN + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_mask = row_mask[:, None] & n_mask[None, :]
    c_rows = c_ptr + rows[:, None].to(tl.int64) * N1
    tl.store(c_rows + n[None, :], acc.to(tl.bfloat16), mask=out_mask)
    if GATED:
        tl.store(c_rows + FFN + n[None, :], acc_up.to(tl.bfloat16), mask=out_mask)
        act = glu_forward(acc, acc_up, ACTIVATION, LIMIT, ALPHA, OFFSET)
    else:
        act = srelu_forward(acc)
    if HAS_PROBS:
        act *= tl.load(probs_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    if not QUANTIZED:
        tl.store(a_ptr + rows[:, None].to(tl.int64) * FFN + n[None, :], act.to(tl.bfloat16), mask=out_mask)
    else:
        # Q_row(a) and Q_col(a) from the same registers; the tile's 4 token blocks are blocks
        # local_blocks of the expert (the tile starts at an expert-aligned row)
        local_blocks = (tile - group_tile_start) * 4 + tl.arange(0, BLOCK_M // 32)
        group_block_start = tl.load(block_start_ptr + group)
        group_blocks = tl.load(block_start_ptr + group + 1) - group_block_start
        store_quantized_both_ways(act, rows, row_mask, n_tile * BLOCK_N, 0, FFN, a_ptr, a_scale_ptr, a_col_ptr,
                                  a_col_scale_ptr, NUM_ROWS, FFN, NUM_COL_BLOCKS, local_blocks, group_block_start,
                                  group_blocks, RECIPROCAL_MAX, EMAX, FLOOR_MODE, BLOCK_M, BLOCK_N)
