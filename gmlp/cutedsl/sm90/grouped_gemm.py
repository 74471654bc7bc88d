"""CuTeDSL sm_90a grouped GEMM ``D[rows of g] = A[rows of g] @ B_g^T (+ bias_g)`` (FC2 forward, FC1 dgrad).

Twin of ``gmlp.triton_ref.grouped_gemm`` (same arguments, same result up to the fp32 summation
order). Operands: A (T, K) bf16 row-major with rows grouped by expert; B (E, N, K) bf16, either
K-major (B_g (N, K) row-major: stacked weights, FC2's W2) or N-major (a transposed view of a
(E, K, N) weight: FC1 dgrad's W1^T read in place); D (T, N) bf16; optional bias (E, N), bf16 or
fp32; fp32 accumulation. Expert g owns rows ``row_start[g] <= r < row_start[g+1]`` of A and D,
from the device prefix sums of ``gmlp.mxfp8.routing.device_groups`` (no host sync; any sizes, 0 too).

Kernel design (one compiled kernel per ``KernelConfig``; T, N, K, E are runtime values; the tile
schedule, the mainloop, the compile and the launcher's common checks are the shared ``_schedule``,
``_pipeline``, ``_compile`` and ``_launch`` of this package, also used by ``fc1`` and
``fc2_dgrad``):

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
  (bf16 x bf16 -> fp32, operands from smem) with registers raised to 232.
- Pipeline: ``stages`` smem slots of one A tile (128 x 64) and one B tile (BN x 64), 128B-swizzled,
  full/empty mbarriers (``PipelineTmaAsync``); the producer runs ahead across tiles, so the next
  tile's loads overlap this tile's epilogue. A is loaded through a TMA descriptor of the whole
  (T, K) tensor at the expert's first row: rows past the expert's end are the next expert's (or
  TMA's zero fill past T); they only reach accumulator rows that are never stored. K tails are
  zero-filled by TMA. B_g is the expert coordinate of a 3-D (N, K, E) descriptor.
- Epilogue (``KernelConfig.store``): "tma", the default without a bias or ping-pong, rounds to
  bf16 into shared-memory subtiles and TMA-stores them through the ragged view of D that ends at
  the expert's last row (``_store``, ``_tma.ragged_rows``), overlapped with the next subtile and
  the next tile's mainloop; "regs" adds the bias (fp32), rounds to bf16 and stores predicated
  32-bit pairs (a thread's adjacent columns) of the rows below the expert's end and the columns
  below N. Both give the same bytes.
- Ping-pong (``KernelConfig.pingpong``, BN = 128): the two consumer warpgroups take alternate
  work items of the CTA, each a whole 128 x 128 tile, so one's epilogue overlaps the other's
  mainloop. They share the producer's slot ring in item order: each skips the other's k-tiles
  in its pipeline state, and their mainloops take turns through two mbarriers
  (``cutlass.pipeline.PipelineOrder``). The turns are required, not only fast: a warpgroup
  waiting on a slot two fills ahead would take the parity of the older fill as its own. Without
  ping-pong the epilogue is not overlapped with the next mainloop.

Defaults: BN = 256, 4 stages (48 KB each); BN = 128 gets 7. ptxas (CUDA 13.4, sm_90a): 168
registers at launch (232 in consumers after setmaxnreg), no spills; see tests/cutedsl/sm90/test_grouped_gemm.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.contract.operands import token_operand
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90 import _schedule, _store, launch_options
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
from gmlp.cutedsl.sm90._launch import (
    check_optional,
    check_problem,
    check_tma_bases,
    expert_matrices,
    run,
)
from gmlp.cutedsl.sm90._pipeline import (
    ELEMENT_ALIGN,
    THREADS_PER_WARPGROUP,
    TILE_K,
    KSplit,
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
    make_turns,
    mma_k_tiles,
    mma_thread,
    produce_token_items,
    register_split,
    shared_storage,
    skip_k_tiles,
    slot_tensors,
    smem_array,
)
from gmlp.cutedsl.sm90._schedule import MAX_EXPERTS, TILE_M, TokenItems
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
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


@dataclass(frozen=True)
class KernelConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    b_k_major: bool = True  # B_g (N, K) row-major (stacked weights); False: N-major (transposed view)
    bias_dtype: torch.dtype | None = None  # None: no bias
    tile_n: int = 256  # 128 (one consumer warpgroup) or 256 (two)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    pingpong: bool = False  # tile_n = 128 only: two consumer warpgroups on alternate work items
    # the epilogue's stores: "regs", predicated bf16 pairs from the registers; "tma", subtiles
    # staged in shared memory and stored by TMA, overlapped with what follows (``_store``)
    store: str = "regs"
    # B given as two tensors side by side along K (W1^T with its gate and up stored apart, FC1
    # dgrad; ``_pipeline.KSplit``), both of the b_k_major layout
    k_split: bool = False

    def __post_init__(self):
        if self.tile_n not in (128, 256):
            raise ValueError(f"tile_n must be 128 or 256, got {self.tile_n}")
        if self.pingpong and self.tile_n != 128:
            raise ValueError(f"pingpong needs tile_n=128 (one 128 x 128 tile per consumer warpgroup), got {self.tile_n}")
        if self.bias_dtype is not None and self.bias_dtype not in FLOAT_DTYPES:
            raise ValueError(f"bias dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.bias_dtype}")
        launch_options.check_store(self.store)
        if self.store == "tma" and (self.pingpong or self.bias_dtype is not None):
            raise ValueError(f"store='tma' needs pingpong=False and no bias (the TMA-store epilogue has neither yet), "
                             f"got pingpong={self.pingpong}, bias_dtype={self.bias_dtype}")
        self.check_stages()

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: a bf16 A tile and a bf16 B tile."""
        return TILE_M * TILE_K * 2 + self.tile_n * TILE_K * 2

    def fixed_bytes(self) -> int:
        """The TMA-store epilogue's subtiles, outside the slot ring."""
        return _store.smem_bytes(self.tile_n // 128) if self.store == "tma" else 0



class GroupedGemmSm90:
    """The jit code of the grouped GEMM (see the module docstring); ``__call__`` is the host side
    that builds TMA descriptors and launches, ``kernel`` the device side. The schedule and the
    mainloop are the shared ones of ``_schedule`` and ``_pipeline``; the epilogue is this kernel's."""

    def __init__(self, config: KernelConfig):
        self.config = config
        self.tile_n = config.tile_n
        self.pingpong = config.pingpong
        # warpgroups sharing one tile's wgmmas: 2 for BN = 256, else 1 (also with ping-pong,
        # where each of the two consumer warpgroups owns a whole 128 x 128 tile)
        self.num_mma_warpgroups = config.tile_n // 128
        self.num_consumers = 2 if config.pingpong else self.num_mma_warpgroups
        self.stages = config.num_stages()
        self.has_bias = config.bias_dtype is not None
        # BN = 256: two consumer warpgroups, each a 64 x 256 half (128 fp32 accumulators a thread);
        # BN = 128: one warpgroup, two m64 wgmmas per k-step (also 128 accumulators).
        self.atom_layout_mnk = (self.num_mma_warpgroups, 1, 1)
        self.threads = (1 + self.num_consumers) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads)  # producer, consumer setmaxnreg counts
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
        ops = make_mainloop_operands(mA, mB, self.tile_n, self.stages, self.atom_layout_mnk)
        tma_atom_b1 = tma_b1 = None
        if const_expr(self.config.k_split):
            tma_atom_b1, tma_b1 = make_b_tma(mB1, ops.b_smem_layout, self.tile_n)
        fields = mainloop_fields(self.stages, ops.a_smem_layout, ops.b_smem_layout, turns=self.pingpong)
        store = None  # store="tma": the subtiles' smem layout and TMA store
        if const_expr(self.tma_store):
            store = _store.make_store_operands(ragged_rows(mD), self.num_mma_warpgroups)
            fields["sD"] = smem_array(BFloat16, cute.cosize(store.smem_layout))
        self.shared_storage = shared_storage(fields)
        launch(self.kernel(ops.tma_atom_a, ops.tma_a, ops.tma_atom_b, ops.tma_b, tma_atom_b1, tma_b1, mBias,
                           mRowStart, mTileStart,
                           mD, *(_store.kernel_arguments(store)), ops.tiled_mma, ops.a_smem_layout,
                           ops.b_smem_layout),
               num_ctas, self.threads, stream)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,  # TMA coordinates of A (T, K)
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,  # TMA coordinates of B (N, K, E), or of its first K0 columns (k_split)
        tma_atom_b1: cute.CopyAtom | None,  # k_split: the second B's TMA load
        mB1: cute.Tensor | None,  # k_split: TMA coordinates of the second B (N, K - K0, E)
        mBias: cute.Tensor | None,
        mRowStart: cute.Tensor,
        mTileStart: cute.Tensor,
        mD: cute.Tensor,
        tma_atom_d: cute.CopyAtom | None,  # store="tma": the subtiles' TMA store
        mD_tma: cute.Tensor | None,  # store="tma": TMA coordinates of D's ragged view (BIG, N, MAX, MAX)
        d_smem_layout: cute.ComposedLayout | None,  # store="tma": (epi rows, epi cols, _store.STAGES) bf16
        tiled_mma: cute.TiledMma,
        a_smem_layout: cute.ComposedLayout,  # (BM, BK, stages)
        b_smem_layout: cute.ComposedLayout,  # (BN, BK, stages)
    ):
        atoms = (tma_atom_a, tma_atom_b) + ((tma_atom_d,) if const_expr(self.tma_store) else ()) \
            + ((tma_atom_b1,) if const_expr(self.config.k_split) else ())
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles(atoms)
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        sA, sB, stage_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout)
        # a slot is released by the warpgroups that read it: both halves of a BN = 256 tile, or
        # with ping-pong the one warpgroup whose item it holds
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages,
                                          self.num_mma_warpgroups, stage_bytes)
        if const_expr(self.pingpong):
            order = make_turns(storage.order_barriers.data_ptr(), warpgroup)

        # Work items over the m-tiles of tile_start x n-tiles, in bands of m-tiles (see _schedule).
        items = TokenItems.of(mRowStart, mTileStart, mD.shape[1], self.tile_n)
        k_tiles = (mA.shape[1] + TILE_K - 1) // TILE_K
        b_parts = (b_tiles(tma_atom_b, mB, sB, self.tile_n),)  # B_g rows n_tile * BN + [0, BN)
        k_split = None
        if const_expr(self.config.k_split):  # the first B's k-tiles, then the second's
            k_split = KSplit.of(mB, (b_tiles(tma_atom_b1, mB1, sB, self.tile_n),))
            k_tiles = k_split.k_tiles + (mA.shape[1] - k_split.k0 + TILE_K - 1) // TILE_K

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every (A, B) k-tile of this CTA's items
            produce_token_items(mainloop, self.stages, items, bidx, grid, k_tiles, tma_atom_a, mA, sA, b_parts,
                                k_split)

        if warpgroup > 0:  # consumers: wgmma mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            # BN = 256: both warpgroups share the tiled MMA; ping-pong: each its own
            mma_warpgroup, mma_tidx = mma_thread(tidx, warpgroup, self.pingpong)
            tCrA, (tCrB,) = consumer_fragments(tiled_mma, mma_warpgroup, sA, (sB,))
            thr_mma = tiled_mma.get_slice(mma_tidx)
            # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
            tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
            acc = cute.make_rmem_tensor(tCcD.shape, Float32)
            out = cute.make_rmem_tensor(tCcD.shape, BFloat16)  # staging of the bf16 pairs
            read_state, release_state = consumer_states(self.stages)
            if const_expr(self.tma_store):
                sD = storage.sD.get_tensor(d_smem_layout.outer, swizzle=d_smem_layout.inner)
                consumers = self.num_mma_warpgroups * THREADS_PER_WARPGROUP
                # the first consumer warp issues the stores
                tile_store = _store.TileStore.of(tiled_mma, acc, sD, tidx - THREADS_PER_WARPGROUP, consumers,
                                                 _store.epi_tile(self.num_mma_warpgroups),
                                                 warp_idx == THREADS_PER_WARPGROUP // 32)
                tiles_done = Int32(0)

            item = bidx
            item_step = grid
            if const_expr(self.pingpong):
                # warpgroup 2 takes this CTA's odd items: skip the slots of the first one
                item_step = 2 * grid
                if warpgroup == 2:
                    item = bidx + grid
                    read_state = skip_k_tiles(read_state, k_tiles)
                    release_state = skip_k_tiles(release_state, k_tiles)
                order_state = order.state.clone()  # carried explicitly through the item loop
            while item < items.count:
                g, _, n_tile, first_row, end_row = items.tile(item)
                if const_expr(self.pingpong):
                    order.wait(order_state)
                tiled_mma, read_state, release_state = mma_k_tiles(tiled_mma, mainloop, read_state, release_state,
                                                                   k_tiles, tCrA, ((acc, tCrB),))
                if const_expr(self.pingpong):
                    # the other warpgroup's mainloop may start; its item's slots are skipped here
                    order_state = order.arrive(order_state)
                    read_state = skip_k_tiles(read_state, k_tiles)
                    release_state = skip_k_tiles(release_state, k_tiles)
                if const_expr(self.tma_store):
                    # the ragged view: rows from end_row on (the next expert's) are not written
                    gD = cute.local_tile(expert_rows(mD_tma, first_row, end_row - first_row), (TILE_M, self.tile_n),
                                         (0, n_tile))
                    tile_store.store(tma_atom_d, gD, tiles_done)
                    tiles_done += 1
                else:
                    self.store_tile(acc, out, thr_mma, tCcD, mD, mBias, g, n_tile, first_row, end_row)
                item += item_step
            if const_expr(self.tma_store):
                tile_store.drain()

    @cute.jit
    def store_tile(self, acc: cute.Tensor, out: cute.Tensor, thr_mma, tCcD: cute.Tensor, mD: cute.Tensor,
                   mBias: cute.Tensor | None, g: Int32, n_tile: Int32, first_row: Int32, end_row: Int32):
        """Epilogue: ``store_bf16_pairs`` of the tile."""
        store_bf16_pairs(acc, out, thr_mma, tCcD, mD, mBias, g, n_tile, first_row, end_row, self.tile_n)


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


def compile_grouped_gemm(
    arch: str = "sm_90a",
    config: KernelConfig = KernelConfig(),
    *,
    shape: tuple[int, int, int, int] | None = None,
) -> CompiledGroupedGemm:
    """Compile the kernel for ``arch`` without a GPU; returns it with its PTX and cubin. The code
    is shape-generic (T, N, K, E at run time), so one compile serves every shape of a config;
    ``shape`` (T, N, K, E), when given, is checked against ``problem_support``."""
    return compile_ahead(_NAME, _compile, config, arch, None if shape is None else problem_support(*shape))


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
    pingpong: bool | None = None,  # tile_n = 128: two consumer warpgroups on alternate items
    store: str | None = None,  # the epilogue's stores, "regs" or "tma"
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
                                          dict(tile_n=tile_n, pingpong=pingpong, store=store),
                                          bias=bias is not None)
    tile_n, pingpong, store = knobs["tile_n"], knobs["pingpong"], knobs["store"]
    config = KernelConfig(b_k_major=_b_layout(b0), bias_dtype=None if bias is None else bias.dtype, tile_n=tile_n,
                          pingpong=pingpong, store=store, k_split=b1 is not None)

    # allocate, launch over min(#SMs, bound of the work items) persistent CTAs
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a.device)
    num_ctas = _schedule.grid_size(tokens, experts, scale_layout.ceil_div(n, tile_n), a.device)
    run(_compile, config, a.device, num_ctas, a, b0, b1, bias, groups.row_start, groups.tile_start, out)
    return out
