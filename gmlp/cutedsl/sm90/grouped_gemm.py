"""CuTeDSL sm_90a grouped GEMM ``D[rows of g] = A[rows of g] @ B_g^T (+ bias_g)`` (FC2 forward, FC1 dgrad).

Twin of ``gmlp.triton_ref.grouped_gemm`` (same arguments, same result up to the fp32 summation
order). Operands: A (T, K) bf16 row-major with rows grouped by expert; B (E, N, K) bf16, either
K-major (B_g (N, K) row-major: stacked weights, FC2's W2) or N-major (a transposed view of a
(E, K, N) weight: FC1 dgrad's W1^T read in place); D (T, N) bf16; optional bias (E, N), bf16 or
fp32; fp32 accumulation. Expert g owns rows ``row_start[g] <= r < row_start[g+1]`` of A and D,
from the device prefix sums of ``gmlp.mxfp8.routing.device_groups`` (no host sync; any sizes, 0 too).

Kernel design (one compiled kernel per ``KernelConfig``; T, N, K, E are runtime values): a site
of the engine (``_engine``: the skeleton of roles, slot ring, schedule and item loop every SM90
kernel runs), whose hooks here are its operands, the bf16 mainloop and its epilogue; the tile
schedule, the compile and the launcher's common checks are ``_schedule``, ``_compile`` and
``_launch``:

- Tiles: BM = 128 rows (one 128-row tile of ``groups.tile_start``: m-tile ``j`` of the layer is
  local tile ``j - tile_start[g]`` of the expert g with ``tile_start[g] <= j < tile_start[g+1]``,
  first row ``row_start[g] + 128 * local``), BN = 128 or 256 columns, BK = 64. Work items in
  bands of ``_schedule.GROUP_M`` m-tiles, m fastest within a band (L2 reuse of B tiles).
- Persistent: the grid is min(#SMs, a host bound of the tiles: ``max_row_tiles(T, E) * n_tiles``);
  CTA b walks items b, b + grid, ... below ``tile_start[E] * n_tiles`` (read on the device). The
  expert of an item is a binary search over ``tile_start`` (``SEARCH_STEPS`` dependent loads of a
  tiny cached array per item).
- Warp-specialized: warp 0 (of warpgroup 0, registers lowered to 40) is the TMA producer;
  1 (BN = 128) or 2 (BN = 256, each a 64-row half) consumer warpgroups issue ``wgmma``
  (bf16 x bf16 -> fp32, operands from smem) with registers raised to 232, and share each tile's
  epilogue (the engine's cooperative schedule).
- Pipeline: ``stages`` smem slots of one A tile (128 x 64) and one B tile (BN x 64), 128B-swizzled,
  full/empty mbarriers (``PipelineTmaAsync``); the producer runs ahead across tiles, so the next
  tile's loads overlap this tile's epilogue. A is loaded through a TMA descriptor of the whole
  (T, K) tensor at the expert's first row: rows past the expert's end are the next expert's (or
  TMA's zero fill past T); they only reach accumulator rows that are never stored. K tails are
  zero-filled by TMA. B_g is the expert coordinate of a 3-D (N, K, E) descriptor.
- Epilogue (``KernelConfig.store``): "tma", the default without a bias, rounds to
  bf16 into shared-memory subtiles and TMA-stores them through the ragged view of D that ends at
  the expert's last row (``_store``, ``_tma.ragged_rows``), overlapped with the next subtile and
  the next tile's mainloop; "regs" adds the bias (fp32), rounds to bf16 and stores predicated
  32-bit pairs (a thread's adjacent columns) of the rows below the expert's end and the columns
  below N, not overlapped with the next mainloop (only the producer's loads run ahead). Both give
  the same bytes.

Clusters (``cluster=2``): CTAs 2c and 2c + 1 pair their items 2p and 2p + 1,
adjacent m-tiles of one n-tile in the banded order; where both are of one expert each CTA loads
half of the B tile and multicasts it to both (``_cluster.PairedTile``), so B leaves L2 once for two
tiles. Bit for bit the unclustered kernel on the H200; the tuner chooses it per shape.

Defaults: BN = 256, 4 stages (48 KB each); BN = 128 gets 7. ptxas (CUDA 13.4, sm_90a): 168
registers at launch (232 in consumers after setmaxnreg), no spills; see tests/cutedsl/sm90/test_grouped_gemm.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.contract.operands import token_operand
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90 import _schedule, _store, launch_options
from gmlp.cutedsl.sm90._compile import (FLOAT_DTYPES, SUPPORTED_ARCHS, CompiledKernel, ahead_compiler, config_compiler,
                                        fake_experts, fake_matrix, fake_stream, fake_vector)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._launch import check_optional, check_problem, check_tma_bases, expert_matrices, run
from gmlp.cutedsl.sm90._pipeline import (ELEMENT_ALIGN, KSplit, b_is_k_major, b_tiles, mainloop_fields, make_b_tma,
                                         make_mainloop_operands, produce_token_items, smem_array)
from gmlp.cutedsl.sm90._schedule import MAX_EXPERTS, TILE_M, TokenItems
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
from gmlp.cutedsl.sm90.configs import KernelConfig
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups

_NAME = "grouped GEMM"  # in the errors of compile_grouped_gemm and grouped_gemm

__all__ = [
    "KernelConfig",
    "GroupedGemmSm90",
    "CompiledGroupedGemm",
    "compile_grouped_gemm",
    "problem_support",
    "grouped_gemm",
    "store_bf16_pairs",
    "SUPPORTED_ARCHS",
    "MAX_EXPERTS",
]

CompiledGroupedGemm = CompiledKernel  # the grouped GEMM's compiled kernel (config, arch, function, ptx, cubin)


class GroupedGemmArgs(NamedTuple):
    """The kernel's arguments (the engine's ``args``)."""

    tma_atom_a: cute.CopyAtom
    mA: cute.Tensor  # TMA coordinates of A (T, K)
    tma_atom_b: cute.CopyAtom
    mB: cute.Tensor  # TMA coordinates of B (N, K, E), or of its first K0 columns (k_split)
    tma_atom_b1: cute.CopyAtom | None  # k_split: the second B's TMA load
    mB1: cute.Tensor | None  # k_split: TMA coordinates of the second B (N, K - K0, E)
    mBias: cute.Tensor | None  # (E, N) bf16/fp32, row-major
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mTileStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
    mD: cute.Tensor  # (T, N) bf16, row-major
    tma_atom_d: cute.CopyAtom | None  # store="tma": the subtiles' TMA store
    mD_tma: cute.Tensor | None  # store="tma": TMA coordinates of D's ragged view (BIG, N, MAX, MAX)
    d_smem_layout: cute.ComposedLayout | None  # store="tma": (epi rows, epi cols, _store.STAGES) bf16


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    tCrA: cute.Tensor
    operands: tuple  # ((acc, tCrB),)
    thr_mma: cute.ThrMma
    tCcD: cute.Tensor  # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
    acc: cute.Tensor
    out: cute.Tensor  # staging of the bf16 pairs
    tile_store: _store.TileStore | None  # store="tma"


class GroupedGemmSm90(GroupedGemmEngine):
    """The grouped GEMM on the engine (see the module docstring): ``__call__`` is the host side
    that builds the TMA descriptors and launches; the hooks are this site's parts of the skeleton."""

    def __init__(self, config: KernelConfig):
        # BN = 256: two consumer warpgroups, each a 64 x 256 half (128 fp32 accumulators a thread);
        # BN = 128: one warpgroup, two m64 wgmmas per k-step (also 128 accumulators)
        self.setup_engine(config, config.tile_n // 128, cluster=config.cluster)
        self.tile_n = config.tile_n
        self.tma_store = config.store == "tma"

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (T, K) bf16, row-major
        mB: cute.Tensor,  # (E, N, K) bf16: K-major (strides (., K', 1)) or N-major (strides (., 1, N'))
        mB1: cute.Tensor | None,  # k_split: (E, N, K - K0) bf16, B's columns from K0 = mB's K on
        mBias: cute.Tensor | None,  # (E, N) bf16/fp32, row-major
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
        mD: cute.Tensor,  # (T, N) bf16, row-major
        num_ctas: Int32,  # persistent grid: min(#SMs, host bound of the work items)
        stream,
    ):
        ops = make_mainloop_operands(mA, mB, self.tile_n, self.stages, (self.mma_warpgroups, 1, 1), self.cluster)
        tma_atom_b1 = tma_b1 = None
        if const_expr(self.config.k_split):
            tma_atom_b1, tma_b1 = make_b_tma(mB1, ops.b_smem_layout, self.tile_n, self.cluster)
        fields = mainloop_fields(self.stages, ops.a_smem_layout, ops.b_smem_layout)
        store = None  # store="tma": the subtiles' smem layout and TMA store
        if const_expr(self.tma_store):
            store = _store.make_store_operands(ragged_rows(mD), self.mma_warpgroups)
            fields["sD"] = smem_array(BFloat16, cute.cosize(store.smem_layout))
        args = GroupedGemmArgs(ops.tma_atom_a, ops.tma_a, ops.tma_atom_b, ops.tma_b, tma_atom_b1, tma_b1, mBias,
                               mRowStart, mTileStart, mD, *_store.kernel_arguments(store))
        self.launch_engine(args, fields, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout, num_ctas, stream)

    def tma_atoms(self, args: GroupedGemmArgs) -> tuple:
        return (args.tma_atom_a, args.tma_atom_b) + ((args.tma_atom_d,) if const_expr(self.tma_store) else ()) \
            + ((args.tma_atom_b1,) if const_expr(self.config.k_split) else ())

    def work(self, args: GroupedGemmArgs) -> TokenItems:
        """The m-tiles of tile_start x n-tiles, in bands of m-tiles (see _schedule); with k_split
        the first B's k-tiles, then the second's."""
        k_parts = (args.mA.shape[1],)
        if const_expr(self.config.k_split):
            k_parts = (args.mB.shape[1], args.mA.shape[1] - args.mB.shape[1])
        return TokenItems.of(args.mRowStart, args.mTileStart, args.mD.shape[1], self.tile_n, k_parts,
                             cluster=self.cluster)

    def produce(self, mainloop, work: TokenItems, bidx: Int32, grid: Int32, args: GroupedGemmArgs, slots: Slots):
        sA, sBs = slots.sA, slots.sBs
        # B_g rows n_tile * BN + [0, BN)
        b_parts = (b_tiles(args.tma_atom_b, args.mB, sBs[0], self.tile_n, cluster=self.cluster),)
        k_split = None
        if const_expr(self.config.k_split):
            k_split = KSplit.of(args.mB, (b_tiles(args.tma_atom_b1, args.mB1, sBs[0], self.tile_n,
                                                  cluster=self.cluster),))
        produce_token_items(mainloop, self.stages, work, bidx, grid, work.k_tiles, args.tma_atom_a, args.mA, sA,
                            b_parts, k_split, self.cluster)

    def consumer_setup(self, args: GroupedGemmArgs, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
        acc = cute.make_rmem_tensor(tCcD.shape, Float32)
        tile_store = None
        if const_expr(self.tma_store):
            tile_store = self.tile_store(storage, args.d_smem_layout, tiled_mma, acc, mma_tidx, warp_idx)
        return _Consumer(tCrA, ((acc, tCrBs[0]),), thr_mma, tCcD, acc, cute.make_rmem_tensor(tCcD.shape, BFloat16),
                         tile_store)

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: GroupedGemmArgs, tile: tuple, ahead, stores: Int32) -> Int32:
        g, _, n_tile, first_row, end_row = tile
        if const_expr(self.tma_store):
            # the ragged view: rows from end_row on (the next expert's) are not written
            gD = cute.local_tile(expert_rows(args.mD_tma, first_row, end_row - first_row), (TILE_M, self.tile_n),
                                 (0, n_tile))
            consumer.tile_store.store(args.tma_atom_d, gD, stores)
            stores = stores + 1
        else:
            store_bf16_pairs(consumer.acc, consumer.out, consumer.thr_mma, consumer.tCcD, args.mD, args.mBias, g,
                             n_tile, first_row, end_row, self.tile_n)
        return stores


@cute.jit
def store_bf16_pairs(acc: cute.Tensor, out: cute.Tensor, thr_mma, tCcD: cute.Tensor, mD: cute.Tensor,
                     mBias: cute.Tensor | None, g: Int32, n_tile: Int32, first_row: Int32, end_row: Int32,
                     tile_n: cutlass.Constexpr):
    """A tile's D at (first_row, n_tile * tile_n), plus expert g's bias row if there is one; only
    rows < end_row (this expert's) and columns < N are written. Accumulators j = 2i, 2i+1 of a
    thread are columns c, c+1 of one row (c even; N % 8 == 0, so both or neither are < N): one
    32-bit store of the bf16 pair through the Int32 views of out and D."""
    n = mD.shape[1]
    col0 = n_tile * tile_n
    limits = (end_row - first_row, n - col0)
    gD = cute.local_tile(cute.domain_offset((first_row, col0), mD), (TILE_M, tile_n), (0, 0))
    tCgD_pairs = cute.recast_tensor(thr_mma.partition_C(gD), Int32)
    out_pairs = cute.recast_tensor(out, Int32)
    for i in cutlass.range_constexpr(cute.size(out_pairs)):
        if cute.elem_less(tCcD[2 * i], limits):
            low, high = acc[2 * i], acc[2 * i + 1]
            if const_expr(mBias is not None):
                col = col0 + tCcD[2 * i][1]
                low = low + mBias[g, col].to(Float32)
                high = high + mBias[g, col + 1].to(Float32)
            out[2 * i] = low.to(BFloat16)
            out[2 * i + 1] = high.to(BFloat16)
            tCgD_pairs[i] = out_pairs[i]


# ---------------------------------------------------------------------------------------------
# Compilation (cached per config and architecture)
# ---------------------------------------------------------------------------------------------


def _fake_arguments(config: KernelConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments, in order: T, N, K, E are runtime values;
    alignments are what the launcher guarantees (16-byte bases; K, N and strides multiples of 8)."""
    rows, n = cute.sym_int(), cute.sym_int(divisibility=ELEMENT_ALIGN)
    starts, experts = cute.sym_int(), cute.sym_int()  # E + 1, E
    k = cute.sym_int(divisibility=ELEMENT_ALIGN)
    a = fake_matrix(BFloat16, rows, k)
    b, b1 = fake_experts(experts, n, k, config.b_k_major), None
    if config.k_split:  # K = K0 + K1, each a multiple of 8
        k0, k1 = cute.sym_int(divisibility=ELEMENT_ALIGN), cute.sym_int(divisibility=ELEMENT_ALIGN)
        b, b1 = fake_experts(experts, n, k0, config.b_k_major), fake_experts(experts, n, k1, config.b_k_major)
    bias = None
    if config.bias_dtype is not None:
        bias = fake_matrix(FLOAT_DTYPES[config.bias_dtype], experts, n, divisibility=1, align=4)
    return (a, b, b1, bias, fake_vector(Int32, starts), fake_vector(Int32, starts), fake_matrix(BFloat16, rows, n),
            Int32(1), fake_stream())


_compile = config_compiler(GroupedGemmSm90, _fake_arguments)  # (config, arch) -> CompiledGroupedGemm, cached


def problem_support(num_rows: int, n: int, k: int, num_experts: int) -> Reason | None:
    """None if the kernel runs a (T, N, K, E) problem, else why not (TMA alignment, search depth)."""
    reason = _schedule.expert_count_reason(num_experts)
    if reason is not None:
        return reason
    if k == 0 or k % ELEMENT_ALIGN or n % ELEMENT_ALIGN:
        return Reason(ReasonKind.SHAPE, f"K={k} and N={n} must be positive multiples of {ELEMENT_ALIGN} (TMA's "
                                        "16-byte strides)")
    if max(num_rows, n, k) * 2 >= 2**31 or scale_layout.max_row_tiles(num_rows, num_experts) * n >= 2**31:
        return Reason(ReasonKind.SHAPE, f"T={num_rows}, N={n}, K={k}, E={num_experts} too large for 32-bit tile "
                                        "coordinates")
    return None


compile_grouped_gemm = ahead_compiler(_NAME, _compile, KernelConfig(), problem_support, "T, N, K, E")


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


_b_layout = functools.partial(b_is_k_major, "b")  # True: K-major B (E, N, K); False: N-major


def grouped_gemm(
    a: torch.Tensor,  # (T, K) bf16, contiguous, rows grouped by expert
    b: torch.Tensor | tuple[torch.Tensor, torch.Tensor],  # B_g (N, K) per expert: bf16 (E, N, K), K-major or N-major
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    bias: torch.Tensor | None = None,  # (E, N) bf16 or fp32
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    # the knobs (KernelConfig); None: launch_options' choice (defaults, tuned table, GMLP_SM90_CONFIG)
    tile_n: int | None = None,  # 128 or 256
    store: str | None = None,  # the epilogue's stores, "regs" or "tma"
    cluster: int | None = None,  # 1, or 2: CTAs paired along M, B tiles multicast
    site: str | None = None,  # the layer's site of the launch (its tuned entries first; gmlp.dispatch.sites)
) -> torch.Tensor:
    """(T, N) bf16: each expert's rows of ``a`` times its ``b`` transposed (+ its bias row); no
    host sync. Same contract as ``gmlp.triton_ref.grouped_gemm``; needs K > 0, K and N multiples
    of 8 and 16-byte aligned bases (TMA). ``b`` may be a pair (B, B2) of
    (E, N, K1) and (E, N, K - K1) operands of one layout, B_g = [B_g | B2_g] along K (W1^T with its
    gate and up stored apart), read in place."""
    # validate
    (tokens, k), experts = token_operand("a", a, None), split_sizes.numel()
    b0, b1 = b if isinstance(b, tuple) else (b, None)
    n = expert_matrices("b", b0, experts, N=None, K=None if b1 is not None else k).n
    if b1 is not None:
        k0 = b0.shape[2]
        if k0 % ELEMENT_ALIGN:
            raise ValueError(f"b's first part must have a multiple of {ELEMENT_ALIGN} columns (K1), got K1={k0}")
        expert_matrices("b[1]", b1, experts, N=n, K=k - k0)
        if _b_layout(b0) != _b_layout(b1):
            raise ValueError(f"b's two parts must both be K-major or both N-major, got strides {b0.stride()} and "
                             f"{b1.stride()}")
        check_tma_bases(b1=b1)
    check_problem(_NAME, problem_support(tokens, n, k, experts))
    check_tma_bases(a=a, b=b0)
    check_optional("bias", bias, (experts, n))
    knobs = launch_options.launch_options("grouped_gemm", tokens, n, k, experts,
                                          dict(tile_n=tile_n, store=store, cluster=cluster), site=site,
                                          bias=bias is not None)
    tile_n, store, cluster = knobs["tile_n"], knobs["store"], knobs["cluster"]
    config = KernelConfig(b_k_major=_b_layout(b0), bias_dtype=None if bias is None else bias.dtype, tile_n=tile_n,
                          store=store, k_split=b1 is not None, cluster=cluster)

    # allocate, launch over min(#SMs, bound of the work items) persistent CTAs
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a.device)
    num_ctas = _schedule.grid_size(tokens, experts, scale_layout.ceil_div(n, tile_n), a.device, cluster)
    run(_compile, config, a.device, num_ctas, a, b0, b1, bias, groups.row_start, groups.tile_start, out)
    return out
