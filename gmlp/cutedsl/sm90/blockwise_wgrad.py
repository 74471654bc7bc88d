"""CuTeDSL sm_90a grouped weight gradient of the FP8 blockwise recipe ``dW_g = A_g^T @ B_g`` over
each expert's tokens, the two operands' 128 x 1 scales promoted every 128 tokens (FC2 wgrad: A =
Q_col(dy), B = Q_col(a); FC1 wgrad: A = Q_col(dh), B = Q_col(x)).

Twin of ``gmlp.triton_ref.blockwise_wgrad`` (same operands: columnwise ``FP8BlockwiseTensor``s,
data (features, 128 n_blocks) with expert g's tokens from block ``tile_start[g]``, the padding
zeros, scales (features, pad4(n_blocks)); same promotion ``acc += (sa[m] * sb[n]) * P``, the result
up to the summation order). Compiled for sm_90a on the CPU (its PTX checked), run against the
Triton twin on the H100; the layer's weight-gradient sites take it on 9.x.

Kernel design (DeepGEMM's 1D1D form as a site of the engine, ``_engine``: its own producer and
k-loop on the skeleton's roles, slots and barriers):

- Work items: output tiles (expert g, m-tile, n-tile) of 128 x 128, item ``(g * m_tiles +
  m_tile) * n_tiles + n_tile`` (n fastest: CTAs running together share expert g's A panel); a
  persistent grid walks them. ``wide`` (the default where N % 256 == 0): an n-tile is two 128-column
  halves, whose slots hold A's k-tile once and B's two (with their scale boxes): 54 KB a slot, 4
  stages; at 128 x 128 the kernel is L2-bound (32 KB a 128 x 128 x 128 step, ncu 2026-12-05: L2
  92 %). Expert g's k-tiles are its 128-token blocks, data columns
  ``128 (tile_start[g] + k)``: each is one scale block and a 16-byte aligned TMA box of both
  operands (K-major fp8, 128 bytes a row: one 128-byte swizzle row); the padding's zeros make
  the last one exact, and an empty expert's tile is zeros (or adds nothing to main_grad).
- Warp-specialized: warp 0 the TMA producer; two consumer warpgroups, each 64 rows of the tile
  (m64n128k32 fp8 ``wgmma``, both operands K-major).
- The scales travel with the data: each slot also holds, by TMA on the same full barrier, a
  (128 rows, 4 blocks) fp32 box of A's and of B's scales, the 16-byte aligned group of four
  blocks holding the k-tile's (a scale row is ``pad4(n_blocks)`` floats; a box started at the
  block itself would start off a 16-byte boundary). Loaded by each thread from global memory
  instead (34 scattered loads a k-tile), they throttled the load/store unit (ncu on the H100:
  tensor pipe 16 %, ``lg_throttle`` the second stall).
- The promotion: per k-tile, four k=32 ``wgmma`` into a fresh fp32 fragment ``partial``; while
  they run, the thread reads its scales of the block from the slot: its two rows' of A (m64
  layout: elements 4j, 4j+1 one row, 4j+2, 4j+3 the row 8 below) and its 32 columns' of B
  (elements 4j + h and 4j + 2 + h are column 8j + 2 (lane % 4) + h); then ``wait_group(0)``, the
  slot released, and ``acc += sa[row] * sb[col] * partial`` in registers (64 + 64 + 34
  registers a thread; ``wide``: the halves one after the other through the one ``partial`` and
  the one set of column scales, 64 + 64 + 64 + 34). The two consumer warpgroups wait and release
  on their own, so one's promotion runs while the other's ``wgmma``s do.
- Epilogue (``BlockwiseWgradConfig.store``): "regs", from the registers
  (``RegisterPaths.store_tile``): fp32 or bf16 pairs, or the fp32 pairs of ``out`` loaded, added
  and stored (main_grad), the tensor pipe idle meanwhile; "tma", the engine's TMA-store epilogue
  (``_store``): each half's tile rounded into shared-memory subtiles and TMA-stored (reduce-added
  into main_grad), the halves through one ring of buffers, draining while the next item's
  mainloop runs. The same roundings of the same accumulators: the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32, Uint8, const_expr
from cutlass.cute.runtime import make_fake_tensor

from gmlp.contract.operands import describe
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90 import _store, launch_options
from gmlp.cutedsl.sm90._compile import (ahead_compiler, config_compiler, fake_matrix, fake_stream, fake_vector,
                                        sym_stride)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._launch import check_problem, check_tma_bases, run
from gmlp.cutedsl.sm90._cluster import PairedTile, load_tile, multicast_load_op, tile_shares
from gmlp.cutedsl.sm90._pipeline import ALIGN, THREADS_PER_WARPGROUP, mainloop_fields, slot_tensors, smem_array
from gmlp.cutedsl.sm90._schedule import ExpertTiles, expert_tiles_grid
from gmlp.cutedsl.sm90._wgrad_register_paths import RegisterPaths
from gmlp.cutedsl.sm90.configs import (BLOCKWISE_TILE as TILE, BLOCKWISE_WGRAD_WARPGROUPS as MMA_WARPGROUPS,
                                       FP8_DTYPES, OUT_DTYPES_DSL, SCALE_BOX, BlockwiseWgradConfig)
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, require_block_shape
from gmlp.mxfp8.routing import DeviceGroups, device_groups

__all__ = ["BlockwiseWgradConfig", "BlockwiseWgradSm90", "compile_blockwise_wgrad", "problem_support",
           "grouped_wgrad_fp8_blockwise"]

_NAME = "blockwise wgrad"
_ADD_CHUNK = 16  # out pairs loaded together by the accumulating epilogue (32 spilled 104 bytes; 16 none)
_WIDE_ADD_CHUNK = 4  # the same with a second half's accumulators alive (16 spilled 272 bytes, 8 40; 4 none)


class BlockwiseWgradArgs(NamedTuple):
    """The kernel's arguments (the engine's ``args``)."""

    tma_atom_a: cute.CopyAtom
    mA: cute.Tensor  # TMA coordinates of A (M, W)
    tma_atom_sa: cute.CopyAtom
    mAScale: cute.Tensor  # TMA coordinates of A's scales (M, pad4(n_blocks))
    tma_atom_b: cute.CopyAtom
    mB: cute.Tensor  # TMA coordinates of B (N, W)
    tma_atom_sb: cute.CopyAtom
    mBScale: cute.Tensor  # TMA coordinates of B's scales (N, pad4(n_blocks))
    mTileStart: cute.Tensor  # (E + 1,) int32: expert g's first block of tokens
    mOut: cute.Tensor  # (E, M, N) fp32 / bf16, row-major
    scale_smem_layout: cute.Layout  # a slot's scale box: (feature, block % 4, stages)
    tma_atom_d: cute.CopyAtom | None  # store="tma": the subtiles' TMA store or reduce-add
    mOut_tma: cute.Tensor | None  # store="tma": TMA coordinates of out as (M, N, E)
    d_smem_layout: cute.ComposedLayout | None  # store="tma": (epi rows, epi cols, _store.STAGES)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    tCrA: cute.Tensor
    tCrBs: tuple  # a half's B tiles
    sAScale: cute.Tensor
    sBScales: tuple  # a half's B scale boxes
    thr_mma: cute.ThrMma
    tCcD: cute.Tensor  # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
    accs: tuple  # one fp32 fragment a half
    partial: cute.Tensor  # a k-tile's products before the promotion
    column_scales: cute.Tensor  # one half: the thread's column scales of the block
    rows: tuple  # the thread's two accumulator rows
    half_stores: tuple  # store="tma": a half's TMA-store epilogue (one ring and pipeline for both), else ()

    @property
    def tile_store(self) -> _store.TileStore | None:
        """The store the engine drains after the last item (the halves share its pipeline)."""
        return self.half_stores[0] if self.half_stores else None


class BlockwiseWgradSm90(GroupedGemmEngine, RegisterPaths):
    """The blockwise weight gradient on the engine (see the module docstring): ``__call__`` the host
    side; its own producer (both operands' scale boxes) and 1D1D promoted k-loop."""

    def __init__(self, config: BlockwiseWgradConfig):
        self.setup_engine(config, MMA_WARPGROUPS, cluster=config.cluster)
        self.halves = config.halves
        self.a_dtype, self.b_dtype = FP8_DTYPES[config.a_format], FP8_DTYPES[config.b_format]
        # RegisterPaths' fields (its epilogue)
        self.tile_shape_mnk = (TILE, TILE, TILE)
        self.tile_n = TILE
        self.out_dtype = OUT_DTYPES_DSL[config.out_dtype]
        self.accumulate = config.accumulate
        self.add_chunk = _WIDE_ADD_CHUNK if config.wide else _ADD_CHUNK
        self.consumer_threads = MMA_WARPGROUPS * THREADS_PER_WARPGROUP
        self.tma_store = config.store == "tma"

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (M, W) uint8: Q_col(A)'s fp8 bytes, K-major along the block-aligned tokens
        mAScale: cute.Tensor,  # (M, pad4(n_blocks)) fp32
        mB: cute.Tensor,  # (N, W) uint8: Q_col(B)'s fp8 bytes
        mBScale: cute.Tensor,  # (N, pad4(n_blocks)) fp32
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128), expert g's first block
        mOut: cute.Tensor,  # (E, M, N) fp32 / bf16, row-major
        num_ctas: Int32,
        stream,
    ):
        # the fp8 operands arrive as bytes (as the other SM90 kernels take them) and are read as their formats
        mA = cute.recast_tensor(mA, self.a_dtype)
        mB = cute.recast_tensor(mB, self.b_dtype)
        a_layout, b_layout = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB)
        tile_shape_mnk = (TILE, TILE, TILE)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.a_dtype, self.b_dtype, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(), Float32,
            (MMA_WARPGROUPS, 1, 1), tiler_mn=(64, TILE))
        a_smem_layout = sm90_utils.make_smem_layout_a(a_layout, tile_shape_mnk, self.a_dtype, self.stages)
        b_smem_layout = sm90_utils.make_smem_layout_b(b_layout, tile_shape_mnk, self.b_dtype, self.stages)
        tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(  # in a cluster of two, A is the shared tile
            multicast_load_op(self.cluster), mA, cute.slice_(a_smem_layout, (None, None, 0)), (TILE, TILE),
            num_multicast=self.cluster)
        tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mB, cute.slice_(b_smem_layout, (None, None, 0)), (TILE, TILE))
        # a slot's scale box: (feature, block % 4), the 4 blocks of a row contiguous as in global memory
        scale_smem_layout = cute.make_layout((TILE, SCALE_BOX, self.stages), stride=(SCALE_BOX, 1, TILE * SCALE_BOX))
        scale_box = cute.slice_(scale_smem_layout, (None, None, 0))
        tma_atom_sa, tma_sa = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mAScale, scale_box, (TILE, SCALE_BOX))
        tma_atom_sb, tma_sb = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mBScale, scale_box, (TILE, SCALE_BOX))
        fields = mainloop_fields(self.stages, a_smem_layout, b_smem_layout, self.a_dtype, self.b_dtype)
        fields["sAScale"] = smem_array(Float32, cute.cosize(scale_smem_layout), align=128)
        fields["sBScale"] = smem_array(Float32, cute.cosize(scale_smem_layout), align=128)
        if const_expr(self.config.wide):  # the second half's B tiles and scale boxes
            fields["sB1"] = smem_array(self.b_dtype, cute.cosize(b_smem_layout))
            fields["sBScale1"] = smem_array(Float32, cute.cosize(scale_smem_layout), align=128)
        store = None  # store="tma": the subtiles' smem layout and TMA store (reduce-add with accumulate)
        if const_expr(self.tma_store):
            out_mne = cute.make_tensor(mOut.iterator, cute.select(mOut.layout, mode=[1, 2, 0]))  # (M, N, E)
            store = _store.make_store_operands(out_mne, MMA_WARPGROUPS, self.out_dtype, reduce=self.accumulate)
            fields["sD"] = smem_array(self.out_dtype, cute.cosize(store.smem_layout))
        args = BlockwiseWgradArgs(tma_atom_a, tma_a, tma_atom_sa, tma_sa, tma_atom_b, tma_b, tma_atom_sb, tma_sb,
                                  mTileStart, mOut, scale_smem_layout, *_store.kernel_arguments(store))
        self.launch_engine(args, fields, tiled_mma, a_smem_layout, b_smem_layout, num_ctas, stream)

    def tma_atoms(self, args: BlockwiseWgradArgs) -> tuple:
        return (args.tma_atom_a, args.tma_atom_b, args.tma_atom_sa, args.tma_atom_sb) \
            + ((args.tma_atom_d,) if const_expr(self.tma_store) else ())

    def slots(self, storage, args: BlockwiseWgradArgs, a_smem_layout, b_smem_layout) -> Slots:
        """A slot: A's k-tile, one B k-tile a half, and each one's scale box; scales = (sAScale,
        the halves' sBScale)."""
        sA, sB, tile_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout, b_tiles_per_slot=self.halves,
                                          a_dtype=self.a_dtype, b_dtype=self.b_dtype)
        layout = args.scale_smem_layout
        sBs = (sB,)
        sBScales = (storage.sBScale.get_tensor(layout),)
        if const_expr(self.halves == 2):
            sBs = (sB, storage.sB1.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner))
            sBScales = (sBScales[0], storage.sBScale1.get_tensor(layout))
        scale_bytes = (1 + self.halves) * cute.size_in_bytes(Float32, cute.slice_(layout, (None, None, 0)))
        return Slots(sA, sBs, tile_bytes + scale_bytes, (storage.sAScale.get_tensor(layout), sBScales))

    def work(self, args: BlockwiseWgradArgs) -> ExpertTiles:
        num_experts, m, n = args.mOut.shape
        return ExpertTiles.of(args.mTileStart, num_experts, m, n, TILE, TILE * self.halves, 1, cluster=self.cluster)

    @cute.jit
    def produce(self, mainloop, work: ExpertTiles, bidx: Int32, grid: Int32, args: BlockwiseWgradArgs,
                slots: Slots):
        """TMA loads of every (A, B) k-tile of this CTA's items, with their scale boxes. In a cluster
        of two the pair's items share their A tiles (``ExpertTiles``): each CTA loads half of each
        for both (``PairedTile``); the scale boxes and B tiles are its own."""
        sAScale, sBScales = slots.scales
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        item = bidx
        while item < work.count:
            g, m_tile, n_tile, first_block, k_tiles, _ = work.tile(item)  # the expert's first block of tokens
            gA = cute.local_tile(cute.domain_offset((0, first_block * TILE), args.mA), (TILE, TILE), (m_tile, None))
            tAsA, tAgA = tile_shares(args.tma_atom_a, slots.sA, gA, self.cluster)
            pair = PairedTile.always(item) if const_expr(self.cluster == 2) else None
            tSAsSA, tSAgSA = _tma_tiles(args.tma_atom_sa, args.mAScale, sAScale, m_tile, SCALE_BOX)
            # each half's B tiles and scale boxes: 128-column tile n_tile * halves + h
            b_loads = [(_tma_tiles(args.tma_atom_b, cute.domain_offset((0, first_block * TILE), args.mB), slots.sBs[h],
                                   n_tile * self.halves + h, TILE),
                        _tma_tiles(args.tma_atom_sb, args.mBScale, sBScales[h], n_tile * self.halves + h, SCALE_BOX))
                       for h in range(self.halves)]
            for k_tile in range(k_tiles):
                mainloop.producer_acquire(state)
                barrier = mainloop.producer_get_barrier(state)
                box = (first_block + k_tile) // SCALE_BOX
                load_tile(args.tma_atom_a, tAgA, tAsA, k_tile, state.index, barrier, pair)
                cute.copy(args.tma_atom_sa, tSAgSA[(None, box)], tSAsSA[(None, state.index)], tma_bar_ptr=barrier)
                for (tBsB, tBgB), (tSBsSB, tSBgSB) in b_loads:
                    cute.copy(args.tma_atom_b, tBgB[(None, k_tile)], tBsB[(None, state.index)], tma_bar_ptr=barrier)
                    cute.copy(args.tma_atom_sb, tSBgSB[(None, box)], tSBsSB[(None, state.index)], tma_bar_ptr=barrier)
                mainloop.producer_commit(state)  # a no-op: TMA completes the transaction
                state.advance()
            item += grid
        mainloop.producer_tail(state)

    def consumer_setup(self, args: BlockwiseWgradArgs, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE, TILE)))
        accs = tuple(cute.make_rmem_tensor(tCcD.shape, Float32) for _ in range(self.halves))
        partial = cute.make_rmem_tensor(tCcD.shape, Float32)
        pairs = cute.size(partial) // 4  # the thread's (4j .. 4j + 3) groups: 2 columns each
        half_stores = ()
        if const_expr(self.tma_store):
            store = self.tile_store(storage, args.d_smem_layout, tiled_mma, accs[0], mma_tidx, warp_idx, self.out_dtype)
            half_stores = store.over(accs)
        return _Consumer(tCrA, tCrBs, *slots.scales, thr_mma, tCcD, accs, partial,
                         cute.make_rmem_tensor((2 * pairs,), Float32), (tCcD[0][0], tCcD[2][0]), half_stores)

    @cute.jit
    def mainloop(self, consumer: _Consumer, args: BlockwiseWgradArgs, tiled_mma, mainloop, read_state, release_state,
                 work: ExpertTiles, tile: tuple):
        """Per k-tile and half: the wgmmas into ``partial``, the block's scales read from the slot
        while they run, then ``acc += sa[row] * sb[col] * partial``; the slot released after the
        last half's promotion."""
        _, _, _, first_block, k_tiles, _ = tile
        halves = self.halves
        accs, partial, tCcD, rows = consumer.accs, consumer.partial, consumer.tCcD, consumer.rows
        sAScale, sBScales, column_scales = consumer.sAScale, consumer.sBScales, consumer.column_scales
        pairs = cute.size(partial) // 4
        for half in cutlass.range_constexpr(halves):
            accs[half].fill(0.0)
        for k_tile in range(k_tiles):
            in_box = (first_block + k_tile) % SCALE_BOX
            mainloop.consumer_wait(read_state)
            stage = read_state.index
            for half in cutlass.range_constexpr(halves):
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                cute.nvgpu.warpgroup.fence()
                for k_block in cutlass.range_constexpr(cute.size(consumer.tCrA, mode=[2])):
                    slot = (None, None, k_block, stage)
                    cute.gemm(tiled_mma, partial, consumer.tCrA[slot], consumer.tCrBs[half][slot], partial)
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.commit_group()
                # the block's scales, read from the slot while the wgmmas run; with two halves the
                # column scales are read as the promotion uses them (32 more registers spilled)
                # and the slot is released after the last promotion
                upper = sAScale[rows[0], in_box, stage]
                lower = sAScale[rows[1], in_box, stage]
                if const_expr(halves == 1):
                    for j in cutlass.range_constexpr(pairs):
                        for h in cutlass.range_constexpr(2):
                            column_scales[2 * j + h] = sBScales[half][tCcD[4 * j + h][1], in_box, stage]
                cute.nvgpu.warpgroup.wait_group(0)
                if const_expr(halves == 1):
                    mainloop.consumer_release(read_state)
                # promote: acc += sa[row] * sb[col] * partial
                for i in cutlass.range_constexpr(cute.size(partial)):
                    row_scale = upper if (i % 4) < 2 else lower
                    column_scale = column_scales[2 * (i // 4) + i % 2]
                    if const_expr(halves == 2):
                        column_scale = sBScales[half][tCcD[i][1], in_box, stage]
                    accs[half][i] = accs[half][i] + (row_scale * column_scale) * partial[i]
            if const_expr(halves == 2):
                mainloop.consumer_release(read_state)
            read_state.advance()
        return tiled_mma, read_state, release_state

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: BlockwiseWgradArgs, tile: tuple, ahead, stores: Int32) -> Int32:
        g, m_tile, n_tile, _, k_tiles, _ = tile
        for half in cutlass.range_constexpr(self.halves):
            if const_expr(self.tma_store):
                # half h's 128-column tile of out[g], clipped at M and N by TMA; an empty expert
                # adds nothing (accumulate) or stores its zeros
                if k_tiles > 0 or not self.accumulate:
                    gOut = cute.local_tile(args.mOut_tma[(None, None, g)], (TILE, TILE),
                                           (m_tile, n_tile * self.halves + half))
                    consumer.half_stores[half].store(args.tma_atom_d, gOut, stores)
                    stores += 1
            else:
                self.store_tile(consumer.accs[half], consumer.thr_mma, consumer.tCcD, args.mOut, g, m_tile,
                                n_tile * self.halves + half, k_tiles)
        return stores


def _tma_tiles(tma_atom: cute.CopyAtom, source: cute.Tensor, staged: cute.Tensor, row_tile: Int32, columns: int):
    """(smem, gmem) TMA partitions of the (128, ``columns``) boxes of ``source`` in row tile
    ``row_tile``: ((TMA), stages) and ((TMA), column tiles)."""
    tiles = cute.local_tile(source, (TILE, columns), (row_tile, None))
    return cute.nvgpu.cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(staged, 0, 2),
                                            cute.group_modes(tiles, 0, 2))


def _fake_arguments(config: BlockwiseWgradConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments: M, N multiples of 128, W of 128 (whole
    blocks), the scale rows' strides multiples of 4 (16 bytes); E a runtime value."""
    m, n, width = (cute.sym_int(divisibility=TILE) for _ in range(3))
    blocks, experts, starts = cute.sym_int(divisibility=4), cute.sym_int(), cute.sym_int()
    a, b = fake_matrix(Uint8, m, width, divisibility=16), fake_matrix(Uint8, n, width, divisibility=16)
    a_scale = make_fake_tensor(Float32, (m, blocks), stride=(sym_stride(4), 1), assumed_align=ALIGN)
    b_scale = make_fake_tensor(Float32, (n, blocks), stride=(sym_stride(4), 1), assumed_align=ALIGN)
    out = make_fake_tensor(OUT_DTYPES_DSL[config.out_dtype], (experts, m, n), stride=(sym_stride(), sym_stride(), 1),
                           assumed_align=ALIGN)
    return a, a_scale, b, b_scale, fake_vector(Int32, starts), out, Int32(1), fake_stream()


_compile = config_compiler(BlockwiseWgradSm90, _fake_arguments)  # (config, arch) -> CompiledKernel, cached


def problem_support(num_rows: int, m: int, n: int, num_experts: int) -> Reason | None:
    """None if the kernel runs a (T, M, N, E) problem, else why not."""
    if num_experts < 1:
        return Reason(ReasonKind.SHAPE, f"E={num_experts}: needs at least one expert")
    if m <= 0 or n <= 0 or m % TILE or n % TILE:
        return Reason(ReasonKind.SHAPE, f"M={m} and N={n} must be positive multiples of {TILE} (the recipe's blocks)")
    if num_rows + TILE * num_experts >= 2**31 or num_experts * m * n >= 2**31:
        return Reason(ReasonKind.SHAPE, f"T={num_rows}, M={m}, N={n}, E={num_experts} too large for 32-bit "
                                        "coordinates")
    return None


compile_blockwise_wgrad = ahead_compiler(_NAME, _compile, BlockwiseWgradConfig(), problem_support, "M, N, W, E")


def grouped_wgrad_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                                out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32,
                                groups: DeviceGroups | None = None, wide: bool | None = None,
                                cluster: int | None = None,  # 2: n-tiles in pairs, A multicast
                                store: str | None = None,  # the epilogue's stores, "regs" or "tma"
                                site: str | None = None) -> torch.Tensor:
    """(E, M, N): dW_g = A_g^T @ B_g over expert g's tokens, A (T, M) and B (T, N) given as their
    columnwise quantizations (contiguous); stored as ``out_dtype``, or added to the fp32 ``out``
    (main_grad). No host sync. The contract of
    ``gmlp.triton_ref.blockwise_wgrad.grouped_wgrad_fp8_blockwise``. ``wide``: 256-column n-tiles
    (``BlockwiseWgradConfig.wide``; needs N % 256 == 0); ``store``: the epilogue's
    (``BlockwiseWgradConfig.store``). The bytes are the same either way. A knob left None is
    ``launch_options``' choice (the tuned table's entry of ``site``, wide wherever N allows it)."""
    require_block_shape(a, "a", BlockShape.COLUMNWISE)
    require_block_shape(b, "b", BlockShape.COLUMNWISE)
    (tokens, m), (b_tokens, n), experts = a.source_shape, b.source_shape, split_sizes.numel()
    if b_tokens != tokens or a.data.shape[1] != b.data.shape[1]:
        raise ValueError(f"a and b must have the same tokens, got {tokens} and {b_tokens} (data "
                         f"{tuple(a.data.shape)} and {tuple(b.data.shape)})")
    for name, value in (("a", a), ("b", b)):
        if not (value.data.is_contiguous() and value.scale_inv.is_contiguous()):
            raise ValueError(f"{name}'s data and scales must be contiguous (TMA rows), got strides "
                             f"{value.data.stride()} and {value.scale_inv.stride()}")
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (experts, m, n)
                            or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous fp32 ({experts}, {m}, {n}) tensor, got {describe(out)}")
    if out_dtype not in OUT_DTYPES_DSL:
        raise ValueError(f"out_dtype must be one of {tuple(OUT_DTYPES_DSL)}, got {out_dtype}")
    knobs = launch_options.launch_options("grouped_wgrad_fp8_blockwise", tokens, m, n, experts,
                                          dict(wide=wide, cluster=cluster, store=store), site=site)
    wide, cluster, store = knobs["wide"], knobs["cluster"], knobs["store"]
    if wide and n % (2 * TILE):
        raise ValueError(f"wide=True needs N a multiple of {2 * TILE} (two 128-column halves an n-tile), got N={n}")
    check_problem(_NAME, problem_support(tokens, m, n, experts))
    accumulate = out is not None
    if out is None:
        out = torch.empty(experts, m, n, dtype=out_dtype, device=a.data.device)
        if tokens == 0:
            return out.zero_()
    if tokens == 0:
        return out  # nothing to add
    check_tma_bases(a=a.data, b=b.data, a_scales=a.scale_inv, b_scales=b.scale_inv)
    if store == "tma":
        check_tma_bases(out=out)  # the TMA store's destination
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    config = BlockwiseWgradConfig(out_dtype=out.dtype, accumulate=accumulate, a_format=a.element_format,
                                  b_format=b.element_format, wide=wide, cluster=cluster, store=store)
    num_ctas = expert_tiles_grid(experts, m // TILE, n // config.tile_n, a.data.device, cluster)
    run(_compile, config, a.data.device, num_ctas, a.data.view(torch.uint8),
        a.scale_inv, b.data.view(torch.uint8), b.scale_inv, groups.tile_start, out)
    return out
