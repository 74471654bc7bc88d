"""Ragged TMA views of token-row tensors: per-expert bounds without masking code.

TMA clips a box only at a tensor's edges, and an expert's rows end inside a (T, features) tensor.
The views here give TMA a 4-D tensor whose token extent ends where the expert ends (the varlen
trick of QuACK's ``copy_utils.create_ragged_tensor_for_tma``, 2-extra-dim form, reimplemented):
token mode of extent ``BIG`` and stride s (the row stride), then two modes of extent ``MAX`` with
strides ``WRAP - s`` and s, all in elements. A box at token coordinate ``BIG - rows + r`` with the
extra modes at ``(BIG, first_row + rows)`` addresses row ``first_row + r``: the middle term is
``BIG * (WRAP - s) = 2**64 - BIG * s``, which wraps, and the rest sums to ``(first_row + r) * s``.
The box is in bounds exactly for ``r < rows``: a load reads zeros past the expert's end, a store
writes nothing there. The descriptor's base stays the tensor's own pointer (QuACK found that TMA
loads fault when the base is shifted outside mapped memory: their
``AI/ragged_tma_ptr_shift_finding.md``), and T never enters it. The feature mode keeps its true
extent, so its tail is ordinary TMA clipping.

Two mode orders: ``ragged_tokens`` (features, BIG, MAX, MAX) for the weight gradient's MN-major
loads, ``ragged_rows`` (BIG, features, MAX, MAX) for token-row stores whose boxes are (rows,
columns) tiles. TMA's limits hold for any row stride s of a multiple of 16 bytes: the strides in
bytes are multiples of 16 below 2**40 (``WRAP`` = 2**34 elements) and every coordinate fits an
int32 (tests/cutedsl/sm90/test_tma.py emulates the addressing with Python integers).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32

__all__ = ["BIG", "MAX", "WRAP", "ragged_tokens", "expert_tokens", "ragged_rows", "expert_rows"]

BIG = 2**30  # the token mode's extent: an expert's rows end at coordinate BIG
MAX = 2**31 - 1  # the extra modes' extent (int32 coordinates)
WRAP = 2**64 // BIG  # BIG * WRAP == 2**64: the wrap-around stride factor


def ragged_tokens(tensor: cute.Tensor) -> cute.Tensor:
    """The (features, BIG, MAX, MAX) view of a row-major (T, features) tensor; same pointer, T dropped."""
    row_stride = tensor.layout.stride[0]
    layout = cute.make_layout((tensor.shape[1], BIG, MAX, MAX), stride=(1, row_stride, WRAP - row_stride, row_stride))
    return cute.make_tensor(tensor.iterator, layout)


def expert_tokens(coords: cute.Tensor, first_row: Int32, rows: Int32) -> cute.Tensor:
    """(features, BIG) TMA coordinates of an expert's rows [first_row, first_row + rows) of a
    ``ragged_tokens`` view: token r at mode-1 coordinate BIG - rows + r (out of bounds from r = rows)."""
    return cute.domain_offset((None, BIG - rows), coords[(None, None, BIG, first_row + rows)])


def ragged_rows(tensor: cute.Tensor) -> cute.Tensor:
    """The (BIG, features, MAX, MAX) view of a row-major (T, features) tensor; same pointer, T dropped."""
    row_stride = tensor.layout.stride[0]
    layout = cute.make_layout((BIG, tensor.shape[1], MAX, MAX), stride=(row_stride, 1, WRAP - row_stride, row_stride))
    return cute.make_tensor(tensor.iterator, layout)


def expert_rows(coords: cute.Tensor, first_row: Int32, rows: Int32) -> cute.Tensor:
    """(BIG, features) TMA coordinates of rows [first_row, first_row + rows) of a ``ragged_rows``
    view: row r at mode-0 coordinate BIG - rows + r (out of bounds from r = rows)."""
    return cute.domain_offset((BIG - rows, None), coords[(None, None, BIG, first_row + rows)])
