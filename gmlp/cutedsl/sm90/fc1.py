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

- Schedule and mainloop: the grouped GEMM's (``_schedule``, ``_pipeline``): persistent CTAs over
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

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.gate_up import GateUp
from gmlp.contract.operands import token_operand
from gmlp.contract.outputs import FC1Output
from gmlp.contract.reasons import Reason
from gmlp.cutedsl.sm90 import _quantize_epilogue, _schedule, _store, launch_options
from gmlp.cutedsl.sm90._compile import (
    FLOAT_DTYPES,
    SUPPORTED_ARCHS,
    CompiledKernel,
    compile_ahead,
    config_compiler,
    fake_experts,
    fake_matrix,
    fake_stream,
    fake_vector,
)
from gmlp.cutedsl.sm90._epilogue_math import load_row_probs, pair_fragment
from gmlp.cutedsl.sm90._fc1_epilogue import ActivationEpilogue
from gmlp.cutedsl.sm90._launch import (
    check_activation,
    check_optional,
    check_problem,
    check_recipe,
    check_tma_bases,
    expert_matrices,
    ffn_problem_support,
    run,
)
from gmlp.cutedsl.sm90._pipeline import (
    THREADS_PER_WARPGROUP,
    TILE_K,
    StagedConfig,
    b_is_k_major,
    b_tiles,
    consumer_fragments,
    consumer_states,
    cta_roles,
    launch,
    mainloop_fields,
    make_b_tma,
    make_mainloop_operands,
    make_mainloop_pipeline,
    mma_k_tiles,
    mma_thread,
    produce_token_items,
    register_split,
    shared_storage,
    slot_tensors,
    smem_array,
)
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout, quantize_tile_both_ways
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode

__all__ = ["FC1Config", "FC1ForwardSm90", "compile_fc1", "problem_support", "fc1_forward", "SUPPORTED_ARCHS"]

_NAME = "fc1 kernel"  # in the errors of compile_fc1 and fc1_forward
TILE_N = 128  # a columns per work item (gated: 2 x 128 h columns)
_CONSUMER_WARPGROUPS = 2  # 64 rows each
_EPILOGUE_BARRIER = 1  # named barrier of the 256 consumer threads (quantizing epilogue); 0 is the CTA's
A_FORMAT = ElementFormat.E4M3  # MXFP8: a is quantized in E4M3 (the recipe's activation format)

@dataclass(frozen=True)
class FC1Config(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    b_k_major: bool = True  # W1_g (N1, H) row-major (stacked weights); False: N-major (transposed view)
    bias_dtype: torch.dtype | None = None  # None: no b1
    probs_dtype: torch.dtype | None = None  # None: no probs
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    quantized: bool = False  # MXFP8: a written as Q_row(a) and Q_col(a) (E4M3, compact scales), not bf16
    floor_scales: bool = False  # FLOOR (OCP) scale bytes instead of RCEIL (quantized only)
    # bf16 c and a's stores: "regs", predicated pairs from the registers; "tma", subtiles staged in
    # shared memory and TMA-stored, c gate, c up and a of a subtile as one bulk group (``_store``)
    store: str = "regs"
    # W1's up weights a second tensor (gate and up stored apart, ``gmlp.contract.gate_up``): the
    # up tiles from its own TMA descriptor at row n_tile * 128, not from W1's at F + n_tile * 128
    up_apart: bool = False

    def __post_init__(self):
        check_activation(self.activation)
        if self.floor_scales and not self.quantized:
            raise ValueError("floor_scales needs quantized=True (a bf16 a has no scales)")
        for name in ("bias_dtype", "probs_dtype"):
            dtype = getattr(self, name)
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(f"{name} must be one of {tuple(FLOAT_DTYPES)}, got {dtype}")
        if self.up_apart and not (self.activation.gated and self.b_k_major):
            raise ValueError(f"up_apart needs a gated activation and K-major gate and up views, got "
                             f"{self.activation.name}, b_k_major={self.b_k_major}")
        launch_options.check_store(self.store)
        if self.store == "tma" and self.quantized:
            raise ValueError("store='tma' needs a bf16 a (the TMA-store epilogue has no quantized outputs yet), got "
                             "quantized=True")
        self.check_stages()

    @property
    def b_tiles(self) -> int:
        """B tiles per k-step: gate and up for the gated activations, one for srelu."""
        return 2 if self.activation.gated else 1

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: the bf16 A tile and B tiles."""
        return TILE_M * TILE_K * 2 + self.b_tiles * TILE_N * TILE_K * 2

    def fixed_bytes(self) -> int:
        """Outside the slot ring: the epilogue's buffers."""
        return self.epilogue_bytes()

    def epilogue_bytes(self) -> int:
        """Shared memory of the epilogue: the quantizing one's transposed fp8 tile and amax keys
        (20 KB), the TMA store's subtiles, none for bf16 from the registers."""
        if self.quantized:
            return _quantize_epilogue.SMEM_BYTES
        return _store.smem_bytes(_CONSUMER_WARPGROUPS) if self.store == "tma" else 0

    def slot_name(self) -> str:
        return f"{self.activation.name}{' (quantized)' if self.quantized else ''}"


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------


class FC1ForwardSm90(ActivationEpilogue):
    """The jit code of FC1 (see the module docstring); ``__call__`` is the host side that builds
    TMA descriptors and launches, ``kernel`` the device side."""

    def __init__(self, config: FC1Config):
        self.config = config
        self.activation = config.activation
        self.gated = config.activation.gated
        self.num_b = config.b_tiles
        self.stages = config.num_stages()
        self.has_bias = config.bias_dtype is not None
        self.has_probs = config.probs_dtype is not None
        self.quantized = config.quantized
        self.floor_scales = config.floor_scales
        self.atom_layout_mnk = (_CONSUMER_WARPGROUPS, 1, 1)
        self.threads = (1 + _CONSUMER_WARPGROUPS) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads)  # producer, consumer setmaxnreg counts
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
        ops = make_mainloop_operands(mX, mW, TILE_N, self.stages, self.atom_layout_mnk)
        tma_atom_u = tma_u = None
        if const_expr(self.config.up_apart):
            tma_atom_u, tma_u = make_b_tma(mWUp, ops.b_smem_layout, TILE_N)
        # sB: the gate tile (h for srelu)
        fields = mainloop_fields(self.stages, ops.a_smem_layout, ops.b_smem_layout)
        if const_expr(self.gated):
            fields["sU"] = smem_array(BFloat16, cute.cosize(ops.b_smem_layout))  # up
        if const_expr(self.quantized):  # the quantizing epilogue's transposed fp8 tile and 16-row amax keys
            fields.update(_quantize_epilogue.smem_fields())
        c_store = a_store = None  # store="tma": the TMA stores of c's and a's ragged views
        if const_expr(self.tma_store):
            c_store = _store.make_store_operands(ragged_rows(mC), _CONSUMER_WARPGROUPS)
            a_store = _store.make_store_operands(ragged_rows(mAct), _CONSUMER_WARPGROUPS)
            fields["sD"] = smem_array(BFloat16, cute.cosize(c_store.smem_layout))  # the same layout for both
        self.shared_storage = shared_storage(fields)
        if const_expr(self.quantized):
            check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        launch(self.kernel(ops.tma_atom_a, ops.tma_a, ops.tma_atom_b, ops.tma_b, tma_atom_u, tma_u, mBias,
                           mProbs, mRowStart,
                           mTileStart, mBlockStart, mC, mAct, mRowData, mRowScale, mColData, mColScale,
                           *_store.kernel_arguments(c_store), *_store.kernel_arguments(a_store)[:2],
                           ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout),
               num_ctas, self.threads, stream)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mX: cute.Tensor,  # TMA coordinates of x (T, H)
        tma_atom_b: cute.CopyAtom,
        mW: cute.Tensor,  # TMA coordinates of W1 (N1, H, E), or (up_apart) of its gate weights (F, H, E)
        tma_atom_u: cute.CopyAtom | None,  # up_apart: the up weights' TMA load
        mWUp: cute.Tensor | None,  # up_apart: TMA coordinates of the up weights (F, H, E)
        mBias: cute.Tensor | None,
        mProbs: cute.Tensor | None,
        mRowStart: cute.Tensor,
        mTileStart: cute.Tensor,
        mBlockStart: cute.Tensor | None,
        mC: cute.Tensor,
        mAct: cute.Tensor | None,
        mRowData: cute.Tensor | None,
        mRowScale: cute.Tensor | None,
        mColData: cute.Tensor | None,
        mColScale: cute.Tensor | None,
        tma_atom_c: cute.CopyAtom | None,  # store="tma": c's subtile stores
        mC_tma: cute.Tensor | None,  # store="tma": TMA coordinates of c's ragged view (BIG, N1, MAX, MAX)
        d_smem_layout: cute.ComposedLayout | None,  # store="tma": (128, 32, _store.STAGES) bf16
        tma_atom_act: cute.CopyAtom | None,  # store="tma": a's subtile stores
        mAct_tma: cute.Tensor | None,  # store="tma": TMA coordinates of a's ragged view (BIG, F, MAX, MAX)
        tiled_mma: cute.TiledMma,
        a_smem_layout: cute.ComposedLayout,  # (BM, BK, stages)
        b_smem_layout: cute.ComposedLayout,  # (BN, BK, stages)
    ):
        atoms = ((tma_atom_a, tma_atom_b, tma_atom_c, tma_atom_act) if const_expr(self.tma_store)
                 else (tma_atom_a, tma_atom_b)) + ((tma_atom_u,) if const_expr(self.config.up_apart) else ())
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles(atoms)
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        # a slot: A and the B tile(s): gate and up (gated)
        sA, sB, stage_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout, self.num_b)
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages, _CONSUMER_WARPGROUPS,
                                          stage_bytes)

        ffn = mRowData.shape[1] if const_expr(self.quantized) else mAct.shape[1]
        items = TokenItems.of(mRowStart, mTileStart, ffn, TILE_N)
        k_tiles = (mX.shape[1] + TILE_K - 1) // TILE_K
        # B tiles of an item's n-tile: W1_g rows n_tile * 128 + [0, 128) (gate, or h for srelu)
        # and, gated, F + n_tile * 128 + [0, 128) (up; up_apart: rows n_tile * 128 + [0, 128) of
        # the up weights)
        up_source = (tma_atom_u, mWUp, 0) if const_expr(self.config.up_apart) else (tma_atom_b, mW, ffn)
        smem_b = (sB,)
        b_parts = (b_tiles(tma_atom_b, mW, sB, TILE_N),)
        if const_expr(self.gated):
            sU = storage.sU.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner)
            b_parts += (b_tiles(up_source[0], up_source[1], sU, TILE_N, row_offset=up_source[2]),)
            smem_b = (sB, sU)

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every (x, W1 gate [, up]) k-tile of this CTA's items
            produce_token_items(mainloop, self.stages, items, bidx, grid, k_tiles, tma_atom_a, mX, sA, b_parts)

        if warpgroup > 0:  # consumers: wgmma mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            mma_warpgroup, mma_tidx = mma_thread(tidx, warpgroup, pingpong=False)
            tCrA, tCrBs = consumer_fragments(tiled_mma, mma_warpgroup, sA, smem_b)
            thr_mma = tiled_mma.get_slice(mma_tidx)
            # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators:
            # ((2 columns, 2 rows, 16 column groups), 1, 1) for two m64n128 warpgroups
            tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
            fragment = pair_fragment(tCcD.shape)
            acc = cute.make_rmem_tensor(fragment, Float32)  # gate (or h)
            acc_up = cute.make_rmem_tensor(fragment, Float32)
            operands = ((acc, tCrBs[0]), (acc_up, tCrBs[1])) if const_expr(self.gated) else ((acc, tCrBs[0]),)
            if const_expr(self.quantized):
                smem_q = _quantize_epilogue.smem_tensors(storage)
            pair = cute.make_rmem_tensor((2,), BFloat16)  # staging of one bf16 pair
            pair_bits = cute.recast_tensor(pair, Int32)
            row_probs = cute.make_rmem_tensor((2,), Float32)
            read_state, release_state = consumer_states(self.stages)
            if const_expr(self.tma_store):
                sD = storage.sD.get_tensor(d_smem_layout.outer, swizzle=d_smem_layout.inner)
                # c gate, c up (gated) and a of a subtile, one bulk group; the first consumer warp stores
                consumers = _CONSUMER_WARPGROUPS * THREADS_PER_WARPGROUP
                tile_store = _store.TileStore.of(tiled_mma, acc, sD, mma_tidx, consumers,
                                                 _store.epi_tile(_CONSUMER_WARPGROUPS),
                                                 warp_idx == THREADS_PER_WARPGROUP // 32,
                                                 outputs=3 if self.gated else 2)
                c_stage, up_stage, a_stage = tile_store.staging(), tile_store.staging(), tile_store.staging()
                subtiles_done = Int32(0)

            item = bidx
            while item < items.count:
                g, m_tile, n_tile, first_row, end_row = items.tile(item)
                tiled_mma, read_state, release_state = mma_k_tiles(tiled_mma, mainloop, read_state, release_state,
                                                                   k_tiles, tCrA, operands)

                # Epilogue at rows first_row + [0, 128), a columns col0 + [0, 128): only rows <
                # end_row (this expert's) and columns < F are written. Accumulators 2i, 2i+1 of a
                # thread are columns c, c+1 of one row (c even; F % 32 == 0: both or neither < F).
                col0 = n_tile * TILE_N
                limits = (end_row - first_row, ffn - col0)
                if const_expr(self.has_probs):
                    load_row_probs(row_probs, mProbs, (tCcD[0][0], tCcD[2][0]), first_row, limits[0])
                # the global tiles are partitioned like the accumulators (tile of the MMA's width)
                tile = (TILE_M, TILE_N)
                if const_expr(self.tma_store):
                    # by subtiles of 32 columns (pairs 8s + [0, 8)): c gate at col0, c up at F +
                    # col0, a at col0 of the ragged views (rows from end_row on unwritten)
                    rows = end_row - first_row
                    gC = cute.local_tile(expert_rows(mC_tma, first_row, rows), tile, (0, n_tile))
                    gA = cute.local_tile(expert_rows(mAct_tma, first_row, rows), tile, (0, n_tile))
                    outputs = ((tma_atom_c, gC), (tma_atom_act, gA))
                    if const_expr(self.gated):
                        outputs = ((tma_atom_c, gC), (tma_atom_c, cute.domain_offset((0, ffn), gC)), (tma_atom_act, gA))
                    _, order, destinations = tile_store.targets(outputs)
                else:
                    gC = cute.local_tile(cute.domain_offset((first_row, col0), mC), tile, (0, 0))
                    tCgC = cute.recast_tensor(thr_mma.partition_C(gC), Int32)
                    tCgA = tCgU = None
                    if const_expr(not self.quantized):
                        gA = cute.local_tile(cute.domain_offset((first_row, col0), mAct), tile, (0, 0))
                        tCgA = cute.recast_tensor(thr_mma.partition_C(gA), Int32)
                    if const_expr(self.gated):
                        gU = cute.local_tile(cute.domain_offset((first_row, ffn + col0), mC), tile, (0, 0))
                        tCgU = cute.recast_tensor(thr_mma.partition_C(gU), Int32)
                pass_args = (acc, acc_up, tCcD, limits, col0, g, ffn, mBias, row_probs, pair, pair_bits)
                if const_expr(self.tma_store):
                    subtiles_done = self.activation_pass(*pass_args, None, (tile_store, c_stage, up_stage, a_stage,
                                                                            order, destinations, subtiles_done))
                else:
                    self.activation_pass(*pass_args, (tCgC, tCgU, tCgA), None)
                if const_expr(self.quantized):
                    # the tile's 4 column blocks are blocks 4 * local + [0, 4) of expert g
                    col_block0 = mBlockStart[g] + (m_tile - mTileStart[g]) * (TILE_M // BLOCK_SIZE)
                    quantize_tile_both_ways(
                        acc, tCcD, thr_mma, mma_tidx, (mRowData, mRowScale, mColData, mColScale), smem_q,
                        first_row, col0, limits, col_block0, False, self.floor_scales, _EPILOGUE_BARRIER)
                item += grid
            if const_expr(self.tma_store):
                tile_store.drain()


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


def compile_fc1(
    arch: str = "sm_90a",
    config: FC1Config | None = None,
    *,
    shape: tuple[int, int, int, int] | None = None,
) -> CompiledKernel:
    """Compile the kernel for ``arch`` without a GPU (default config: swiglu, no bias, no probs);
    returns it with its PTX and cubin. The code is shape-generic, so one compile serves every
    shape of a config; ``shape`` (T, H, F, E), when given, is checked against ``problem_support``."""
    config = config if config is not None else FC1Config(Activation(ActivationKind.SWIGLU))
    reason = None if shape is None else problem_support(*shape, gated=config.activation.gated)
    return compile_ahead(_NAME, _compile, config, arch, reason)


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
                                          dict(store=store), quantized=quantized)
    store = knobs["store"]
    config = FC1Config(activation, b_k_major=b_k_major, bias_dtype=None if b1 is None else b1.dtype,
                       probs_dtype=None if probs is None else probs.dtype, quantized=quantized,
                       floor_scales=quantized and recipe.scale_mode is ScaleMode.FLOOR,
                       store=store, up_apart=w_up is not None)

    # allocate (as the Triton launcher: the unused columnwise scale columns stay 0), launch over
    # min(#SMs, bound of the work items) persistent CTAs
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    device = x.device
    c = torch.empty(tokens, n1, dtype=torch.bfloat16, device=device)
    quantized_a, outputs = _quantize_epilogue.output_arguments(tokens, ffn, experts, A_FORMAT if quantized else None,
                                                               device)
    block_start = groups.block_start if quantized else None
    num_ctas = _schedule.grid_size(tokens, experts, scale_layout.ceil_div(ffn, TILE_N), device)
    run(_compile, config, device, num_ctas, x, w_gate, w_up, b1, probs, groups.row_start,
        groups.tile_start, block_start, c, *outputs)
    if not quantized:
        return FC1Output(c=c, a=outputs[0], a_rowwise=None, a_columnwise=None)
    a_rowwise, a_columnwise = quantized_a.tensors(False, A_FORMAT, recipe.scale_mode, split_sizes)
    return FC1Output(c=c, a=None, a_rowwise=a_rowwise, a_columnwise=a_columnwise)
