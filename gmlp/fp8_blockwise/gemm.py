"""What the FP8 blockwise GEMMs compute, in fp64: the oracle of every kernel.

A kernel multiplies the fp8 elements and applies the two blocks' scales once per 128 of the
contraction (the promotion): for the forward and dgrad GEMMs (1 x 128 tokens times 128 x 128
weight tiles, "1D2D")::

    out[t, n] = sum over k-blocks kb of  (sa[kb, t] * sb[n // 128, kb]) * P_kb[t, n]
    P_kb[t, n] = sum over k in kb of  qa[t, k] * qb[n, k]        (products of fp8 values: exact)

and for the weight gradients (128 x 1 token blocks of both operands, "1D1D")::

    dW_g[m, n] = sum over g's token blocks b of  (sa[m, b] * sb[n, b]) * P_b[m, n]

with the partial sums P in fp32 (on Hopper, inside an fp8 ``wgmma`` chain of 128, at the
tensor core's own accumulation precision). Every product of dequantized values is exact in fp64,
so the fp64 sums here differ from the exact result only by fp64 rounding: a kernel's error against
them is its own summation error, bounded by the tests from the sums of |products|.
"""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseTensor,
    require_block_shape,
)

__all__ = ["grouped_gemm_blockwise_ref", "grouped_wgrad_blockwise_ref"]



def _sizes(split_sizes: torch.Tensor, tokens: int) -> list[int]:
    sizes = [int(m) for m in split_sizes.tolist()]
    if any(m < 0 for m in sizes) or sum(sizes) != tokens:
        raise ValueError(f"split_sizes must be non-negative and sum to the {tokens} tokens, got {sizes}")
    return sizes


def grouped_gemm_blockwise_ref(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                               bias: torch.Tensor | None = None,
                               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(T, N): each expert's tokens of ``a`` (rowwise, (T, K)) times its weight ``b`` (128 x 128
    tiles, (E, N, K)) transposed, plus ``bias`` (E, N), summed in fp64 and rounded to ``out_dtype``."""
    require_block_shape(a, "a", BlockShape.ROWWISE)
    require_block_shape(b, "b", BlockShape.TILE)
    tokens, k = a.source_shape
    if b.data.dim() != 3 or b.data.shape[0] != split_sizes.numel() or b.data.shape[2] != k:
        raise ValueError(f"b must be (E={split_sizes.numel()}, N, K={k}), got {tuple(b.data.shape)}")
    a_values, b_values = a.dequantize().double(), b.dequantize().double()
    out = torch.empty(tokens, b.data.shape[1], dtype=torch.float64, device=a.data.device)
    row = 0
    for g, m in enumerate(_sizes(split_sizes, tokens)):
        out[row:row + m] = a_values[row:row + m] @ b_values[g].t()
        if bias is not None:
            out[row:row + m] += bias[g].double()
        row += m
    return out.to(out_dtype)


def grouped_wgrad_blockwise_ref(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                                out: torch.Tensor | None = None,
                                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(E, M, N): dW_g = A_g^T @ B_g over expert g's tokens, A (T, M) and B (T, N) given as their
    columnwise (128 x 1) quantizations, summed in fp64 and rounded to ``out_dtype``, or to fp32
    and added to ``out`` (main_grad)."""
    require_block_shape(a, "a", BlockShape.COLUMNWISE)
    require_block_shape(b, "b", BlockShape.COLUMNWISE)
    tokens = a.source_shape[0]
    if b.source_shape[0] != tokens:
        raise ValueError(f"a and b must have the same tokens, got {tokens} and {b.source_shape[0]}")
    a_values, b_values = a.dequantize().double(), b.dequantize().double()
    sizes = _sizes(split_sizes, tokens)
    result = torch.empty(len(sizes), a_values.shape[1], b_values.shape[1], dtype=torch.float64, device=a.data.device)
    row = 0
    for g, m in enumerate(sizes):
        result[g] = a_values[row:row + m].t() @ b_values[row:row + m]
        row += m
    return out.add_(result.float()) if out is not None else result.to(out_dtype)
