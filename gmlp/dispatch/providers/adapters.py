"""Calling conventions: every path's implementation of an op takes the arguments of the op's
Triton launcher. The torch implementations (the oracle's twins) ignore the launch-only ones."""

from __future__ import annotations

from typing import Callable

import torch

from gmlp.mxfp8.tensor import MXFP8Tensor

__all__ = ["without", "dequantize_ref"]


def without(*launch_only: str) -> Callable[[Callable], Callable]:
    """Wrap an implementation so that it accepts, and ignores, the Triton launcher's launch-only
    arguments."""
    def wrap(function: Callable) -> Callable:
        def twin(*args, **kwargs):
            for name in launch_only:
                kwargs.pop(name, None)
            return function(*args, **kwargs)
        twin.__name__ = twin.__qualname__ = function.__name__
        return twin
    return wrap


def dequantize_ref(tensor: MXFP8Tensor, groups=None) -> torch.Tensor:
    """The spec's dequantize, rounded to bf16 (what the Triton kernel writes, bit for bit)."""
    del groups
    return tensor.dequantize().to(torch.bfloat16)
