"""The persistent tile schedule over experts shared by the sm_90a kernels (grouped GEMM, FC1, FC2
dgrad; ``TokenItems``).

The m-tiles are the 128-row tiles of ``gmlp.mxfp8.routing.DeviceGroups.tile_start``: m-tile ``j`` of the
layer is local tile ``j - tile_start[g]`` of the expert g with ``tile_start[g] <= j <
tile_start[g+1]``, first row ``row_start[g] + 128 * local``. Work items are ordered in bands of
``GROUP_M`` m-tiles, m fastest within a band: item ``w`` is in band ``w // (GROUP_M * n_tiles)``,
whose ``rows`` m-tiles (GROUP_M, fewer in the last band) take local item ``l`` as m-tile
``band * GROUP_M + l % rows`` and n-tile ``l // rows``. The CTAs running together then cover about
GROUP_M m-tiles x (#SMs / GROUP_M) n-tiles, so each B_g n-tile they load serves GROUP_M m-tiles
from L2 (in an n-fastest order every m-tile re-reads all of B_g: 235 MB at Mixtral's FC1,
far past the 50 MB L2). A persistent CTA b walks items b,
b + grid, ... below ``tile_start[E] * n_tiles`` (read on the device: no host sync); the grid is
``grid_size``: min(#SMs, a host bound of the items). The expert of an item is a binary search over
``tile_start`` (``SEARCH_STEPS`` dependent loads of a tiny cached array per item).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.scale_layout import SCALE_TILE_ROWS

__all__ = ["TILE_M", "GROUP_M", "SEARCH_STEPS", "MAX_EXPERTS", "expert_of_tile", "work_tile", "num_work_items",
           "TokenItems", "ExpertTiles", "grid_size", "expert_tiles_grid", "expert_count_reason", "sm_count"]

TILE_M = SCALE_TILE_ROWS  # 128: the m-tiles are those of DeviceGroups.tile_start
TILE_K = 64  # one 128-byte swizzle row of bf16 (the k-tiles of the slots)
GROUP_M = 8  # m-tiles per band of the item order (L2 reuse of B tiles; see the module docstring)
SEARCH_STEPS = 12  # binary search over tile_start: up to 2**12 experts
MAX_EXPERTS = 2**SEARCH_STEPS


@cute.jit
def expert_of_tile(mTileStart: cute.Tensor, m_tile: Int32, num_experts: Int32) -> Int32:
    """The last g < E with tile_start[g] <= m_tile: the expert owning m-tile ``m_tile`` (empty
    experts before it share its start and lose the search). Bits from the top, SEARCH_STEPS
    probes; needs E <= 2**SEARCH_STEPS."""
    g = Int32(0)
    for step in cutlass.range_constexpr(SEARCH_STEPS):
        # branch-free: the load is unconditional (clamped to tile_start[E], which exists), so
        # ptxas emits no predicated load + R2UR (an illegal instruction near TMA issue on sm_90a)
        probe = g + (1 << (SEARCH_STEPS - 1 - step))
        start = mTileStart[cutlass.min(probe, num_experts)]
        g = cutlass.select_((probe < num_experts) & (start <= m_tile), probe, g)
    return g


@cute.jit
def work_tile(mRowStart: cute.Tensor, mTileStart: cute.Tensor, item: Int32, n_tiles: Int32, num_experts: Int32):
    """(expert g, m-tile, n-tile, first row, end row) of work item ``item`` (banded order, see the
    module docstring): the tile covers rows [first_row, first_row + 128), of which those below
    end_row (the expert's end) are g's. Per-tile outputs must be indexed by m-tile, not by item."""
    band_items = GROUP_M * n_tiles
    band = item // band_items
    first_m_tile = band * GROUP_M
    rows = cutlass.min(GROUP_M, mTileStart[num_experts] - first_m_tile)
    local = item - band * band_items
    n_tile = local // rows
    m_tile = first_m_tile + (local - n_tile * rows)
    g = expert_of_tile(mTileStart, m_tile, num_experts)
    first_row = mRowStart[g] + (m_tile - mTileStart[g]) * TILE_M
    return g, m_tile, n_tile, first_row, mRowStart[g + 1]


def num_work_items(mTileStart: cute.Tensor, n_tiles: Int32) -> Int32:
    """Work items of the launch, read on the device: tile_start[E] * n_tiles."""
    return mTileStart[mTileStart.shape[0] - 1] * n_tiles


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class TokenItems:
    """The work items of one launch (built in the kernel, ``of``): the m-tiles of ``tile_start`` x
    the n-tiles of N, ``items`` of them (read on the device); ``tile(item)`` is ``work_tile``;
    every item has the same ``k_tiles`` (the contraction is the tokens' feature dimension): the
    ``tile_k``-wide k-tiles (64 bf16, 128 fp8) of each part of K (one part, or two when B is given
    as two tensors side by side along K, ``_pipeline.KSplit``). The CTAs walk items below
    ``count``: ``items`` rounded up to the ``cluster``, so that both CTAs of a pair run every pair
    of items (each slot released by both, ``_cluster.PairedTile``); the one item past ``items``, a
    *shadow*, runs the last item's mainloop again and stores nothing."""

    mRowStart: cute.Tensor
    mTileStart: cute.Tensor
    num_experts: Int32
    n_tiles: Int32
    items: Int32
    count: Int32
    k_tiles: Int32
    cluster: int = 1

    @staticmethod
    def of(mRowStart: cute.Tensor, mTileStart: cute.Tensor, n: Int32, tile_n: int, k_parts: tuple,
           tile_k: int = TILE_K, cluster: int = 1) -> TokenItems:
        num_experts = mTileStart.shape[0] - 1
        n_tiles = (n + tile_n - 1) // tile_n
        items = num_work_items(mTileStart, n_tiles)
        count = items if cluster == 1 else (items + cluster - 1) // cluster * cluster
        k_tiles = (k_parts[0] + tile_k - 1) // tile_k
        for part in k_parts[1:]:
            k_tiles = k_tiles + (part + tile_k - 1) // tile_k
        return TokenItems(mRowStart, mTileStart, num_experts, n_tiles, items, count, k_tiles, cluster)

    def tile(self, item: Int32):
        """``work_tile`` of ``item`` (of the last item for a shadow)."""
        if self.cluster > 1:
            item = cutlass.min(item, self.items - 1)
        return work_tile(self.mRowStart, self.mTileStart, item, self.n_tiles, self.num_experts)

    def stores(self, item: Int32):
        """Whether ``item`` is one (not a shadow): its epilogue runs."""
        return item < self.items

    @cute.jit
    def shares_b(self, item: Int32, rank: Int32, g: Int32, n_tile: Int32):
        """Whether item ``item`` (expert ``g``, n-tile ``n_tile``, of the CTA of rank ``rank`` in a
        cluster of two) and its pair's other item (item + 1 for rank 0, item - 1 for rank 1) read
        the same B tile: neither is a shadow, and both have the same expert and n-tile. In the
        banded order the two are adjacent m-tiles of one n-tile where a band has an even number of
        m-tiles (all but maybe the last), of one expert unless its last m-tile is the first of the
        pair."""
        other = item + 1 - 2 * rank
        other_g, _, other_n_tile, _, _ = self.tile(other)
        return (cutlass.max(item, other) < self.items) & (other_g == g) & (other_n_tile == n_tile)


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class ExpertTiles:
    """The work items of a weight gradient (built in the kernel, ``of``): the output tiles (expert
    g, m-tile, n-tile) of the E experts' (M, N) results, item ``(g * m_tiles + m_tile) * n_slots +
    n_tile`` (n fastest: CTAs running together share expert g's A panel), a host-known count (no
    tile search). The contraction is the expert's tokens, from ``mStart[g]`` to ``mStart[g + 1]``
    (token rows, or 128-token blocks of the FP8 recipe): ``tile(item)`` is (g, m-tile, n-tile,
    first, extent, k-tiles), ceil(extent / k_tile) k-tiles (none for an empty expert). ``n_slots``
    is the n-tiles rounded up to the ``cluster``: in a cluster of two, items 2p and 2p + 1 are
    adjacent n-tiles of one (expert, m-tile), so they share its A tile and run the same k-tiles
    (``_cluster.PairedTile``); an odd row's extra slot is a *shadow* (its last n-tile's mainloop
    again, no epilogue)."""

    mStart: cute.Tensor
    n_tiles: Int32
    n_slots: Int32
    tiles_per_expert: Int32
    count: Int32
    k_tile: int
    cluster: int = 1

    @staticmethod
    def of(mStart: cute.Tensor, num_experts: Int32, m: Int32, n: Int32, tile_m: int, tile_n: int,
           k_tile: int = TILE_K, cluster: int = 1) -> ExpertTiles:
        m_tiles = (m + tile_m - 1) // tile_m
        n_tiles = (n + tile_n - 1) // tile_n
        n_slots = n_tiles if cluster == 1 else (n_tiles + cluster - 1) // cluster * cluster
        tiles_per_expert = m_tiles * n_slots
        return ExpertTiles(mStart, n_tiles, n_slots, tiles_per_expert, num_experts * tiles_per_expert, k_tile,
                           cluster)

    def tile(self, item: Int32):
        g = item // self.tiles_per_expert
        rest = item - g * self.tiles_per_expert
        m_tile = rest // self.n_slots
        n_tile = rest - m_tile * self.n_slots
        if self.cluster > 1:
            n_tile = cutlass.min(n_tile, self.n_tiles - 1)  # a shadow: its row's last n-tile
        first = self.mStart[g]
        extent = self.mStart[g + 1] - first
        return g, m_tile, n_tile, first, extent, self.k_tiles(extent)

    def stores(self, item: Int32):
        """Whether ``item`` is one (not a shadow): its epilogue runs."""
        rest = item - item // self.tiles_per_expert * self.tiles_per_expert
        return rest - rest // self.n_slots * self.n_slots < self.n_tiles

    def k_tiles(self, extent: Int32) -> Int32:
        return extent if self.k_tile == 1 else (extent + self.k_tile - 1) // self.k_tile


def expert_tiles_grid(experts: int, m_tiles: int, n_tiles: int, device: torch.device, cluster: int = 1) -> int:
    """Persistent CTAs of a weight gradient: min(#SMs, its ``ExpertTiles`` items, each row of
    n-tiles padded to the cluster), in whole clusters; 0: nothing to do."""
    items = experts * m_tiles * -(-n_tiles // cluster) * cluster
    sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return min(items, sms // cluster * cluster)


def expert_count_reason(num_experts: int) -> Reason | None:
    """None if the expert search covers E experts, else why not."""
    if not 0 < num_experts <= MAX_EXPERTS:
        return Reason(ReasonKind.SHAPE, f"E={num_experts} outside [1, {MAX_EXPERTS}] (the expert search's depth)")
    return None


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def grid_size(tokens: int, num_experts: int, n_tiles: int, device: torch.device, cluster: int = 1) -> int:
    """Persistent CTAs of a launch: min(#SMs, a host bound of the work items), in whole clusters of
    ``cluster`` CTAs; 0: nothing to do (a TMA descriptor needs T >= 1, so T = 0 launches nothing)."""
    items = scale_layout.max_row_tiles(tokens, num_experts) * n_tiles
    if items <= 0 or tokens <= 0:
        return 0
    sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return min(-(-items // cluster), sms // cluster) * cluster
