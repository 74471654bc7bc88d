"""CuTeDSL sm_90a grouped weight gradient ``dW_g = A_g^T @ B_g`` over each expert's token rows.

Twin of ``gmlp.triton_ref.wgrad.grouped_wgrad`` (same arguments, same result up to the fp32
summation order): A (T, M) and B (T, N) bf16 row-major with rows grouped by expert (FC2: A = dy,
B = a; FC1: A = dh, B = x); expert g owns rows ``row_start[g] <= r < row_start[g+1]`` (device
prefix sums of ``gmlp.mxfp8.routing.device_groups``: no host sync, any sizes, 0 too). The result
(E, M, N) is the fp32 sums stored as ``out_dtype`` (fp32 or bf16), or added to an fp32 ``out``
(main_grad). The contraction dimension is the ragged one (a varlen-K GEMM).

Kernel design (one compiled kernel per ``WgradConfig``; T, M, N, E are runtime values):

- Work items: output tiles (expert g, m-tile, n-tile) of BM = 128 x BN (128 or 256), item
  ``w = (g * m_tiles + m_tile) * n_tiles + n_tile`` (n fastest: CTAs running together share
  expert g's A panel). The count E * ceil(M/BM) * ceil(N/BN) is host-known, so no tile search:
  a persistent grid of min(#SMs, items) CTAs, CTA b walks items b, b + grid, ...
- Contraction: k-steps of BK = 64 token rows from row_start[g]; ceil(m_g / 64) steps (none for an
  empty expert, whose tile is zeros). Both operands are MN-major for wgmma: A's (BK, BM) box is
  M-contiguous (A^T with A row-major), B's (BK, BN) box N-contiguous; 128B-swizzled MN-major smem
  (``MN_SW128`` atoms, 64 elements x 8 rows), wgmma with both transpose bits set.
- Ragged K tail without masking code: the last k-step of an expert must not read the next
  expert's rows, and TMA zero-fills only outside the tensor, so A and B are given to TMA as the
  4-D ``_tma.ragged_tokens`` views, whose token extent ends where the expert ends: rows past the
  expert's end come back as zeros.
  M and N tails are ordinary TMA zero fill (mode 0 has the true extent). Fallback
  (``ragged_tma=False``): plain (features, T) descriptors, and on an expert's last k-step the
  consumer threads zero the slot's rows past the expert's end in smem (st.shared, then
  fence.proxy.async and a named barrier of the consumers before the wgmmas).
- Warp-specialized, the engine's skeleton (``_engine``; its ``ExpertTiles`` work, its own
  producer and k-loop here): warp 0 (of warpgroup 0, registers
  lowered to 40) is the TMA producer; 1 (BN = 128) or 2 (BN = 256, a 64-column half of M each)
  consumer warpgroups issue wgmma (bf16 x bf16 -> fp32 from smem) with registers raised to 232
  and share each tile's epilogue (the engine's cooperative schedule).
  ``stages`` slots of an A and a B tile, full/empty mbarriers (``PipelineTmaAsync``); the
  producer runs ahead across items, so the next tile's loads overlap this tile's epilogue.
- Clusters (``cluster=2``): CTAs 2c and 2c + 1 take items 2p and 2p + 1,
  adjacent n-tiles of one (expert, m-tile) (an odd row's n-tiles padded by a shadow item that
  stores nothing, ``_schedule.ExpertTiles``); each loads half of their common A tile and
  multicasts it to both (``_cluster.PairedTile``). Bit for bit the unclustered kernel on the H200.
- Epilogue (``WgradConfig.store``): "tma", the default, stages fp32 or bf16 subtiles in shared
  memory and TMA-stores them into out (E, M, N), clipped at M and N, or with ``accumulate``
  TMA-reduce-adds them into the fp32 out (``_store``); "regs"
  stores from the accumulator registers, predicated at the M and N tails: a thread's adjacent
  column pair is one 64-bit store (fp32) or 32-bit store (bf16), and with ``accumulate`` the fp32
  pair of ``out`` is loaded, added and stored back. Either way an empty expert's tile adds
  nothing, and the sum is the single fp32 add ``old + acc``: the two give the same bytes.

Defaults: BN = 256, 4 stages (48 KB each); BN = 128 gets 7. ptxas (CUDA 13.x, sm_90a), every
config: 168 registers at launch for BN = 256 (232 for BN = 128; 232 in consumers after
setmaxnreg), no stack, no spills; HGMMA.64x{BN}x16.F32.BF16 with both transpose bits; 4-D (2-D
with ``ragged_tma=False``) TMA loads; see tests/cutedsl/sm90/test_wgrad.py. Verified on the H200
and the H100 (the ``gpu`` tests there).
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
from cutlass import BFloat16, Float32, Int32, const_expr
from cutlass.cute.runtime import make_fake_tensor

from gmlp.contract.operands import describe
from gmlp.cutedsl.sm90 import _store, launch_options
from gmlp.cutedsl.sm90._compile import (SUPPORTED_ARCHS, CompiledKernel, ahead_compiler, config_compiler, fake_matrix,
                                        fake_stream, fake_vector, sym_stride)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._launch import check_tma_bases, run
from gmlp.cutedsl.sm90._cluster import PairedTile, multicast_load_op, tile_shares
from gmlp.cutedsl.sm90._pipeline import (ALIGN, ELEMENT_ALIGN, THREADS_PER_WARPGROUP, TILE_K, mainloop_fields,
                                         produce_k_tiles, smem_array)
from gmlp.cutedsl.sm90._schedule import ExpertTiles, expert_tiles_grid
from gmlp.cutedsl.sm90._tma import expert_tokens, ragged_tokens
from gmlp.cutedsl.sm90._wgrad_operands import problem_support, wgrad_operands
from gmlp.cutedsl.sm90._wgrad_register_paths import RegisterPaths
from gmlp.cutedsl.sm90.configs import OUT_DTYPES_DSL, WgradConfig
from gmlp.mxfp8.routing import DeviceGroups, device_groups

__all__ = [
    "WgradConfig",
    "GroupedWgradSm90",
    "CompiledWgrad",
    "compile_wgrad",
    "problem_support",
    "grouped_wgrad",
    "SUPPORTED_ARCHS",
]

_NAME = "grouped wgrad"  # in the errors of compile_wgrad and grouped_wgrad
TILE_M = 128  # output rows (features of A) per tile; TILE_K (64) token rows per k-step
_ADD_CHUNK = 32  # out pairs loaded together by the accumulating epilogue: no spills at 32


def _transposed(tensor: cute.Tensor) -> cute.Tensor:
    """The (features, T) view of a row-major (T, features) tensor (the plain, ``ragged_tma=False``
    TMA view: rows past an expert's end are the next expert's, zero only past T)."""
    return cute.make_tensor(tensor.iterator, cute.select(tensor.layout, mode=[1, 0]))


class WgradArgs(NamedTuple):
    """The kernel's arguments (the engine's ``args``)."""

    tma_atom_a: cute.CopyAtom
    mA: cute.Tensor  # TMA coordinates of A's ragged view (M, BIG, MAX, MAX), or (M, T)
    tma_atom_b: cute.CopyAtom
    mB: cute.Tensor  # TMA coordinates of B's ragged view (N, BIG, MAX, MAX), or (N, T)
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mOut: cute.Tensor  # (E, M, N) fp32 / bf16, row-major
    tma_atom_d: cute.CopyAtom | None  # store="tma": the subtiles' TMA store or reduce-add
    mOut_tma: cute.Tensor | None  # store="tma": TMA coordinates of out as (M, N, E)
    d_smem_layout: cute.ComposedLayout | None  # store="tma": (epi rows, epi cols, _store.STAGES)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    tCrA: cute.Tensor
    tCrB: cute.Tensor
    sA: cute.Tensor
    sB: cute.Tensor
    mma_tidx: Int32
    thr_mma: cute.ThrMma
    tCcD: cute.Tensor  # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
    acc: cute.Tensor
    tile_store: _store.TileStore | None  # store="tma"


class GroupedWgradSm90(GroupedGemmEngine, RegisterPaths):
    """The weight gradient on the engine (see the module docstring): ``__call__`` is the host side
    that builds the TMA descriptors and launches; the hooks are this site's parts of the skeleton
    (its own producer and k-loop: the contraction is the experts' ragged token rows)."""

    def __init__(self, config: WgradConfig):
        # BN = 256: two consumer warpgroups, each 64 rows of M x 256 (128 fp32 accumulators a
        # thread); BN = 128: one warpgroup, two m64 wgmmas per k-block (also 128 accumulators).
        self.setup_engine(config, config.tile_n // 128, cluster=config.cluster)
        self.tile_n = config.tile_n
        self.accumulate = config.accumulate
        self.out_dtype = OUT_DTYPES_DSL[config.out_dtype]
        self.tile_shape_mnk = (TILE_M, config.tile_n, TILE_K)
        self.add_chunk = _ADD_CHUNK
        self.ragged_tma = config.ragged_tma
        self.consumer_threads = self.mma_warpgroups * THREADS_PER_WARPGROUP
        self.tma_store = config.store == "tma"

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (T, M) bf16, row-major
        mB: cute.Tensor,  # (T, N) bf16, row-major
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mOut: cute.Tensor,  # (E, M, N) fp32 / bf16, row-major
        num_ctas: Int32,  # persistent grid: min(#SMs, E * m_tiles * n_tiles)
        stream,
    ):
        # Both operands MN-major: the contraction (token) dimension is their row dimension.
        major = utils.LayoutEnum.COL_MAJOR
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, major.sm90_mma_major_mode(), major.sm90_mma_major_mode(), Float32,
            (self.mma_warpgroups, 1, 1), tiler_mn=(64, self.tile_n),
        )
        a_smem_layout = sm90_utils.make_smem_layout_a(major, self.tile_shape_mnk, BFloat16, self.stages)
        b_smem_layout = sm90_utils.make_smem_layout_b(major, self.tile_shape_mnk, BFloat16, self.stages)
        view = ragged_tokens if const_expr(self.ragged_tma) else _transposed
        tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(  # in a cluster of two, A is the shared tile
            multicast_load_op(self.cluster), view(mA), cute.slice_(a_smem_layout, (None, None, 0)), (TILE_M, TILE_K),
            num_multicast=self.cluster,
        )
        tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), view(mB),
            cute.slice_(b_smem_layout, (None, None, 0)), (self.tile_n, TILE_K),
        )

        fields = mainloop_fields(self.stages, a_smem_layout, b_smem_layout)
        store = None  # store="tma": the subtiles' smem layout and TMA store (reduce-add with accumulate)
        if const_expr(self.tma_store):
            out_mne = cute.make_tensor(mOut.iterator, cute.select(mOut.layout, mode=[1, 2, 0]))  # (M, N, E)
            store = _store.make_store_operands(out_mne, self.mma_warpgroups, self.out_dtype, reduce=self.accumulate)
            fields["sD"] = smem_array(self.out_dtype, cute.cosize(store.smem_layout))
        args = WgradArgs(tma_atom_a, tma_a, tma_atom_b, tma_b, mRowStart, mOut, *_store.kernel_arguments(store))
        self.launch_engine(args, fields, tiled_mma, a_smem_layout, b_smem_layout, num_ctas, stream)

    def tma_atoms(self, args: WgradArgs) -> tuple:
        return (args.tma_atom_a, args.tma_atom_b) + ((args.tma_atom_d,) if const_expr(self.tma_store) else ())

    def work(self, args: WgradArgs) -> ExpertTiles:
        num_experts, m, n = args.mOut.shape
        return ExpertTiles.of(args.mRowStart, num_experts, m, n, TILE_M, self.tile_n, cluster=self.cluster)

    @cute.jit
    def produce(self, mainloop, work: ExpertTiles, bidx: Int32, grid: Int32, args: WgradArgs, slots: Slots):
        sA, sBs = slots.sA, slots.sBs
        """TMA loads of every (A, B) k-step of this CTA's items: (BM, BK, RestK) / (BN, BK, RestK)
        tiles of the expert's rows (zero past its end with the ragged view; else the consumers
        zero them). In a cluster of two the pair's items share their A tile (``ExpertTiles``): each
        CTA loads half of it for both (``PairedTile``), and its own B tile."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        item = bidx
        while item < work.count:
            g, m_tile, n_tile, first_row, rows, k_tiles = work.tile(item)
            if const_expr(self.ragged_tma):
                mA_g = expert_tokens(args.mA, first_row, rows)
                mB_g = expert_tokens(args.mB, first_row, rows)
            else:
                mA_g = cute.domain_offset((0, first_row), args.mA)
                mB_g = cute.domain_offset((0, first_row), args.mB)
            gA = cute.local_tile(mA_g, (TILE_M, TILE_K), (m_tile, None))
            gB = cute.local_tile(mB_g, (self.tile_n, TILE_K), (n_tile, None))
            tAsA, tAgA = tile_shares(args.tma_atom_a, sA, gA, self.cluster)
            tBsB, tBgB = tile_shares(args.tma_atom_b, sBs[0], gB)
            if const_expr(self.cluster == 1):
                state = produce_k_tiles(mainloop, state, k_tiles, args.tma_atom_a, tAgA, tAsA,
                                        ((args.tma_atom_b, tBgB, tBsB),))
            else:  # B is the CTA's own load, A the pair's shared one
                state = produce_k_tiles(mainloop, state, k_tiles, args.tma_atom_b, tBgB, tBsB,
                                        ((args.tma_atom_a, tAgA, tAsA),), PairedTile.always(item))
            item += grid
        mainloop.producer_tail(state)  # wait until the consumers freed every slot

    def consumer_setup(self, args: WgradArgs, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
        acc = cute.make_rmem_tensor(tCcD.shape, Float32)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)  # the k-loop accumulates into zeroed accumulators
        tile_store = None
        if const_expr(self.tma_store):
            tile_store = self.tile_store(storage, args.d_smem_layout, tiled_mma, acc, mma_tidx, warp_idx,
                                         self.out_dtype)
        return _Consumer(tCrA, tCrBs[0], slots.sA, slots.sBs[0], mma_tidx, thr_mma, tCcD, acc, tile_store)

    @cute.jit
    def mainloop(self, consumer: _Consumer, args: WgradArgs, tiled_mma, mainloop, read_state, release_state, work,
                 tile: tuple):
        """Zeroed accumulators (an empty expert's tile stays zero); one k-step of wgmmas in
        flight, a slot released once the wgmmas that read it completed."""
        _, _, _, _, rows, k_tiles = tile
        acc, tCrA, tCrB = consumer.acc, consumer.tCrA, consumer.tCrB
        acc.fill(0.0)
        for k_tile in range(k_tiles):
            mainloop.consumer_wait(read_state)
            if const_expr(not self.ragged_tma):
                tail = rows - k_tile * TILE_K  # the expert's rows left; < BK on its last step
                if tail < TILE_K:
                    self.zero_rows(consumer.sA, consumer.sB, read_state.index, tail, consumer.mma_tidx)
            cute.nvgpu.warpgroup.fence()
            for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                slot = (None, None, k_block, read_state.index)
                cute.gemm(tiled_mma, acc, tCrA[slot], tCrB[slot], acc)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(1)
            if k_tile > 0:
                mainloop.consumer_release(release_state)
                release_state.advance()
            read_state.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        if k_tiles > 0:
            mainloop.consumer_release(release_state)
            release_state.advance()
        return tiled_mma, read_state, release_state

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: WgradArgs, tile: tuple, ahead, stores: Int32) -> Int32:
        g, m_tile, n_tile, _, _, k_tiles = tile
        if const_expr(self.tma_store):
            # tile (m_tile, n_tile) of out[g], clipped at M and N by TMA; an empty expert adds
            # nothing (accumulate) or stores its zeros
            if k_tiles > 0 or not self.accumulate:
                gOut = cute.local_tile(args.mOut_tma[(None, None, g)], (TILE_M, self.tile_n), (m_tile, n_tile))
                consumer.tile_store.store(args.tma_atom_d, gOut, stores)
                stores += 1
        else:
            self.store_tile(consumer.acc, consumer.thr_mma, consumer.tCcD, args.mOut, g, m_tile, n_tile, k_tiles)
        return stores


# ---------------------------------------------------------------------------------------------
# Compilation (cached per config and architecture)
# ---------------------------------------------------------------------------------------------


def _fake_arguments(config: WgradConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments, in order: T, M, N, E are runtime values;
    alignments are what the launcher guarantees (16-byte bases; M, N and strides multiples of 8)."""
    rows = cute.sym_int()
    m, n = cute.sym_int(divisibility=ELEMENT_ALIGN), cute.sym_int(divisibility=ELEMENT_ALIGN)
    experts, starts = cute.sym_int(), cute.sym_int()  # E, E + 1
    a, b = fake_matrix(BFloat16, rows, m), fake_matrix(BFloat16, rows, n)
    row_start = fake_vector(Int32, starts)
    out = make_fake_tensor(OUT_DTYPES_DSL[config.out_dtype], (experts, m, n), stride=(sym_stride(), sym_stride(), 1),
                           assumed_align=ALIGN)
    return (a, b, row_start, out, Int32(1), fake_stream())


CompiledWgrad = CompiledKernel  # the callable (runs on a matching GPU), its PTX and cubin
_compile = config_compiler(GroupedWgradSm90, _fake_arguments)  # (config, arch) -> CompiledWgrad, cached


compile_wgrad = ahead_compiler(_NAME, _compile, WgradConfig(), problem_support, "T, M, N, E")


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


def grouped_wgrad(
    a: torch.Tensor,  # (T, M) bf16: dy (FC2) or dh (FC1), contiguous
    b: torch.Tensor,  # (T, N) bf16: a (FC2) or x (FC1), contiguous
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,  # (E, M, N) fp32 to accumulate into
    out_dtype: torch.dtype = torch.float32,  # of a new result: fp32, or bf16 (the fp32 sums rounded once)
    split_rows: int | None = None,  # return rows [0, split_rows) and the rest of each dW_g apart
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    # the knobs (WgradConfig); None: launch_options' choice (defaults, tuned table, GMLP_SM90_CONFIG)
    tile_n: int | None = None,  # 256 or 128
    ragged_tma: bool | None = None,  # K tail: TMA zero fill past the expert (else smem zeroing)
    store: str | None = None,  # the epilogue's stores, "regs" or "tma"
    cluster: int | None = None,  # 1, or 2: CTAs paired along N, their A tiles multicast
    site: str | None = None,  # the layer's site of the launch (its tuned entries first; gmlp.dispatch.sites)
) -> torch.Tensor:
    """(E, M, N) weight gradients, fp32 sums stored as ``out_dtype``; added to ``out`` (fp32) when
    given. No host sync. Same contract as ``gmlp.triton_ref.wgrad.grouped_wgrad``; needs M and N
    multiples of 8 and 16-byte aligned bases (TMA). With ``split_rows`` (``out`` then a pair),
    each dW_g's first ``split_rows`` rows and the rest are two (E, ., N) tensors (dW1's gate and
    up, the gradients of two weights: ``gmlp.contract.gate_up``): two launches, one per part of
    A's columns (the same sums, bit for bit, as one launch's rows)."""
    if split_rows is not None:
        return _split_wgrad(a, b, split_sizes, split_rows, out=out, out_dtype=out_dtype, groups=groups,
                            tile_n=tile_n, ragged_tma=ragged_tma, store=store, cluster=cluster, site=site)
    experts = split_sizes.numel()
    a, b, tokens, m, n = wgrad_operands(_NAME, a, b, experts, out, out_dtype)

    # allocate; no tokens: zeros (nothing added to out), else launch over min(#SMs, tiles) CTAs
    accumulate = out is not None
    if out is None:
        out = torch.empty(experts, m, n, dtype=out_dtype, device=a.device)
        if tokens == 0:
            return out.zero_()
    knobs = launch_options.launch_options("grouped_wgrad", tokens, m, n, experts,
                                          dict(tile_n=tile_n, ragged_tma=ragged_tma, store=store, cluster=cluster),
                                          site=site)
    tile_n, ragged_tma, store, cluster = knobs["tile_n"], knobs["ragged_tma"], knobs["store"], knobs["cluster"]
    num_ctas = expert_tiles_grid(experts, -(-m // TILE_M), -(-n // tile_n), a.device, cluster) if tokens > 0 else 0
    if num_ctas > 0:  # (a TMA descriptor needs a valid base)
        config = WgradConfig(out_dtype=out.dtype, accumulate=accumulate, tile_n=tile_n, ragged_tma=ragged_tma,
                             store=store, cluster=cluster)
        if store == "tma":
            check_tma_bases(out=out)  # the TMA store's destination
        groups = groups if groups is not None else device_groups(split_sizes, tokens)
        run(_compile, config, a.device, num_ctas, a, b, groups.row_start, out)
    return out


def _split_wgrad(a, b, split_sizes: torch.Tensor, split_rows: int, *, out, **options) -> tuple[torch.Tensor, ...]:
    """``grouped_wgrad`` with ``split_rows``: dW_g's rows [0, split_rows) from A's columns [0,
    split_rows), the rest from the others, each part a launch into its own (E, ., N) result or
    ``out`` of the pair."""
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise TypeError(f"a must be a bf16 (T, M) matrix, got {describe(a)}")
    m = a.shape[1]
    if not 0 <= split_rows <= m or split_rows % ELEMENT_ALIGN:
        raise ValueError(f"split_rows must be a multiple of {ELEMENT_ALIGN} in [0, {m}] (the rows of each dW_g; "
                         f"A's second part starts there, 16-byte aligned for TMA), got {split_rows}")
    if out is not None and not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"out must be a pair of tensors when split_rows is given, got {describe(out)}")
    outs = out if out is not None else (None, None)
    return tuple(grouped_wgrad(part, b, split_sizes, out=target, **options)
                 for part, target in zip((a[:, :split_rows], a[:, split_rows:]), outs))
