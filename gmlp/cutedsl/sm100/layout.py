"""Layouts of cuDNN frontend's SM100 grouped kernels, from and to gmlp's (no host sync).

Those kernels want every expert's rows to start at a multiple of ``M_ALIGNED`` = 256 rows (their
``m_aligned``), described by ``padded_offsets``, the (E,) int32 cumulative padded ends; and, in
the GLU kernels, FC1's gate and up outputs interleaved in 32-column blocks
(``[g0:32, u0:32, g32:64, u32:64, ...]``) where gmlp stores W1 as [gate; up] halves. Rows are
moved with index tensors computed on the device; every size is a host-known bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.mxfp8.scale_layout import ceil_div

__all__ = ["M_ALIGNED", "GLU_BLOCK", "PaddedRows", "padded_rows", "padded_group_sizes", "to_padded", "from_padded",
           "interleave_gate_up", "deinterleave_gate_up", "split_interleaved"]

M_ALIGNED = 256
GLU_BLOCK = 32  # columns of gate, then of up, alternating


@dataclass(frozen=True)
class PaddedRows:
    """Where each expert's rows go when every expert starts at a multiple of M_ALIGNED rows."""

    offsets: torch.Tensor  # (E,) int32 cumulative padded ends (the kernels' padded_offsets)
    index: torch.Tensor  # (T,) int64 padded row of each token row

    @property
    def num_rows(self) -> int:
        """Rows of the padded tensors: a bound on offsets[-1], a multiple of M_ALIGNED (the sum
        over experts of ceil(m/256)*256 is at most T + 255 E). A property, so that the layout
        holds tensors only (a traced forward's saved state has no size in it)."""
        return (self.index.shape[0] + (M_ALIGNED - 1) * self.offsets.shape[0]) // M_ALIGNED * M_ALIGNED


def padded_rows(split_sizes: torch.Tensor, tokens: int) -> PaddedRows:
    """The padded layout of ``tokens`` rows split by expert (``split_sizes`` on the device)."""
    sizes = split_sizes.to(torch.int64)
    padded_sizes = (sizes + M_ALIGNED - 1) // M_ALIGNED * M_ALIGNED
    padded_ends = torch.cumsum(padded_sizes, 0)
    shift = (padded_ends - padded_sizes) - (torch.cumsum(sizes, 0) - sizes)  # padded start - start, per expert
    index = torch.arange(tokens, device=sizes.device) + torch.repeat_interleave(shift, sizes, output_size=tokens)
    return PaddedRows(padded_ends.to(torch.int32), index)


def padded_group_sizes(offsets: torch.Tensor, num_rows: int) -> torch.Tensor:
    """(E + 1,) int64 group sizes that cover all ``num_rows`` padded rows: each expert's padded
    size (from ``offsets``, the padded ends), then the slack after the last expert. Quantized
    columnwise with these groups, a padded tensor has each expert's 32-row blocks and scale
    tiles where the kernels read and write them."""
    ends = offsets.to(torch.int64)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    return torch.cat([sizes, num_rows - ends[-1:]])


def to_padded(x: torch.Tensor, rows: PaddedRows) -> torch.Tensor:
    """(rows.num_rows, ...) copy of x (T, ...) in the padded layout; padding rows are zeros."""
    out = x.new_zeros(rows.num_rows, *x.shape[1:])
    return out.index_copy_(0, rows.index, x)


def from_padded(y: torch.Tensor, rows: PaddedRows) -> torch.Tensor:
    """The (T, ...) token rows of a padded tensor."""
    return y.index_select(0, rows.index)


def interleave_gate_up(w1: torch.Tensor) -> torch.Tensor:
    """W1 (E, 2F, H) as [gate; up] halves -> rows interleaved in GLU_BLOCK blocks (a copy)."""
    experts, rows, hidden = w1.shape
    if rows % (2 * GLU_BLOCK):
        raise ValueError(f"w1 must have 2F rows with F a multiple of {GLU_BLOCK}, got {rows}")
    blocks = rows // (2 * GLU_BLOCK)
    return w1.reshape(experts, 2, blocks, GLU_BLOCK, hidden).transpose(1, 2).reshape(experts, rows, hidden)


def deinterleave_gate_up(w: torch.Tensor) -> torch.Tensor:
    """Inverse of ``interleave_gate_up``: (E, 2F, ...) rows in GLU_BLOCK blocks -> [gate; up] (a copy)."""
    experts, rows = w.shape[:2]
    if rows % (2 * GLU_BLOCK):
        raise ValueError(f"w must have 2F rows with F a multiple of {GLU_BLOCK}, got {rows}")
    blocks = rows // (2 * GLU_BLOCK)
    return w.reshape(experts, blocks, 2, GLU_BLOCK, *w.shape[2:]).transpose(1, 2).reshape(w.shape)


def split_interleaved(c: torch.Tensor) -> torch.Tensor:
    """(M, 2F) columns interleaved in GLU_BLOCK blocks (the GLU kernels' C) -> [gate | up] halves."""
    rows, columns = c.shape
    blocks = ceil_div(columns, 2 * GLU_BLOCK)
    if columns != blocks * 2 * GLU_BLOCK:
        raise ValueError(f"c must have 2F columns with F a multiple of {GLU_BLOCK}, got {columns}")
    return c.reshape(rows, blocks, 2, GLU_BLOCK).transpose(1, 2).reshape(rows, columns)
