"""A simulated warp for the CPU models of the SM90 epilogues' shuffle steps: the 256 consumer
threads' values as (256,) tensors and the warp operations of
``gmlp.cutedsl.sm90._quantize_epilogue.DeviceOps`` on them."""

from __future__ import annotations

import torch

__all__ = ["THREADS", "WarpOps", "amax_keys", "amax_of_keys"]

THREADS = torch.arange(256)  # the consumer threads


class WarpOps:
    """``DeviceOps`` on (256,) int64 tensors holding one value per consumer thread (a shuffle
    stays within the thread's warp)."""

    @staticmethod
    def lane_bit(lane, offset):
        return (lane & offset) != 0

    @staticmethod
    def select(condition, if_value, else_value):
        return torch.where(condition, if_value, else_value)

    @staticmethod
    def shuffle_xor(value, offset):
        return value[THREADS ^ offset]

    @staticmethod
    def maximum(a, b):
        return torch.maximum(a, b)


def amax_keys(values: torch.Tensor) -> torch.Tensor:
    """The quantize kernel's fp32 amax keys (``_amax_keys``) as int64: 2 x + 0xFFFFFF mod 2**32,
    NaN below the key of 0."""
    bits = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return (bits * 2 + 0xFFFFFF) & 0xFFFFFFFF


def amax_of_keys(keys: torch.Tensor) -> torch.Tensor:
    """The fp32 amax of reduced keys (``_amax_of_keys``): 0 when every value was NaN."""
    return torch.where(keys >= 0xFFFFFF, (keys - 0xFFFFFF) >> 1, 0).to(torch.int32).view(torch.float32)
