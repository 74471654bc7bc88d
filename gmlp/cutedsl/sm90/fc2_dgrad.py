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

- Schedule and mainloop: the grouped GEMM's (``_schedule``, ``_pipeline``): persistent CTAs over
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

MXFP8 epilogue (``FC2DgradConfig(quantized=True, e5m2=..., floor_scales=...)``, tile_n 128 only; its
device methods are ``_fc2_dgrad_mxfp8.QuantizedDhEpilogue``;
``_quantize_epilogue.quantize_tile_both_ways`` with ``segments`` and ``column_first``):

- What is quantized is the fp32 dh, as Triton's ``store_quantized_both_ways(d_gate, ...)`` and
  ``(d_up, ...)`` get it (no bf16 step); dprobs (of da before the probs scale) and db1 (of the
  fp32 dh) as in the bf16 path. The dh expression trees are Triton's (``_epilogue_math``); c is
  read as 32-bit words whose bf16 halves are widened by shifts (exact, the values of cvt.f32.bf16).
- Registers decide the shape of the epilogue. Quantizing needs a tile's 64 values in a thread
  (plus keys, scales, addresses); holding a thread's d gate and d up of the whole 128-wide tile
  (64 + 64, one half over the accumulators) before quantizing them as two 128-column tiles was
  tried: ptxas spills, even with the stale-value and key-order fixes below (swiglu: 36 bytes of
  spill stores, 264 with probs and db1; at 240 registers 20 and 184). So gated, the da tile is
  done in two 64-column halves q: a pass over half q's 32 da values writes its 32 d gate and 32 d
  up values into one 64-value quantized tile (columns [0, 64) d gate, [64, 128) d up:
  ``dh_segments``), which is quantized with the two output ranges as ``segments`` (its 32-column
  blocks and transposed rows never straddle them), then the other half (skipped when it has no
  valid column). Peak: the quantized tile's 64 values, the other half's 32 da values and the
  quantization's temporaries. srelu: one pass over the 64 values, one quantized tile. Masked pairs
  write 0 into the tile (else the previous half's or item's values stay live through the mainloop:
  LLVM cannot see that the quantization masks them). The consumer warpgroups run at 240 registers,
  the producer at 24 (``QUANTIZED_*_REGISTERS``; 128 x 24 + 256 x 240 = 384 x 168, the launch allocation:
  ``_pipeline.register_split``): at 232 / 40 a few
  configurations (db1 without probs) spill one register. ptxas -v (sm_90a): 0 bytes stack, 0
  spills in every configuration the tests compile (the highest register of the consumers' code
  R237 gated, R209 srelu).
- Q_col's per-column keys are reduced and stored before Q_row (``column_first``; ptxas otherwise
  keeps the 64 per-value keys live through Q_row's stores).
- db1: after each quantized tile, per column its two rows (masked), the warp's 8 quads by
  butterflies, lanes 0-3 store to ``dh_warp_sums`` as in the bf16 path (same rows, columns).
- Shared memory: the epilogue's 20 KB (16 KB transposed fp8 tile + 4 KB amax keys,
  ``_quantize_epilogue.SMEM_BYTES``, reused by every quantized tile: its two named barriers order
  the reuse) leave 6 stages of 32 KB (``FC2DgradConfig.max_stages``).
- tile_n = 256 is refused with a recipe: a thread would hold 128 da values through the epilogue,
  96 of them live beside a quantized tile's 64 values (about 64 registers more than the 128-wide
  tile's peak, which is at the 240 limit already).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.operands import token_operand
from gmlp.contract.outputs import FC2DgradOutput
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
from gmlp.cutedsl.sm90._epilogue_math import c_pair_views, load_row_probs, pair_fragment
from gmlp.cutedsl.sm90._fc2_dgrad_epilogue import C_WORD_PAIRS, DhEpilogue
from gmlp.cutedsl.sm90._fc2_dgrad_mxfp8 import QuantizedDhEpilogue
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
    ELEMENT_ALIGN,
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
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode

__all__ = ["FC2DgradConfig", "FC2DgradSm90", "compile_fc2_dgrad", "problem_support", "fc2_dgrad",
           "SUPPORTED_ARCHS", "WARPS_PER_TILE", "QUANTIZED_TILE_N"]

_NAME = "fc2_dgrad kernel"  # in the errors of compile_fc2_dgrad and fc2_dgrad
TILE_NS = (128, 256)  # da (and dh gate / up) columns per work item: FC2DgradConfig.tile_n
_CONSUMER_WARPGROUPS = 2  # 64 rows each
WARPS_PER_TILE = _CONSUMER_WARPGROUPS * 4  # consumer warps of a 128-row tile: 16 rows each (db1 partials)
# the quantizing epilogue's tile width (_quantize_epilogue.TILE_COLS, 128), the launcher's tile_n
# with a recipe (launch_options fixes it there; a test checks the two agree)
QUANTIZED_TILE_N = launch_options.QUANTIZED_TILE_N
# MXFP8: 8 more registers a consumer thread, 16 fewer a producer one (128 x 24 + 256 x 240 = 384 x 168)
QUANTIZED_PRODUCER_REGISTERS, QUANTIZED_CONSUMER_REGISTERS = 24, 240



def _quantized_tile_n_reason(tile_n: int) -> str:
    return (f"the sm90 fc2_dgrad MXFP8 epilogue needs tile_n={QUANTIZED_TILE_N}, got tile_n={tile_n}: a thread "
            f"holds {tile_n // 2} fp32 da accumulators through the epilogue, and quantizing dh needs 64 more (the d "
            f"gate and d up values of a 128-column quantized tile) while the rest stay live; at tile_n=128 that "
            f"peaks at 238 of the {QUANTIZED_CONSUMER_REGISTERS} consumer registers, at 256 it would need about 64 "
            f"more than exist")


@dataclass(frozen=True)
class FC2DgradConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    b_k_major: bool = True  # w2t_g (F, H) row-major; False: N-major (the transposed view of W2 (E, H, F))
    probs_dtype: torch.dtype | None = None  # None: no probs (and no dprobs)
    bias_grad: bool = False  # per-warp column sums of dh for db1
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    tile_n: int = 128  # da columns per work item: 128 (m64n128 wgmmas) or 256 (m64n256)
    quantized: bool = False  # MXFP8: dh written as Q_row(dh) and Q_col(dh) (compact scales), not bf16
    e5m2: bool = False  # the gradient format E5M2 instead of E4M3 (quantized only)
    floor_scales: bool = False  # FLOOR (OCP) scale bytes instead of RCEIL (quantized only)
    # a bf16 dh's stores: "regs", predicated pairs from the registers; "tma", subtiles staged in
    # shared memory and TMA-stored, d gate and d up of a subtile as one bulk group (``_store``)
    store: str = "regs"

    def __post_init__(self):
        if self.tile_n not in TILE_NS:
            raise ValueError(f"tile_n must be one of {TILE_NS}, got {self.tile_n}")
        check_activation(self.activation)
        if self.probs_dtype is not None and self.probs_dtype not in FLOAT_DTYPES:
            raise ValueError(f"probs_dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.probs_dtype}")
        if (self.e5m2 or self.floor_scales) and not self.quantized:
            raise ValueError("e5m2 and floor_scales need quantized=True (a bf16 dh has no scales)")
        if self.quantized and self.tile_n != QUANTIZED_TILE_N:
            raise ValueError(_quantized_tile_n_reason(self.tile_n))
        launch_options.check_store(self.store)
        if self.store == "tma" and self.quantized:
            raise ValueError("store='tma' needs a bf16 dh (the TMA-store epilogue has no quantized outputs yet), got "
                             "quantized=True")
        self.check_stages()

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: a bf16 dy tile and a bf16 w2t tile."""
        return TILE_M * TILE_K * 2 + self.tile_n * TILE_K * 2

    def fixed_bytes(self) -> int:
        """Outside the slot ring: the epilogue's buffers."""
        return self.epilogue_bytes()

    def epilogue_bytes(self) -> int:
        """Shared memory of the epilogue: the quantizing one's transposed fp8 tile and amax keys
        (20 KB, reused by the d gate and d up halves), the TMA store's subtiles, none for bf16 from
        the registers."""
        if self.quantized:
            return _quantize_epilogue.SMEM_BYTES
        return _store.smem_bytes(_CONSUMER_WARPGROUPS) if self.store == "tma" else 0

    def slot_name(self) -> str:
        return f"tile_n={self.tile_n}{' (quantized)' if self.quantized else ''}"



# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------


class FC2DgradSm90(DhEpilogue, QuantizedDhEpilogue):
    """The jit code of FC2 dgrad (see the module docstring); ``__call__`` is the host side that
    builds the TMA descriptors and launches, ``kernel`` the device side."""

    def __init__(self, config: FC2DgradConfig):
        self.config = config
        self.activation = config.activation
        self.gated = config.activation.gated
        self.stages = config.num_stages()
        self.has_probs = config.probs_dtype is not None
        self.bias_grad = config.bias_grad
        self.tile_n = config.tile_n
        self.quantized = config.quantized
        self.e5m2 = config.e5m2
        self.floor_scales = config.floor_scales
        self.atom_layout_mnk = (_CONSUMER_WARPGROUPS, 1, 1)
        self.threads = (1 + _CONSUMER_WARPGROUPS) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads, QUANTIZED_PRODUCER_REGISTERS, QUANTIZED_CONSUMER_REGISTERS) \
            if config.quantized else register_split(self.threads)
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
        ops = make_mainloop_operands(mDy, mW, self.tile_n, self.stages, self.atom_layout_mnk)
        fields = mainloop_fields(self.stages, ops.a_smem_layout, ops.b_smem_layout)
        if const_expr(self.quantized):  # the quantizing epilogue's transposed fp8 tile and 16-row amax keys
            fields.update(_quantize_epilogue.smem_fields())
        store = None  # store="tma": the subtiles' smem layout and TMA store of dh's ragged view
        if const_expr(self.tma_store):
            store = _store.make_store_operands(ragged_rows(mDh), _CONSUMER_WARPGROUPS)
            fields["sD"] = smem_array(BFloat16, cute.cosize(store.smem_layout))
        self.shared_storage = shared_storage(fields)
        if const_expr(self.quantized):
            check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        launch(self.kernel(ops.tma_atom_a, ops.tma_a, ops.tma_atom_b, ops.tma_b, mC, mProbs, mRowStart,
                           mTileStart, mBlockStart, mDprobsPartial, mWarpSums, mDh, mRowData, mRowScale, mColData,
                           mColScale, *_store.kernel_arguments(store), ops.tiled_mma, ops.a_smem_layout,
                           ops.b_smem_layout),
               num_ctas, self.threads, stream)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mDy: cute.Tensor,  # TMA coordinates of dy (T, H)
        tma_atom_b: cute.CopyAtom,
        mW: cute.Tensor,  # TMA coordinates of w2t (F, H, E)
        mC: cute.Tensor,
        mProbs: cute.Tensor | None,
        mRowStart: cute.Tensor,
        mTileStart: cute.Tensor,
        mBlockStart: cute.Tensor | None,
        mDprobsPartial: cute.Tensor | None,
        mWarpSums: cute.Tensor | None,
        mDh: cute.Tensor | None,
        mRowData: cute.Tensor | None,
        mRowScale: cute.Tensor | None,
        mColData: cute.Tensor | None,
        mColScale: cute.Tensor | None,
        tma_atom_h: cute.CopyAtom | None,  # store="tma": the dh subtiles' TMA store
        mDh_tma: cute.Tensor | None,  # store="tma": TMA coordinates of dh's ragged view (BIG, N1, MAX, MAX)
        h_smem_layout: cute.ComposedLayout | None,  # store="tma": (128, 32, _store.STAGES) bf16
        tiled_mma: cute.TiledMma,
        a_smem_layout: cute.ComposedLayout,  # (BM, BK, stages)
        b_smem_layout: cute.ComposedLayout,  # (BN, BK, stages)
    ):
        atoms = (tma_atom_a, tma_atom_b, tma_atom_h) if const_expr(self.tma_store) else (tma_atom_a, tma_atom_b)
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles(atoms)
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        sA, sB, stage_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout)
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages, _CONSUMER_WARPGROUPS,
                                          stage_bytes)

        ffn = mW.shape[0]
        items = TokenItems.of(mRowStart, mTileStart, ffn, self.tile_n)
        k_tiles = (mDy.shape[1] + TILE_K - 1) // TILE_K
        b_parts = (b_tiles(tma_atom_b, mW, sB, self.tile_n),)  # w2t_g rows n_tile * BN + [0, BN)

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every (dy, w2t) k-tile of this CTA's items
            produce_token_items(mainloop, self.stages, items, bidx, grid, k_tiles, tma_atom_a, mDy, sA, b_parts)

        if warpgroup > 0:  # consumers: wgmma mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            mma_warpgroup, mma_tidx = mma_thread(tidx, warpgroup, pingpong=False)
            lane = mma_tidx % 32
            tile_warp = mma_tidx // 32  # rows 16 * tile_warp + [0, 16) of the tile
            tCrA, tCrBs = consumer_fragments(tiled_mma, mma_warpgroup, sA, (sB,))
            thr_mma = tiled_mma.get_slice(mma_tidx)
            # (row, column) of this thread's accumulators: ((2 columns, 2 rows, BN / 8 column
            # groups), 1, 1): accumulator 4j + c is row r, column f_j + c and 4j + 2 + c row r + 8
            tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
            acc = cute.make_rmem_tensor(pair_fragment(tCcD.shape), Float32)  # da, then the db1 sums (bf16 dh)
            operands = ((acc, tCrBs[0]),)
            if const_expr(self.quantized):
                values = cute.make_rmem_tensor(pair_fragment(tCcD.shape), Float32)  # a quantized tile's fp32 dh
                smem_q = _quantize_epilogue.smem_tensors(storage)
            group_sums = cute.make_rmem_tensor((4,), Float32)  # bias_grad: a group's d gate, d up column sums
            pair = cute.make_rmem_tensor((2,), BFloat16)  # staging of one bf16 pair
            pair_bits = cute.recast_tensor(pair, Int32)
            row_probs = cute.make_rmem_tensor((2,), Float32)
            row_dprobs = cute.make_rmem_tensor((2,), Float32)
            read_state, release_state = consumer_states(self.stages)
            if const_expr(self.tma_store):
                sH = storage.sD.get_tensor(h_smem_layout.outer, swizzle=h_smem_layout.inner)
                # d gate and d up of a subtile, one bulk group; the first consumer warp stores
                consumers = _CONSUMER_WARPGROUPS * THREADS_PER_WARPGROUP
                tile_store = _store.TileStore.of(tiled_mma, acc, sH, mma_tidx, consumers,
                                                 _store.epi_tile(_CONSUMER_WARPGROUPS),
                                                 warp_idx == THREADS_PER_WARPGROUP // 32,
                                                 outputs=2 if self.gated else 1)
                gate_stage, up_stage = tile_store.staging(), tile_store.staging()
                subtiles_done = Int32(0)

            # c's gate and up words of pair i at 2 (i % 16): bf16 dh, two batches of up to 8 pairs; MXFP8, a
            # batch of 16 (a gated half's pairs)
            c_words = cute.make_rmem_tensor((2 * C_WORD_PAIRS,), Int32)

            item = bidx
            while item < items.count:
                g, m_tile, n_tile, first_row, end_row = items.tile(item)
                # The epilogue reads rows first_row + [0, 128), columns col0 + [0, BN): only rows <
                # end_row (this expert's) and columns < F are read and written. Accumulators 2i,
                # 2i+1 are columns f, f+1 of one row (f even; F % 32 == 0: both or neither < F).
                col0 = n_tile * self.tile_n
                limits = (end_row - first_row, ffn - col0)
                tile = (TILE_M, self.tile_n)
                tCgG, tCgU = c_pair_views(thr_mma, mC, first_row, col0, ffn, tile, self.gated)
                if const_expr(self.has_probs):
                    load_row_probs(row_probs, mProbs, (tCcD[0][0], tCcD[2][0]), first_row, limits[0], row_dprobs)
                # c's first batch before the mainloop: the bf16 pass's first batch, or a gated half's pairs
                self.load_c_pairs(c_words, 0, C_WORD_PAIRS if const_expr(self.quantized) else 2 * self.c_batch,
                                  tCgG, tCgU, tCcD, limits)
                tiled_mma, read_state, release_state = mma_k_tiles(tiled_mma, mainloop, read_state, release_state,
                                                                   k_tiles, tCrA, operands)

                if const_expr(self.tma_store):
                    # dh's tile by subtiles of 32 columns (4 column groups j each), d gate at
                    # col0 and d up at F + col0 of the ragged view (rows from end_row on unwritten)
                    gH = cute.local_tile(expert_rows(mDh_tma, first_row, end_row - first_row), tile, (0, n_tile))
                    outputs = ((tma_atom_h, gH),)
                    if const_expr(self.gated):
                        outputs = ((tma_atom_h, gH), (tma_atom_h, cute.domain_offset((0, ffn), gH)))
                    _, order, destinations = tile_store.targets(outputs)
                elif const_expr(not self.quantized):
                    tCgH = cute.recast_tensor(thr_mma.partition_C(
                        cute.local_tile(cute.domain_offset((first_row, col0), mDh), tile, (0, 0))), Int32)
                    tCgHU = None
                    if const_expr(self.gated):
                        tCgHU = cute.recast_tensor(thr_mma.partition_C(
                            cute.local_tile(cute.domain_offset((first_row, ffn + col0), mDh), tile, (0, 0))), Int32)
                if const_expr(self.quantized):
                    # the tile's 4 column blocks are blocks 4 * local + [0, 4) of expert g
                    col_block0 = mBlockStart[g] + (m_tile - mTileStart[g]) * (TILE_M // BLOCK_SIZE)
                    self.quantized_epilogue(
                        acc, values, c_words, tCcD, thr_mma, mma_tidx, tCgG, tCgU, row_probs, row_dprobs,
                        (mRowData, mRowScale, mColData, mColScale), smem_q, mWarpSums, first_row, col0, ffn, limits,
                        col_block0, m_tile * WARPS_PER_TILE + tile_warp)

                bf16_pass = (acc, c_words, tCgG, tCgU, tCcD, limits, row_probs, row_dprobs, group_sums, pair, pair_bits)
                if const_expr(self.tma_store):
                    subtiles_done = self.bf16_pass(*bf16_pass, None, (tile_store, gate_stage, up_stage, order,
                                                                      destinations, subtiles_done), col0, ffn)
                elif const_expr(not self.quantized):
                    self.bf16_pass(*bf16_pass, (tCgH, tCgHU), None, col0, ffn)

                if const_expr(self.has_probs):
                    self.store_dprobs_partials(row_dprobs, tCcD, lane, limits, mDprobsPartial, first_row, n_tile)
                if const_expr(self.bias_grad and not self.quantized):
                    self.store_db1_warp_sums(acc, tCcD, lane, limits, mWarpSums, m_tile * WARPS_PER_TILE + tile_warp,
                                             ffn, col0)
                item += grid
            if const_expr(self.tma_store):
                tile_store.drain()



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


def compile_fc2_dgrad(
    arch: str = "sm_90a",
    config: FC2DgradConfig | None = None,
    *,
    shape: tuple[int, int, int, int] | None = None,
) -> CompiledKernel:
    """Compile the kernel for ``arch`` without a GPU (default config: swiglu, no probs, no
    bias_grad); returns it with its PTX and cubin. One compile serves every shape of a config;
    ``shape`` (T, H, F, E), when given, is checked against ``problem_support``."""
    config = config if config is not None else FC2DgradConfig(Activation(ActivationKind.SWIGLU))
    reason = None if shape is None else problem_support(*shape, gated=config.activation.gated)
    return compile_ahead(_NAME, _compile, config, arch, reason)


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
) -> FC2DgradOutput:
    """Steps 5-6 of the dataflow; no host sync; deterministic. Same contract as
    ``gmlp.triton_ref.fc2_dgrad.fc2_dgrad``: ``recipe=None`` writes dh in bf16; an ``MXFP8Recipe``
    writes dh as Q_row(dh) and Q_col(dh) in ``recipe.grad_format`` with the recipe's scale mode
    (compact scales; ``FC2DgradOutput.dh`` is None), bit for bit the Triton kernel's where the da
    accumulations agree (tile_n must be 128); dprobs and db1 fp32 either way."""
    # validate
    check_recipe(recipe)
    if recipe is not None and tile_n not in (None, QUANTIZED_TILE_N):
        raise ValueError(_quantized_tile_n_reason(tile_n))
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
    knobs = launch_options.launch_options("fc2_dgrad", tokens, ffn, hidden, experts, dict(tile_n=tile_n, store=store),
                                          quantized=quantized)
    tile_n, store = knobs["tile_n"], knobs["store"]
    config = FC2DgradConfig(activation, b_k_major=b_k_major, probs_dtype=None if probs is None else probs.dtype,
                            bias_grad=bias_grad, tile_n=tile_n, quantized=quantized,
                            e5m2=quantized and fmt is ElementFormat.E5M2,
                            floor_scales=quantized and recipe.scale_mode is ScaleMode.FLOOR, store=store)

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
    num_ctas = _schedule.grid_size(tokens, experts, n_tiles, device)
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
