"""The TMA-store epilogue of the sm_90a token-row kernels: accumulators -> registers -> shared
memory -> TMA store, clipped at the expert's last row.

Per tile, the consumer warpgroups walk the accumulator tile in subtiles of ``epi_tile`` (128 x 32
when two warpgroups share the tile, 64 x 32 for one; the subtiles in row-major order over the
tile, which is the order of the accumulator registers once retiled by the ``stmatrix`` copy).
Per subtile: the fp32 values are rounded to bf16 in registers, written to one of ``STAGES``
shared-memory buffers with ``stmatrix``, made visible to the async proxy (``fence.proxy.async``),
and once every consumer thread has written (named barrier ``BARRIER``), one warp issues the
TMA store of the buffer and commits it as a bulk group. Before a buffer is written again the
storing warp waits until at most ``STAGES - 1`` groups still read shared memory
(``PipelineTmaStore.producer_acquire``), and a second barrier holds the other threads until it
has. The stores are asynchronous: the next subtile's rounding, and after the tile the next
mainloop, run while they drain; the buffer index continues across tiles (a count of the tiles
done), and the kernel ends with ``drain`` (every group complete).

The destination is the ``_tma.ragged_rows`` view of D, so a tile's rows past the expert's end
(the next expert's) are not written, and columns past N are clipped by TMA: no predicate per
element. The rounding is the same ``to(BFloat16)`` of the same fp32 accumulators as the
register-store epilogue, so the two give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32

from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows

__all__ = ["STAGES", "BARRIER", "EPI_N", "epi_tile", "smem_bytes", "StoreOperands", "make_store_operands",
           "kernel_arguments", "TileStore"]

STAGES = 4  # shared-memory buffers of the subtiles in flight
EPI_N = 32  # columns of a subtile
# named barrier of the consumer warpgroups' epilogue (0 is the CTA's, 1 the quantizing
# epilogues', 2-3 the decode's: _decode.FIRST_BARRIER)
BARRIER = 4


def epi_tile(mma_warpgroups: int) -> tuple[int, int]:
    """(rows, columns) of a subtile: the tile's 128 rows when two warpgroups share it (64 each),
    64 for one (its two m64 blocks in turn)."""
    return (64 * mma_warpgroups, EPI_N)


def smem_bytes(mma_warpgroups: int) -> int:
    """Shared memory of the bf16 subtile buffers."""
    rows, cols = epi_tile(mma_warpgroups)
    return STAGES * rows * cols * 2


class StoreOperands:
    """Host-side pieces (built in the ``@cute.jit`` host function): the staged smem layout of the
    subtiles and the TMA store atom + coordinate tensor of D's ragged view."""

    def __init__(self, smem_layout, tma_atom, tma_tensor, tile):
        self.smem_layout = smem_layout
        self.tma_atom, self.tma_tensor = tma_atom, tma_tensor
        self.tile = tile


def make_store_operands(mD: cute.Tensor, mma_warpgroups: int) -> StoreOperands:
    """The TMA store of subtiles of a row-major bf16 D (T, N) through its ragged view."""
    tile = epi_tile(mma_warpgroups)
    smem_layout = sm90_utils.make_smem_layout_epi(BFloat16, utils.LayoutEnum.from_tensor(mD), tile, STAGES)
    tma_atom, tma_tensor = cute.nvgpu.cpasync.make_tiled_tma_atom(
        cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), ragged_rows(mD), cute.slice_(smem_layout, (None, None, 0)), tile)
    return StoreOperands(smem_layout, tma_atom, tma_tensor, tile)


def kernel_arguments(store: StoreOperands | None) -> tuple:
    """(TMA atom, TMA coordinates, smem layout) of a kernel's store arguments; Nones without a TMA store."""
    return (None, None, None) if store is None else (store.tma_atom, store.tma_tensor, store.smem_layout)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class TileStore:
    """Device side, built once per consumer thread before the item loop (``of``, in the kernel's
    trace): the ``stmatrix`` copy, its partition of the smem buffers and of the accumulators, the
    register staging, and the store pipeline. ``store`` writes one tile; ``drain`` ends the kernel."""

    copy_r2s: cute.TiledCopy
    tRS_sD: cute.Tensor  # (R2S, R2S_M, R2S_N, STAGES): this thread's part of the smem buffers
    tRS_acc: cute.Tensor  # the accumulators in subtile order
    values: cute.Tensor  # one subtile's fp32 values
    rounded: cute.Tensor  # and their bf16 roundings
    sD: cute.Tensor
    mD: cute.Tensor  # TMA coordinates of D's ragged view
    tile_shape: tuple
    tile: tuple
    consumers: int
    store_warp: cutlass.Boolean
    pipeline: pipeline.PipelineTmaStore

    @staticmethod
    def of(tiled_mma: cute.TiledMma, acc: cute.Tensor, sD: cute.Tensor, mD: cute.Tensor, consumer_tidx: Int32,
           consumers: int, tile_shape: tuple[int, int], tile: tuple[int, int], store_warp) -> TileStore:
        copy_r2s = cute.make_tiled_copy_S(
            sm90_utils.sm90_get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, elem_ty_d=BFloat16, elem_ty_acc=Float32),
            cute.make_tiled_copy_C_atom(cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), BFloat16),
                                        tiled_mma))
        thr_copy = copy_r2s.get_slice(consumer_tidx)
        staged = cute.shape(thr_copy.partition_S(sD))[:3]
        return TileStore(copy_r2s, thr_copy.partition_D(sD), copy_r2s.retile(acc),
                         cute.make_rmem_tensor(staged, Float32), cute.make_rmem_tensor(staged, BFloat16), sD, mD,
                         tile_shape, tile, consumers, store_warp,
                         pipeline.PipelineTmaStore.create(
                             num_stages=STAGES,
                             producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumers)))

    @cute.jit
    def store(self, tma_atom: cute.CopyAtom, n_tile: Int32, first_row: Int32, end_row: Int32, tiles_done: Int32):
        """The tile of rows [first_row, first_row + 128) x columns n_tile * BN + [0, BN) of D; rows
        from end_row on (the next expert's) and columns past N are left as they are."""
        gD = cute.local_tile(expert_rows(self.mD, first_row, end_row - first_row), self.tile_shape, (0, n_tile))
        gD_subtiles = cute.zipped_divide(gD, self.tile)  # ((rows, cols), (subtile m, subtile n))
        bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(self.sD, 0, 2), gD_subtiles)
        grid = gD_subtiles.shape[1]
        order = cute.make_layout(grid, stride=(grid[1], 1))  # subtile index -> (m, n), n fastest
        per_subtile = cute.size(self.values)
        subtiles = cute.size(gD_subtiles, mode=[1])
        for index in cutlass.range_constexpr(subtiles):
            for v in cutlass.range_constexpr(per_subtile):
                self.values[v] = self.tRS_acc[index * per_subtile + v]
            self.rounded.store(self.values.load().to(BFloat16))
            buffer = (tiles_done * subtiles + index) % STAGES
            cute.copy(self.copy_r2s, self.rounded, self.tRS_sD[(None, None, None, buffer)])
            # the generic-proxy smem writes, visible to the TMA (async proxy) store that reads them
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=BARRIER, number_of_threads=self.consumers)
            if self.store_warp:
                cute.copy(tma_atom, bSG_sD[(None, buffer)], bSG_gD[(None, order.get_hier_coord(index))])
                self.pipeline.producer_commit()
                self.pipeline.producer_acquire()  # the buffer written next is free once this returns
            cute.arch.barrier(barrier_id=BARRIER, number_of_threads=self.consumers)

    @cute.jit
    def drain(self):
        """Wait until every store of this thread's warp completed (the storing warp's groups)."""
        if self.store_warp:
            self.pipeline.producer_tail()
