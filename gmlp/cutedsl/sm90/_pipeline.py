"""The parts of the warp-specialized TMA + wgmma pipeline that the engine (``_engine``) and its
sites assemble: roles, register split, the slot ring's shared memory and mbarriers, TMA
partitions, the token-row producer and the bf16 k-loop.

One CTA: warpgroup 0 holds the TMA producer (warp 0; the warpgroup's registers lowered to
``PRODUCER_REGISTERS``), the next warpgroups are the consumers issuing ``wgmma`` (bf16 x bf16 ->
fp32, operands from smem; registers raised to ``CONSUMER_REGISTERS``). ``stages`` smem slots each
hold one A tile (128 x 64) and one or more B tiles (BN x 64), 128B-swizzled, behind full/empty
mbarriers (``PipelineTmaAsync``): the producer runs ahead across work items, so the next item's
loads overlap this item's epilogue. A persistent grid (``launch``): one CTA an SM, alone or in
clusters of two (``launch_options.CLUSTERS``; ``_cluster``: the tile a pair shares, multicast).

A is read through a TMA descriptor of the whole (T, K) tensor at the expert's first row (rows
past the expert's end are the next expert's, or TMA's zero fill past T: they only reach
accumulator rows that are never stored); K tails are zero-filled by TMA. B_g is the expert
coordinate of a 3-D (N, K, E) descriptor; a B tile may start at any row (``b_tiles``' offset),
rows past N read zeros.
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

from gmlp.cutedsl.sm90._cluster import PairedTile, item_tiles, load_tile, multicast_load_op, tile_shares
from gmlp.cutedsl.sm90._schedule import TILE_K, TILE_M, TokenItems

__all__ = ["TILE_K", "ALIGN", "ELEMENT_ALIGN", "SMEM_BYTES", "THREADS_PER_WARPGROUP", "PRODUCER_REGISTERS",
           "CONSUMER_REGISTERS", "REGISTER_FILE", "register_split", "StagedConfig", "WideItems", "cta_roles",
           "slot_tensors", "MainloopOperands", "make_mainloop_operands", "make_mainloop_pipeline",
           "consumer_states", "smem_array", "mainloop_fields", "shared_storage", "launch", "b_is_k_major",
           "a_tiles", "b_tiles", "make_b_tma", "KSplit", "produce_k_tiles", "produce_token_items", "mma_k_tiles",
           "consumer_fragments"]

ALIGN = 16  # bytes: TMA needs 16-byte aligned bases and strides
ELEMENT_ALIGN = ALIGN // 2  # bf16 elements
SMEM_BYTES = 232448 - 1024  # sm_90 227 KB per CTA, less mbarriers and alignment slack
THREADS_PER_WARPGROUP = 128
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232
REGISTER_FILE = 65536  # 32-bit registers of an sm_90 SM: the pool of a CTA that runs alone on it


def register_split(threads: int, producer: int = PRODUCER_REGISTERS,
                   consumer: int = CONSUMER_REGISTERS) -> tuple[int, int]:
    """``(producer, consumer)``: the ``setmaxnreg`` counts of the producer warpgroup and of each
    consumer warpgroup of a ``threads``-thread CTA, checked against its launch allocation.

    A CTA is launched with at most ``REGISTER_FILE / threads`` registers a thread (ptxas rounds
    down to a multiple of 8: 168 for 384 threads). ``setmaxnreg.dec`` returns registers to the
    CTA's pool and ``setmaxnreg.inc`` takes them from it (SASS ``USETMAXREG.TRY_ALLOC.CTAPOOL``, a
    loop until they are there): a split asking for more than the launch gave can wait forever.
    FC2 dgrad's MXFP8 epilogue at 32 / 240 (1024 registers over 384 x 168) passed its tests at
    small shapes and hung at the DeepSeek-V3 shape on the H200."""
    warpgroups = threads // THREADS_PER_WARPGROUP
    launch = min(255, REGISTER_FILE // threads // 8 * 8)
    asked = producer + (warpgroups - 1) * consumer
    if threads % THREADS_PER_WARPGROUP or warpgroups < 2 or asked > warpgroups * launch:
        raise ValueError(f"a {threads}-thread CTA has {launch} registers a thread at launch ({warpgroups * launch} "
                         f"over its {warpgroups} warpgroups); a producer warpgroup at {producer} and "
                         f"{warpgroups - 1} consumer warpgroups at {consumer} ask for {asked}")
    return producer, consumer


class StagedConfig:
    """The pipeline-depth rules of a kernel config (a frozen dataclass with a ``stages`` field and
    a ``stage_bytes()`` of its slot): as many stages as fit in shared memory unless set."""

    def fixed_bytes(self) -> int:
        """Shared memory outside the slot ring (none unless a config says otherwise)."""
        return 0

    def max_stages(self) -> int:
        return (SMEM_BYTES - self.fixed_bytes()) // self.stage_bytes()

    def num_stages(self) -> int:
        return self.stages if self.stages is not None else self.max_stages()

    def slot_name(self) -> str:
        """What the slot size depends on, for the error message."""
        return f"tile_n={self.tile_n}"

    def check_stages(self) -> None:
        if self.stages is not None and not 2 <= self.stages <= self.max_stages():
            raise ValueError(f"stages must be in [2, {self.max_stages()}] for {self.slot_name()}, got {self.stages}")


class WideItems:
    """A config's ``wide`` field (a frozen dataclass's): work items of two 128-column halves side
    by side, their B tiles in one slot (the blockwise GEMM and weight gradient; N % 256 == 0)."""

    @property
    def halves(self) -> int:
        """128-column halves of a work item: its B tiles a slot."""
        return 2 if self.wide else 1

    @property
    def tile_n(self) -> int:  # for StagedConfig's messages
        return 128 * self.halves


@cute.jit
def cta_roles(tma_atoms: tuple):
    """(tidx, bidx, grid, warp_idx, warpgroup) of this thread, the last two warp-uniform; warp 0
    prefetches the TMA descriptors of ``tma_atoms``."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    grid, _, _ = cute.arch.grid_dim()
    warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    warpgroup = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
    if warp_idx == 0:
        for atom in cutlass.range_constexpr(len(tma_atoms)):
            cute.nvgpu.cpasync.prefetch_descriptor(tma_atoms[atom])
    return tidx, bidx, grid, warp_idx, warpgroup


def slot_tensors(storage, a_smem_layout: cute.ComposedLayout, b_smem_layout: cute.ComposedLayout,
                 b_tiles_per_slot: int = 1, a_dtype=BFloat16, b_dtype=BFloat16):
    """(sA, sB, stage_bytes): the staged A and B tiles of ``storage`` (fields ``sA``, ``sB``) and
    the TMA bytes that fill one slot (its A tile of ``a_dtype`` and ``b_tiles_per_slot`` B tiles of
    ``b_dtype``: the full barrier's transaction count, which must be exactly what TMA delivers, or
    the slot never completes)."""
    sA = storage.sA.get_tensor(a_smem_layout.outer, swizzle=a_smem_layout.inner)
    sB = storage.sB.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner)
    stage_bytes = (cute.size_in_bytes(a_dtype, cute.slice_(a_smem_layout, (None, None, 0)))
                   + b_tiles_per_slot * cute.size_in_bytes(b_dtype, cute.slice_(b_smem_layout, (None, None, 0))))
    return sA, sB, stage_bytes


def smem_array(dtype, elements: int, align: int = 1024):
    """A shared-memory field of ``elements`` values of ``dtype`` at an ``align``-byte boundary
    (1024: the period of the 128B swizzle, which TMA and wgmma address from the buffer's base)."""
    return cute.struct.Align[cute.struct.MemRange[dtype, elements], align]


def mainloop_fields(stages: int, a_smem_layout: cute.ComposedLayout, b_smem_layout: cute.ComposedLayout,
                    a_dtype=BFloat16, b_dtype=BFloat16) -> dict:
    """The first fields of a kernel's ``shared_storage``: the full and empty mbarriers of the
    slots, then the staged A and B tiles (``slot_tensors``). A kernel adds its own after them
    (more B tiles, epilogue buffers)."""
    fields = dict(pipeline_barriers=cute.struct.MemRange[cutlass.Int64, stages * 2])  # full, empty
    fields["sA"] = smem_array(a_dtype, cute.cosize(a_smem_layout))
    fields["sB"] = smem_array(b_dtype, cute.cosize(b_smem_layout))
    return fields


def shared_storage(fields: dict):
    """A ``cute.struct`` of ``fields`` (name -> MemRange / Align annotation, in order): the shared
    memory of a kernel whose optional parts (more B tiles, an epilogue's buffers) come and go
    with its config."""
    return cute.struct(type("SharedStorage", (), {"__annotations__": dict(fields)}))


def launch(kernel, num_ctas: Int32, threads: int, stream, cluster: int = 1) -> None:
    """Launch ``kernel`` (a ``@cute.kernel`` applied to its arguments) over ``num_ctas`` persistent
    CTAs of ``threads``: one CTA an SM (its shared memory and registers), in clusters of
    ``cluster`` consecutive CTAs (``num_ctas`` a multiple of it)."""
    kernel.launch(grid=[num_ctas, 1, 1], block=[threads, 1, 1], cluster=[cluster, 1, 1], min_blocks_per_mp=1,
                  stream=stream)


class MainloopOperands:
    """Host-side pieces of the mainloop (built inside the ``@cute.jit`` host function): the tiled
    MMA, the staged smem layouts of A and of one B tile, and the TMA atoms + coordinate tensors of
    A (T, K) and B (N, K, E)."""

    def __init__(self, tiled_mma, a_smem_layout, b_smem_layout, tma_atom_a, tma_a, tma_atom_b, tma_b):
        self.tiled_mma = tiled_mma
        self.a_smem_layout = a_smem_layout
        self.b_smem_layout = b_smem_layout
        self.tma_atom_a, self.tma_a = tma_atom_a, tma_a
        self.tma_atom_b, self.tma_b = tma_atom_b, tma_b


def b_is_k_major(name: str, b: torch.Tensor) -> bool:
    """True for a K-major B (E, N, K), False for N-major; raises for layouts TMA cannot read."""
    _, s_n, s_k = b.stride()
    aligned = lambda *values: all(v % ELEMENT_ALIGN == 0 for v in values)  # noqa: E731
    if s_k == 1 and aligned(b.stride(0), s_n):
        return True
    if s_n == 1 and aligned(b.stride(0), s_k):
        return False
    raise ValueError(f"{name} (E, N, K) must be K-major (strides (., K', 1)) or N-major (strides (., 1, N')) with "
                     f"the other strides multiples of {ELEMENT_ALIGN}, got strides {b.stride()}")


def make_mainloop_operands(mA: cute.Tensor, mB: cute.Tensor, tile_n: int, stages: int,
                           atom_layout_mnk: tuple[int, int, int], cluster: int = 1) -> MainloopOperands:
    """Tiles (128, tile_n, 64) of A (T, K) and B (E, N, K), B read as the (N, K, E) tensor of the
    dense Hopper GEMMs (L = experts: ``b_tiles``' coordinates); the tiled MMA covers (64 *
    atom_layout_mnk[0], tile_n) per call (one m64 wgmma per consumer warpgroup and repeated over
    the tile's remaining rows). ``cluster``: B's TMA multicast to that many CTAs (``make_b_tma``)."""
    mB_nke = _nke(mB)
    tile_shape_mnk = (TILE_M, tile_n, TILE_K)
    a_layout = utils.LayoutEnum.from_tensor(mA)
    b_layout = utils.LayoutEnum.from_tensor(mB_nke)
    tiled_mma = sm90_utils.make_trivial_tiled_mma(
        BFloat16, BFloat16, a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(), Float32,
        atom_layout_mnk, tiler_mn=(64, tile_n),
    )
    a_smem_layout = sm90_utils.make_smem_layout_a(a_layout, tile_shape_mnk, BFloat16, stages)
    b_smem_layout = sm90_utils.make_smem_layout_b(b_layout, tile_shape_mnk, BFloat16, stages)
    tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
        cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mA, cute.slice_(a_smem_layout, (None, None, 0)),
        (TILE_M, TILE_K),
    )
    tma_atom_b, tma_b = make_b_tma(mB, b_smem_layout, tile_n, cluster)
    return MainloopOperands(tiled_mma, a_smem_layout, b_smem_layout, tma_atom_a, tma_a, tma_atom_b, tma_b)


def _nke(mB: cute.Tensor) -> cute.Tensor:
    """B (E, N, K) as the (N, K, E) tensor of the dense Hopper GEMMs (L = experts)."""
    return cute.make_tensor(mB.iterator, cute.select(mB.layout, mode=[1, 2, 0]))


def make_b_tma(mB: cute.Tensor, b_smem_layout: cute.ComposedLayout, tile_n: int, cluster: int = 1):
    """(TMA atom, TMA coordinates (N, K, E)) of B (E, N, K) into ``b_smem_layout``'s (tile_n, 64)
    tiles. A second B of a K split (``KSplit``) gets its own from here, into the same slots. With
    ``cluster`` > 1 the atom multicasts (``multicast_load_op``)."""
    return cute.nvgpu.cpasync.make_tiled_tma_atom(multicast_load_op(cluster), _nke(mB),
                                                  cute.slice_(b_smem_layout, (None, None, 0)), (tile_n, TILE_K),
                                                  num_multicast=cluster)


def make_mainloop_pipeline(barrier_ptr, stages: int, consumer_warpgroups: int, stage_bytes: int, cluster: int = 1):
    """full[s]: armed by the producer with the slot's TMA bytes; empty[s]: one arrive per consumer
    warp once its wgmmas reading slot s completed, from every CTA of the ``cluster`` (a CTA's
    producer may write its B share into its peers' slot s: ``PairedTile``; lane r of a consumer warp
    arrives on CTA r's barrier). Initializes the mbarriers and syncs the CTA (the cluster)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barrier_ptr,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warpgroups * 4 * cluster),
        tx_count=stage_bytes,
        cta_layout_vmnk=cute.make_layout((1, cluster, 1, 1)),
    )


def consumer_states(stages: int):
    """(read_state, release_state): a consumer's next slot to wait for and next slot to release."""
    return (pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages),
            pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages))


def a_tiles(tma_atom_a: cute.CopyAtom, mA: cute.Tensor, sA: cute.Tensor, first_row: Int32, first_col=0):
    """(tAsA, tAgA): TMA partitions of the (128, 64) k-tiles of A from row ``first_row`` (an
    expert's row, not tile-aligned) and column ``first_col``: ((TMA), stages) and ((TMA), RestK)."""
    gA = cute.local_tile(cute.domain_offset((first_row, first_col), mA), (TILE_M, TILE_K), (0, None))
    return cute.nvgpu.cpasync.tma_partition(
        tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))


def b_tiles(tma_atom_b: cute.CopyAtom, mB: cute.Tensor, sB: cute.Tensor, tile_n: int, row_offset=0,
            cluster: int = 1):
    """(tma_atom_b, tBsB, tBgB): the TMA partitions of the (tile_n, 64) tiles of B (N, K, E) whose
    rows start at ``row_offset`` + n_tile * tile_n, ((TMA), stages) and ((TMA), RestN, RestK, E),
    with the atom that loads them (a B part of ``produce_token_items``). With ``cluster`` > 1
    (a multicast atom, ``make_b_tma``), tBsB and tBgB are tuples of the tile's ``cluster`` shares."""
    if isinstance(row_offset, int) and row_offset == 0:
        source = mB
    else:
        source = cute.domain_offset((row_offset, 0, 0), mB)
    gB = cute.local_tile(source, (tile_n, TILE_K), (None, None, None))
    return (tma_atom_b, *tile_shares(tma_atom_b, sB, gB, cluster))


@cute.jit
def produce_k_tiles(mainloop, state, k_tiles: Int32, tma_atom_a: cute.CopyAtom, tAgA: cute.Tensor,
                    tAsA: cute.Tensor, b_loads: tuple, pair: PairedTile | None = None):
    """TMA loads of one work item's k-tiles: per slot, A's k-tile and every tile of ``b_loads``
    ((TMA atom, tBgB of the item: ((TMA), RestK), tBsB) triples), all on the slot's full barrier;
    a triple of shares (tuples, ``tile_shares`` in a cluster) by shares as ``pair`` says, the others
    (the CTA's own: scale boxes) plainly. Returns the advanced producer state."""
    for k_tile in range(k_tiles):
        mainloop.producer_acquire(state)
        barrier = mainloop.producer_get_barrier(state)
        cute.copy(tma_atom_a, tAgA[(None, k_tile)], tAsA[(None, state.index)], tma_bar_ptr=barrier)
        for b in cutlass.range_constexpr(len(b_loads)):
            load_tile(*b_loads[b], k_tile, state.index, barrier, pair)
        mainloop.producer_commit(state)  # a no-op: TMA completes the transaction
        state.advance()
    return state


@cute.jit
def produce_token_items(mainloop, stages: cutlass.Constexpr, items: TokenItems, item: Int32, step: Int32,
                        k_tiles: Int32, tma_atom_a: cute.CopyAtom, mA: cute.Tensor, sA: cute.Tensor,
                        b_parts: tuple, k_split: KSplit | None = None, cluster: cutlass.Constexpr = 1):
    """The producer warp of a token-row kernel: for its CTA's work items (``item``, ``item +
    step``, ...), the TMA loads of every k-tile (``produce_k_tiles``): A at the expert's first row,
    and per B part of ``b_parts`` (``b_tiles``) the expert's B tile of the item's n-tile.
    With ``k_split`` (B given as two tensors side by side along K), the first ``k_split.k_tiles``
    k-tiles read A from column 0 and ``b_parts``, the rest A from column ``k_split.k0`` and
    ``k_split.b_parts``. With ``cluster`` 2, B by ``PairedTile`` (``b_parts`` from ``b_tiles`` with the
    cluster). Then waits until the consumers freed every slot."""
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
    while item < items.count:
        g, _, n_tile, first_row, _ = items.tile(item)
        pair = PairedTile.of(items, item, g, n_tile) if const_expr(cluster == 2) else None
        tAsA, tAgA = a_tiles(tma_atom_a, mA, sA, first_row)
        if const_expr(k_split is None):
            state = produce_k_tiles(mainloop, state, k_tiles, tma_atom_a, tAgA, tAsA, _item_loads(b_parts, n_tile, g),
                                    pair)
        else:
            state = produce_k_tiles(mainloop, state, k_split.k_tiles, tma_atom_a, tAgA, tAsA,
                                    _item_loads(b_parts, n_tile, g), pair)
            tAsA, tAgA = a_tiles(tma_atom_a, mA, sA, first_row, k_split.k0)
            state = produce_k_tiles(mainloop, state, k_tiles - k_split.k_tiles, tma_atom_a, tAgA, tAsA,
                                    _item_loads(k_split.b_parts, n_tile, g), pair)
        item += step
    mainloop.producer_tail(state)


def _item_loads(b_parts: tuple, n_tile: Int32, g: Int32) -> tuple:
    """``produce_k_tiles``' B loads of an item: each B part's tiles of n-tile ``n_tile``, expert ``g``
    (of each share, in a cluster)."""
    return tuple((atom, item_tiles(tBgB, (None, n_tile, None, g)), tBsB) for atom, tBsB, tBgB in b_parts)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class KSplit:
    """B given as two tensors side by side along K (W1^T's gate and up stored apart, FC1 dgrad):
    A's columns [0, k0) meet the first B, the rest the second (its ``b_parts``, ``b_tiles``).
    ``k_tiles``: the first part's, ceil(k0 / 64); where k0 is not a multiple of 64 its last k-tile
    reads A's columns past k0 against B's zero fill (TMA's, past the first tensor's K), which adds
    exact zeros for finite A, and the k16 steps of the products that count are those of one B
    (k0 is a multiple of 16): the same sums."""

    k0: Int32
    k_tiles: Int32
    b_parts: tuple

    @staticmethod
    def of(mB: cute.Tensor, b_parts: tuple) -> KSplit:
        """The split after a first B whose TMA coordinates ``mB`` are (N, k0, E)."""
        k0 = mB.shape[1]
        return KSplit(k0, (k0 + TILE_K - 1) // TILE_K, b_parts)


@cute.jit
def consumer_fragments(tiled_mma: cute.TiledMma, warpgroup: Int32, sA: cute.Tensor, sBs: tuple):
    """A/B smem descriptors of consumer warpgroup ``warpgroup`` (1, 2, ...): tCrA (MMA, MMA_M,
    MMA_K, stages) and one tCrB per smem B tile of ``sBs``."""
    thr_mma_wg = tiled_mma.get_slice((warpgroup - 1) * THREADS_PER_WARPGROUP)
    tCrA = tiled_mma.make_fragment_A(thr_mma_wg.partition_A(sA))
    return tCrA, tuple(tiled_mma.make_fragment_B(thr_mma_wg.partition_B(sB)) for sB in sBs)


@cute.jit
def mma_k_tiles(tiled_mma: cute.TiledMma, mainloop, read_state, release_state, k_tiles: Int32, tCrA: cute.Tensor,
                operands: tuple):
    """One work item's mainloop: acc = sum over k-tiles of A_k B_k^T for every (acc, tCrB) of
    ``operands`` (the first k-block overwrites). Keeps one k-tile of wgmmas in flight; a slot is
    released once the wgmmas that read it are complete (wait_group(1) after committing the next
    k-tile). Returns (tiled_mma, read_state, release_state): the caller rebinds all three, so the
    tracer carries them (the MMA's ACCUMULATE field and the states) across its work-item loop."""
    k_blocks = cute.size(tCrA, mode=[2])
    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
    cute.nvgpu.warpgroup.fence()
    mainloop.consumer_wait(read_state)
    for k_block in cutlass.range_constexpr(k_blocks):
        slot = (None, None, k_block, read_state.index)
        for o in cutlass.range_constexpr(len(operands)):
            cute.gemm(tiled_mma, operands[o][0], tCrA[slot], operands[o][1][slot], operands[o][0])
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    cute.nvgpu.warpgroup.commit_group()
    read_state.advance()
    for k_tile in range(1, k_tiles):
        mainloop.consumer_wait(read_state)
        for k_block in cutlass.range_constexpr(k_blocks):
            slot = (None, None, k_block, read_state.index)
            for o in cutlass.range_constexpr(len(operands)):
                cute.gemm(tiled_mma, operands[o][0], tCrA[slot], operands[o][1][slot], operands[o][0])
        cute.nvgpu.warpgroup.commit_group()
        cute.nvgpu.warpgroup.wait_group(1)
        mainloop.consumer_release(release_state)
        release_state.advance()
        read_state.advance()
    cute.nvgpu.warpgroup.wait_group(0)
    mainloop.consumer_release(release_state)
    release_state.advance()
    return tiled_mma, read_state, release_state
