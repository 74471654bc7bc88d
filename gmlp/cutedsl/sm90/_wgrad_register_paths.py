"""The weight gradient's paths that work from registers instead of TMA: the register-store
epilogue (``WgradConfig.store="regs"``: fp32 or bf16 pairs, or the load-add-store into fp32
``main_grad``) and the shared-memory zeroing of an expert's last k-step on the plain-view fallback
(``ragged_tma=False``). A mixin of ``gmlp.cutedsl.sm90.wgrad.GroupedWgradSm90``, which supplies
``tile_shape_mnk``, ``tile_n``, ``out_dtype``, ``accumulate``, ``add_chunk`` and ``consumer_threads``; the methods are
traced inline in its kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr

from gmlp.cutedsl.sm90._pipeline import TILE_K

__all__ = ["RegisterPaths"]


class RegisterPaths:
    """The register-store epilogue and the K-tail zeroing (module docstring)."""

    @cute.jit
    def zero_rows(self, sA: cute.Tensor, sB: cute.Tensor, slot: Int32, first: Int32, tidx: Int32):
        """Zero the token rows [first, BK) of slot ``slot`` of A and B (the next expert's rows of
        an expert's last k-step), by all consumer threads; then make the generic-proxy stores
        visible to wgmma (async proxy) and wait for every consumer thread before any wgmma."""
        for rows, width in ((sA, self.tile_shape_mnk[0]), (sB, self.tile_n)):
            for index in range(tidx, (TILE_K - first) * width, self.consumer_threads):
                row = first + index // width
                rows[(index - (index // width) * width, row, slot)] = BFloat16(0.0)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=1, number_of_threads=self.consumer_threads)

    @cute.jit
    def store_tile(self, acc: cute.Tensor, thr_mma, tCcD: cute.Tensor, mOut: cute.Tensor, g: Int32, m_tile: Int32,
                   n_tile: Int32, k_tiles: Int32):
        """Epilogue from the registers: tile (m_tile, n_tile) of out[g]; only rows < M and columns
        < N. Accumulators j = 2i, 2i+1 of a thread are columns c, c+1 of one row (c even; N % 8 ==
        0, so both or neither are < N): one 64-bit (fp32) or 32-bit (bf16) access of the pair."""
        _, m, n = mOut.shape
        limits = (m - m_tile * self.tile_shape_mnk[0], n - n_tile * self.tile_n)
        gOut = cute.local_tile(mOut[(g, None, None)], (self.tile_shape_mnk[0], self.tile_n), (m_tile, n_tile))
        tCgOut = thr_mma.partition_C(gOut)
        if const_expr(self.out_dtype == Float32):
            tCgPairs = cute.recast_tensor(tCgOut, Int64)
            acc_pairs = cute.recast_tensor(acc, Int64)
            if const_expr(self.accumulate):
                if k_tiles > 0:  # an empty expert adds nothing
                    # chunks of pairs: a chunk's loads in flight together, then its
                    # adds and stores (all loads first would spill the accumulators)
                    previous = cute.make_rmem_tensor((2 * self.add_chunk,), Float32)
                    previous_pairs = cute.recast_tensor(previous, Int64)
                    for chunk in cutlass.range_constexpr(cute.size(acc_pairs) // self.add_chunk):
                        for j in cutlass.range_constexpr(self.add_chunk):
                            i = chunk * self.add_chunk + j
                            if cute.elem_less(tCcD[2 * i], limits):
                                previous_pairs[j] = tCgPairs[i]
                        for j in cutlass.range_constexpr(self.add_chunk):
                            i = chunk * self.add_chunk + j
                            if cute.elem_less(tCcD[2 * i], limits):
                                acc[2 * i] = acc[2 * i] + previous[2 * j]
                                acc[2 * i + 1] = acc[2 * i + 1] + previous[2 * j + 1]
                                tCgPairs[i] = acc_pairs[i]
            else:
                for i in cutlass.range_constexpr(cute.size(acc_pairs)):
                    if cute.elem_less(tCcD[2 * i], limits):
                        tCgPairs[i] = acc_pairs[i]
        else:  # bf16: the fp32 sums rounded once, stored as pairs through Int32 views
            tCgPairs = cute.recast_tensor(tCgOut, Int32)
            pair = cute.make_rmem_tensor((2,), BFloat16)
            pair_bits = cute.recast_tensor(pair, Int32)
            for i in cutlass.range_constexpr(cute.size(tCgPairs)):
                if cute.elem_less(tCcD[2 * i], limits):
                    pair[0] = acc[2 * i].to(BFloat16)
                    pair[1] = acc[2 * i + 1].to(BFloat16)
                    tCgPairs[i] = pair_bits[0]
