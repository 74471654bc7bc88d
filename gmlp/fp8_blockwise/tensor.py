"""Containers for FP8 blockwise quantized tensors (plain frozen dataclasses, not tensor subclasses)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["BlockShape", "FP8BlockwiseTensor", "FP8BlockwiseQuantized", "FP8BlockwiseWeightPair", "require_block_shape",
           "absolute"]


class BlockShape(enum.Enum):
    """Which values share one scale (``gmlp.fp8_blockwise.layout`` has the layouts)."""

    ROWWISE = "1x128"
    """128 consecutive values of a row (along K): data (T, K), scales (K/128, pad4(T))."""
    COLUMNWISE = "128x1"
    """128 consecutive tokens of one expert in a column: data transposed and block-aligned
    (K, 128 n_blocks), each expert from the start of a block; scales (K, pad4(n_blocks))."""
    TILE = "128x128"
    """A 128 x 128 tile of a weight (..., N, K): data (..., N, K), scales (..., N/128, K/128)."""


@dataclass(frozen=True)
class FP8BlockwiseTensor:
    """One quantized orientation of a source tensor: fp8 ``data`` and fp32 ``scale_inv`` (the
    padded buffers of ``gmlp.fp8_blockwise.layout``). ``split_sizes`` (E,) int on the data's
    device when a token operand's rows are grouped by expert; None otherwise. ``num_rows``: T of a
    columnwise tensor (its data's block-aligned width does not tell it); None for the others."""

    data: torch.Tensor
    scale_inv: torch.Tensor
    block_shape: BlockShape
    element_format: ElementFormat
    power_of_two: bool
    split_sizes: torch.Tensor | None = None
    num_rows: int | None = None

    def __post_init__(self):
        if (self.block_shape is BlockShape.COLUMNWISE) != (self.num_rows is not None):
            raise ValueError(f"num_rows is T of a columnwise tensor and None for the others, got {self.num_rows} "
                             f"with {self.block_shape.value} blocks")

    @property
    def source_shape(self) -> tuple[int, ...]:
        """Shape of the tensor that was quantized ((T, K) for token operands)."""
        if self.block_shape is BlockShape.COLUMNWISE:
            return self.num_rows, self.data.shape[0]
        return tuple(self.data.shape)

    def expert_sizes(self) -> list[int]:
        """Each expert's token count (host values: syncs with the device)."""
        return [self.num_rows] if self.split_sizes is None else [int(m) for m in self.split_sizes.tolist()]

    def element_scales(self) -> torch.Tensor:
        """fp32 ``scale_inv`` of each element's block, in the source's shape (syncs with the
        device to read the split sizes of a columnwise tensor)."""
        if self.block_shape is BlockShape.TILE:
            return self.scale_inv.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
        rows, cols = self.source_shape
        if self.block_shape is BlockShape.ROWWISE:
            return self.scale_inv[:, :rows].t().repeat_interleave(BLOCK, dim=1)
        columns = layout.columnwise_token_columns(self.expert_sizes(), self.data.device)
        return self.scale_inv.index_select(1, columns // BLOCK).t()

    def dequantize(self) -> torch.Tensor:
        """fp32 values ``q * scale_inv`` in the source's shape."""
        if self.block_shape is BlockShape.COLUMNWISE:
            return self.token_data().float() * self.element_scales()
        return self.data.float() * self.element_scales()

    def token_data(self) -> torch.Tensor:
        """A columnwise tensor's fp8 values in the source's shape (T, K), the padding left out
        (syncs with the device to read the split sizes)."""
        if self.block_shape is not BlockShape.COLUMNWISE:
            raise ValueError(f"token_data is a columnwise tensor's, got {self.block_shape.value} blocks")
        columns = layout.columnwise_token_columns(self.expert_sizes(), self.data.device)
        return self.data.index_select(1, columns).t()

    def transpose(self) -> FP8BlockwiseTensor:
        """A weight's transpose (..., K, N): its data and scales transposed (128 x 128 tiles only)."""
        if self.block_shape is not BlockShape.TILE:
            raise ValueError(f"only 128x128-tiled weights transpose exactly (a 1-D block's transpose is another "
                             f"quantization), got {self.block_shape.value}")
        return FP8BlockwiseTensor(self.data.transpose(-2, -1).contiguous(),
                                  self.scale_inv.transpose(-2, -1).contiguous(), BlockShape.TILE,
                                  self.element_format, self.power_of_two)

    def __repr__(self) -> str:
        groups = "" if self.split_sizes is None else f", experts={self.split_sizes.numel()}"
        scales = "power-of-two" if self.power_of_two else "fp32"
        return (f"FP8BlockwiseTensor({self.block_shape.value}, source={self.source_shape}, "
                f"{self.element_format.value}, {scales} scales, data={tuple(self.data.shape)}, "
                f"scale_inv={tuple(self.scale_inv.shape)}{groups}, device={self.data.device})")


@dataclass(frozen=True)
class FP8BlockwiseQuantized:
    """A token operand's rowwise (1 x 128) and/or columnwise (128 x 1) quantizations, each from
    the source values (the columnwise one is never re-quantized from the rowwise fp8)."""

    rowwise: FP8BlockwiseTensor | None
    columnwise: FP8BlockwiseTensor | None


@dataclass(frozen=True)
class FP8BlockwiseWeightPair:
    """A weight's 128 x 128 tiles in both orientations, made from one read of W: ``tiles`` W's
    (..., N, K), ``transposed`` W^T's (..., K, N), each bit for bit the quantize of its orientation
    alone (a tile's amax is its transpose's)."""

    tiles: FP8BlockwiseTensor
    transposed: FP8BlockwiseTensor


def require_block_shape(value, name: str, block_shape: BlockShape) -> None:
    """Raise TypeError unless argument ``name`` is an ``FP8BlockwiseTensor`` of ``block_shape`` blocks."""
    if not isinstance(value, FP8BlockwiseTensor) or value.block_shape is not block_shape:
        raise TypeError(f"{name} must be an FP8BlockwiseTensor with {block_shape.value} blocks, got {value!r}")


def absolute(q: FP8BlockwiseTensor) -> FP8BlockwiseTensor:
    """The same blocks with |elements| and |scales| (NaN scales stay NaN): a GEMM of such operands
    is the sum of |products| that bounds a summation's rounding error."""
    magnitudes = q.data.view(torch.uint8) & 0x7F  # the sign bit cleared: |q| in both fp8 formats
    return FP8BlockwiseTensor(magnitudes.view(q.data.dtype), q.scale_inv.abs(), q.block_shape, q.element_format,
                              q.power_of_two, q.split_sizes, q.num_rows)
