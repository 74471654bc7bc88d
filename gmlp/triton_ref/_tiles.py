"""Triton device function shared by the GEMM main loops: load one bf16 operand tile."""

import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, rows, row_mask, k0, K, ROW_STRIDE, K_STRIDE, BLOCK_K: tl.constexpr):
    """The (len(rows), BLOCK_K) bf16 tile at columns k0.. of an (R, K) operand whose element (r, k)
    is at ptr[r*ROW_STRIDE + k*K_STRIDE]; masked rows and columns read 0. (Strides equal to 1 are
    specialized by Triton's launcher, so a contiguous operand keeps its vector loads.)"""
    cols = k0 + tl.arange(0, BLOCK_K)
    mask = row_mask[:, None] & (cols < K)[None, :]
    return tl.load(ptr + rows[:, None].to(tl.int64) * ROW_STRIDE + cols[None, :] * K_STRIDE, mask=mask, other=0.0)
