"""The TMA-store epilogue of the sm_90a kernels: accumulators -> registers -> shared memory ->
TMA store (or TMA reduce-add), clipped by TMA at the tensor's edges.

Per tile, the consumer warpgroups walk the accumulator tile in subtiles of ``epi_tile`` (128 rows
when two warpgroups share the tile, 64 for one; 64 bytes of columns: 32 bf16 or 16 fp32; the
subtiles in row-major order over the tile, which is the order of the accumulator registers once
retiled by the copy). Per subtile: the fp32 values are rounded to the output's dtype in registers
(fp32: as they are), written to one of ``STAGES`` shared-memory buffers (``stmatrix`` for 16-bit
values, 32-bit shared stores for fp32), made visible to the async proxy (``fence.proxy.async``),
and once every consumer thread has written (named barrier ``BARRIER``), one warp issues the
TMA store of the buffer and commits it as a bulk group. Before a buffer is written again the
storing warp waits until at most ``STAGES - 1`` groups still read shared memory
(``PipelineTmaStore.producer_acquire``), and a second barrier holds the other threads until it
has. The stores are asynchronous: the next subtile's rounding, and after the tile the next
mainloop, run while they drain; the buffer index continues across tiles (a count of the tiles
done), and the kernel ends with ``drain`` (every group complete).

The caller gives the destination view: the token-row kernels the ``_tma.ragged_rows`` view of D,
so a tile's rows past the expert's end (the next expert's) are not written, and columns past N are
clipped by TMA; the weight gradient its (M, N, E) output, clipped at M and N. No predicate per
element. The rounding is the same conversion of the same fp32 accumulators as the register-store
epilogues, so the two give the same bytes; ``reduce=True`` adds each fp32 value once into the
destination (TMA's reduce-add at L2: one writer per tile, so the sum ``old + acc`` is the one
the load-add-store epilogue computes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32

__all__ = ["STAGES", "BARRIER", "EPI_BYTES", "epi_tile", "smem_bytes", "StoreOperands", "make_store_operands",
           "kernel_arguments", "TileStore"]

STAGES = 4  # shared-memory buffers of the subtiles in flight
EPI_BYTES = 64  # bytes of a subtile's row: 32 bf16 or 16 fp32 columns
# named barrier of the consumer warpgroups' epilogue (0 is the CTA's, 1 the quantizing
# epilogues'; 2-3 were the removed in-kernel decode's, kept free so that the PTX stays as recorded)
BARRIER = 4


def epi_tile(mma_warpgroups: int, dtype=BFloat16) -> tuple[int, int]:
    """(rows, columns) of a subtile of ``dtype``: the tile's 128 rows when two warpgroups share it
    (64 each), 64 for one (its two m64 blocks in turn); ``EPI_BYTES`` of columns."""
    return (64 * mma_warpgroups, EPI_BYTES * 8 // dtype.width)


def smem_bytes(mma_warpgroups: int, dtype=BFloat16) -> int:
    """Shared memory of the subtile buffers."""
    rows, _ = epi_tile(mma_warpgroups, dtype)
    return STAGES * rows * EPI_BYTES


class StoreOperands:
    """Host-side pieces (built in the ``@cute.jit`` host function): the staged smem layout of the
    subtiles and the TMA store atom + coordinate tensor of D's ragged view."""

    def __init__(self, smem_layout, tma_atom, tma_tensor):
        self.smem_layout = smem_layout
        self.tma_atom, self.tma_tensor = tma_atom, tma_tensor


def make_store_operands(destination: cute.Tensor, mma_warpgroups: int, dtype=BFloat16,
                        reduce: bool = False) -> StoreOperands:
    """The TMA store (``reduce``: reduce-add) of ``dtype`` subtiles into ``destination``, a tensor
    whose first two modes are the tile's rows and N-contiguous columns (more modes: coordinates
    a tile fixes, the expert's)."""
    tile = epi_tile(mma_warpgroups, dtype)
    smem_layout = sm90_utils.make_smem_layout_epi(dtype, utils.LayoutEnum.ROW_MAJOR, tile, STAGES)
    op = (cute.nvgpu.cpasync.CopyReduceBulkTensorTileS2GOp() if reduce
          else cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp())
    tma_atom, tma_tensor = cute.nvgpu.cpasync.make_tiled_tma_atom(
        op, destination, cute.slice_(smem_layout, (None, None, 0)), tile)
    return StoreOperands(smem_layout, tma_atom, tma_tensor)


def kernel_arguments(store: StoreOperands | None) -> tuple:
    """(TMA atom, TMA coordinates, smem layout) of a kernel's store arguments; Nones without a TMA store."""
    return (None, None, None) if store is None else (store.tma_atom, store.tma_tensor, store.smem_layout)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class TileStore:
    """Device side, built once per consumer thread before the item loop (``of``, in the kernel's
    trace): the ``stmatrix`` copy, its partition of the smem buffers and of the accumulators, the
    register staging, and the store pipeline. ``store`` writes one tile of the accumulators;
    ``subtiles`` and ``write`` serve an epilogue that computes its own values (several outputs a
    subtile, each a staged tensor in the accumulators' subtile order); ``drain`` ends the kernel.

    With ``outputs`` outputs a subtile, the buffers are ``STAGES // outputs`` groups of
    ``outputs`` (a subtile's stores are one bulk group), so a group is reused after the stores
    of the subtile that last used it completed."""

    copy_r2s: cute.TiledCopy
    tRS_sD: cute.Tensor  # (R2S, R2S_M, R2S_N, STAGES): this thread's part of the smem buffers
    tRS_acc: cute.Tensor  # the accumulators in subtile order: subtile s is values [s * size, (s + 1) * size)
    values: cute.Tensor  # one subtile's fp32 values
    rounded: cute.Tensor  # and their roundings to the output's dtype
    sD: cute.Tensor
    tile: tuple
    consumers: int
    outputs: int
    store_warp: cutlass.Boolean
    pipeline: pipeline.PipelineTmaStore

    @staticmethod
    def of(tiled_mma: cute.TiledMma, acc: cute.Tensor, sD: cute.Tensor, consumer_tidx: Int32, consumers: int,
           tile: tuple[int, int], store_warp, dtype=BFloat16, outputs: int = 1) -> TileStore:
        # the stmatrix copy's thread layout, with the store op of the dtype (stmatrix for 16-bit)
        copy_r2s = cute.make_tiled_copy_S(
            sm90_utils.sm90_get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, elem_ty_d=dtype, elem_ty_acc=Float32),
            cute.make_tiled_copy_C_atom(cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), BFloat16),
                                        tiled_mma))
        thr_copy = copy_r2s.get_slice(consumer_tidx)
        staged = cute.shape(thr_copy.partition_S(sD))[:3]
        return TileStore(copy_r2s, thr_copy.partition_D(sD), copy_r2s.retile(acc),
                         cute.make_rmem_tensor(staged, Float32), cute.make_rmem_tensor(staged, dtype), sD, tile,
                         consumers, outputs, store_warp,
                         pipeline.PipelineTmaStore.create(
                             num_stages=STAGES // outputs,
                             producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumers)))

    def over(self, accs: tuple) -> tuple:
        """One store a fragment of ``accs`` (this one is ``accs[0]``'s), all through this store's
        buffers and pipeline: a work item's 128-column halves stored one after the other."""
        return (self,) + tuple(dataclasses.replace(self, tRS_acc=self.copy_r2s.retile(acc)) for acc in accs[1:])

    def staging(self, dtype=None) -> cute.Tensor:
        """A register tensor of one subtile's values of one output (``dtype``: the store's)."""
        return cute.make_rmem_tensor(self.rounded.shape, dtype if dtype is not None else self.rounded.element_type)

    @cute.jit
    def targets(self, outputs: tuple):
        """(count, order, destinations) of a tile's outputs, each (TMA atom, gD: its TMA
        coordinates, the tile's shape): the tile's subtiles, index -> (m, n) subtile coordinate
        (n fastest: the accumulators' order), and per output (TMA atom, bSG_sD, bSG_gD), the
        TMA partitions of the smem buffers and of the destination by subtile (``write``'s)."""
        destinations = []
        for o in cutlass.range_constexpr(len(outputs)):
            tma_atom, gD = outputs[o]
            gD_subtiles = cute.zipped_divide(gD, self.tile)  # ((rows, cols), (subtile m, subtile n))
            bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(
                tma_atom, 0, cute.make_layout(1), cute.group_modes(self.sD, 0, 2), gD_subtiles)
            destinations.append((tma_atom, bSG_sD, bSG_gD))
        grid = gD_subtiles.shape[1]
        return cute.size(gD_subtiles, mode=[1]), cute.make_layout(grid, stride=(grid[1], 1)), tuple(destinations)

    @cute.jit
    def write(self, staged: tuple, destinations: tuple, coord, sequence: Int32, stored):
        """One subtile: each staged tensor of ``staged`` (this thread's values of one output) into
        its smem buffer, then, once every consumer thread has written, one warp TMA-stores buffer o
        by ``destinations[o]`` = (TMA atom, bSG_sD, bSG_gD) (``targets``' partitions) at subtile
        ``coord`` (``stored`` false: none, the subtile lies outside the output) as one bulk group.
        ``sequence``: the subtiles this thread wrote before."""
        group = sequence % (STAGES // self.outputs)
        for o in cutlass.range_constexpr(len(staged)):
            cute.copy(self.copy_r2s, staged[o], self.tRS_sD[(None, None, None, group * self.outputs + o)])
        # the generic-proxy smem writes, visible to the TMA (async proxy) store that reads them
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BARRIER, number_of_threads=self.consumers)
        if self.store_warp:
            if stored:
                for o in cutlass.range_constexpr(len(staged)):
                    tma_atom, bSG_sD, bSG_gD = destinations[o]
                    cute.copy(tma_atom, bSG_sD[(None, group * self.outputs + o)], bSG_gD[(None, coord)])
            self.pipeline.producer_commit()
            self.pipeline.producer_acquire()  # the group written next is free once this returns
        cute.arch.barrier(barrier_id=BARRIER, number_of_threads=self.consumers)

    @cute.jit
    def store(self, tma_atom: cute.CopyAtom, gD: cute.Tensor, tiles_done: Int32):
        """The accumulators' tile at ``gD`` (its TMA coordinates, the tile's shape), rounded to the
        store's dtype; what lies outside the destination's bounds is left as it is.
        ``tiles_done``: the tiles this thread stored before."""
        subtiles, order, destinations = self.targets(((tma_atom, gD),))
        per_subtile = cute.size(self.values)
        for index in cutlass.range_constexpr(subtiles):
            for v in cutlass.range_constexpr(per_subtile):
                self.values[v] = self.tRS_acc[index * per_subtile + v]
            self.rounded.store(self.values.load().to(self.rounded.element_type))
            self.write((self.rounded,), destinations, order.get_hier_coord(index), tiles_done * subtiles + index,
                       True)

    @cute.jit
    def drain(self):
        """Wait until every store of this thread's warp completed (the storing warp's groups)."""
        if self.store_warp:
            self.pipeline.producer_tail()
