"""Triton kernel: grouped weight gradient, a ragged contraction over each expert's tokens.

``dW_g = A_g^T @ B_g`` with A (T, M) and B (T, N) holding expert g's tokens in rows
[row_start[g], row_start[g+1]) (FC2: A = dy, B = a; FC1: A = dh, B = x). Operands are bf16
(row-major (T, M)) or the columnwise MXFP8 quantization (data (M, T), compact scales
(M, n_blocks) with 32-token blocks starting at each expert's first token), dequantized to bf16 on
load. One program owns a (BLOCK_M, BLOCK_N) tile of one expert's dW and walks that expert's
tokens; fp32 sums, stored as fp32 or bf16, or added to an fp32 ``out`` (``ACCUMULATE``, for ``main_grad``).
"""

import triton
import triton.language as tl

from gmlp.triton_ref._mxfp8_math import e8m0_to_float


@triton.jit
def _load_token_major(ptr, scale_ptr, features, feature_mask, tokens, token_mask, local_block0, group_block_start,
                      NUM_TOKENS, NUM_FEATURES, NUM_COL_BLOCKS, QUANTIZED: tl.constexpr,
                      BLOCK_F: tl.constexpr, BLOCK_T: tl.constexpr):
    """(BLOCK_F, BLOCK_T) bf16 tile, features x tokens, of a (T, F) operand: bf16 row-major, or
    columnwise MXFP8 data (F, T) with its token-block scales."""
    mask = feature_mask[:, None] & token_mask[None, :]
    if QUANTIZED:
        values = tl.load(ptr + features[:, None].to(tl.int64) * NUM_TOKENS + tokens[None, :], mask=mask, other=0.0)
        blocks = group_block_start + local_block0 + tl.arange(0, BLOCK_T // 32)
        e = tl.load(scale_ptr + features[:, None].to(tl.int64) * NUM_COL_BLOCKS + blocks[None, :],
                    mask=feature_mask[:, None], other=127).to(tl.int32)
        scaled = tl.reshape(values.to(tl.float32), (BLOCK_F, BLOCK_T // 32, 32)) * e8m0_to_float(e)[:, :, None]
        return tl.reshape(scaled, (BLOCK_F, BLOCK_T)).to(tl.bfloat16)
    values = tl.load(ptr + tokens[None, :].to(tl.int64) * NUM_FEATURES + features[:, None], mask=mask, other=0.0)
    return values.to(tl.bfloat16)


@triton.jit
def wgrad_kernel(
    a_ptr, a_scale_ptr,  # (T, M) bf16 | columnwise MXFP8 (M, T) + (M, n_blocks)
    b_ptr, b_scale_ptr,  # (T, N) bf16 | columnwise MXFP8 (N, T) + (N, n_blocks)
    row_start_ptr, block_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.groups)
    out_ptr,  # (E, M, N) fp32 | bf16 (not ACCUMULATE)
    NUM_TOKENS, M, N, NUM_COL_BLOCKS,
    QUANTIZED: tl.constexpr, ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    N_FASTEST: tl.constexpr,  # grid (N tiles, M tiles, experts): consecutive programs share an expert's A panel
):
    tl.static_assert(BLOCK_T % 32 == 0, f"{BLOCK_T=} must be a multiple of 32 (token blocks)")
    if N_FASTEST:
        group, m_tile, n_tile = tl.program_id(2), tl.program_id(1), tl.program_id(0)
    else:  # grid (experts, M tiles, N tiles)
        group, m_tile, n_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    first_token = tl.load(row_start_ptr + group)
    end_token = tl.load(row_start_ptr + group + 1)
    group_block_start = tl.load(block_start_ptr + group)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t0 in range(first_token, end_token, BLOCK_T):
        tokens = t0 + tl.arange(0, BLOCK_T)
        token_mask = tokens < end_token
        local_block0 = (t0 - first_token) // 32
        a_tile = _load_token_major(a_ptr, a_scale_ptr, m, m_mask, tokens, token_mask, local_block0, group_block_start,
                                   NUM_TOKENS, M, NUM_COL_BLOCKS, QUANTIZED, BLOCK_M, BLOCK_T)
        b_tile = _load_token_major(b_ptr, b_scale_ptr, n, n_mask, tokens, token_mask, local_block0, group_block_start,
                                   NUM_TOKENS, N, NUM_COL_BLOCKS, QUANTIZED, BLOCK_N, BLOCK_T)
        acc = tl.dot(a_tile, tl.trans(b_tile), acc)
    out = out_ptr + group.to(tl.int64) * M * N + m[:, None].to(tl.int64) * N + n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=mask, other=0.0)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
