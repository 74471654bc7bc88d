"""FC2 dgrad's bf16 epilogue (``gmlp.cutedsl.sm90.fc2_dgrad``'s docstring, "Epilogue"): c's words
loaded in batches ahead of use, the activation backward pair by pair into bf16 dh (stored from
the registers or staged for the TMA store), and the two per-tile partials both epilogues write:
the dprobs row partials and the db1 warp sums. A mixin of ``FC2DgradSm90``, which supplies the
config attributes (``activation``, ``gated``, ``has_probs``, ``bias_grad``, ``tma_store``,
``c_batch``); every method is traced inline in its kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

from gmlp.cutedsl.sm90._epilogue_math import activation_backward, activation_forward

__all__ = ["DhEpilogue", "C_WORD_PAIRS"]

C_WORD_PAIRS = 16  # c's pairs a thread holds: two batches of up to 4 column groups x 2 rows


class DhEpilogue:
    """The bf16 epilogue's device methods and the per-tile partials of both epilogues."""

    @cute.jit
    def bf16_pass(self, acc, c_words, tCgG, tCgU, tCcD, limits, row_probs, row_dprobs, group_sums, pair, pair_bits,
                  dh_regs, store, col0, ffn):
        """One pass over a tile's accumulators into bf16 dh: ``dh_regs`` (tCgH, tCgHU: d gate's and d
        up's pair words) stores them from the registers, ``store`` (tile_store, gate_stage,
        up_stage, order, destinations, subtiles_done) stages them for the TMA store. Returns the
        TMA store's subtile count (None without it). ``c_words`` holds c's first batch (loaded
        before the item's mainloop); each batch loads the next as it starts."""
        tCgH, tCgHU = dh_regs if const_expr(dh_regs is not None) else (None, None)
        if const_expr(self.tma_store):
            tile_store, gate_stage, up_stage, order, destinations, subtiles_done = store
        else:
            subtiles_done = None
        # one pass over the thread's column groups j (two rows r, r + 8 of a column pair
        # f, f+1; pair i = 2j + row slot), c of batch b + 1 loaded as batch b starts; with
        # probs, act(c) for the dprobs partials (of da before the probs scale) shares its
        # sigmoid with act'(c).
        # bias_grad: the group's two rows are added at once and written over its da
        # (read first): acc[4j + c] = d gate, acc[4j + 2 + c] = d up sums of column c.
        groups = cute.size(tCcD) // 4
        for j in cutlass.range_constexpr(groups):
            batch = j // self.c_batch + 1
            if const_expr(j % self.c_batch == 0 and batch * self.c_batch < groups):
                self.load_c_pairs(c_words, 2 * self.c_batch * batch, 2 * self.c_batch,
                                  tCgG, tCgU, tCcD, limits)
            if const_expr(self.bias_grad):
                group_sums.fill(0.0)  # masked elements add 0
            for slot in cutlass.range_constexpr(2):
                i = 2 * j + slot
                staged = 4 * (j % 4) + 2 * slot  # the pair's place in its subtile's staging
                if const_expr(self.tma_store):  # a masked pair's values are never stored
                    gate_stage[staged], gate_stage[staged + 1] = BFloat16(0.0), BFloat16(0.0)
                    up_stage[staged], up_stage[staged + 1] = BFloat16(0.0), BFloat16(0.0)
                if cute.elem_less(tCcD[2 * i], limits):
                    grad = (acc[2 * i], acc[2 * i + 1])
                    word = 2 * (i % C_WORD_PAIRS)
                    pair_bits[0] = c_words[word]
                    gate = (pair[0].to(Float32), pair[1].to(Float32))
                    up = gate
                    if const_expr(self.gated):
                        pair_bits[0] = c_words[word + 1]
                        up = (pair[0].to(Float32), pair[1].to(Float32))
                    d0, d1 = self.pair_backward(gate, up, grad, slot, row_probs, row_dprobs)
                    if const_expr(self.tma_store):
                        gate_stage[staged], gate_stage[staged + 1] = d0[0].to(BFloat16), d1[0].to(BFloat16)
                        if const_expr(self.gated):
                            up_stage[staged], up_stage[staged + 1] = d0[1].to(BFloat16), d1[1].to(BFloat16)
                    else:
                        pair[0], pair[1] = d0[0].to(BFloat16), d1[0].to(BFloat16)
                        tCgH[i] = pair_bits[0]
                        if const_expr(self.gated):
                            pair[0], pair[1] = d0[1].to(BFloat16), d1[1].to(BFloat16)
                            tCgHU[i] = pair_bits[0]
                    if const_expr(self.bias_grad):
                        group_sums[0] = group_sums[0] + d0[0]
                        group_sums[1] = group_sums[1] + d1[0]
                        if const_expr(self.gated):
                            group_sums[2] = group_sums[2] + d0[1]
                            group_sums[3] = group_sums[3] + d1[1]
            if const_expr(self.bias_grad):
                for k in cutlass.range_constexpr(4):
                    acc[4 * j + k] = group_sums[k]
            if const_expr(self.tma_store and j % 4 == 3):
                # the subtile's 4 column groups are staged: into smem, then TMA-stored
                # unless its 32 columns lie past F (F % 32 == 0: all or none of them)
                s = j // 4
                staged_outputs = (gate_stage, up_stage) if const_expr(self.gated) else (gate_stage,)
                tile_store.write(staged_outputs, destinations, order.get_hier_coord(s),
                                 subtiles_done, col0 + 32 * s < ffn)
                subtiles_done += 1
        return subtiles_done

    @cute.jit
    def store_dprobs_partials(self, row_dprobs, tCcD, lane, limits, mDprobsPartial, first_row, n_tile):
        """The dprobs partials of the thread's two rows: the row's 4 threads (lanes 4q + [0, 4))
        reduced, written to dprobs_partial[row, n_tile]."""
        for slot in cutlass.range_constexpr(2):
            total = row_dprobs[slot]
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
            row = tCcD[2 * slot][0]
            if lane % 4 == 0 and row < limits[0]:
                mDprobsPartial[first_row + row, n_tile] = total

    @cute.jit
    def store_db1_warp_sums(self, acc, tCcD, lane, limits, mWarpSums, sums_row, ffn, col0):
        """bias_grad: column sums of the warp's 16 rows (the thread's two rows were added over its
        accumulators by ``bf16_pass``; the warp's 8 quads by shuffles) -> dh_warp_sums[sums_row]."""
        halves = ((0, 0), (2, ffn)) if const_expr(self.gated) else ((0, 0),)
        for h in cutlass.range_constexpr(len(halves)):
            index, offset = halves[h]
            for j in cutlass.range_constexpr(cute.size(tCcD) // 4):
                for c in cutlass.range_constexpr(2):
                    total = acc[4 * j + index + c]
                    total = total + cute.arch.shuffle_sync_bfly(total, offset=4)
                    total = total + cute.arch.shuffle_sync_bfly(total, offset=8)
                    total = total + cute.arch.shuffle_sync_bfly(total, offset=16)
                    col = tCcD[4 * j + c][1]
                    if lane < 4 and col < limits[1]:
                        mWarpSums[sums_row, offset + col0 + col] = total

    @cute.jit
    def load_c_pairs(self, c_words, first: int, count: int, tCgG, tCgU, tCcD, limits):
        """c's words (bf16 pairs, gate and up) of the thread's pairs ``first + [0, count)`` into
        ``c_words`` (pair i at 2 (i % 16)), traced inline: all issued before any is used. A masked
        pair's words are not loaded but set to 0 (never read: else LLVM, not seeing that, keeps the
        previous item's words live through the mainloop)."""
        for k in cutlass.range_constexpr(count):
            i = first + k
            word = 2 * (i % C_WORD_PAIRS)
            c_words[word], c_words[word + 1] = Int32(0), Int32(0)
            if cute.elem_less(tCcD[2 * i], limits):
                c_words[word] = tCgG[i]
                if const_expr(self.gated):
                    c_words[word + 1] = tCgU[i]

    def pair_backward(self, gate, up, grad, slot: int, row_probs, row_dprobs):
        """(d0, d1): the activation backward of one column pair of row slot ``slot`` (gate, up and
        grad pairs in fp32), traced inline. With probs, act(c) first adds into the row's dprobs
        partial (of da before the probs scale), then da is scaled by the row's prob; d0 and d1 are
        (d gate, d up) per column (srelu: (dh, None))."""
        if const_expr(self.has_probs):
            act0 = activation_forward(self.activation, gate[0], up[0])
            act1 = activation_forward(self.activation, gate[1], up[1])
            row_dprobs[slot] = row_dprobs[slot] + (grad[0] * act0 + grad[1] * act1)
            p = row_probs[slot]
            grad = (grad[0] * p, grad[1] * p)
        return (activation_backward(self.activation, gate[0], up[0], grad[0]),
                activation_backward(self.activation, gate[1], up[1], grad[1]))
