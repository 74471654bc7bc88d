"""A simulated warp for the CPU models of the SM90 epilogues' shuffle steps: the 256 consumer
threads' values as (256,) tensors and the warp operations of
``gmlp.cutedsl.sm90._quantize_epilogue.DeviceOps`` on them."""

from __future__ import annotations

import torch

__all__ = ["THREADS", "WarpOps"]

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
