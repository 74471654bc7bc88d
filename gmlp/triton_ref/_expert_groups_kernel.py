"""Triton kernel: the expert groups' device prefix sums (``gmlp.mxfp8.routing.DeviceGroups``) in one program."""

import triton
import triton.language as tl


@triton.jit
def expert_groups_kernel(
    sizes_ptr,  # (E,) int split sizes, as given (negative ones included)
    row_start_ptr,  # (E + 1,) int32 out: prefix sums of rows,
    tile_start_ptr,  # of 128-row tiles
    block_start_ptr,  # and of 32-row blocks
    valid_ptr,  # () bool out: no size was negative and the sizes summed to num_rows
    num_experts,
    num_rows,
    BLOCK_E: tl.constexpr,  # a power of two >= E: one program holds every expert
    TILE_ROWS: tl.constexpr,  # 128 (scale tiles)
    BLOCK_ROWS: tl.constexpr,  # 32 (MXFP8 blocks)
):
    experts = tl.arange(0, BLOCK_E)
    mask = experts < num_experts
    sizes = tl.load(sizes_ptr + experts, mask=mask, other=0).to(tl.int64)
    # the groups of sizes clamped to be non-negative with running totals clamped to num_rows: a
    # kernel reading them never leaves its tensors, whatever the sizes hold
    clamped = tl.maximum(sizes, 0)
    inclusive = tl.cumsum(clamped, 0)
    ends = tl.minimum(inclusive, num_rows)
    safe_sizes = ends - tl.minimum(inclusive - clamped, num_rows)
    tiles = tl.cumsum((safe_sizes + TILE_ROWS - 1) // TILE_ROWS, 0)
    blocks = tl.cumsum((safe_sizes + BLOCK_ROWS - 1) // BLOCK_ROWS, 0)
    tl.store(row_start_ptr + 1 + experts, ends.to(tl.int32), mask=mask)
    tl.store(tile_start_ptr + 1 + experts, tiles.to(tl.int32), mask=mask)
    tl.store(block_start_ptr + 1 + experts, blocks.to(tl.int32), mask=mask)
    first = experts == 0  # each prefix sum starts at 0
    zero = tl.zeros((BLOCK_E,), dtype=tl.int32)
    tl.store(row_start_ptr + experts, zero, mask=first)
    tl.store(tile_start_ptr + experts, zero, mask=first)
    tl.store(block_start_ptr + experts, zero, mask=first)
    no_negative = tl.max((sizes < 0).to(tl.int32), 0) == 0
    tl.store(valid_ptr, no_negative & (tl.sum(sizes, 0) == num_rows))
