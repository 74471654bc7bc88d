"""The CUDA device a CuTeDSL launch runs on: its operands' GPU, switched to only when it is not current."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["on_device"]


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """A context in which ``device`` is the current CUDA device (a launch, and a first compile,
    run there): ``torch.cuda.device(device)`` when another one is current, else nothing to do
    (entering ``torch.cuda.device`` costs a few microseconds of host time at every launch)."""
    if device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()
