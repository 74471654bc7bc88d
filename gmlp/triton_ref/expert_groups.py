"""Triton launcher: a step's expert groups (device prefix sums of the split sizes) in one launch.

``gmlp.mxfp8.routing.device_groups`` builds the same ``DeviceGroups`` from about 20 small torch
ops, each a launch and several microseconds of host time; the layer computes them once per step,
with this launch where Triton runs the split sizes' device (a CUDA tensor, or Triton's
interpreter) and with those torch ops elsewhere. Same values, bit for bit.
"""

from __future__ import annotations

import torch
import triton

from gmlp.mxfp8.routing import DeviceGroups
from gmlp.mxfp8.scale_layout import SCALE_TILE_ROWS
from gmlp.mxfp8.spec import BLOCK_SIZE
from gmlp.triton_ref._expert_groups_kernel import expert_groups_kernel

__all__ = ["expert_groups"]


def expert_groups(split_sizes: torch.Tensor, num_rows: int) -> DeviceGroups:
    """``device_groups(split_sizes, num_rows)`` in one Triton launch, no host sync; ``split_sizes``
    on a device Triton runs (CUDA, or any under TRITON_INTERPRET)."""
    experts = split_sizes.numel()
    # four tensors of their own, as device_groups gives them (a saved state holds them apart)
    starts = [torch.empty(experts + 1, dtype=torch.int32, device=split_sizes.device) for _ in range(3)]
    valid = torch.empty((), dtype=torch.bool, device=split_sizes.device)
    expert_groups_kernel[(1,)](split_sizes, *starts, valid, experts, num_rows,
                               BLOCK_E=triton.next_power_of_2(max(experts, 1)), TILE_ROWS=SCALE_TILE_ROWS,
                               BLOCK_ROWS=BLOCK_SIZE)
    return DeviceGroups(*starts, valid)
