"""Helpers of the FP8 blockwise tests."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise.tensor import FP8BlockwiseTensor


def on_device(q: FP8BlockwiseTensor, device: torch.device | str) -> FP8BlockwiseTensor:
    """``q`` with its data, scales and split sizes on ``device`` (the references run on the CPU)."""
    return FP8BlockwiseTensor(q.data.to(device), q.scale_inv.to(device), q.block_shape, q.element_format,
                              q.power_of_two, None if q.split_sizes is None else q.split_sizes.to(device))
