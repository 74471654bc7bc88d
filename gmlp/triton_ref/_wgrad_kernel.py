"""Triton kernel: grouped weight gradient, a ragged contraction over each expert's tokens.

``dW_g = A_g^T @ B_g`` with A (T, M) and B (T, N) holding expert g's tokens in rows
[row_start[g], row_start[g+1]) (FC2: A = dy, B = a; FC1: A = dh, B = x). Operands are bf16,
row-major (MXFP8 ones are Q_col dequantized beforehand, ``dequantize``). One program owns a
(BLOCK_M, BLOCK_N) tile of one expert's dW and walks that expert's tokens; fp32 sums, stored as
fp32 or bf16, or added to an fp32 ``out`` (``ACCUMULATE``, for ``main_grad``). With SPLIT_M
the rows of dW_g go to two outputs, rows [0, M1) to ``out`` (E, M1, N) and the rest to ``out2``
(E, M - M1, N): dW1's gate and up rows as the gradients of two weights (``gmlp.contract.gate_up``).
"""

import triton
import triton.language as tl


@triton.jit
def _features_by_tokens(ptr, features, feature_mask, tokens, token_mask, NUM_FEATURES):
    """The (features, tokens) tile of a row-major (T, NUM_FEATURES) operand (64-bit offsets: T x
    features can pass 2**31)."""
    mask = feature_mask[:, None] & token_mask[None, :]
    return tl.load(ptr + tokens[None, :].to(tl.int64) * NUM_FEATURES + features[:, None], mask=mask, other=0.0)


@triton.jit
def wgrad_kernel(
    a_ptr,  # (T, M) bf16
    b_ptr,  # (T, N) bf16
    row_start_ptr,  # (E+1,) int32 device prefix sums (gmlp.mxfp8.routing)
    out_ptr,  # (E, M, N) fp32 | bf16 (not ACCUMULATE); with SPLIT_M (E, M1, N)
    out2_ptr,  # with SPLIT_M: (E, M - M1, N), of out's dtype
    M, N, M1,
    ACCUMULATE: tl.constexpr, SPLIT_M: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
    N_FASTEST: tl.constexpr,  # grid (N tiles, M tiles, experts): consecutive programs share an expert's A panel
):
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t0 in range(first_token, end_token, BLOCK_T):
        tokens = t0 + tl.arange(0, BLOCK_T)
        token_mask = tokens < end_token
        a_tile = _features_by_tokens(a_ptr, m, m_mask, tokens, token_mask, M)
        b_tile = _features_by_tokens(b_ptr, n, n_mask, tokens, token_mask, N)
        acc = tl.dot(a_tile, tl.trans(b_tile), acc)
    mask = m_mask[:, None] & n_mask[None, :]
    if not SPLIT_M:
        out = out_ptr + group.to(tl.int64) * M * N + m[:, None].to(tl.int64) * N + n[None, :]
        if ACCUMULATE:
            acc += tl.load(out, mask=mask, other=0.0)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # a tile may hold rows of both outputs: each row goes to one, by two masked accesses
        first = (m < M1)[:, None]
        out = out_ptr + group.to(tl.int64) * M1 * N + m[:, None].to(tl.int64) * N + n[None, :]
        out2 = out2_ptr + group.to(tl.int64) * (M - M1) * N + (m[:, None] - M1).to(tl.int64) * N + n[None, :]
        if ACCUMULATE:
            acc += tl.where(first, tl.load(out, mask=mask & first, other=0.0), tl.load(out2, mask=mask & ~first, other=0.0))
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask & first)
        tl.store(out2, acc.to(out2_ptr.dtype.element_ty), mask=mask & ~first)
