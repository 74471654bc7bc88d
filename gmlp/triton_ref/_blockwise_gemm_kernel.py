"""Triton kernels: the grouped FP8 blockwise GEMMs, the scales applied once per 128 of the
contraction (``gmlp.fp8_blockwise.gemm``).

Each 128-wide block of the contraction is one fp8 ``tl.dot`` into a fresh fp32 partial (on
Hopper a chain of four k=32 fp8 ``wgmma``, at the tensor core's accumulation precision), then
promoted: the partial times its two scales is added to the fp32 accumulator in registers.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._blockwise_tiles import load_token_block, promoted_dot
from gmlp.triton_ref._grouping import group_tile, output_tile


@triton.jit
def grouped_gemm_blockwise_kernel(
    a_ptr,  # (T, K) fp8, rowwise (1 x 128 blocks)
    a_scale_ptr,  # (K/128, A_SCALE_STRIDE) fp32, MN-major
    b_ptr,  # B_g (N, K) fp8 per expert, 128 x 128 tiles: element (g, n, k) at g*B_STRIDE_E + n*B_STRIDE_N + k
    b_scale_ptr,  # (E, N/128, K/128) fp32, contiguous
    bias_ptr,  # (E, N) (HAS_BIAS)
    row_start_ptr, tile_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    out_ptr,  # (T, N) bf16
    NUM_ROWS, N, K, A_SCALE_STRIDE, B_STRIDE_E, B_STRIDE_N,
    HAS_BIAS: tl.constexpr, NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    BLOCK_N: tl.constexpr,  # divides 128: an output tile's columns share one weight tile row
    N_FASTEST: tl.constexpr,
):
    BLOCK_M: tl.constexpr = 128  # one expert-aligned tile
    BLOCK_K: tl.constexpr = 128  # one scale block
    tile, n_tile, n_tiles = output_tile(N_FASTEST)
    first_row, end_row, _, _, group = group_tile(tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, True,
                                                 NUM_ROWS)
    if end_row <= first_row:
        return  # a tile past the last expert
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < end_row
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)  # N is a multiple of 128: no column past its end
    b_expert = b_ptr + group.to(tl.int64) * B_STRIDE_E
    b_rows = n.to(tl.int64) * B_STRIDE_N
    k_blocks = K // BLOCK_K
    b_scales = b_scale_ptr + (group * (N // 128) + n_tile * BLOCK_N // 128) * k_blocks  # this tile row's k-blocks
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, k_blocks):
        a_tile, a_scale = load_token_block(a_ptr, a_scale_ptr, rows, row_mask, kb, K, A_SCALE_STRIDE)
        acc = promoted_dot(acc, a_tile, a_scale, b_expert, b_rows, kb, tl.load(b_scales + kb))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + group * N + n).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + n[None, :], acc.to(tl.bfloat16), mask=row_mask[:, None])


@triton.jit
def _features_by_tokens(data_ptr, features, feature_mask, columns, DATA_STRIDE):
    """The (features, 128 tokens) tile of a columnwise block of data (features, DATA_STRIDE),
    K-major along the tokens (the padding past an expert's end holds zeros)."""
    return tl.load(data_ptr + features[:, None].to(tl.int64) * DATA_STRIDE + columns[None, :],
                   mask=feature_mask[:, None], other=0.0)


@triton.jit
def wgrad_blockwise_kernel(
    a_ptr,  # (M, DATA_STRIDE) fp8, columnwise: expert g's 128-token blocks from block tile_start[g]
    a_scale_ptr,  # (M, A_SCALE_STRIDE) fp32: one a block
    b_ptr,  # (N, DATA_STRIDE) fp8, columnwise
    b_scale_ptr,  # (N, B_SCALE_STRIDE) fp32
    tile_start_ptr,  # (E+1,) int32 device prefix sums of ceil(m_g / 128) (gmlp.mxfp8.routing)
    out_ptr,  # (E, M, N) fp32 | bf16, or fp32 added to (ACCUMULATE)
    DATA_STRIDE, M, N, A_SCALE_STRIDE, B_SCALE_STRIDE,
    ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    group, m_tile, n_tile = tl.program_id(2), tl.program_id(1), tl.program_id(0)  # n fastest: programs share A
    m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    first_block = tl.load(tile_start_ptr + group)
    blocks = tl.load(tile_start_ptr + group + 1) - first_block
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for block in range(0, blocks):
        columns = (first_block + block) * 128 + tl.arange(0, 128)
        a_tile = _features_by_tokens(a_ptr, m, m_mask, columns, DATA_STRIDE)
        b_tile = _features_by_tokens(b_ptr, n, n_mask, columns, DATA_STRIDE)
        partial = tl.dot(a_tile, tl.trans(b_tile))
        a_scale = tl.load(a_scale_ptr + m.to(tl.int64) * A_SCALE_STRIDE + first_block + block, mask=m_mask, other=0.0)
        b_scale = tl.load(b_scale_ptr + n.to(tl.int64) * B_SCALE_STRIDE + first_block + block, mask=n_mask, other=0.0)
        acc += partial * (a_scale[:, None] * b_scale[None, :])
    mask = m_mask[:, None] & n_mask[None, :]
    out = out_ptr + group.to(tl.int64) * M * N + m[:, None].to(tl.int64) * N + n[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=mask, other=0.0)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
