"""CuTeDSL sm_90a FC1 forward: grouped GEMM ``h = x @ W1_g^T (+ b1_g)`` with the fused epilogue
``c = bf16(h)``, ``a = act(h) * probs``: bf16, or (MXFP8 recipe) quantized both ways, Q_row(a) and
Q_col(a), from the same registers.

Twin of ``gmlp.triton_ref.fc1.fc1_forward`` (same arguments and outputs, same fp32 epilogue
formulas as ``gmlp.triton_ref._activations``, i.e. ``gmlp.contract.activations``). Operands: x (T, H) bf16
row-major with rows grouped by expert; W1 (E, N1, H) bf16 with N1 = 2F ([gate; up] rows) for the
gated activations and F for srelu, K-major (stacked weights) or N-major (a transposed view);
optional b1 (E, N1) bf16/fp32 and probs (T,) fp32/bf16. Outputs: c (T, N1) bf16; a (T, F) bf16,
or with an ``MXFP8Recipe`` Q_row(a) (T, F) e4m3 + compact scales (T, F/32) and Q_col(a) (F, T)
e4m3 + compact grouped scales (F, (T + 31 E) // 32) (each expert's tokens in their own 32-row
blocks from its first row, the unused columns 0), bit for bit the Triton kernel's.
Expert g owns rows ``row_start[g] <= r < row_start[g+1]`` (``gmlp.mxfp8.routing.device_groups``; no
host sync, any sizes, 0 too).

Kernel design (one compiled kernel per ``FC1Config``; T, H, F, E are runtime values):

- Schedule and mainloop: the engine's (``_engine``, ``_schedule``, ``_pipeline``): persistent CTAs over
  work items (128-row expert tile j, a-column tile n), a TMA producer warp and two consumer
  warpgroups (64 rows each) issuing bf16 ``wgmma`` with fp32 accumulators.
- Gated activations: **two B tiles per k-step**. The a-tile of columns [j, j+128) needs h's gate
  columns [j, j+128) and up columns [F+j, F+j+128), i.e. W1_g rows [j, j+128) and [F+j, F+j+128):
  each pipeline slot holds the A k-tile and both B k-tiles (two TMA loads through the same W1
  descriptor, the second at row offset F; past 2F TMA reads zeros), and every k-block issues two
  m64n128k16 wgmmas per warpgroup into two accumulators (gate, up: 64 + 64 fp32 a thread). So
  the gate and up values of one (row, column) sit in the same thread at the same accumulator
  index, and W1 is read in place in its stored [gate; up] order (no interleaved copy). srelu: one
  B tile, one accumulator.
- Slot: A 16 KB + 2 x 16 KB (gated) -> 4 stages; 32 KB (srelu) -> 7 stages. The MXFP8 epilogue
  takes 20 KB more (below): gated still 4 stages, srelu 6 (one fewer).
- Epilogue, from the accumulator registers, per thread pair of adjacent columns (c, c+1) of one
  row: + b1 (fp32), c = bf16 pairs of gate and up (two 32-bit stores), act in fp32 (exp as
  ``ex2.approx.f32(z * -log2 e)`` and ``1 / x`` as ``div.full.f32``, Triton's lowering of the
  same formulas; the same fp32 operations as Triton's PTX, ``_epilogue_math``), times probs[row]
  (loaded once per item for the thread's rows). bf16: a = bf16 pair (one 32-bit store). Only
  rows below the expert's end and columns below F are written.
- MXFP8 epilogue (``_quantize_epilogue.quantize_tile_both_ways``, E4M3, RCEIL or FLOOR): the
  fp32 a values (no bf16 rounding: Triton quantizes its fp32 registers too) overwrite the gate
  accumulator; rows past the expert's end and columns past F count as zeros. Q_row: a row's
  32-column block is 8 values in each lane of a quad: in-thread key max, a quad reduce-scatter
  (one scale per lane and row), the quad's scale bytes gathered back; fp8 column pairs stored as
  16-bit words (the bf16 a's store pattern), the scale bytes by the lane owning the block. Q_col:
  a 32-row block spans two warps: per column the thread's 2 rows, a reduce-scatter over the
  column's 8 lanes (28 shuffles: each lane keeps 4 columns), the warp's 16-row keys through
  4 KB of smem (named barrier of the 256 consumer threads), the scale bytes of the lane's 4
  columns (the even warp stores them, at block ``block_start[g] + 4 * local + warp // 2``),
  gathered back over the 8 lanes (7 shuffles), then every value is quantized into a 16 KB smem
  fp8 tile in the transposed orientation (64 byte stores a thread, bank-conflict free), and after
  a second barrier the 256 threads write it with the quantize kernel's 16-byte aligned funnel
  store (expert rows start anywhere in the (F, T) output). Registers: ptxas reports no spills
  (the consumer warpgroups run at 232 after ``setmaxnreg``; a thread holds the 64 a values, 32
  column keys and the gathered scale words).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.gate_up import GateUp
from gmlp.contract.operands import token_operand
from gmlp.contract.outputs import FC1Output
from gmlp.contract.reasons import Reason
from gmlp.cutedsl.sm90 import _quantize_epilogue, _schedule, _store, launch_options
from gmlp.cutedsl.sm90._compile import (FLOAT_DTYPES, SUPPORTED_ARCHS, ahead_compiler, config_compiler, fake_experts,
                                        fake_matrix, fake_stream, fake_vector)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._epilogue_math import load_row_probs, pair_fragment
from gmlp.cutedsl.sm90._fc1_epilogue import ActivationEpilogue
from gmlp.cutedsl.sm90._launch import (check_activation, check_optional, check_problem, check_recipe, check_tma_bases,
                                       expert_matrices, ffn_problem_support, run)
from gmlp.cutedsl.sm90._pipeline import (b_is_k_major, b_tiles, mainloop_fields, make_b_tma, make_mainloop_operands,
                                         produce_token_items, slot_tensors, smem_array)
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout, quantize_tile_both_ways
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
from gmlp.cutedsl.sm90.configs import FC1_TILE_N, TOKEN_ROW_WARPGROUPS, FC1Config
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode

__all__ = ["FC1Config", "FC1ForwardSm90", "compile_fc1", "problem_support", "fc1_forward", "SUPPORTED_ARCHS"]

_NAME = "fc1 kernel"  # in the errors of compile_fc1 and fc1_forward
_EPILOGUE_BARRIER = 1  # named barrier of the 256 consumer threads (quantizing epilogue); 0 is the CTA's
A_FORMAT = ElementFormat.E4M3  # MXFP8: a is quantized in E4M3 (the recipe's activation format)

class FC1Args(NamedTuple):
    """The kernel's arguments (the engine's ``args``)."""

    tma_atom_a: cute.CopyAtom
    mX: cute.Tensor  # TMA coordinates of x (T, H)
    tma_atom_b: cute.CopyAtom
    mW: cute.Tensor  # TMA coordinates of W1 (N1, H, E), or (up_apart) of its gate weights (F, H, E)
    tma_atom_u: cute.CopyAtom | None  # up_apart: the up weights' TMA load
    mWUp: cute.Tensor | None  # up_apart: TMA coordinates of the up weights (F, H, E)
    mBias: cute.Tensor | None  # (E, N1) bf16/fp32, row-major
    mProbs: cute.Tensor | None  # (T,) fp32/bf16
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mTileStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
    mBlockStart: cute.Tensor | None  # (E + 1,) int32: sum_{h<g} ceil(m_h / 32) (quantized)
    mC: cute.Tensor  # (T, N1) bf16, row-major
    mAct: cute.Tensor | None  # (T, F) bf16, row-major (bf16 a)
    mRowData: cute.Tensor | None  # (T, F) uint8: Q_row(a)'s e4m3 bytes (quantized)
    mRowScale: cute.Tensor | None  # (T, F / 32) uint8: its compact scales
    mColData: cute.Tensor | None  # (F, T) uint8: Q_col(a)'s e4m3 bytes, transposed
    mColScale: cute.Tensor | None  # (F, n_blocks) uint8: its compact grouped scales
    tma_atom_c: cute.CopyAtom | None  # store="tma": c's subtile stores
    mC_tma: cute.Tensor | None  # store="tma": TMA coordinates of c's ragged view (BIG, N1, MAX, MAX)
    d_smem_layout: cute.ComposedLayout | None  # store="tma": (128, 32, _store.STAGES) bf16
    tma_atom_act: cute.CopyAtom | None  # store="tma": a's subtile stores
    mAct_tma: cute.Tensor | None  # store="tma": TMA coordinates of a's ragged view (BIG, F, MAX, MAX)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    tCrA: cute.Tensor
    operands: tuple  # ((gate acc, its tCrB), (up acc, its tCrB)), or srelu's one
    thr_mma: cute.ThrMma
    mma_tidx: Int32
    # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators:
    # ((2 columns, 2 rows, 16 column groups), 1, 1) for two m64n128 warpgroups
    tCcD: cute.Tensor
    acc: cute.Tensor  # gate (or h)
    acc_up: cute.Tensor
    smem_q: tuple | None  # quantized: the quantizing epilogue's smem
    pair: cute.Tensor  # staging of one bf16 pair
    pair_bits: cute.Tensor
    row_probs: cute.Tensor
    tile_store: _store.TileStore | None  # store="tma"
    staging: tuple | None  # store="tma": c gate, c up and a subtiles


class FC1ForwardSm90(GroupedGemmEngine, ActivationEpilogue):
    """FC1 on the engine (see the module docstring): ``__call__`` is the host side that builds the
    TMA descriptors and launches; the hooks are this site's parts of the skeleton."""

    def __init__(self, config: FC1Config):
        self.setup_engine(config, TOKEN_ROW_WARPGROUPS, cluster=config.cluster)
        self.activation = config.activation
        self.gated = config.activation.gated
        self.num_b = config.b_tiles
        self.has_bias = config.bias_dtype is not None
        self.has_probs = config.probs_dtype is not None
        self.quantized = config.quantized
        self.floor_scales = config.floor_scales
        self.tma_store = config.store == "tma"

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # (T, H) bf16, row-major
        mW: cute.Tensor,  # (E, N1, H) bf16: K-major (strides (., H', 1)) or N-major (strides (., 1, N1'))
        mWUp: cute.Tensor | None,  # up_apart: W1's up weights (E, F, H), K-major; mW is then the gate's (E, F, H)
        mBias: cute.Tensor | None,  # (E, N1) bf16/fp32, row-major
        mProbs: cute.Tensor | None,  # (T,) fp32/bf16
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
        mBlockStart: cute.Tensor | None,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 32) (quantized)
        mC: cute.Tensor,  # (T, N1) bf16, row-major
        mAct: cute.Tensor | None,  # (T, F) bf16, row-major (bf16 a)
        mRowData: cute.Tensor | None,  # (T, F) uint8: Q_row(a)'s e4m3 bytes (quantized)
        mRowScale: cute.Tensor | None,  # (T, F / 32) uint8: its compact scales
        mColData: cute.Tensor | None,  # (F, T) uint8: Q_col(a)'s e4m3 bytes, transposed
        mColScale: cute.Tensor | None,  # (F, n_blocks) uint8: its compact grouped scales
        num_ctas: Int32,  # persistent grid: min(#SMs, host bound of the work items)
        stream,
    ):
        ops = make_mainloop_operands(mX, mW, FC1_TILE_N, self.stages, (TOKEN_ROW_WARPGROUPS, 1, 1), self.cluster)
        tma_atom_u = tma_u = None
        if const_expr(self.config.up_apart):
            tma_atom_u, tma_u = make_b_tma(mWUp, ops.b_smem_layout, FC1_TILE_N, self.cluster)
        # sB: the gate tile (h for srelu)
        fields = mainloop_fields(self.stages, ops.a_smem_layout, ops.b_smem_layout)
        if const_expr(self.gated):
            fields["sU"] = smem_array(BFloat16, cute.cosize(ops.b_smem_layout))  # up
        if const_expr(self.quantized):  # the quantizing epilogue's transposed fp8 tile and 16-row amax keys
            fields.update(_quantize_epilogue.smem_fields())
        c_store = a_store = None  # store="tma": the TMA stores of c's and a's ragged views
        if const_expr(self.tma_store):
            c_store = _store.make_store_operands(ragged_rows(mC), TOKEN_ROW_WARPGROUPS)
            a_store = _store.make_store_operands(ragged_rows(mAct), TOKEN_ROW_WARPGROUPS)
            fields["sD"] = smem_array(BFloat16, cute.cosize(c_store.smem_layout))  # the same layout for both
        if const_expr(self.quantized):
            check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        args = FC1Args(ops.tma_atom_a, ops.tma_a, ops.tma_atom_b, ops.tma_b, tma_atom_u, tma_u, mBias, mProbs,
                       mRowStart, mTileStart, mBlockStart, mC, mAct, mRowData, mRowScale, mColData, mColScale,
                       *_store.kernel_arguments(c_store), *_store.kernel_arguments(a_store)[:2])
        self.launch_engine(args, fields, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout, num_ctas, stream)

    def tma_atoms(self, args: FC1Args) -> tuple:
        atoms = ((args.tma_atom_a, args.tma_atom_b, args.tma_atom_c, args.tma_atom_act) if const_expr(self.tma_store)
                 else (args.tma_atom_a, args.tma_atom_b))
        return atoms + ((args.tma_atom_u,) if const_expr(self.config.up_apart) else ())

    def slots(self, storage, args: FC1Args, a_smem_layout, b_smem_layout):
        """A slot: the x tile and the B tile(s): gate and up (gated)."""
        sA, sB, stage_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout, self.num_b)
        if const_expr(self.gated):
            return Slots(sA, (sB, storage.sU.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner)), stage_bytes)
        return Slots(sA, (sB,), stage_bytes)

    def ffn(self, args: FC1Args) -> Int32:
        return args.mRowData.shape[1] if const_expr(self.quantized) else args.mAct.shape[1]

    def work(self, args: FC1Args) -> TokenItems:
        return TokenItems.of(args.mRowStart, args.mTileStart, self.ffn(args), FC1_TILE_N, (args.mX.shape[1],),
                             cluster=self.cluster)

    def produce(self, mainloop, work: TokenItems, bidx: Int32, grid: Int32, args: FC1Args, slots: Slots):
        sA, sBs = slots.sA, slots.sBs
        # B tiles of an item's n-tile: W1_g rows n_tile * 128 + [0, 128) (gate, or h for srelu)
        # and, gated, F + n_tile * 128 + [0, 128) (up; up_apart: rows n_tile * 128 + [0, 128) of
        # the up weights)
        up_source = (args.tma_atom_u, args.mWUp, 0) if const_expr(self.config.up_apart) \
            else (args.tma_atom_b, args.mW, self.ffn(args))
        b_parts = (b_tiles(args.tma_atom_b, args.mW, sBs[0], FC1_TILE_N, cluster=self.cluster),)
        if const_expr(self.gated):
            b_parts += (b_tiles(up_source[0], up_source[1], sBs[1], FC1_TILE_N, row_offset=up_source[2],
                                cluster=self.cluster),)
        produce_token_items(mainloop, self.stages, work, bidx, grid, work.k_tiles, args.tma_atom_a, args.mX, sA,
                            b_parts, cluster=self.cluster)

    def consumer_setup(self, args: FC1Args, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, FC1_TILE_N)))
        fragment = pair_fragment(tCcD.shape)
        acc = cute.make_rmem_tensor(fragment, Float32)
        acc_up = cute.make_rmem_tensor(fragment, Float32)
        operands = ((acc, tCrBs[0]), (acc_up, tCrBs[1])) if const_expr(self.gated) else ((acc, tCrBs[0]),)
        smem_q = _quantize_epilogue.smem_tensors(storage) if const_expr(self.quantized) else None
        pair = cute.make_rmem_tensor((2,), BFloat16)
        pair_bits = cute.recast_tensor(pair, Int32)
        row_probs = cute.make_rmem_tensor((2,), Float32)
        tile_store = staging = None
        if const_expr(self.tma_store):
            # c gate, c up (gated) and a of a subtile, one bulk group
            tile_store = self.tile_store(storage, args.d_smem_layout, tiled_mma, acc, mma_tidx, warp_idx,
                                         outputs=3 if self.gated else 2)
            staging = (tile_store.staging(), tile_store.staging(), tile_store.staging())
        return _Consumer(tCrA, operands, thr_mma, mma_tidx, tCcD, acc, acc_up, smem_q, pair, pair_bits, row_probs,
                         tile_store, staging)

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: FC1Args, tile: tuple, ahead, stores: Int32) -> Int32:
        """Rows first_row + [0, 128), a columns col0 + [0, 128): only rows < end_row (this
        expert's) and columns < F are written. Accumulators 2i, 2i+1 of a thread are columns c,
        c+1 of one row (c even; F % 32 == 0: both or neither < F)."""
        g, m_tile, n_tile, first_row, end_row = tile
        ffn = self.ffn(args)
        col0 = n_tile * FC1_TILE_N
        limits = (end_row - first_row, ffn - col0)
        tCcD = consumer.tCcD
        if const_expr(self.has_probs):
            load_row_probs(consumer.row_probs, args.mProbs, (tCcD[0][0], tCcD[2][0]), first_row, limits[0])
        # the global tiles are partitioned like the accumulators (tile of the MMA's width)
        tile_shape = (TILE_M, FC1_TILE_N)
        pass_args = (consumer.acc, consumer.acc_up, tCcD, limits, col0, g, ffn, args.mBias, consumer.row_probs,
                     consumer.pair, consumer.pair_bits)
        if const_expr(self.tma_store):
            # by subtiles of 32 columns (pairs 8s + [0, 8)): c gate at col0, c up at F + col0, a at
            # col0 of the ragged views (rows from end_row on unwritten)
            rows = end_row - first_row
            gC = cute.local_tile(expert_rows(args.mC_tma, first_row, rows), tile_shape, (0, n_tile))
            gA = cute.local_tile(expert_rows(args.mAct_tma, first_row, rows), tile_shape, (0, n_tile))
            outputs = ((args.tma_atom_c, gC), (args.tma_atom_act, gA))
            if const_expr(self.gated):
                outputs = ((args.tma_atom_c, gC), (args.tma_atom_c, cute.domain_offset((0, ffn), gC)),
                           (args.tma_atom_act, gA))
            _, order, destinations = consumer.tile_store.targets(outputs)
            stores = self.activation_pass(*pass_args, None, (consumer.tile_store, *consumer.staging, order,
                                                             destinations, stores))
        else:
            thr_mma = consumer.thr_mma
            gC = cute.local_tile(cute.domain_offset((first_row, col0), args.mC), tile_shape, (0, 0))
            tCgC = cute.recast_tensor(thr_mma.partition_C(gC), Int32)
            tCgA = tCgU = None
            if const_expr(not self.quantized):
                gA = cute.local_tile(cute.domain_offset((first_row, col0), args.mAct), tile_shape, (0, 0))
                tCgA = cute.recast_tensor(thr_mma.partition_C(gA), Int32)
            if const_expr(self.gated):
                gU = cute.local_tile(cute.domain_offset((first_row, ffn + col0), args.mC), tile_shape, (0, 0))
                tCgU = cute.recast_tensor(thr_mma.partition_C(gU), Int32)
            self.activation_pass(*pass_args, (tCgC, tCgU, tCgA), None)
        if const_expr(self.quantized):
            # the tile's 4 column blocks are blocks 4 * local + [0, 4) of expert g
            col_block0 = args.mBlockStart[g] + (m_tile - args.mTileStart[g]) * (TILE_M // BLOCK_SIZE)
            quantize_tile_both_ways(
                consumer.acc, tCcD, consumer.thr_mma, consumer.mma_tidx,
                (args.mRowData, args.mRowScale, args.mColData, args.mColScale), consumer.smem_q, first_row, col0,
                limits, col_block0, False, self.floor_scales, _EPILOGUE_BARRIER)
        return stores


# ---------------------------------------------------------------------------------------------
# Compilation (cached per config and architecture)
# ---------------------------------------------------------------------------------------------


def _fake_arguments(config: FC1Config) -> tuple:
    """Symbolic stand-ins of the kernel's arguments, in order: T, H, F (N1 = 2F | F), E are
    runtime values; alignments are what the launcher guarantees (16-byte bases, H and F multiples
    of 32, strides of 8)."""
    rows, hidden = cute.sym_int(), cute.sym_int(divisibility=BLOCK_SIZE)
    ffn, n1 = cute.sym_int(divisibility=BLOCK_SIZE), cute.sym_int(divisibility=BLOCK_SIZE)
    starts, experts = cute.sym_int(), cute.sym_int()
    x = fake_matrix(BFloat16, rows, hidden)
    w, w_up = fake_experts(experts, n1, hidden, config.b_k_major), None
    if config.up_apart:  # the gate and up views, each (E, F, H) with its own strides
        w, w_up = fake_experts(experts, ffn, hidden, True), fake_experts(experts, ffn, hidden, True)
    bias = probs = None
    if config.bias_dtype is not None:
        bias = fake_matrix(FLOAT_DTYPES[config.bias_dtype], experts, n1, divisibility=1, align=4)
    if config.probs_dtype is not None:
        probs = fake_vector(FLOAT_DTYPES[config.probs_dtype], rows)
    row_start, tile_start = fake_vector(Int32, starts), fake_vector(Int32, starts)
    c = fake_matrix(BFloat16, rows, n1)
    block_start, outputs = _quantize_epilogue.fake_outputs(rows, ffn, starts, config.quantized)  # a's
    return (x, w, w_up, bias, probs, row_start, tile_start, block_start, c, *outputs, Int32(1), fake_stream())


_compile = config_compiler(FC1ForwardSm90, _fake_arguments)  # (config, arch) -> CompiledKernel, cached


def problem_support(num_rows: int, hidden: int, ffn: int, num_experts: int, gated: bool = True) -> Reason | None:
    """None if the kernel runs a (T, H, F, E) problem, else why not (the Triton twin's 32-column
    rule, TMA alignment, search depth, 32-bit coordinates: ``_launch.ffn_problem_support``)."""
    return ffn_problem_support(num_rows, hidden, ffn, num_experts, gated, tile_rows=1)


compile_fc1 = ahead_compiler(_NAME, _compile, FC1Config(Activation(ActivationKind.SWIGLU)),
                             problem_support, "T, H, F, E", gated=True)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


def fc1_forward(
    x: torch.Tensor,  # (T, H) bf16
    w1: torch.Tensor | GateUp,  # W1_g (N1, H) per expert: bf16 (E, N1, H), K-major or N-major; or its gate and up views
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    ffn_hidden_size: int,
    activation: Activation,
    recipe: MXFP8Recipe | None,
    b1: torch.Tensor | None = None,  # (E, N1) bf16 or fp32
    probs: torch.Tensor | None = None,  # (T,) fp32 or bf16
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling=None,  # the Triton launcher's GemmTiling; unused (this kernel's tile is 128 x 128 a columns)
    # the knobs (FC1Config); None: launch_options' choice (defaults, tuned table, GMLP_SM90_CONFIG)
    store: str | None = None,  # bf16 c and a's stores, "regs" or "tma"
    cluster: int | None = None,  # 1, or 2: CTAs paired along M, W1 tiles multicast
    site: str | None = None,  # the layer's site of the launch (its tuned entries first; gmlp.dispatch.sites)
) -> FC1Output:
    """FC1 of every expert with the fused forward epilogue; no host sync. Same contract as
    ``gmlp.triton_ref.fc1.fc1_forward``: ``recipe=None`` writes c and a in bf16; an
    ``MXFP8Recipe`` writes c and ``a`` as Q_row(a) and Q_col(a) (E4M3, the recipe's scale mode,
    compact scales; ``FC1Output.a`` is None), bit for bit the Triton kernel's. A gated W1 may come
    in any ``gmlp.contract.gate_up`` layout, as the two (E, F, H) views of a ``GateUp`` (rows
    contiguous: K-major), read in place."""
    # validate
    check_recipe(recipe)
    check_activation(activation)
    experts, ffn = split_sizes.numel(), ffn_hidden_size
    n1 = (2 if activation.gated else 1) * ffn
    tokens, hidden = token_operand("x", x, None)
    w_gate, w_up = (w1.gate, w1.up) if isinstance(w1, GateUp) else (w1, None)
    if w_up is not None:
        if not activation.gated:
            raise ValueError(f"w1 is a GateUp (gate and up weights) but the activation {activation.name} is not gated")
        expert_matrices("w1.gate", w_gate, experts, F=ffn, H=hidden)
        expert_matrices("w1.up", w_up, experts, F=ffn, H=hidden)
        b_is_k_major("w1.up", w_up)  # a layout TMA reads, else ValueError
        check_tma_bases(w1_up=w_up)
    else:
        expert_matrices("w1", w1, experts, N1=n1, H=hidden)
    check_problem(_NAME, problem_support(tokens, hidden, ffn, experts, gated=activation.gated))
    b_k_major = b_is_k_major("w1", w_gate)  # a layout TMA reads, else ValueError
    check_tma_bases(x=x, w1=w_gate)
    check_optional("b1", b1, (experts, n1))
    check_optional("probs", probs, (tokens,))
    quantized = recipe is not None
    knobs = launch_options.launch_options("fc1_forward", tokens, n1, hidden, experts,
                                          dict(store=store, cluster=cluster), site=site, quantized=quantized)
    store, cluster = knobs["store"], knobs["cluster"]
    config = FC1Config(activation, b_k_major=b_k_major, bias_dtype=None if b1 is None else b1.dtype,
                       probs_dtype=None if probs is None else probs.dtype, quantized=quantized,
                       floor_scales=quantized and recipe.scale_mode is ScaleMode.FLOOR,
                       store=store, up_apart=w_up is not None, cluster=cluster)

    # allocate (as the Triton launcher: the unused columnwise scale columns stay 0), launch over
    # min(#SMs, bound of the work items) persistent CTAs
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    device = x.device
    c = torch.empty(tokens, n1, dtype=torch.bfloat16, device=device)
    quantized_a, outputs = _quantize_epilogue.output_arguments(tokens, ffn, experts, A_FORMAT if quantized else None,
                                                               device)
    block_start = groups.block_start if quantized else None
    num_ctas = _schedule.grid_size(tokens, experts, scale_layout.ceil_div(ffn, FC1_TILE_N), device, cluster)
    run(_compile, config, device, num_ctas, x, w_gate, w_up, b1, probs, groups.row_start,
        groups.tile_start, block_start, c, *outputs)
    if not quantized:
        return FC1Output(c=c, a=outputs[0], a_rowwise=None, a_columnwise=None)
    a_rowwise, a_columnwise = quantized_a.tensors(False, A_FORMAT, recipe.scale_mode, split_sizes)
    return FC1Output(c=c, a=None, a_rowwise=a_rowwise, a_columnwise=a_columnwise)
