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
- Warp-specialized, as ``gmlp.cutedsl.sm90.grouped_gemm``: warp 0 (of warpgroup 0, registers
  lowered to 40) is the TMA producer; 1 (BN = 128) or 2 (BN = 256, a 64-column half of M each)
  consumer warpgroups issue wgmma (bf16 x bf16 -> fp32 from smem) with registers raised to 232.
  ``stages`` slots of an A and a B tile, full/empty mbarriers (``PipelineTmaAsync``); the
  producer runs ahead across items, so the next tile's loads overlap this tile's epilogue.
- Epilogue (``WgradConfig.store``): "tma", the default without ping-pong,
  stages fp32 or bf16 subtiles in shared memory and TMA-stores them into out (E, M, N), clipped
  at M and N, or with ``accumulate`` TMA-reduce-adds them into the fp32 out (``_store``); "regs"
  stores from the accumulator registers, predicated at the M and N tails: a thread's adjacent
  column pair is one 64-bit store (fp32) or 32-bit store (bf16), and with ``accumulate`` the fp32
  pair of ``out`` is loaded, added and stored back. Either way an empty expert's tile adds
  nothing, and the sum is the single fp32 add ``old + acc``: the two give the same bytes.
- Ping-pong (``WgradConfig.pingpong``, BN = 128, the ragged TMA view): the two consumer
  warpgroups take alternate items, each a whole 128 x 128 tile, their mainloops in turns, each
  skipping the other's k-steps (its expert's count) in the shared slot ring; the scheme and why
  the turns are needed are those of ``gmlp.cutedsl.sm90.grouped_gemm``.

Defaults: BN = 256, 4 stages (48 KB each); BN = 128 gets 7. ptxas (CUDA 13.x, sm_90a), every
config: 168 registers at launch for BN = 256 (232 for BN = 128; 232 in consumers after
setmaxnreg), no stack, no spills; HGMMA.64x{BN}x16.F32.BF16 with both transpose bits; 4-D (2-D
with ``ragged_tma=False``) TMA loads; see tests/cutedsl/sm90/test_wgrad.py. Verified on the H200
(the ``gpu`` tests there), except ping-pong, which has only been compiled (168 registers at
launch, none spilled).
"""

from __future__ import annotations

from dataclasses import dataclass

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
from gmlp.cutedsl.sm90._compile import (
    SUPPORTED_ARCHS,
    CompiledKernel,
    compile_ahead,
    config_compiler,
    fake_matrix,
    fake_stream,
    fake_vector,
    sym_stride,
)
from gmlp.cutedsl.sm90._launch import check_tma_bases, run
from gmlp.cutedsl.sm90._pipeline import (
    ALIGN,
    ELEMENT_ALIGN,
    THREADS_PER_WARPGROUP,
    TILE_K,
    StagedConfig,
    consumer_fragments,
    consumer_states,
    cta_roles,
    launch,
    mainloop_fields,
    make_mainloop_pipeline,
    make_turns,
    mma_thread,
    produce_k_tiles,
    register_split,
    shared_storage,
    skip_k_tiles,
    slot_tensors,
    smem_array,
)
from gmlp.cutedsl.sm90._schedule import sm_count
from gmlp.cutedsl.sm90._tma import expert_tokens, ragged_tokens
from gmlp.cutedsl.sm90._wgrad_operands import (
    OUT_DTYPES,
    problem_support,
    wgrad_operands,
)
from gmlp.cutedsl.sm90._wgrad_register_paths import RegisterPaths
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
_OUT_DTYPES = dict(zip(OUT_DTYPES, (Float32, BFloat16)))  # torch -> cutlass dtype of the result


@dataclass(frozen=True)
class WgradConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    out_dtype: torch.dtype = torch.float32  # of a new result (ignored, fp32, with accumulate)
    accumulate: bool = False  # add into an fp32 out (main_grad) instead of storing
    tile_n: int = 256  # 128 (one consumer warpgroup) or 256 (two)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    # K tail: True, TMA zero-fills past the expert's end (the ragged 4-D view); False, the plain
    # (features, T) view, and the consumers zero the next expert's rows of the last k-step in smem
    ragged_tma: bool = True
    pingpong: bool = False  # tile_n = 128, ragged_tma: two consumer warpgroups on alternate items
    # the epilogue's stores: "regs", predicated pairs from the registers (accumulate: loaded,
    # added, stored); "tma", subtiles staged in shared memory and TMA-stored, or TMA reduce-added
    # with accumulate (``_store``)
    store: str = "regs"

    def __post_init__(self):
        if self.tile_n not in (128, 256):
            raise ValueError(f"tile_n must be 128 or 256, got {self.tile_n}")
        if self.pingpong and (self.tile_n != 128 or not self.ragged_tma):
            raise ValueError(f"pingpong needs tile_n=128 and ragged_tma=True (the smem zeroing syncs all consumer "
                             f"threads), got tile_n={self.tile_n}, ragged_tma={self.ragged_tma}")
        if self.out_dtype not in _OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {tuple(_OUT_DTYPES)}, got {self.out_dtype}")
        if self.accumulate and self.out_dtype != torch.float32:
            raise ValueError("accumulate adds into an fp32 out: out_dtype must be torch.float32")
        launch_options.check_store(self.store)
        if self.store == "tma" and self.pingpong:
            raise ValueError("store='tma' needs pingpong=False (the TMA-store epilogue has no ping-pong yet), got "
                             "pingpong=True")
        self.check_stages()

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: a bf16 A tile and a bf16 B tile."""
        return (TILE_M + self.tile_n) * TILE_K * 2

    def fixed_bytes(self) -> int:
        """The TMA-store epilogue's subtiles, outside the slot ring."""
        return _store.smem_bytes(self.tile_n // 128, _OUT_DTYPES[self.out_dtype]) if self.store == "tma" else 0



def _transposed(tensor: cute.Tensor) -> cute.Tensor:
    """The (features, T) view of a row-major (T, features) tensor (the plain, ``ragged_tma=False``
    TMA view: rows past an expert's end are the next expert's, zero only past T)."""
    return cute.make_tensor(tensor.iterator, cute.select(tensor.layout, mode=[1, 0]))


class GroupedWgradSm90(RegisterPaths):
    """The jit code of the grouped weight gradient (see the module docstring); ``__call__`` is the
    host side that builds TMA descriptors and launches, ``kernel`` the device side."""

    def __init__(self, config: WgradConfig):
        self.config = config
        self.tile_n = config.tile_n
        self.num_mma_warpgroups = config.tile_n // 128
        self.stages = config.num_stages()
        self.accumulate = config.accumulate
        self.out_dtype = _OUT_DTYPES[config.out_dtype]
        self.tile_shape_mnk = (TILE_M, config.tile_n, TILE_K)
        # BN = 256: two consumer warpgroups, each 64 rows of M x 256 (128 fp32 accumulators a
        # thread); BN = 128: one warpgroup, two m64 wgmmas per k-block (also 128 accumulators).
        self.atom_layout_mnk = (self.num_mma_warpgroups, 1, 1)
        self.add_chunk = _ADD_CHUNK
        self.ragged_tma = config.ragged_tma
        self.consumer_threads = self.num_mma_warpgroups * THREADS_PER_WARPGROUP
        self.pingpong = config.pingpong
        self.threads = (1 + (2 if config.pingpong else self.num_mma_warpgroups)) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads)  # producer, consumer setmaxnreg counts
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
            self.atom_layout_mnk, tiler_mn=(64, self.tile_n),
        )
        a_smem_layout = sm90_utils.make_smem_layout_a(major, self.tile_shape_mnk, BFloat16, self.stages)
        b_smem_layout = sm90_utils.make_smem_layout_b(major, self.tile_shape_mnk, BFloat16, self.stages)
        view = ragged_tokens if const_expr(self.ragged_tma) else _transposed
        tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), view(mA),
            cute.slice_(a_smem_layout, (None, None, 0)), (TILE_M, TILE_K),
        )
        tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), view(mB),
            cute.slice_(b_smem_layout, (None, None, 0)), (self.tile_n, TILE_K),
        )

        fields = mainloop_fields(self.stages, a_smem_layout, b_smem_layout, turns=self.pingpong)
        store = None  # store="tma": the subtiles' smem layout and TMA store (reduce-add with accumulate)
        if const_expr(self.tma_store):
            out_mne = cute.make_tensor(mOut.iterator, cute.select(mOut.layout, mode=[1, 2, 0]))  # (M, N, E)
            store = _store.make_store_operands(out_mne, self.num_mma_warpgroups, self.out_dtype, reduce=self.accumulate)
            fields["sD"] = smem_array(self.out_dtype, cute.cosize(store.smem_layout))
        self.shared_storage = shared_storage(fields)
        launch(self.kernel(tma_atom_a, tma_a, tma_atom_b, tma_b, mRowStart, mOut,
                           *_store.kernel_arguments(store), tiled_mma, a_smem_layout, b_smem_layout),
               num_ctas, self.threads, stream)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,  # TMA coordinates of A's ragged view (M, BIG, MAX, MAX), or (M, T)
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,  # TMA coordinates of B's ragged view (N, BIG, MAX, MAX), or (N, T)
        mRowStart: cute.Tensor,
        mOut: cute.Tensor,
        tma_atom_d: cute.CopyAtom | None,  # store="tma": the subtiles' TMA store or reduce-add
        mOut_tma: cute.Tensor | None,  # store="tma": TMA coordinates of out as (M, N, E)
        d_smem_layout: cute.ComposedLayout | None,  # store="tma": (epi rows, epi cols, _store.STAGES)
        tiled_mma: cute.TiledMma,
        a_smem_layout: cute.ComposedLayout,  # (BM, BK, stages)
        b_smem_layout: cute.ComposedLayout,  # (BN, BK, stages)
    ):
        atoms = (tma_atom_a, tma_atom_b, tma_atom_d) if const_expr(self.tma_store) else (tma_atom_a, tma_atom_b)
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles(atoms)
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        # full[s]: armed by the producer with the slot's TMA bytes (zero-filled rows count too);
        # empty[s]: one arrive per consumer warp once its wgmmas reading slot s completed.
        sA, sB, stage_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout)
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages, self.num_mma_warpgroups,
                                          stage_bytes)  # initializes the mbarriers and syncs the CTA
        if const_expr(self.pingpong):  # the mainloops' turns
            order = make_turns(storage.order_barriers.data_ptr(), warpgroup)

        # Work items w = (g * m_tiles + m_tile) * n_tiles + n_tile (see the module doc).
        num_experts, m, n = mOut.shape
        m_tiles = (m + TILE_M - 1) // TILE_M
        n_tiles = (n + self.tile_n - 1) // self.tile_n
        tiles_per_expert = m_tiles * n_tiles
        num_items = num_experts * tiles_per_expert

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every (A, B) k-step of this CTA's items
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            item = bidx
            while item < num_items:
                g = item // tiles_per_expert
                rest = item - g * tiles_per_expert
                m_tile = rest // n_tiles
                n_tile = rest - m_tile * n_tiles
                first_row = mRowStart[g]
                rows = mRowStart[g + 1] - first_row
                # (BM, BK, RestK) / (BN, BK, RestK) tiles of the expert's rows (zero past its end
                # with the ragged view; else the consumers zero them)
                if const_expr(self.ragged_tma):
                    mA_g = expert_tokens(mA, first_row, rows)
                    mB_g = expert_tokens(mB, first_row, rows)
                else:
                    mA_g = cute.domain_offset((0, first_row), mA)
                    mB_g = cute.domain_offset((0, first_row), mB)
                gA = cute.local_tile(mA_g, (TILE_M, TILE_K), (m_tile, None))
                gB = cute.local_tile(mB_g, (self.tile_n, TILE_K), (n_tile, None))
                tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
                    tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
                tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
                    tma_atom_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
                k_tiles = (rows + TILE_K - 1) // TILE_K
                state = produce_k_tiles(mainloop, state, k_tiles, tma_atom_a, tAgA, tAsA,
                                        ((tma_atom_b, tBgB, tBsB),))
                item += grid
            mainloop.producer_tail(state)  # wait until the consumers freed every slot

        if warpgroup > 0:  # consumers: wgmma mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            # BN = 256: both warpgroups share the tiled MMA; ping-pong: each its own
            mma_warpgroup, mma_tidx = mma_thread(tidx, warpgroup, self.pingpong)
            # A/B smem descriptors are per warpgroup, (MMA, MMA_M | N, MMA_K, stages); C fragments per thread
            tCrA, (tCrB,) = consumer_fragments(tiled_mma, mma_warpgroup, sA, (sB,))
            thr_mma = tiled_mma.get_slice(mma_tidx)
            # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
            tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
            acc = cute.make_rmem_tensor(tCcD.shape, Float32)
            k_blocks = cute.size(tCrA, mode=[2])
            read_state, release_state = consumer_states(self.stages)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            if const_expr(self.tma_store):
                sD = storage.sD.get_tensor(d_smem_layout.outer, swizzle=d_smem_layout.inner)
                # the first consumer warp issues the stores
                tile_store = _store.TileStore.of(tiled_mma, acc, sD, mma_tidx, self.consumer_threads,
                                                 _store.epi_tile(self.num_mma_warpgroups, self.out_dtype),
                                                 warp_idx == THREADS_PER_WARPGROUP // 32, self.out_dtype)
                tiles_done = Int32(0)

            item = bidx
            item_step = grid
            if const_expr(self.pingpong):
                # warpgroup 2 takes this CTA's odd items: skip the slots of the first one
                item_step = 2 * grid
                if warpgroup == 2:
                    skipped = self.k_tiles_of(mRowStart, bidx, tiles_per_expert)
                    read_state = skip_k_tiles(read_state, skipped)
                    release_state = skip_k_tiles(release_state, skipped)
                    item = bidx + grid
                order_state = order.state.clone()  # carried explicitly through the item loop
            while item < num_items:
                g = item // tiles_per_expert
                rest = item - g * tiles_per_expert
                m_tile = rest // n_tiles
                n_tile = rest - m_tile * n_tiles
                rows = mRowStart[g + 1] - mRowStart[g]
                k_tiles = (rows + TILE_K - 1) // TILE_K
                if const_expr(self.pingpong):
                    order.wait(order_state)

                # Mainloop: zeroed accumulators (an empty expert's tile stays zero); one k-step
                # of wgmmas in flight, a slot released once the wgmmas that read it completed.
                acc.fill(0.0)
                for k_tile in range(k_tiles):
                    mainloop.consumer_wait(read_state)
                    if const_expr(not self.ragged_tma):
                        tail = rows - k_tile * TILE_K  # the expert's rows left; < BK on its last step
                        if tail < TILE_K:
                            self.zero_rows(sA, sB, read_state.index, tail, mma_tidx)
                    cute.nvgpu.warpgroup.fence()
                    for k_block in cutlass.range_constexpr(k_blocks):
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
                if const_expr(self.pingpong):
                    # the other warpgroup's mainloop may start; its next item's slots are skipped here
                    order_state = order.arrive(order_state)
                    if item + grid < num_items:
                        skipped = self.k_tiles_of(mRowStart, item + grid, tiles_per_expert)
                        read_state = skip_k_tiles(read_state, skipped)
                        release_state = skip_k_tiles(release_state, skipped)

                if const_expr(self.tma_store):
                    # tile (m_tile, n_tile) of out[g], clipped at M and N by TMA; an empty expert
                    # adds nothing (accumulate) or stores its zeros
                    if k_tiles > 0 or not self.accumulate:
                        gOut = cute.local_tile(mOut_tma[(None, None, g)], (TILE_M, self.tile_n), (m_tile, n_tile))
                        tile_store.store(tma_atom_d, gOut, tiles_done)
                        tiles_done += 1
                else:
                    self.store_tile(acc, thr_mma, tCcD, mOut, g, m_tile, n_tile, k_tiles)
                item += item_step
            if const_expr(self.tma_store):
                tile_store.drain()

    @cute.jit
    def k_tiles_of(self, mRowStart: cute.Tensor, item: Int32, tiles_per_expert: Int32) -> Int32:
        """The k-steps of work item ``item``: ceil(m_g / BK) for its expert g."""
        g = item // tiles_per_expert
        return (mRowStart[g + 1] - mRowStart[g] + TILE_K - 1) // TILE_K


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
    out = make_fake_tensor(_OUT_DTYPES[config.out_dtype], (experts, m, n), stride=(sym_stride(), sym_stride(), 1),
                           assumed_align=ALIGN)
    return (a, b, row_start, out, Int32(1), fake_stream())


CompiledWgrad = CompiledKernel  # the callable (runs on a matching GPU), its PTX and cubin
_compile = config_compiler(GroupedWgradSm90, _fake_arguments)  # (config, arch) -> CompiledWgrad, cached


def compile_wgrad(
    arch: str = "sm_90a",
    config: WgradConfig = WgradConfig(),
    *,
    shape: tuple[int, int, int, int] | None = None,
) -> CompiledWgrad:
    """Compile the kernel for ``arch`` without a GPU; returns it with its PTX and cubin. The code
    is shape-generic (T, M, N, E at run time), so one compile serves every shape of a config;
    ``shape`` (T, M, N, E), when given, is checked against ``problem_support``."""
    return compile_ahead(_NAME, _compile, config, arch, None if shape is None else problem_support(*shape))


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
    pingpong: bool | None = None,  # tile_n = 128: two consumer warpgroups on alternate items
    store: str | None = None,  # the epilogue's stores, "regs" or "tma"
) -> torch.Tensor:
    """(E, M, N) weight gradients, fp32 sums stored as ``out_dtype``; added to ``out`` (fp32) when
    given. No host sync. Same contract as ``gmlp.triton_ref.wgrad.grouped_wgrad``; needs M and N
    multiples of 8 and 16-byte aligned bases (TMA). With ``split_rows`` (``out`` then a pair),
    each dW_g's first ``split_rows`` rows and the rest are two (E, ., N) tensors (dW1's gate and
    up, the gradients of two weights: ``gmlp.contract.gate_up``): two launches, one per part of
    A's columns (the same sums, bit for bit, as one launch's rows)."""
    if split_rows is not None:
        return _split_wgrad(a, b, split_sizes, split_rows, out=out, out_dtype=out_dtype, groups=groups,
                            tile_n=tile_n, ragged_tma=ragged_tma, pingpong=pingpong, store=store)
    experts = split_sizes.numel()
    a, b, tokens, m, n = wgrad_operands(_NAME, a, b, experts, out, out_dtype)

    # allocate; no tokens: zeros (nothing added to out), else launch over min(#SMs, tiles) CTAs
    accumulate = out is not None
    if out is None:
        out = torch.empty(experts, m, n, dtype=out_dtype, device=a.device)
        if tokens == 0:
            return out.zero_()
    knobs = launch_options.launch_options("grouped_wgrad", tokens, m, n, experts,
                                          dict(tile_n=tile_n, ragged_tma=ragged_tma, pingpong=pingpong, store=store))
    tile_n, ragged_tma, pingpong, store = knobs["tile_n"], knobs["ragged_tma"], knobs["pingpong"], knobs["store"]
    items = experts * -(-m // TILE_M) * -(-n // tile_n)
    if tokens > 0 and items > 0:  # (a TMA descriptor needs a valid base)
        config = WgradConfig(out_dtype=out.dtype, accumulate=accumulate, tile_n=tile_n, ragged_tma=ragged_tma,
                             pingpong=pingpong, store=store)
        if store == "tma":
            check_tma_bases(out=out)  # the TMA store's destination
        groups = groups if groups is not None else device_groups(split_sizes, tokens)
        run(_compile, config, a.device, min(items, sm_count(a.device.index)), a, b, groups.row_start, out)
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
