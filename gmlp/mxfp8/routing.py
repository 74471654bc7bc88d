"""Expert groups on the device: prefix sums that kernels index with, safe whatever the split sizes hold.

Split sizes stay on the device (no host sync), so their values cannot be checked before a
launch without stalling the stream. Instead the offsets are built from sizes clamped to be
non-negative with running totals clamped to T, so a kernel never leaves its tensors, and
``valid`` records on the device whether the sizes were non-negative and summed to T; launchers
otherwise set every scale byte to 0xFF (E8M0 NaN), so an invalid split poisons the result instead of
silently giving a wrong one. ``GMLP_VALIDATE=1`` (and CPU tensors, where it is free) checks
eagerly and raises instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.mxfp8.scale_layout import SCALE_TILE_ROWS
from gmlp.mxfp8.spec import BLOCK_SIZE
from gmlp.system.env import setting

__all__ = ["DeviceGroups", "device_groups", "sizes_valid", "given_or_device_groups", "launch_offsets",
           "should_check_split_values", "poison_scales_if_invalid"]


@dataclass(frozen=True)
class DeviceGroups:
    """(E+1,) int32 prefix sums of rows, 128-row tiles and 32-row blocks, and the validity flag."""

    row_start: torch.Tensor
    tile_start: torch.Tensor
    block_start: torch.Tensor
    valid: torch.Tensor  # () bool: no size negative, the sizes summing to T (the layer's device assert reads it)
    # the split sizes were checked before any kernel reads these (the layer's validate_split_sizes:
    # a host error, or a device-side assert that stops the stream first): no scales to poison
    checked: bool = False


def device_groups(split_sizes: torch.Tensor, num_rows: int) -> DeviceGroups:
    """Offsets of the expert groups of ``split_sizes`` over ``num_rows`` rows, without host sync."""
    sizes = split_sizes.to(torch.int64)
    zero = torch.zeros(1, dtype=torch.int64, device=sizes.device)
    row_start = torch.cat([zero, torch.cumsum(sizes.clamp(min=0), 0).clamp(max=num_rows)])
    safe_sizes = row_start[1:] - row_start[:-1]
    tile_start = torch.cat([zero, torch.cumsum((safe_sizes + SCALE_TILE_ROWS - 1) // SCALE_TILE_ROWS, 0)])
    block_start = torch.cat([zero, torch.cumsum((safe_sizes + BLOCK_SIZE - 1) // BLOCK_SIZE, 0)])
    return DeviceGroups(row_start.to(torch.int32), tile_start.to(torch.int32), block_start.to(torch.int32),
                        sizes_valid(sizes, num_rows))


def sizes_valid(split_sizes: torch.Tensor, num_rows: int) -> torch.Tensor:
    """() bool on the device: no size is negative and the sizes sum to ``num_rows``."""
    sizes = split_sizes.to(torch.int64)
    return (sizes >= 0).all() & (sizes.sum() == num_rows)


def given_or_device_groups(split_sizes: torch.Tensor | None, num_rows: int,
                           groups: DeviceGroups | None) -> DeviceGroups | None:
    """A quantize launcher's groups: ``groups`` when the caller has them (the layer computes them
    once per step), else those of ``split_sizes``; None for an ungrouped tensor."""
    if groups is not None and split_sizes is None:
        raise ValueError("groups (the device prefix sums of split_sizes) were given without split_sizes")
    if split_sizes is not None and groups is None:
        return device_groups(split_sizes, num_rows)
    return groups


def launch_offsets(groups: DeviceGroups | None, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row_start, tile_start, block_start) for a kernel launch: those of ``groups``, or, for an
    ungrouped tensor (None), one-element placeholders that kernels built with GROUPED=False never read."""
    if groups is not None:
        return groups.row_start, groups.tile_start, groups.block_start
    placeholder = torch.empty(1, dtype=torch.int32, device=device)  # never read: an allocation, no launch
    return placeholder, placeholder, placeholder


def should_check_split_values(split_sizes: torch.Tensor) -> bool:
    """Whether to check split sizes' values eagerly: free on the CPU, on request elsewhere."""
    return split_sizes.device.type == "cpu" or setting("GMLP_VALIDATE")


def poison_scales_if_invalid(scales: torch.Tensor, groups: DeviceGroups | None, poison: float = 0xFF) -> None:
    """Set every scale to ``poison`` (the E8M0 NaN byte 0xFF; NaN for fp32 scales) when the split
    sizes were invalid; no host sync. Groups whose sizes were ``checked`` need none (one launch
    less per scale tensor)."""
    if groups is not None and not groups.checked:
        scales.masked_fill_(groups.valid.logical_not(), poison)  # a 0-dim mask, broadcast: every scale or none
