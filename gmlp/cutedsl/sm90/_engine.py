"""The SM90 grouped-GEMM engine: the one kernel skeleton every sm_90a kernel of this package runs.

A kernel is a *site* (a GEMM of the layer in one recipe) declared as a subclass of
``GroupedGemmEngine``; the skeleton is ``GroupedGemmEngine.kernel``, the same for all:

- roles: warp 0 of warpgroup 0 is the TMA producer (the warpgroup's registers lowered with
  ``setmaxnreg``); the consumer warpgroups (registers raised) share each work item's tile, a
  cooperative schedule: one issues its ``wgmma``s over all 128 rows, or two 64 rows each, and
  they run its epilogue together; one persistent CTA an SM (``_pipeline.launch``), alone or in
  clusters of two along M (a config's ``cluster``: the pair's B tiles multicast where their items
  share one, ``_cluster.PairedTile``; the slots' empty barriers count both CTAs' consumers, and
  the CTAs leave together through a cluster barrier);
- the slot ring: ``stages`` shared-memory slots behind full/empty mbarriers
  (``_pipeline.make_mainloop_pipeline``), the producer running ahead across work items;
- the work-item loop: the site's work (``TokenItems`` over ragged expert rows, or expert tiles
  over a ragged K) walked from the CTA's index in steps of the grid, a count of the TMA-store
  bulk groups carried across items (``_store``: the store buffers' ring continues across tiles).

What a site plugs in (the hooks below, each a short method of the site's class):

- host: its ``__call__`` builds the TMA atoms and the kernel's arguments (a ``NamedTuple`` of the
  site, ``Args``) and calls ``launch_engine`` with its shared-memory fields;
- ``tma_atoms(args)``: the descriptors warp 0 prefetches;
- ``slots(storage, args, a_smem_layout, b_smem_layout)``: the ``Slots`` of the ring (the staged A
  tile, the B tiles of a slot, any scale boxes, and the bytes TMA delivers into one slot: the full
  barrier's transaction count);
- ``work(args)``: the work items (``count``, ``tile(item)``, ``stores(item)``);
- the operand policy: ``produce`` (the producer warp's loads) and ``mainloop`` (the consumer's
  k-loop: bf16 ``_pipeline.mma_k_tiles`` by default, FP8 with promotion, a ragged K);
- the epilogue: ``consumer_setup`` (per-thread state built once: fragments' coordinates,
  accumulators, the TMA store), ``before_mainloop`` (what a tile loads ahead of its mainloop),
  ``epilogue`` (the tile's outputs; returns the carried store count) and ``finish`` (drain).
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Int32, const_expr

from gmlp.cutedsl.sm90 import _store
from gmlp.cutedsl.sm90._pipeline import (CONSUMER_REGISTERS, PRODUCER_REGISTERS, THREADS_PER_WARPGROUP,
                                         consumer_fragments, consumer_states, cta_roles, launch, make_mainloop_pipeline,
                                         mma_k_tiles, register_split, shared_storage, slot_tensors)

__all__ = ["Slots", "GroupedGemmEngine"]


class Slots(NamedTuple):
    """The staged tiles of the slot ring (a site's ``slots``)."""

    sA: cute.Tensor  # (BM, BK, stages)
    sBs: tuple  # the B tiles a slot holds, each (BN, BK, stages)
    stage_bytes: int  # what TMA delivers into one slot: the full barrier's transaction count
    scales: tuple = ()  # FP8 policies: the scale boxes staged beside the tiles


class GroupedGemmEngine:
    """The kernel skeleton (see the module docstring). A site's ``__init__`` calls
    ``setup_engine``; its ``__call__`` calls ``launch_engine``; the device side is ``kernel``,
    which calls the site's hooks."""

    def setup_engine(self, config, mma_warpgroups: int, *, cluster: int = 1,
                     registers: tuple[int, int] = (PRODUCER_REGISTERS, CONSUMER_REGISTERS)) -> None:
        """The skeleton's constants of a config: ``mma_warpgroups`` consumer warpgroups share a
        tile's wgmmas (1 or 2: the tiled MMA's M extent over 64); ``cluster`` CTAs a cluster
        (checked by the config, ``launch_options.check_cluster``; the site's producer multicasts B
        by ``_cluster.PairedTile``); ``registers`` the (producer, consumer) ``setmaxnreg`` counts,
        checked against the launch's."""
        self.config = config
        self.stages = config.num_stages()
        self.mma_warpgroups = mma_warpgroups
        self.cluster = cluster
        self.threads = (1 + mma_warpgroups) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads, *registers)

    def launch_engine(self, args: tuple, fields: dict, tiled_mma: cute.TiledMma, a_smem_layout: cute.ComposedLayout,
                      b_smem_layout: cute.ComposedLayout, num_ctas: Int32, stream) -> None:
        """Launch ``kernel`` on the site's arguments over ``num_ctas`` persistent CTAs (a multiple
        of the cluster); ``fields`` the shared memory (``_pipeline.mainloop_fields`` and the site's
        own, in order)."""
        self.shared_storage = shared_storage(fields)
        launch(self.kernel(args, tiled_mma, a_smem_layout, b_smem_layout), num_ctas, self.threads, stream,
               self.cluster)

    @cute.kernel
    def kernel(self, args: tuple, tiled_mma: cute.TiledMma, a_smem_layout: cute.ComposedLayout,
               b_smem_layout: cute.ComposedLayout):
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles(self.tma_atoms(args))
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        slots = self.slots(storage, args, a_smem_layout, b_smem_layout)
        # a slot is released by the warpgroups that read it: those sharing a tile
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages, self.mma_warpgroups,
                                          slots.stage_bytes, self.cluster)
        work = self.work(args)

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every k-tile of this CTA's items
            self.produce(mainloop, work, bidx, grid, args, slots)

        if warpgroup > 0:  # consumers: mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            # the tiled MMA spans the consumer warpgroups (MMA warpgroups 1, 2, ...; threads from 0)
            mma_tidx = tidx - THREADS_PER_WARPGROUP
            tCrA, tCrBs = consumer_fragments(tiled_mma, warpgroup, slots.sA, slots.sBs)
            consumer = self.consumer_setup(args, storage, tiled_mma, mma_tidx, warp_idx, slots, tCrA, tCrBs)
            read_state, release_state = consumer_states(self.stages)
            stores = Int32(0)  # TMA-store bulk groups (or tiles) committed so far: the store ring's position

            item = bidx
            while item < work.count:
                tile = work.tile(item)
                ahead = self.before_mainloop(consumer, args, tile)
                tiled_mma, read_state, release_state = self.mainloop(consumer, args, tiled_mma, mainloop, read_state,
                                                                     release_state, work, tile)
                if const_expr(self.cluster == 1):
                    stores = self.epilogue(consumer, args, tile, ahead, stores)
                elif work.stores(item):  # not a shadow (TokenItems, ExpertTiles)
                    stores = self.epilogue(consumer, args, tile, ahead, stores)
                item += grid
            self.finish(consumer, args, work, bidx, grid)
        if const_expr(self.cluster > 1):
            # every thread of both CTAs: neither leaves while its peer's consumers may still
            # arrive on its empty barriers (or its producer's multicast be in flight)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    # --- default hooks: one bf16 A and B tile a slot, the bf16 mainloop of token-row sites;
    # nothing ahead, nothing to drain ---

    def slots(self, storage, args: tuple, a_smem_layout: cute.ComposedLayout,
              b_smem_layout: cute.ComposedLayout) -> Slots:
        """One bf16 A tile and one bf16 B tile a slot (``_pipeline.slot_tensors``; zero-filled
        rows count in the slot's bytes too)."""
        sA, sB, stage_bytes = slot_tensors(storage, a_smem_layout, b_smem_layout)
        return Slots(sA, (sB,), stage_bytes)

    def before_mainloop(self, consumer, args: tuple, tile: tuple):
        """What the epilogue of ``tile`` loads ahead of the mainloop (default: nothing)."""
        return None

    @cute.jit
    def mainloop(self, consumer, args: tuple, tiled_mma: cute.TiledMma, mainloop, read_state, release_state, work,
                 tile: tuple):
        """One item's k-loop (default: ``mma_k_tiles`` of ``consumer.operands``, ``work.k_tiles``
        k-tiles); returns (tiled_mma, read_state, release_state)."""
        return mma_k_tiles(tiled_mma, mainloop, read_state, release_state, work.k_tiles, consumer.tCrA,
                           consumer.operands)

    def tile_store(self, storage, smem_layout: cute.ComposedLayout, tiled_mma: cute.TiledMma, acc: cute.Tensor,
                   mma_tidx: Int32, warp_idx: Int32, dtype=BFloat16, outputs: int = 1) -> _store.TileStore:
        """This consumer thread's TMA-store epilogue over the site's ``sD`` buffers (built by
        ``_store.make_store_operands``): one ring for the warpgroups sharing a tile, stored by the
        first consumer warp."""
        sD = storage.sD.get_tensor(smem_layout.outer, swizzle=smem_layout.inner)
        return _store.TileStore.of(tiled_mma, acc, sD, mma_tidx, self.mma_warpgroups * THREADS_PER_WARPGROUP,
                                   _store.epi_tile(self.mma_warpgroups, dtype), warp_idx == THREADS_PER_WARPGROUP // 32,
                                   dtype, outputs)

    def finish(self, consumer, args: tuple, work, bidx: Int32, grid: Int32) -> None:
        """After the CTA's last item (default: drain the TMA stores, if the site's consumer record
        has a ``tile_store``)."""
        tile_store = getattr(consumer, "tile_store", None)
        if const_expr(tile_store is not None):
            tile_store.drain()
