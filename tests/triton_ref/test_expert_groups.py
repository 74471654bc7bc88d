"""The Triton expert groups (one launch) against ``gmlp.mxfp8.routing.device_groups`` (torch ops), bit for bit."""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8.routing import device_groups
from tests.support.backends import kernel_device, triton_op

# valid routings (empty experts, one expert with every token, more than one program's worth of
# experts), then invalid ones: negative sizes, short and long sums, one size past int32
CASES = {
    "ragged-with-empty": ([0, 37, 64, 1, 90, 0, 32], 224),
    "one-expert": ([300], 300),
    "many-experts": ([3] * 200 + [0] * 56, 600),
    "no-tokens": ([0, 0, 0], 0),
    "negative": ([5, -3, 10], 12),
    "sum-short": ([100, 100], 250),
    "sum-long": ([100, 100], 150),
    "huge": ([2**40, 5], 10),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("splits,rows", list(CASES.values()), ids=list(CASES))
def test_expert_groups_match_the_torch_ops(splits, rows, dtype):
    expert_groups = triton_op("expert_groups", "expert_groups")
    if dtype is torch.int32 and max(splits) >= 2**31:
        pytest.skip("not an int32 size")
    split_sizes = torch.tensor(splits, dtype=dtype, device=kernel_device())
    got, want = expert_groups(split_sizes, rows), device_groups(split_sizes.cpu(), rows)
    for name in ("row_start", "tile_start", "block_start", "valid"):
        value = getattr(got, name)
        assert value.dtype == getattr(want, name).dtype and value.device == split_sizes.device, name
        assert torch.equal(value.cpu(), getattr(want, name)), name
