"""Triton kernel: per-group column sums of a row-grouped matrix, in a fixed order (deterministic)."""

import triton
import triton.language as tl


@triton.jit
def segment_sum_kernel(
    values_ptr,  # (R, N) rows grouped: group g owns rows [starts[g], starts[g+1])
    starts_ptr,  # (G+1,) int32 device prefix sums
    out_ptr,  # (G, N) fp32
    N,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    group = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    start = tl.load(starts_ptr + group)
    end = tl.load(starts_ptr + group + 1)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        mask = (rows < end)[:, None] & n_mask[None, :]
        acc += tl.sum(tl.load(values_ptr + rows[:, None].to(tl.int64) * N + n[None, :], mask=mask, other=0.0).to(tl.float32),
                      axis=0)
    tl.store(out_ptr + group.to(tl.int64) * N + n, acc, mask=n_mask)
