"""Helpers of the FP8 blockwise tests."""

from __future__ import annotations

import dataclasses

import torch

from gmlp.fp8_blockwise.tensor import FP8BlockwiseTensor


def on_device(q: FP8BlockwiseTensor, device: torch.device | str) -> FP8BlockwiseTensor:
    """``q`` with its data, scales and split sizes on ``device`` (the references run on the CPU)."""
    return dataclasses.replace(q, data=q.data.to(device), scale_inv=q.scale_inv.to(device),
                               split_sizes=None if q.split_sizes is None else q.split_sizes.to(device))
