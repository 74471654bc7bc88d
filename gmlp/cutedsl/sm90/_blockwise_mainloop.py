"""The promoted fp8 mainloop of the sm_90a FP8 blockwise token-row kernels (the grouped GEMM,
FC1, FC2 dgrad): DeepGEMM's 1D2D form, one or two 128-column halves a work item; as the engine's
operand policy (``_engine``), the hooks of ``PromotedTokenRows``.

- Producer (warp 0): per work item and k-tile, one slot with A's (128 rows, 128) fp8 k-tile at
  the expert's first row and one (128, 128) B k-tile a half, from weight tile rows ``BRows``
  of the item's n-tile (the grouped GEMM: two adjacent tile rows; FC1: the gate and up rows,
  F / 128 apart).
- Consumers (two warpgroups of 64 rows): per k-tile and half, four k=32 ``wgmma`` into a fresh
  fp32 fragment ``partial``, then ``acc += (sa * sb) * partial`` in registers (``_blockwise_k_loops``:
  ``promoted_k_tiles`` waits for each k-tile's wgmmas before promoting it; with one half, the
  ``pipelined`` variant promotes k-tile k - 1 while k-tile k's wgmmas run, into a second
  ``partial``). A thread's accumulators hold two rows (m64 layout: elements 4j, 4j+1 one row,
  4j+2, 4j+3 the row 8 below), so it reads two A scales and the half's B scale a k-tile. A slot
  is released once its last wgmmas are done. Registers: 64 fp32 a half for acc and 64 a
  ``partial`` (two partials fit the 232 of a consumer thread with one half only).
- A's scales come with the slot: one TMA box of the k-tile's scale row (A's scales are MN-major,
  (K/128, pad4(T))), ``SCALE_BOX_ROWS`` = 132 floats from the item's first row rounded down to 4
  (TMA needs the innermost coordinate 16-byte aligned: a box at an odd expert start is an
  illegal instruction), read by the consumers at ``first_row % 4`` past the slot's start. Read
  per thread from global memory they were the mainloop's largest stall (ncu, 2026-12-05:
  long_scoreboard, lg_throttle). Rows past the expert's end read the next expert's scales or
  TMA's zero fill: their accumulators are never stored, and the epilogues zero them. The B
  scales (one float a k-tile and half) are global loads issued a k-tile before their promotion.
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
from cutlass import Float32, Float8E4M3FN, Int32, Uint8, const_expr
from cutlass.cute.runtime import make_fake_tensor

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90._compile import fake_matrix, sym_stride
from gmlp.cutedsl.sm90._blockwise_k_loops import pipelined_k_tiles, promoted_k_tiles
from gmlp.cutedsl.sm90._engine import Slots
from gmlp.cutedsl.sm90._cluster import PairedTile, item_tiles, multicast_load_op, tile_shares
from gmlp.cutedsl.sm90._pipeline import ALIGN, mainloop_fields, produce_k_tiles, slot_tensors, smem_array
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems, expert_count_reason
from gmlp.fp8_blockwise import layout

__all__ = ["TILE_N", "TILE_K", "MMA_WARPGROUPS", "SCALE_BOX_ROWS", "BRows", "Operands", "slot_bytes", "make_operands",
           "scale_smem_layout", "storage_fields", "scaled_slot_tensors", "check_token_scales", "fake_token_rows",
           "fake_weight_tiles", "ffn_problem_support", "produce_items", "PromotedArgs",
           "PromotedOperands", "PromotedTokenRows"]

TILE_N = 128  # one weight tile row: one B scale per k-tile
TILE_K = 128  # fp8 elements: one 128-byte swizzle row, one scale block
MMA_WARPGROUPS = 2  # consumers, each 64 rows of the tile
SCALE_ROW_ALIGN = 4  # fp32 scales in 16 bytes: a TMA box's innermost coordinate is a multiple of this
SCALE_BOX_ROWS = TILE_M + SCALE_ROW_ALIGN  # A's scales a slot: 128 rows from any start inside the box
SCALE_SLOT_FLOATS = 160  # one slot's scales: the box padded to 640 bytes (TMA destinations 128-byte aligned)
SCALE_SLOT_BYTES = 4 * SCALE_SLOT_FLOATS


@dataclass(frozen=True)
class Operands:
    """The mainloop's host-built pieces (``make_operands``)."""

    tiled_mma: cute.TiledMma
    a_smem_layout: cute.ComposedLayout
    b_smem_layout: cute.ComposedLayout
    tma_atom_a: cute.CopyAtom
    tma_a: cute.Tensor  # TMA coordinates of A (T, K)
    tma_atom_b: cute.CopyAtom
    tma_b: cute.Tensor  # TMA coordinates of B (N, K, E)
    tma_atom_sa: cute.CopyAtom
    tma_sa: cute.Tensor  # TMA coordinates of A's scales (pad4(T), K/128)


def slot_bytes(halves: int) -> int:
    """The smem of one slot: A's k-tile and ``halves`` B k-tiles of fp8 bytes, and A's scales."""
    return (TILE_M + halves * TILE_N) * TILE_K + SCALE_SLOT_BYTES


def scale_smem_layout(stages: int) -> cute.Layout:
    """A's scales in the slots: (SCALE_BOX_ROWS, 1, stages), a slot every SCALE_SLOT_FLOATS."""
    return cute.make_layout((SCALE_BOX_ROWS, 1, stages), stride=(1, SCALE_SLOT_FLOATS, SCALE_SLOT_FLOATS))


def make_operands(mA: cute.Tensor, mAScale: cute.Tensor, mB: cute.Tensor, a_dtype, stages: int,
                  cluster: int = 1) -> Operands:
    """Host side (traced in a kernel's ``__call__``): the fp8 ``wgmma`` tiled MMA of the two
    consumer warpgroups, the slots' swizzled smem layouts and TMA loads of A (T, K) bytes read as
    ``a_dtype``, of A's (K/128, pad4(T)) scales (boxes of a scale row) and of B (E, N, K) E4M3
    bytes (multicast in a ``cluster`` of two: ``_cluster.PairedTile``), A and B K-major (the
    operands go in as ``uint8``: torch's fp8 dtypes are not exchanged with the host runtime alike
    on every version)."""
    mA = cute.recast_tensor(mA, a_dtype)
    mB = cute.recast_tensor(mB, Float8E4M3FN)
    mB_nke = cute.make_tensor(mB.iterator, cute.select(mB.layout, mode=[1, 2, 0]))  # L = experts
    a_layout, b_layout = utils.LayoutEnum.from_tensor(mA), utils.LayoutEnum.from_tensor(mB_nke)
    tile_shape_mnk = (TILE_M, TILE_N, TILE_K)
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        a_dtype, Float8E4M3FN, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(), Float32,
        (MMA_WARPGROUPS, 1, 1), tiler_mn=(64, TILE_N))
    a_smem_layout = sm90_utils.make_smem_layout_a(a_layout, tile_shape_mnk, a_dtype, stages)
    b_smem_layout = sm90_utils.make_smem_layout_b(b_layout, tile_shape_mnk, Float8E4M3FN, stages)
    tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
        cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mA, cute.slice_(a_smem_layout, (None, None, 0)), (TILE_M, TILE_K))
    tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
        multicast_load_op(cluster), mB_nke, cute.slice_(b_smem_layout, (None, None, 0)), (TILE_N, TILE_K),
        num_multicast=cluster)
    mAScale_tk = cute.make_tensor(mAScale.iterator, cute.select(mAScale.layout, mode=[1, 0]))  # rows contiguous
    tma_atom_sa, tma_sa = cute.nvgpu.cpasync.make_tiled_tma_atom(
        cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mAScale_tk,
        cute.slice_(scale_smem_layout(stages), (None, None, 0)), (SCALE_BOX_ROWS, 1))
    return Operands(tiled_mma, a_smem_layout, b_smem_layout, tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_sa,
                    tma_sa)


def storage_fields(stages: int, ops: Operands, a_dtype) -> dict:
    """The first fields of a blockwise kernel's ``shared_storage``: ``_pipeline.mainloop_fields``
    (E4M3 B tiles) and the slots' A scales (``sAScale``)."""
    fields = mainloop_fields(stages, ops.a_smem_layout, ops.b_smem_layout, a_dtype, Float8E4M3FN)
    fields["sAScale"] = smem_array(Float32, cute.cosize(scale_smem_layout(stages)), align=128)
    return fields


def scaled_slot_tensors(storage, stages: int, a_smem_layout: cute.ComposedLayout, b_smem_layout: cute.ComposedLayout,
                        halves: int, a_dtype) -> tuple:
    """(sA, sB, sAScale, stage_bytes): ``_pipeline.slot_tensors``' A and B tiles, the slots' A
    scales, and the bytes TMA delivers to a slot (the full barrier's transaction count: A's
    k-tile, ``halves`` B k-tiles and the scale box, zero fill included)."""
    sA, sB, tile_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout, b_tiles_per_slot=halves, a_dtype=a_dtype,
                                      b_dtype=Float8E4M3FN)
    sAScale = storage.sAScale.get_tensor(scale_smem_layout(stages))
    return sA, sB, sAScale, tile_bytes + 4 * SCALE_BOX_ROWS


def check_token_scales(name: str, scale_inv: torch.Tensor) -> None:
    """A rowwise token operand's (K/128, pad4(T)) scales as the scale TMA reads them: rows
    contiguous, their stride a multiple of 4 floats (16 bytes); an empty batch's are never read."""
    if scale_inv.numel() and (scale_inv.stride(1) != 1 or scale_inv.stride(0) % SCALE_ROW_ALIGN):
        raise ValueError(f"{name}'s scales must have contiguous rows 16-byte apart (TMA boxes), got strides "
                         f"{scale_inv.stride()}")


def fake_token_rows(rows, cols, blocks, padded_rows, divisibility: int = 16) -> tuple:
    """Symbolic stand-ins of a rowwise token operand (a kernel's input, or an epilogue's Q_row
    output): its (rows, cols) fp8 bytes (row stride a multiple of ``divisibility``) and its
    MN-major (blocks, padded_rows) fp32 scales (rows 16-byte aligned)."""
    data = fake_matrix(Uint8, rows, cols, divisibility=divisibility)
    scale = make_fake_tensor(Float32, (blocks, padded_rows), stride=(sym_stride(4), 1), assumed_align=ALIGN)
    return data, scale


def fake_weight_tiles(experts, n, k, n_blocks, k_blocks) -> tuple:
    """Symbolic stand-ins of a weight stack in 128 x 128 tiles: (E, N, K) fp8 bytes, K-major, and
    its (E, N/128, K/128) fp32 scales."""
    data = make_fake_tensor(Uint8, (experts, n, k), stride=(sym_stride(16), sym_stride(16), 1), assumed_align=ALIGN)
    scale = make_fake_tensor(Float32, (experts, n_blocks, k_blocks), stride=(sym_stride(1), sym_stride(1), 1),
                             assumed_align=4)
    return data, scale


def ffn_problem_support(num_rows: int, hidden: int, ffn: int, num_experts: int, gated: bool) -> Reason | None:
    """None if FC1's or FC2 dgrad's blockwise kernel runs a (T, H, F, E) problem, else why not: the
    expert search's depth, H and F multiples of 128 (the recipe's blocks), 32-bit coordinates of
    the (T, 2F | F) outputs and their block-aligned columnwise copies."""
    reason = expert_count_reason(num_experts)
    if reason is not None:
        return reason
    if hidden <= 0 or ffn <= 0 or hidden % TILE_K or ffn % TILE_N:
        return Reason(ReasonKind.SHAPE, f"H={hidden} and F={ffn} must be positive multiples of 128 (the recipe's "
                                        "blocks)")
    n1 = (2 if gated else 1) * ffn
    columns = 128 * layout.columnwise_blocks(num_rows, num_experts)
    if max(num_rows, n1, hidden, columns) >= 2**31 or n1 * columns >= 2**31:
        return Reason(ReasonKind.SHAPE, f"T={num_rows}, H={hidden}, F={ffn}, E={num_experts} too large for 32-bit "
                                        "tile coordinates")
    return None


@dataclass(frozen=True)
class BRows:
    """The weight tile rows of a work item's halves: half h of n-tile n reads tile row
    ``n * stride + h * offset`` (the grouped GEMM: stride = halves, offset 1; FC1: stride 1,
    offset F / 128, the up rows)."""

    stride: int
    offset: object  # int or a runtime Int32

    def of(self, n_tile, halves: int) -> tuple:
        """(row of half 0, row of half 1); with one half both are half 0's."""
        first = n_tile * self.stride
        return (first, first + self.offset) if halves == 2 else (first, first)


@cute.jit
def produce_items(mainloop, stages: cutlass.Constexpr, items: TokenItems, item: Int32, step: Int32, k_tiles: Int32,
                  tma_atom_a: cute.CopyAtom, mA: cute.Tensor, sA: cute.Tensor, tma_atom_sa: cute.CopyAtom,
                  mAScale: cute.Tensor, sAScale: cute.Tensor, tma_atom_b: cute.CopyAtom, mB: cute.Tensor, sBs: list,
                  b_rows: BRows, cluster: cutlass.Constexpr = 1):
    """The producer warp: for the CTA's work items (``item``, ``item + step``, ...), every k-tile's
    A tile, A's scale box (``mAScale``: TMA coordinates (pad4(T), K/128)) and one B tile a half of
    ``sBs`` (``mB``: TMA coordinates (N, K, E); in a ``cluster`` of two by ``PairedTile``); then waits
    until the consumers freed every slot."""
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
    gB = cute.local_tile(mB, (TILE_N, TILE_K), (None, None, None))
    b_parts = [tile_shares(tma_atom_b, s, gB, cluster) for s in sBs]
    while item < items.count:
        g, _, n_tile, first_row, _ = items.tile(item)
        pair = PairedTile.of(items, item, g, n_tile) if const_expr(cluster == 2) else None
        rows = b_rows.of(n_tile, len(sBs))
        gA = cute.local_tile(cute.domain_offset((first_row, 0), mA), (TILE_M, TILE_K), (0, None))
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        box_row = first_row - first_row % SCALE_ROW_ALIGN  # 16-byte aligned (see the module docstring)
        gS = cute.local_tile(cute.domain_offset((box_row, 0), mAScale), (SCALE_BOX_ROWS, 1), (0, None))
        tSsS, tSgS = cute.nvgpu.cpasync.tma_partition(
            tma_atom_sa, 0, cute.make_layout(1), cute.group_modes(sAScale, 0, 2), cute.group_modes(gS, 0, 2))
        state = produce_k_tiles(mainloop, state, k_tiles, tma_atom_a, tAgA, tAsA,
                                ((tma_atom_sa, tSgS, tSsS),
                                 *((tma_atom_b, item_tiles(tBgB, (None, rows[h], None, g)), tBsB)
                                   for h, (tBsB, tBgB) in enumerate(b_parts))), pair)
        item += step
    mainloop.producer_tail(state)


class PromotedArgs(NamedTuple):
    """The promoted mainloop's kernel arguments: the first field, ``operands``, of a blockwise
    token-row site's ``args``."""

    tma_atom_a: cute.CopyAtom
    mA: cute.Tensor  # TMA coordinates of A (T, K)
    tma_atom_sa: cute.CopyAtom
    mAScale: cute.Tensor  # TMA coordinates of A's scales (pad4(T), K/128)
    tma_atom_b: cute.CopyAtom
    mB: cute.Tensor  # TMA coordinates of B (N, K, E)
    mBScale: cute.Tensor  # (E, N/128, K/128) fp32: B's tiles' scales

    @staticmethod
    def of(ops: Operands, mBScale: cute.Tensor) -> PromotedArgs:
        return PromotedArgs(ops.tma_atom_a, ops.tma_a, ops.tma_atom_sa, ops.tma_sa, ops.tma_atom_b, ops.tma_b, mBScale)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class PromotedOperands:
    """A consumer thread's operands of the promoted mainloop, built once before the item loop."""

    tCrA: cute.Tensor
    tCrBs: tuple
    accs: tuple  # one fp32 fragment a half
    partials: tuple  # a k-tile's products before the promotion: one fragment, two when pipelined
    sAScale: cute.Tensor
    rows: tuple  # the thread's two accumulator rows (m64 layout: elements 4j, 4j+1 and 4j+2, 4j+3)


class PromotedTokenRows:
    """The operand policy of the blockwise token-row sites, as engine hooks: the slots (A's
    k-tile, its scale box and ``halves`` E4M3 B tiles), the producer and the promoted mainloop.
    A site sets ``a_dtype`` and ``halves`` and supplies ``b_rows(args)`` (its ``BRows``) and
    ``item_columns(args)`` (its output columns and a work item's width); its ``args`` start with
    the ``PromotedArgs`` as ``operands`` and hold the groups' ``mRowStart`` and ``mTileStart``;
    its consumer record holds the ``PromotedOperands`` as ``mma``. ``pipelined`` (one half only,
    the site's config): ``pipelined_k_tiles`` for ``promoted_k_tiles``."""

    pipelined = False

    def tma_atoms(self, args: tuple) -> tuple:
        return (args.operands.tma_atom_a, args.operands.tma_atom_sa, args.operands.tma_atom_b)

    def storage_fields(self, ops: Operands) -> dict:
        """Host side: the shared memory of the slot ring (a second half's B tiles as ``sB1``)."""
        fields = storage_fields(self.stages, ops, self.a_dtype)
        if const_expr(self.halves == 2):
            fields["sB1"] = smem_array(Float8E4M3FN, cute.cosize(ops.b_smem_layout))
        return fields

    def slots(self, storage, args: tuple, a_smem_layout: cute.ComposedLayout,
              b_smem_layout: cute.ComposedLayout) -> Slots:
        sA, sB, sAScale, stage_bytes = scaled_slot_tensors(storage, self.stages, a_smem_layout, b_smem_layout,
                                                           self.halves, self.a_dtype)
        sBs = (sB,)
        if const_expr(self.halves == 2):
            sBs = (sB, storage.sB1.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner))
        return Slots(sA, sBs, stage_bytes, (sAScale,))

    def work(self, args: tuple) -> TokenItems:
        """The m-tiles x the site's n-tiles (``item_columns``); K in 128-wide k-tiles."""
        n, tile_n = self.item_columns(args)
        return TokenItems.of(args.mRowStart, args.mTileStart, n, tile_n, (args.operands.mA.shape[1],), TILE_K,
                             cluster=self.cluster)

    def produce(self, mainloop, work: TokenItems, bidx: Int32, grid: Int32, args: tuple, slots: Slots):
        ops = args.operands
        produce_items(mainloop, self.stages, work, bidx, grid, work.k_tiles, ops.tma_atom_a, ops.mA, slots.sA,
                      ops.tma_atom_sa, ops.mAScale, slots.scales[0], ops.tma_atom_b, ops.mB, list(slots.sBs),
                      self.b_rows(args), self.cluster)

    def promoted_operands(self, slots: Slots, tCrA: cute.Tensor, tCrBs: tuple, tCcD: cute.Tensor,
                          fragment) -> PromotedOperands:
        """The consumer's operands: ``fragment`` the accumulators' shape (one fragment a half)."""
        accs = tuple(cute.make_rmem_tensor(fragment, Float32) for _ in range(self.halves))
        partials = tuple(cute.make_rmem_tensor(fragment, Float32) for _ in range(2 if self.pipelined else 1))
        return PromotedOperands(tCrA, tCrBs, accs, partials, slots.scales[0], (tCcD[0][0], tCcD[2][0]))

    @cute.jit
    def mainloop(self, consumer, args: tuple, tiled_mma: cute.TiledMma, mainloop, read_state, release_state,
                 work: TokenItems, tile: tuple):
        """The item's k-loop (``_blockwise_k_loops``); a slot is released in it once read."""
        g, _, n_tile, first_row, _ = tile
        mma = consumer.mma
        rows_b = self.b_rows(args).of(n_tile, self.halves)
        box_rows = (mma.rows[0] + first_row % SCALE_ROW_ALIGN, mma.rows[1] + first_row % SCALE_ROW_ALIGN)
        if const_expr(self.pipelined):
            tiled_mma, read_state, release_state = pipelined_k_tiles(
                tiled_mma, mainloop, read_state, release_state, work.k_tiles, mma.tCrA, mma.tCrBs[0], mma.accs[0],
                mma.partials, mma.sAScale, args.operands.mBScale, g, rows_b[0], box_rows)
        else:
            tiled_mma, read_state = promoted_k_tiles(tiled_mma, mainloop, read_state, work.k_tiles, mma.tCrA,
                                                     mma.tCrBs, mma.accs, mma.partials[0], mma.sAScale,
                                                     args.operands.mBScale, g, rows_b, box_rows)
        return tiled_mma, read_state, release_state
