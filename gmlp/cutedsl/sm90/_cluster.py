"""Clusters of two CTAs that share a tile: each loads half of it and multicasts it to both
(``PairedTile``), so each byte of it leaves L2 once for two CTAs.

The token-row kernels pair CTAs along M (two m-tiles, one B tile of the weights), the weight
gradients along N (two n-tiles, one A tile). What the engine does for a cluster
(``_engine.GroupedGemmEngine``): the launch's cluster dimension; each slot's empty barrier
counts the consumer warps of both CTAs (``_pipeline.make_mainloop_pipeline``: lane r of a warp
arrives on CTA r's barrier), since a CTA's producer writes its share into its peer's slot too;
a cluster barrier before exit. What it asks of a site's work: both CTAs of a pair walk the same
slots in the same order, so a pair's two items must have as many k-tiles and there must be an
even number of items (``_schedule.TokenItems`` and ``ExpertTiles`` pad with *shadow* items that
run a mainloop and store nothing). Here: the load op, the partitions of a tile in shares, and
the loads of an item.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

__all__ = ["multicast_load_op", "tile_shares", "item_tiles", "PairedTile", "load_tile"]


def multicast_load_op(cluster: int):
    """The TMA load of the tiles a cluster of ``cluster`` CTAs shares (the token-row kernels' B,
    the weight gradient's A): plain alone, else multicast (its atom made with
    ``num_multicast=cluster`` copies a ``1 / cluster`` share of the tile; ``PairedTile``)."""
    return cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp() if cluster == 1 \
        else cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()


def tile_shares(tma_atom_b: cute.CopyAtom, sB: cute.Tensor, gB: cute.Tensor, cluster: int = 1):
    """(tBsB, tBgB): the TMA partitions of staged tiles ``sB`` and their tiled source ``gB``; with
    ``cluster`` > 1 (a multicast atom) tuples of the tile's ``cluster`` shares, each loaded by one
    CTA where a pair shares the tile (``PairedTile``)."""
    shares = [cute.nvgpu.cpasync.tma_partition(tma_atom_b, share, cute.make_layout(cluster),
                                               cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
              for share in range(cluster)]
    if cluster == 1:
        return shares[0]
    return tuple(s for s, _ in shares), tuple(g for _, g in shares)


def item_tiles(tBgB, coordinate: tuple):
    """``tBgB`` (of ``tile_shares``) at an item's ``coordinate`` (None for the k-tiles), of each share
    in a cluster."""
    return tuple(share[coordinate] for share in tBgB) if isinstance(tBgB, tuple) else tBgB[coordinate]


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class PairedTile:
    """A work item's loads of the tile a cluster of two CTAs may share (rank ``rank``; CTAs 2c and
    2c + 1 take items 2p and 2p + 1). The token-row kernels pair adjacent m-tiles along M, whose
    B tile is shared where both are of one expert and n-tile (``TokenItems.shares_b``); the weight
    gradient pairs adjacent n-tiles of one (expert, m-tile), whose A tile is always shared
    (``ExpertTiles``). Where shared, each CTA loads its half of the tile and multicasts it to both,
    so each byte leaves L2 once for two CTAs; otherwise each loads both halves itself (a mask of
    its own CTA). Both CTAs take the same decision, and each slot's full barrier receives the
    whole tile either way."""

    rank: Int32
    shared: cutlass.Boolean

    @staticmethod
    def of(items, item: Int32, g: Int32, n_tile: Int32) -> PairedTile:
        """The pair of a token-row item (``items``: its ``_schedule.TokenItems``; expert ``g``,
        n-tile ``n_tile``)."""
        rank = item % 2  # the CTA's rank in its cluster: items keep the parity of the CTA's index
        return PairedTile(rank, items.shares_b(item, rank, g, n_tile))

    @staticmethod
    def always(item: Int32) -> PairedTile:
        """The pair of a weight-gradient item, whose pair always shares its A tile (``ExpertTiles``)."""
        return PairedTile(item % 2, cutlass.Boolean(True))

    def loads(self, share: int):
        """Whether this CTA issues share ``share`` of the tile."""
        return (share == self.rank) | ~self.shared

    @property
    def mask(self):
        """The CTAs a load writes: both (shared), else this one."""
        return (Int32(1) << self.rank) | (Int32(self.shared) << (1 - self.rank))


@cute.jit
def load_tile(atom: cute.CopyAtom, tXgX, tXsX, tile: Int32, slot: Int32, barrier, pair: PairedTile | None = None):
    """TMA load of tile ``tile`` of ``tXgX`` into slot ``slot`` of ``tXsX`` on ``barrier``: plainly,
    or for partitions in shares (tuples of ``tile_shares``) the shares ``pair`` says, multicast."""
    if const_expr(not isinstance(tXgX, tuple)):
        cute.copy(atom, tXgX[(None, tile)], tXsX[(None, slot)], tma_bar_ptr=barrier)
    else:
        for share in cutlass.range_constexpr(len(tXgX)):
            if pair.loads(share):
                cute.copy(atom, tXgX[share][(None, tile)], tXsX[share][(None, slot)], tma_bar_ptr=barrier,
                          mcast_mask=pair.mask)
