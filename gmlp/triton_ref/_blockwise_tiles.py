"""Triton device function shared by the FP8 blockwise GEMM main loops: one promoted k-block."""

import triton
import triton.language as tl


@triton.jit
def promoted_dot(acc, a_tile, a_scale, w_ptr, w_rows, kb, w_scale):
    """acc + (a_scale * w_scale) * (a_tile @ W[w_rows, 128 kb : 128 kb + 128]^T): one 128-wide
    k-block of a token tile (rows, 128) fp8 with its per-row scales times a weight's rows (all
    inside one 128 x 128 tile, whose scale is ``w_scale``), the fp8 dot into a fresh fp32 partial
    (on Hopper a chain of four k=32 ``wgmma``), then promoted. ``w_ptr``: the expert's weight,
    rows ``w_ptr + row * (row stride)`` precomputed by the caller as ``w_rows`` offsets."""
    k = kb * 128 + tl.arange(0, 128)
    w_tile = tl.load(w_ptr + w_rows[:, None] + k[None, :])
    partial = tl.dot(a_tile, tl.trans(w_tile))
    return acc + partial * (a_scale[:, None] * w_scale)


@triton.jit
def load_token_block(data_ptr, scale_ptr, rows, row_mask, kb, K, SCALE_STRIDE):
    """k-block ``kb`` of a rowwise token operand: its (rows, 128) fp8 tile (0 past the expert's
    rows) and the rows' ``scale_inv`` (MN-major scales, ``gmlp.fp8_blockwise.layout``)."""
    k = kb * 128 + tl.arange(0, 128)
    tile = tl.load(data_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=row_mask[:, None], other=0.0)
    return tile, tl.load(scale_ptr + kb * SCALE_STRIDE + rows, mask=row_mask, other=0.0)
