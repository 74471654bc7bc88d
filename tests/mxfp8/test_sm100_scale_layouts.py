"""gmlp's swizzled scale layouts are the SM100 kernels' scale-factor layouts, offset for offset.

The kernels build their scale-factor layouts from CuTe layouts (``cutlass.utils.blockscaled_layout``)
at trace time; here those same expressions are evaluated on the CPU, inside a ``cute.jit`` trace,
and every block's offset is compared with the one gmlp writes (``gmlp.mxfp8.scale_layout``). Where each
expression comes from, in cuDNN frontend 1.32 (``cudnn/gemm/cutedsl/grouped``):
- SFA / SFD_row, and SFB of a dense B (n, k, l) whatever its major mode: ``tile_atom_to_shape_SF``
  of the operand's shape (``glu/moe_blockscaled_grouped_gemm_glu_bias.py``, the quant and dGLU
  kernels alike);
- SFD_col with ``discrete_col_sfd``: each expert's ``tile_to_shape`` of the MN-major 32-block
  chunk, based at the row layout's offset of the expert's first padded row (the GLU kernel's
  epilogue; dGLU's with ``moe_sched_extension.py``);
- the weight-gradient kernel's SFA / SFB: per expert ``tile_atom_to_shape_SF((N_pad, t_e, 1))`` at
  ``N_pad * token_offset / 32`` (``moe_utils.py``, ``WgradSfTensormapConstructor``).
The torch twins of the kernels (``tests/support/sm100_twins.py``) read scales through gmlp's layouts, so
these equalities are what makes them read what the kernels read.
"""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8 import scale_layout

cute = pytest.importorskip("cutlass.cute")
blockscaled = pytest.importorskip("cutlass.utils.blockscaled_layout")
OperandMajorMode = pytest.importorskip("cutlass.cute.nvgpu").OperandMajorMode

PADDED_SIZES = [256, 512, 256]  # padded expert sizes (multiples of 256); 1024 padded token rows
FEATURES = 192  # not a multiple of 128: the padding of the 128-wide feature tiles counts
EXPERTS, K = 3, 256


def _traced(body) -> dict:
    """Run ``body(out)`` inside a cute.jit trace (the layouts are trace-time objects)."""
    out: dict = {}

    @cute.jit
    def trace():
        body(out)

    trace()
    return out


def _kernels_offsets(out: dict) -> None:
    rows, n = sum(PADDED_SIZES), FEATURES
    starts = [sum(PADDED_SIZES[:e]) for e in range(len(PADDED_SIZES))]
    row_layout = blockscaled.tile_atom_to_shape_SF((rows, n, 1), 32)
    out["row"] = {(m, j): cute.crd2idx((m, j * 32, 0), row_layout) for m in range(rows) for j in range(n // 32)}
    chunk = blockscaled.BlockScaledBasicChunk(32, OperandMajorMode.MN).layout
    discrete = {}
    for start, size in zip(starts, PADDED_SIZES):
        base = cute.crd2idx((start, 0, 0), row_layout)
        expert = cute.tile_to_shape(chunk, (size, n, 1), (1, 2, 3))
        discrete.update({(start + m, f): base + cute.crd2idx((m, f, 0), expert) for m in range(0, size, 32) for f in range(n)})
    out["discrete_col"] = discrete
    n_pad = scale_layout.ceil_div(n, 128) * 128
    wgrad = {}
    for start, size in zip(starts, PADDED_SIZES):
        expert = blockscaled.tile_atom_to_shape_SF((n_pad, size, 1), 32)
        wgrad.update({(start + m, f): n_pad * start // 32 + cute.crd2idx((f, m, 0), expert)
                      for m in range(0, size, 32) for f in range(n)})
    out["wgrad"] = wgrad
    sfb = blockscaled.tile_atom_to_shape_SF((128, K, EXPERTS), 32)
    out["sfb"] = {(e, r, k): cute.crd2idx((r, k, e), sfb) for e in range(EXPERTS) for r in range(128)
                  for k in range(0, K, 32)}


@pytest.fixture(scope="module")
def kernels() -> dict:
    return _traced(_kernels_offsets)


def test_row_scales_are_gmlps_rowwise_swizzle(kernels):
    """SFA / SFD_row of (M_pad, N): gmlp's swizzled rowwise scales (N / 32 = 6 block columns, so
    the 4-wide column padding of the last tile counts)."""
    columns = FEATURES // 32
    assert all(offset == scale_layout.swizzled_index(m, j, columns) for (m, j), offset in kernels["row"].items())


def test_discrete_column_scales_are_gmlps_grouped_columnwise_swizzle(kernels):
    """SFD_col with ``discrete_col_sfd`` = gmlp's grouped columnwise swizzle of the padded (M_pad,
    N) tensor, split by the padded sizes; and the weight-gradient kernel reads that same layout."""
    rows, blocks = sum(PADDED_SIZES), sum(PADDED_SIZES) // 32
    compact = torch.arange(1, FEATURES * blocks + 1).view(FEATURES, blocks)  # every block's scale distinct
    flat = scale_layout.swizzle_columnwise_grouped(compact, torch.tensor(PADDED_SIZES), rows)
    assert all(flat[offset] == compact[f, m // 32] for (m, f), offset in kernels["discrete_col"].items())
    assert kernels["wgrad"] == kernels["discrete_col"]
    ungrouped = scale_layout.swizzle(compact)  # the kernels' default (not discrete) layout: not what gmlp writes
    assert not all(ungrouped[offset] == compact[f, m // 32] for (m, f), offset in kernels["discrete_col"].items())


def test_weight_scales_are_gmlps_stack_swizzles(kernels):
    """SFB of a dense B, (N, K, E) with N = 128 here: gmlp's rowwise swizzle of the (E * N, K)
    stack (a K-major B: Q_row of the weights), and its grouped columnwise swizzle of the (E * K,
    N) stack split [K] * E (an N-major B: Q_col of the weights in their own orientation)."""
    n, k_blocks = 128, K // 32
    assert all(offset == scale_layout.swizzled_index(e * n + r, k // 32, k_blocks)
               for (e, r, k), offset in kernels["sfb"].items())
    compact = torch.arange(1, n * EXPERTS * k_blocks + 1).view(n, EXPERTS * k_blocks)  # (N, E * K / 32)
    flat = scale_layout.swizzle_columnwise_grouped(compact, torch.tensor([K] * EXPERTS), EXPERTS * K)
    assert all(flat[offset] == compact[r, (e * K + k) // 32] for (e, r, k), offset in kernels["sfb"].items())
