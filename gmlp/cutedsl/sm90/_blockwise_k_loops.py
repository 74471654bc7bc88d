"""The consumer k-loops of the promoted mainloop (``_blockwise_mainloop``): per k-tile and half,
four k=32 fp8 ``wgmma`` into a fresh fp32 fragment ``partial``, then the promotion ``acc += (sa *
sb) * partial`` in registers, in k order.

- ``promoted_k_tiles`` (the default): one ``partial``; per k-tile and half the wgmmas,
  ``wait_group(0)``, the promotion. The tensor pipe idles while a k-tile is promoted: the next
  k-tile's wgmmas are issued after it.
- ``pipelined_k_tiles`` (one half only, the configs' ``pipelined``): two partials, DeepGEMM's
  structure. k-tile k's wgmmas go into partial k % 2, then ``wait_group(1)`` (k - 1's done, k's
  running) and k - 1's promotion runs beside k's wgmmas. The same products, the same promotions
  in the same order: the bytes of ``promoted_k_tiles``. The loop is unrolled by two (register
  fragments are indexed statically), an even count's last k-tile after it. Registers: acc and two
  partials are 192 of a consumer thread's 232; two halves would need 320.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

__all__ = ["promoted_k_tiles", "pipelined_k_tiles"]


@cute.jit
def promoted_k_tiles(tiled_mma: cute.TiledMma, mainloop, read_state, k_tiles: Int32, tCrA: cute.Tensor,
                     tCrBs: list, accs: list, partial: cute.Tensor, sAScale: cute.Tensor, mBScale: cute.Tensor,
                     g: Int32, rows_b: tuple, box_rows: tuple):
    """One work item's promoted mainloop into ``accs`` (one fragment a half, overwritten):
    ``rows_b`` the halves' weight tile rows (``BRows.of``), ``box_rows`` the thread's two
    accumulator rows in the slots' A scale boxes. Returns (tiled_mma, read_state): the caller
    rebinds both, so the tracer carries them (the MMA's ACCUMULATE field and the state) across its
    work-item loop."""
    halves = len(accs)
    for h in cutlass.range_constexpr(halves):
        accs[h].fill(0.0)
    # the B scales of k-tile 0, then each k-tile's next ones loaded while its wgmmas run (the
    # second repeats the first with one half)
    b_scale0, b_scale1 = _b_scales(mBScale, g, rows_b, halves, Int32(0))
    for k_tile in range(k_tiles):
        mainloop.consumer_wait(read_state)
        a_scales = _a_scales(sAScale, box_rows, read_state.index)
        for h in cutlass.range_constexpr(halves):
            tiled_mma = _k_tile_wgmmas(tiled_mma, tCrA, tCrBs[h], partial, read_state.index)
            if const_expr(h == halves - 1):
                next_b_scale0, next_b_scale1 = b_scale0, b_scale1
                if k_tile + 1 < k_tiles:
                    next_b_scale0, next_b_scale1 = _b_scales(mBScale, g, rows_b, halves, k_tile + 1)
            cute.nvgpu.warpgroup.wait_group(0)
            if const_expr(h == halves - 1):
                mainloop.consumer_release(read_state)
                read_state.advance()
            _promote(accs[h], partial, a_scales, b_scale0 if h == 0 else b_scale1)
        b_scale0, b_scale1 = next_b_scale0, next_b_scale1
    return tiled_mma, read_state


@cute.jit
def pipelined_k_tiles(tiled_mma: cute.TiledMma, mainloop, read_state, release_state, k_tiles: Int32,
                      tCrA: cute.Tensor, tCrB: cute.Tensor, acc: cute.Tensor, partials: tuple, sAScale: cute.Tensor,
                      mBScale: cute.Tensor, g: Int32, row_b: Int32, box_rows: tuple):
    """One work item's pipelined mainloop (one half, ``k_tiles`` >= 1) into ``acc`` (overwritten),
    through the two fragments ``partials``; ``row_b`` the half's weight tile row, ``box_rows`` as
    in ``promoted_k_tiles``. A slot is released once its wgmmas are done: ``release_state``
    follows ``read_state`` one k-tile behind and meets it at the item's end. Returns (tiled_mma,
    read_state, release_state), all three rebound by the caller (see ``promoted_k_tiles``)."""
    acc.fill(0.0)
    mainloop.consumer_wait(read_state)
    a_scales = _a_scales(sAScale, box_rows, read_state.index)
    tiled_mma = _k_tile_wgmmas(tiled_mma, tCrA, tCrB, partials[0], read_state.index)
    read_state.advance()
    b_scale = mBScale[g, row_b, 0]
    operands = (mainloop, tCrA, tCrB, acc, sAScale, mBScale, g, row_b, box_rows)
    for k_tile in range(1, k_tiles - 1, 2):  # k-tiles k into partials[1] and k + 1 into partials[0]
        tiled_mma, read_state, release_state, a_scales, b_scale = _overlapped(
            tiled_mma, read_state, release_state, k_tile, partials[1], partials[0], a_scales, b_scale, operands)
        tiled_mma, read_state, release_state, a_scales, b_scale = _overlapped(
            tiled_mma, read_state, release_state, k_tile + 1, partials[0], partials[1], a_scales, b_scale, operands)
    if k_tiles % 2 == 0:  # the last k-tile is odd: into partials[1]
        tiled_mma, read_state, release_state, last_a, last_b = _overlapped(
            tiled_mma, read_state, release_state, k_tiles - 1, partials[1], partials[0], a_scales, b_scale, operands)
        release_state = _last_promotion(mainloop, release_state, acc, partials[1], last_a, last_b)
    else:
        release_state = _last_promotion(mainloop, release_state, acc, partials[0], a_scales, b_scale)
    return tiled_mma, read_state, release_state


@cute.jit
def _overlapped(tiled_mma: cute.TiledMma, read_state, release_state, k_tile: Int32, into: cute.Tensor,
                previous: cute.Tensor, a_scales: tuple, b_scale: Float32, operands: tuple):
    """k-tile ``k_tile``'s wgmmas into ``into``, then the previous k-tile's promotion from
    ``previous`` (its scales ``a_scales``, ``b_scale``) while they run. Returns (tiled_mma,
    read_state, release_state, ``k_tile``'s A scales, its B scale)."""
    mainloop, tCrA, tCrB, acc, sAScale, mBScale, g, row_b, box_rows = operands
    mainloop.consumer_wait(read_state)
    next_a_scales = _a_scales(sAScale, box_rows, read_state.index)
    tiled_mma = _k_tile_wgmmas(tiled_mma, tCrA, tCrB, into, read_state.index)
    read_state.advance()
    next_b_scale = mBScale[g, row_b, k_tile]  # a global load: in registers by this k-tile's promotion
    # the previous k-tile's wgmmas are done (this one's may run): its slot is free (its A scales
    # were read when it was waited for), its partial complete
    cute.nvgpu.warpgroup.wait_group(1)
    mainloop.consumer_release(release_state)
    release_state.advance()
    _promote(acc, previous, a_scales, b_scale)
    return tiled_mma, read_state, release_state, next_a_scales, next_b_scale


@cute.jit
def _last_promotion(mainloop, release_state, acc: cute.Tensor, partial: cute.Tensor, a_scales: tuple,
                    b_scale: Float32):
    """The item's last k-tile: waits for its wgmmas, frees its slot, promotes ``partial``; returns
    ``release_state``."""
    cute.nvgpu.warpgroup.wait_group(0)
    mainloop.consumer_release(release_state)
    release_state.advance()
    _promote(acc, partial, a_scales, b_scale)
    return release_state


@cute.jit
def _a_scales(sAScale: cute.Tensor, box_rows: tuple, index: Int32) -> tuple:
    """The A scales of the thread's two rows in slot ``index``."""
    return sAScale[box_rows[0], 0, index], sAScale[box_rows[1], 0, index]


@cute.jit
def _k_tile_wgmmas(tiled_mma: cute.TiledMma, tCrA: cute.Tensor, tCrB: cute.Tensor, partial: cute.Tensor,
                   index: Int32) -> cute.TiledMma:
    """One k-tile's wgmmas of slot ``index`` into ``partial`` (overwritten), committed as a group."""
    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
    cute.nvgpu.warpgroup.fence()
    for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
        slot = (None, None, k_block, index)
        cute.gemm(tiled_mma, partial, tCrA[slot], tCrB[slot], partial)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    cute.nvgpu.warpgroup.commit_group()
    return tiled_mma


@cute.jit
def _promote(acc: cute.Tensor, partial: cute.Tensor, a_scales: tuple, b_scale: Float32):
    """acc += (sa * sb) * partial: elements 4j, 4j+1 of the thread's upper row, 4j+2, 4j+3 of its
    lower one."""
    upper, lower = a_scales[0] * b_scale, a_scales[1] * b_scale
    for i in cutlass.range_constexpr(cute.size(partial)):
        acc[i] = acc[i] + (upper if (i % 4) < 2 else lower) * partial[i]


@cute.jit
def _b_scales(mBScale: cute.Tensor, g: Int32, rows_b: tuple, halves: cutlass.Constexpr, k_tile: Int32):
    """The B scales of k-tile ``k_tile`` of weight tile row ``rows_b[0]`` and, with two halves, of
    ``rows_b[1]`` (the first twice with one half)."""
    b0 = mBScale[g, rows_b[0], k_tile]
    b1 = b0
    if const_expr(halves == 2):
        b1 = mBScale[g, rows_b[1], k_tile]
    return b0, b1
