"""CuTeDSL sm_90a FC2 dgrad with the fused activation backward (dataflow steps 5-6):
``da = dy @ W2_g`` per expert, then ``dprobs``, ``dh = act'(c) (da * probs)`` (bf16, or with an
MXFP8 recipe quantized both ways from the fp32 registers) and ``db1``.

Twin of ``gmlp.triton_ref.fc2_dgrad.fc2_dgrad`` (same arguments and outputs, same fp32 epilogue
formulas as ``gmlp.triton_ref._activations``, i.e. ``gmlp.contract.activations``). Operands: dy (T, H) bf16
row-major with rows grouped by expert; w2t = W2_g^T (E, F, H) bf16, K-major (a stacked W2^T) or
N-major (the transposed view of a stacked W2 (E, H, F), read in place); c (T, 2F | F) bf16 (the
saved pre-activation: [gate | up] for the gated activations); optional probs (T,) fp32/bf16.
Outputs (``FC2DgradOutput``): dh (T, 2F | F) bf16, or with an ``MXFP8Recipe`` (``dh`` None)
Q_row(dh) (T, N1) + compact scales (T, N1/32) and Q_col(dh) (N1, T) + compact grouped scales
(N1, (T + 31 E) // 32) (each expert's tokens in their own 32-row blocks; the unused columns 0) in
``recipe.grad_format`` (E4M3 or E5M2) with ``recipe.scale_mode`` (RCEIL or FLOOR), bit for bit the
Triton kernel's where the two accumulations of da agree (both are bf16 wgmma k16 steps in K
order); dprobs (T,) fp32 if probs, db1 (E, 2F | F) fp32 if bias_grad. No host sync;
deterministic.

Kernel design (one compiled kernel per ``FC2DgradConfig``; T, H, F, E are runtime values):

- Schedule and mainloop: the engine's (``_engine``, ``_schedule``, ``_pipeline``): persistent CTAs over
  work items (128-row expert tile, BN-column tile of da, BN = ``FC2DgradConfig.tile_n``, 128 or
  256), a TMA producer warp and two consumer warpgroups (64 rows each) issuing bf16 m64n{BN}k16
  ``wgmma`` with fp32 accumulators; one B tile (w2t rows [n, n+BN), K = H) per k-step: 32 KB
  slots and 7 stages (BN = 128), 48 KB and 4 (BN = 256).
- Epilogue from the accumulator registers in one pass, per thread pair of adjacent columns
  (f, f+1) of one row (only rows below the expert's end and columns below F): the gate pair
  c[row, f:f+2] and, gated, the up pair c[row, F+f:F+f+2] are loaded once (a 32-bit word each),
  a batch of pairs ahead of their use, the first batch before the item's mainloop (the loads of
  a pair at a time, waited for one by one, were FC2 dgrad's top stall, long_scoreboard); with
  probs, act(c) in fp32 is added into the thread's partial ``sum da * act`` of the row, then
  ``da *= probs[row]`` (probs loaded once per item); ``dh = act'(c) da`` (d gate, d up; srelu one
  output), bf16 pairs stored as 32-bit words. exp is ``ex2.approx.f32``, division
  ``div.full.f32`` (Triton's lowering, the FC1 kernel's helpers), and act and act' share their
  sigmoid (CSE: one ex2 and one div per element). After the pass, each row's partial is reduced
  over the 4 threads of its quad (butterfly shuffles) and written to ``dprobs_partial[row,
  n_tile]`` (T, n_tiles) fp32: **deterministic partials**, summed over n_tiles by the launcher in
  a fixed order (as the Triton twin).
- bias_grad: per-warp column sums of the fp32 dh (the thread's two rows, added as soon as both
  are computed and written over their da accumulators, so no second register array; then
  butterfly shuffles over the warp's 8 quads: 16 rows) written by lanes 0-3 to
  ``dh_warp_sums[m_tile * 8 + warp, :]``
  ((max tiles * 8, N1) fp32, zero-filled); the launcher sums the 8 warps of each tile, then each
  expert's tiles in order (``torch.segment_reduce`` over ``tile_start``): deterministic, no atomics.

MXFP8 epilogue (``FC2DgradConfig(quantized=True, e5m2=..., floor_scales=...)``, tile_n 128 only):
``_fc2_dgrad_mxfp8``, whose docstring tells how registers shape it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.operands import token_operand
from gmlp.contract.outputs import FC2DgradOutput
from gmlp.contract.reasons import Reason
from gmlp.cutedsl.sm90 import _quantize_epilogue, _schedule, _store, launch_options
from gmlp.cutedsl.sm90._compile import (FLOAT_DTYPES, SUPPORTED_ARCHS, ahead_compiler, config_compiler, fake_experts,
                                        fake_matrix, fake_stream, fake_vector)
from gmlp.cutedsl.sm90._epilogue_math import c_pair_views, load_row_probs, pair_fragment
from gmlp.cutedsl.sm90._fc2_dgrad_epilogue import C_WORD_PAIRS, DhEpilogue
from gmlp.cutedsl.sm90._fc2_dgrad_mxfp8 import QuantizedDhEpilogue
from gmlp.cutedsl.sm90._launch import (check_activation, check_optional, check_problem, check_recipe, check_tma_bases,
                                       expert_matrices, ffn_problem_support, run)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._pipeline import (CONSUMER_REGISTERS, ELEMENT_ALIGN, PRODUCER_REGISTERS, b_is_k_major, b_tiles,
                                         mainloop_fields, make_mainloop_operands, produce_token_items, smem_array)
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
from gmlp.cutedsl.sm90.configs import (QUANTIZED_CONSUMER_REGISTERS, QUANTIZED_PRODUCER_REGISTERS, QUANTIZED_TILE_N,
                                       TOKEN_ROW_WARPGROUPS, FC2DgradConfig, quantized_tile_n_reason)
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode

__all__ = ["FC2DgradConfig", "FC2DgradSm90", "compile_fc2_dgrad", "problem_support", "fc2_dgrad",
           "SUPPORTED_ARCHS", "WARPS_PER_TILE", "QUANTIZED_TILE_N"]

_NAME = "fc2_dgrad kernel"  # in the errors of compile_fc2_dgrad and fc2_dgrad
WARPS_PER_TILE = TOKEN_ROW_WARPGROUPS * 4  # consumer warps of a 128-row tile: 16 rows each (db1 partials)


class FC2DgradArgs(NamedTuple):
    """The kernel's arguments (the engine's ``args``)."""

    tma_atom_a: cute.CopyAtom
    mDy: cute.Tensor  # TMA coordinates of dy (T, H)
    tma_atom_b: cute.CopyAtom
    mW: cute.Tensor  # TMA coordinates of w2t (F, H, E)
    mC: cute.Tensor  # (T, N1) bf16, row-major
    mProbs: cute.Tensor | None  # (T,) fp32/bf16
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mTileStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
    mBlockStart: cute.Tensor | None  # (E + 1,) int32: sum_{h<g} ceil(m_h / 32) (quantized)
    mDprobsPartial: cute.Tensor | None  # (T, n_tiles) fp32 (with probs)
    mWarpSums: cute.Tensor | None  # (max tiles * 8, N1) fp32, zero-filled (bias_grad)
    mDh: cute.Tensor | None  # (T, N1) bf16, row-major (bf16 dh)
    mRowData: cute.Tensor | None  # (T, N1) uint8: Q_row(dh)'s fp8 bytes (quantized)
    mRowScale: cute.Tensor | None  # (T, N1 / 32) uint8: its compact scales
    mColData: cute.Tensor | None  # (N1, T) uint8: Q_col(dh)'s fp8 bytes, transposed
    mColScale: cute.Tensor | None  # (N1, n_blocks) uint8: its compact grouped scales
    tma_atom_h: cute.CopyAtom | None  # store="tma": the dh subtiles' TMA store
    mDh_tma: cute.Tensor | None  # store="tma": TMA coordinates of dh's ragged view (BIG, N1, MAX, MAX)
    h_smem_layout: cute.ComposedLayout | None  # store="tma": (128, 32, _store.STAGES) bf16


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    tCrA: cute.Tensor
    operands: tuple  # ((acc, tCrB),)
    thr_mma: cute.ThrMma
    mma_tidx: Int32
    lane: Int32
    tile_warp: Int32  # rows 16 * tile_warp + [0, 16) of the tile
    # (row, column) of this thread's accumulators: ((2 columns, 2 rows, BN / 8 column groups), 1,
    # 1): accumulator 4j + c is row r, column f_j + c and 4j + 2 + c row r + 8
    tCcD: cute.Tensor
    acc: cute.Tensor  # da, then the db1 sums (bf16 dh)
    values: cute.Tensor | None  # quantized: a quantized tile's fp32 dh
    smem_q: tuple | None  # quantized: the quantizing epilogue's smem
    group_sums: cute.Tensor  # bias_grad: a group's d gate, d up column sums
    pair: cute.Tensor  # staging of one bf16 pair
    pair_bits: cute.Tensor
    row_probs: cute.Tensor
    row_dprobs: cute.Tensor
    # c's gate and up words of pair i at 2 (i % 16): bf16 dh, two batches of up to 8 pairs;
    # MXFP8, a batch of 16 (a gated half's pairs)
    c_words: cute.Tensor
    tile_store: _store.TileStore | None  # store="tma"
    staging: tuple | None  # store="tma": d gate and d up subtiles


class FC2DgradSm90(GroupedGemmEngine, DhEpilogue, QuantizedDhEpilogue):
    """FC2 dgrad on the engine (see the module docstring): ``__call__`` is the host side that
    builds the TMA descriptors and launches; the hooks are this site's parts of the skeleton."""

    def __init__(self, config: FC2DgradConfig):
        registers = (QUANTIZED_PRODUCER_REGISTERS, QUANTIZED_CONSUMER_REGISTERS) if config.quantized \
            else (PRODUCER_REGISTERS, CONSUMER_REGISTERS)
        self.setup_engine(config, TOKEN_ROW_WARPGROUPS, cluster=config.cluster, registers=registers)
        self.activation = config.activation
        self.gated = config.activation.gated
        self.has_probs = config.probs_dtype is not None
        self.bias_grad = config.bias_grad
        self.tile_n = config.tile_n
        self.quantized = config.quantized
        self.e5m2 = config.e5m2
        self.floor_scales = config.floor_scales
        self.tma_store = config.store == "tma"
        # bf16 dh: c is loaded in batches of column groups (a group: a thread's 2 pairs in 8
        # columns), a batch ahead, the first before the item's mainloop; with db1 at tile_n 256
        # batches of 2 groups (4 spill 8 bytes beside the TMA store's staging there)
        self.c_batch = 2 if config.bias_grad and config.tile_n == 256 else 4

    @cute.jit
    def __call__(
        self,
        mDy: cute.Tensor,  # (T, H) bf16, row-major
        mW: cute.Tensor,  # (E, F, H) bf16: K-major (strides (., H', 1)) or N-major (strides (., 1, F'))
        mC: cute.Tensor,  # (T, N1) bf16, row-major
        mProbs: cute.Tensor | None,  # (T,) fp32/bf16
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
        mBlockStart: cute.Tensor | None,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 32) (quantized)
        mDprobsPartial: cute.Tensor | None,  # (T, n_tiles) fp32 (with probs)
        mWarpSums: cute.Tensor | None,  # (max tiles * 8, N1) fp32, zero-filled (bias_grad)
        mDh: cute.Tensor | None,  # (T, N1) bf16, row-major (bf16 dh)
        mRowData: cute.Tensor | None,  # (T, N1) uint8: Q_row(dh)'s fp8 bytes (quantized)
        mRowScale: cute.Tensor | None,  # (T, N1 / 32) uint8: its compact scales
        mColData: cute.Tensor | None,  # (N1, T) uint8: Q_col(dh)'s fp8 bytes, transposed
        mColScale: cute.Tensor | None,  # (N1, n_blocks) uint8: its compact grouped scales
        num_ctas: Int32,  # persistent grid: min(#SMs, host bound of the work items)
        stream,
    ):
        ops = make_mainloop_operands(mDy, mW, self.tile_n, self.stages, (TOKEN_ROW_WARPGROUPS, 1, 1), self.cluster)
        fields = mainloop_fields(self.stages, ops.a_smem_layout, ops.b_smem_layout)
        if const_expr(self.quantized):  # the quantizing epilogue's transposed fp8 tile and 16-row amax keys
            fields.update(_quantize_epilogue.smem_fields())
        store = None  # store="tma": the subtiles' smem layout and TMA store of dh's ragged view
        if const_expr(self.tma_store):
            store = _store.make_store_operands(ragged_rows(mDh), TOKEN_ROW_WARPGROUPS)
            fields["sD"] = smem_array(BFloat16, cute.cosize(store.smem_layout))
        if const_expr(self.quantized):
            check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        args = FC2DgradArgs(ops.tma_atom_a, ops.tma_a, ops.tma_atom_b, ops.tma_b, mC, mProbs, mRowStart, mTileStart,
                            mBlockStart, mDprobsPartial, mWarpSums, mDh, mRowData, mRowScale, mColData, mColScale,
                            *_store.kernel_arguments(store))
        self.launch_engine(args, fields, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout, num_ctas, stream)

    def tma_atoms(self, args: FC2DgradArgs) -> tuple:
        return (args.tma_atom_a, args.tma_atom_b) + ((args.tma_atom_h,) if const_expr(self.tma_store) else ())

    def work(self, args: FC2DgradArgs) -> TokenItems:
        return TokenItems.of(args.mRowStart, args.mTileStart, args.mW.shape[0], self.tile_n, (args.mDy.shape[1],),
                             cluster=self.cluster)

    def produce(self, mainloop, work: TokenItems, bidx: Int32, grid: Int32, args: FC2DgradArgs, slots: Slots):
        sA, sBs = slots.sA, slots.sBs
        # w2t_g rows n_tile * BN + [0, BN)
        b_parts = (b_tiles(args.tma_atom_b, args.mW, sBs[0], self.tile_n, cluster=self.cluster),)
        produce_token_items(mainloop, self.stages, work, bidx, grid, work.k_tiles, args.tma_atom_a, args.mDy, sA,
                            b_parts, cluster=self.cluster)

    def consumer_setup(self, args: FC2DgradArgs, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
        acc = cute.make_rmem_tensor(pair_fragment(tCcD.shape), Float32)
        values = smem_q = None
        if const_expr(self.quantized):
            values = cute.make_rmem_tensor(pair_fragment(tCcD.shape), Float32)
            smem_q = _quantize_epilogue.smem_tensors(storage)
        group_sums = cute.make_rmem_tensor((4,), Float32)
        pair = cute.make_rmem_tensor((2,), BFloat16)
        pair_bits = cute.recast_tensor(pair, Int32)
        row_probs = cute.make_rmem_tensor((2,), Float32)
        row_dprobs = cute.make_rmem_tensor((2,), Float32)
        tile_store = staging = None
        if const_expr(self.tma_store):
            # d gate and d up of a subtile, one bulk group
            tile_store = self.tile_store(storage, args.h_smem_layout, tiled_mma, acc, mma_tidx, warp_idx,
                                         outputs=2 if self.gated else 1)
            staging = (tile_store.staging(), tile_store.staging())
        c_words = cute.make_rmem_tensor((2 * C_WORD_PAIRS,), Int32)
        return _Consumer(tCrA, ((acc, tCrBs[0]),), thr_mma, mma_tidx, mma_tidx % 32, mma_tidx // 32, tCcD, acc,
                         values, smem_q, group_sums, pair, pair_bits, row_probs, row_dprobs, c_words, tile_store,
                         staging)

    @cute.jit
    def before_mainloop(self, consumer: _Consumer, args: FC2DgradArgs, tile: tuple):
        """The epilogue reads rows first_row + [0, 128), columns col0 + [0, BN): only rows <
        end_row (this expert's) and columns < F are read and written. Accumulators 2i, 2i+1 are
        columns f, f+1 of one row (f even; F % 32 == 0: both or neither < F). Loaded here: the
        rows' probs and c's first batch (the bf16 pass's first batch, or a gated half's pairs).
        Returns (limits, c's gate and up views)."""
        _, _, n_tile, first_row, end_row = tile
        ffn = args.mW.shape[0]
        col0 = n_tile * self.tile_n
        limits = (end_row - first_row, ffn - col0)
        tCcD = consumer.tCcD
        tCgG, tCgU = c_pair_views(consumer.thr_mma, args.mC, first_row, col0, ffn, (TILE_M, self.tile_n), self.gated)
        if const_expr(self.has_probs):
            load_row_probs(consumer.row_probs, args.mProbs, (tCcD[0][0], tCcD[2][0]), first_row, limits[0],
                           consumer.row_dprobs)
        self.load_c_pairs(consumer.c_words, 0, C_WORD_PAIRS if const_expr(self.quantized) else 2 * self.c_batch,
                          tCgG, tCgU, tCcD, limits)
        return limits, tCgG, tCgU

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: FC2DgradArgs, tile: tuple, ahead: tuple, stores: Int32) -> Int32:
        g, m_tile, n_tile, first_row, end_row = tile
        limits, tCgG, tCgU = ahead
        ffn = args.mW.shape[0]
        col0 = n_tile * self.tile_n
        tile_shape = (TILE_M, self.tile_n)
        thr_mma, tCcD = consumer.thr_mma, consumer.tCcD
        if const_expr(self.tma_store):
            # dh's tile by subtiles of 32 columns (4 column groups j each), d gate at col0 and d up
            # at F + col0 of the ragged view (rows from end_row on unwritten)
            gH = cute.local_tile(expert_rows(args.mDh_tma, first_row, end_row - first_row), tile_shape, (0, n_tile))
            outputs = ((args.tma_atom_h, gH),)
            if const_expr(self.gated):
                outputs = ((args.tma_atom_h, gH), (args.tma_atom_h, cute.domain_offset((0, ffn), gH)))
            _, order, destinations = consumer.tile_store.targets(outputs)
        elif const_expr(not self.quantized):
            tCgH = cute.recast_tensor(thr_mma.partition_C(
                cute.local_tile(cute.domain_offset((first_row, col0), args.mDh), tile_shape, (0, 0))), Int32)
            tCgHU = None
            if const_expr(self.gated):
                tCgHU = cute.recast_tensor(thr_mma.partition_C(
                    cute.local_tile(cute.domain_offset((first_row, ffn + col0), args.mDh), tile_shape, (0, 0))), Int32)
        if const_expr(self.quantized):
            # the tile's 4 column blocks are blocks 4 * local + [0, 4) of expert g
            col_block0 = args.mBlockStart[g] + (m_tile - args.mTileStart[g]) * (TILE_M // BLOCK_SIZE)
            self.quantized_epilogue(
                consumer.acc, consumer.values, consumer.c_words, tCcD, thr_mma, consumer.mma_tidx, tCgG, tCgU,
                consumer.row_probs, consumer.row_dprobs, (args.mRowData, args.mRowScale, args.mColData, args.mColScale),
                consumer.smem_q, args.mWarpSums, first_row, col0, ffn, limits, col_block0,
                m_tile * WARPS_PER_TILE + consumer.tile_warp)

        bf16_pass = (consumer.acc, consumer.c_words, tCgG, tCgU, tCcD, limits, consumer.row_probs, consumer.row_dprobs,
                     consumer.group_sums, consumer.pair, consumer.pair_bits)
        if const_expr(self.tma_store):
            stores = self.bf16_pass(*bf16_pass, None, (consumer.tile_store, *consumer.staging, order, destinations,
                                                       stores), col0, ffn)
        elif const_expr(not self.quantized):
            self.bf16_pass(*bf16_pass, (tCgH, tCgHU), None, col0, ffn)

        if const_expr(self.has_probs):
            self.store_dprobs_partials(consumer.row_dprobs, tCcD, consumer.lane, limits, args.mDprobsPartial,
                                       first_row, n_tile)
        if const_expr(self.bias_grad and not self.quantized):
            self.store_db1_warp_sums(consumer.acc, tCcD, consumer.lane, limits, args.mWarpSums,
                                     m_tile * WARPS_PER_TILE + consumer.tile_warp, ffn, col0)
        return stores


# ---------------------------------------------------------------------------------------------
# Compilation (cached per config and architecture)
# ---------------------------------------------------------------------------------------------


def _fake_arguments(config: FC2DgradConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments, in order: T, H, F (N1 = 2F | F), E are
    runtime values; alignments are what the launcher guarantees (16-byte bases, H and F multiples
    of 32, strides of 8)."""
    rows, hidden = cute.sym_int(), cute.sym_int(divisibility=BLOCK_SIZE)
    ffn, n1 = cute.sym_int(divisibility=BLOCK_SIZE), cute.sym_int(divisibility=BLOCK_SIZE)
    starts, experts, n_tiles, sum_rows = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
    dy = fake_matrix(BFloat16, rows, hidden)
    w = fake_experts(experts, ffn, hidden, config.b_k_major)
    c = fake_matrix(BFloat16, rows, n1)
    probs = dprobs_partial = warp_sums = None
    if config.probs_dtype is not None:
        probs = fake_vector(FLOAT_DTYPES[config.probs_dtype], rows)
        dprobs_partial = fake_matrix(Float32, rows, n_tiles, divisibility=1, align=4)
    if config.bias_grad:
        warp_sums = fake_matrix(Float32, sum_rows, n1, divisibility=1, align=4)
    row_start, tile_start = fake_vector(Int32, starts), fake_vector(Int32, starts)
    block_start, outputs = _quantize_epilogue.fake_outputs(rows, n1, starts, config.quantized)  # dh's
    return (dy, w, c, probs, row_start, tile_start, block_start, dprobs_partial, warp_sums, *outputs, Int32(1),
            fake_stream())


_compile = config_compiler(FC2DgradSm90, _fake_arguments)  # (config, arch) -> CompiledKernel, cached


def problem_support(num_rows: int, hidden: int, ffn: int, num_experts: int, gated: bool = True) -> Reason | None:
    """None if the kernel runs a (T, H, F, E) problem, else why not (the Triton twin's 32-column
    rule for F, TMA alignment of H, search depth, 32-bit coordinates, the db1 warp sums' rows
    included: ``_launch.ffn_problem_support``)."""
    return ffn_problem_support(num_rows, hidden, ffn, num_experts, gated, tile_rows=WARPS_PER_TILE)


compile_fc2_dgrad = ahead_compiler(_NAME, _compile, FC2DgradConfig(Activation(ActivationKind.SWIGLU)),
                                   problem_support, "T, H, F, E", gated=True)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


def fc2_dgrad(
    dy: torch.Tensor,  # (T, H) bf16
    w2t: torch.Tensor,  # W2_g^T per expert: bf16 (E, F, H), K-major or N-major (a transposed view of W2)
    c: torch.Tensor,  # (T, 2F | F) bf16
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    activation: Activation,
    recipe: MXFP8Recipe | None,
    probs: torch.Tensor | None = None,  # (T,) fp32 or bf16
    bias_grad: bool = False,
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling=None,  # the Triton launcher's GemmTiling; unused (this kernel's tile is tile_n)
    # the knobs (FC2DgradConfig); None: launch_options' choice (defaults, tuned table, GMLP_SM90_CONFIG)
    tile_n: int | None = None,  # da columns per work item
    store: str | None = None,  # a bf16 dh's stores, "regs" or "tma"
    cluster: int | None = None,  # 1, or 2: CTAs paired along M, w2t tiles multicast
    site: str | None = None,  # the layer's site of the launch (its tuned entries first; gmlp.dispatch.sites)
) -> FC2DgradOutput:
    """Steps 5-6 of the dataflow; no host sync; deterministic. Same contract as
    ``gmlp.triton_ref.fc2_dgrad.fc2_dgrad``: ``recipe=None`` writes dh in bf16; an ``MXFP8Recipe``
    writes dh as Q_row(dh) and Q_col(dh) in ``recipe.grad_format`` with the recipe's scale mode
    (compact scales; ``FC2DgradOutput.dh`` is None), bit for bit the Triton kernel's where the da
    accumulations agree (tile_n must be 128); dprobs and db1 fp32 either way."""
    # validate
    check_recipe(recipe)
    if recipe is not None and tile_n not in (None, QUANTIZED_TILE_N):
        raise ValueError(quantized_tile_n_reason(tile_n))
    check_activation(activation)
    tokens, hidden = token_operand("dy", dy, None)
    experts = split_sizes.numel()
    ffn = expert_matrices("w2t", w2t, experts, F=None, H=hidden).n
    n1 = (2 if activation.gated else 1) * ffn
    # the kernel is compiled for a row stride of c that is a multiple of 8 (_fake_arguments)
    if tuple(c.shape) != (tokens, n1) or c.dtype != torch.bfloat16 or c.stride(1) != 1 or c.stride(0) % ELEMENT_ALIGN:
        raise ValueError(f"c must be bf16 row-major ({tokens}, {n1}) with a row stride a multiple of {ELEMENT_ALIGN}, "
                         f"got {c.dtype} {tuple(c.shape)} strides {c.stride()}")
    check_problem(_NAME, problem_support(tokens, hidden, ffn, experts, gated=activation.gated))
    b_k_major = b_is_k_major("w2t", w2t)  # a layout TMA reads, else ValueError
    check_tma_bases(dy=dy, w2t=w2t, c=c)
    check_optional("probs", probs, (tokens,))
    quantized = recipe is not None
    fmt = recipe.grad_format if quantized else None
    knobs = launch_options.launch_options("fc2_dgrad", tokens, ffn, hidden, experts, dict(tile_n=tile_n, store=store,
                                                                                          cluster=cluster),
                                          site=site, quantized=quantized)
    tile_n, store, cluster = knobs["tile_n"], knobs["store"], knobs["cluster"]
    config = FC2DgradConfig(activation, b_k_major=b_k_major, probs_dtype=None if probs is None else probs.dtype,
                            bias_grad=bias_grad, tile_n=tile_n, quantized=quantized,
                            e5m2=quantized and fmt is ElementFormat.E5M2,
                            floor_scales=quantized and recipe.scale_mode is ScaleMode.FLOOR, store=store,
                            cluster=cluster)

    # allocate (as the Triton launcher: the unused columnwise scale columns stay 0), launch over
    # min(#SMs, bound of the work items) persistent CTAs
    device = dy.device
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    n_tiles = scale_layout.ceil_div(ffn, tile_n)
    quantized_dh, outputs = _quantize_epilogue.output_arguments(tokens, n1, experts, fmt, device)
    block_start = groups.block_start if quantized else None
    # every (row, n-tile) partial is written (each row below its expert's end, by every n-tile of
    # its m-tile): no zero fill
    dprobs_partial = torch.empty(tokens, n_tiles, dtype=torch.float32, device=device) if probs is not None else None
    warp_sums = (torch.zeros(max(num_tiles, 1) * WARPS_PER_TILE, n1, dtype=torch.float32, device=device)
                 if bias_grad else None)
    num_ctas = _schedule.grid_size(tokens, experts, n_tiles, device, cluster)
    run(_compile, config, device, num_ctas, dy, w2t, c, probs, groups.row_start, groups.tile_start,
        block_start, dprobs_partial, warp_sums, *outputs)
    dprobs = dprobs_partial.sum(dim=1) if probs is not None else None  # fixed order: deterministic
    db1 = None
    if bias_grad:
        tile_sums = warp_sums.view(-1, WARPS_PER_TILE, n1).sum(dim=1)  # fixed order
        # each expert's tiles in order, one thread per output element: deterministic, no atomics
        db1 = torch.segment_reduce(tile_sums, "sum", offsets=groups.tile_start, axis=0)
    if not quantized:
        return FC2DgradOutput(dprobs=dprobs, dh=outputs[0], dh_rowwise=None, dh_columnwise=None, db1=db1)
    dh_rowwise, dh_columnwise = quantized_dh.tensors(False, fmt, recipe.scale_mode, split_sizes)
    return FC2DgradOutput(dprobs=dprobs, dh=None, db1=db1, dh_rowwise=dh_rowwise, dh_columnwise=dh_columnwise)
