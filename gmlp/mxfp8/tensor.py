"""Containers for MXFP8-quantized tensors (plain frozen dataclasses, not tensor subclasses)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode, e8m0_to_float

__all__ = ["QuantAxis", "MXFP8Tensor", "MXFP8Quantized", "MXFP8Values"]


class QuantAxis(enum.Enum):
    """Direction of the 32-element blocks."""

    ROWWISE = "rowwise"
    """Blocks along the last dimension K of an (M, K) source. data: (M, K); compact scales (M, K/32)."""
    COLUMNWISE = "columnwise"
    """Blocks along the first dimension M (tokens), per expert when grouped. data is written
    transposed, (K, M), so that it is K-major for the GEMM that contracts over tokens (weight
    gradients); compact scales (K, n_blocks) (see ``gmlp.mxfp8.scale_layout``)."""


@dataclass(frozen=True)
class MXFP8Tensor:
    """One quantized orientation of an (M, K) source tensor.

    ``scales`` is uint8 E8M0: a compact matrix, or when ``swizzled`` the flat padded swizzled
    vector of ``gmlp.mxfp8.scale_layout``. ``split_sizes`` (E,) int on the data's device, when the M
    rows are grouped by expert; None for a plain matrix.
    """

    data: torch.Tensor
    scales: torch.Tensor
    axis: QuantAxis
    swizzled: bool
    element_format: ElementFormat
    scale_mode: ScaleMode
    split_sizes: torch.Tensor | None = None

    @property
    def source_shape(self) -> tuple[int, int]:
        """(M, K) of the tensor that was quantized."""
        rows, cols = self.data.shape
        return (rows, cols) if self.axis is QuantAxis.ROWWISE else (cols, rows)

    def compact_scales(self) -> torch.Tensor:
        """Scales as the compact matrix of ``gmlp.mxfp8.scale_layout`` (unswizzled if needed)."""
        if not self.swizzled:
            return self.scales
        m, k = self.source_shape
        splits = self.split_sizes if self.split_sizes is not None else torch.tensor([m])
        if self.axis is QuantAxis.ROWWISE:
            return scale_layout.unswizzle_rowwise_grouped(self.scales, splits, k // BLOCK_SIZE)
        return scale_layout.unswizzle_columnwise_grouped(self.scales, splits, k, m)

    def element_scales(self) -> torch.Tensor:
        """fp32 (M, K) scale ``2**(e - 127)`` of each element's block, in the source's orientation."""
        m, k = self.source_shape
        scales = e8m0_to_float(self.compact_scales())
        if self.axis is QuantAxis.ROWWISE:
            return torch.repeat_interleave(scales, BLOCK_SIZE, dim=1)
        out = torch.empty(k, m, dtype=torch.float32, device=self.data.device)
        splits = self.split_sizes.tolist() if self.split_sizes is not None else [m]
        row, block = 0, 0
        for rows in (int(r) for r in splits):  # each expert's 32-row blocks start at its first row
            blocks = scale_layout.ceil_div(rows, BLOCK_SIZE)
            out[:, row : row + rows] = torch.repeat_interleave(scales[:, block : block + blocks], BLOCK_SIZE, dim=1)[:, :rows]
            row, block = row + rows, block + blocks
        return out.t()

    def dequantize(self) -> torch.Tensor:
        """fp32 (M, K) values, in the source's orientation."""
        data = self.data if self.axis is QuantAxis.ROWWISE else self.data.t()
        return data.float() * self.element_scales()

    def __repr__(self) -> str:
        m, k = self.source_shape
        layout = "swizzled" if self.swizzled else "compact"
        groups = "" if self.split_sizes is None else f", experts={self.split_sizes.numel()}"
        return (
            f"MXFP8Tensor({self.axis.value}, source=({m}, {k}), {self.element_format.value}, "
            f"{self.scale_mode.value}, data={tuple(self.data.shape)}, scales={tuple(self.scales.shape)} "
            f"{layout}{groups}, device={self.data.device})"
        )


@dataclass(frozen=True)
class MXFP8Quantized:
    """Result of ``quantize_mxfp8``: the rowwise and/or columnwise quantization of one tensor."""

    rowwise: MXFP8Tensor | None
    columnwise: MXFP8Tensor | None

    def __repr__(self) -> str:
        return f"MXFP8Quantized(\n  rowwise={self.rowwise!r},\n  columnwise={self.columnwise!r})"


@dataclass(frozen=True)
class MXFP8Values:
    """Result of ``quantize_dequantize_mxfp8``: the values an MXFP8 GEMM multiplies, in bf16 and
    in the source's (M, K) orientation, of the rowwise and/or columnwise quantization of one
    tensor (``quantize_mxfp8(...).rowwise.dequantize()`` in bf16, bit for bit), with no fp8
    tensor kept."""

    rowwise: torch.Tensor | None
    columnwise: torch.Tensor | None
