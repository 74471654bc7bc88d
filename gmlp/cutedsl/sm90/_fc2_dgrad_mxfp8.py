"""FC2 dgrad's MXFP8 epilogue (``gmlp.cutedsl.sm90.fc2_dgrad``'s MXFP8 recipe): the
fp32 dh of a tile quantized both ways from the registers, in 64-column halves of the da tile when
gated, with its db1 warp sums. A mixin of ``FC2DgradSm90``, which supplies the config attributes
(``gated``, ``bias_grad``, ``e5m2``, ``floor_scales``) and, from ``_fc2_dgrad_epilogue``,
``pair_backward``, the activation backward both epilogues share, and ``load_c_pairs``: c's words
come in batches of ``C_WORD_PAIRS`` pairs (a gated half's), every load of a batch issued before
the first is used, the first batch before the item's mainloop (``quantize_tile_both_ways`` with
``segments`` and ``column_first``).

- What is quantized is the fp32 dh, as Triton's ``store_quantized_both_ways(d_gate, ...)`` and
  ``(d_up, ...)`` get it (no bf16 step); dprobs (of da before the probs scale) and db1 (of the
  fp32 dh) as in the bf16 path. The dh expression trees are Triton's (``_epilogue_math``); c is
  read as 32-bit words whose bf16 halves are widened by shifts (exact, the values of cvt.f32.bf16).
- Registers decide the shape of the epilogue. Quantizing needs a tile's 64 values in a thread
  (plus keys, scales, addresses); holding a thread's d gate and d up of the whole 128-wide tile
  (64 + 64, one half over the accumulators) before quantizing them as two 128-column tiles was
  tried: ptxas spills, even with the stale-value and key-order fixes below (swiglu: 36 bytes of
  spill stores, 264 with probs and db1; at 240 registers 20 and 184). So gated, the da tile is
  done in two 64-column halves q: a pass over half q's 32 da values writes its 32 d gate and 32 d
  up values into one 64-value quantized tile (columns [0, 64) d gate, [64, 128) d up:
  ``dh_segments``), which is quantized with the two output ranges as ``segments`` (its 32-column
  blocks and transposed rows never straddle them), then the other half (skipped when it has no
  valid column). Peak: the quantized tile's 64 values, the other half's 32 da values and the
  quantization's temporaries. srelu: one pass over the 64 values, one quantized tile. Masked pairs
  write 0 into the tile (else the previous half's or item's values stay live through the mainloop:
  LLVM cannot see that the quantization masks them). The consumer warpgroups run at 240 registers,
  the producer at 24 (``QUANTIZED_*_REGISTERS``; 128 x 24 + 256 x 240 = 384 x 168, the launch allocation:
  ``_pipeline.register_split``): at 232 / 40 a few
  configurations (db1 without probs) spill one register. ptxas -v (sm_90a): 0 bytes stack, 0
  spills in every configuration the tests compile (the highest register of the consumers' code
  R237 gated, R209 srelu).
- Q_col's per-column keys are reduced and stored before Q_row (``column_first``; ptxas otherwise
  keeps the 64 per-value keys live through Q_row's stores).
- db1: after each quantized tile, per column its two rows (masked), the warp's 8 quads by
  butterflies, lanes 0-3 store to ``dh_warp_sums`` as in the bf16 path (same rows, columns).
- Shared memory: the epilogue's 20 KB (16 KB transposed fp8 tile + 4 KB amax keys,
  ``_quantize_epilogue.SMEM_BYTES``, reused by every quantized tile: its two named barriers order
  the reuse) leave 6 stages of 32 KB (``FC2DgradConfig.max_stages``).
- tile_n = 256 is refused with a recipe: a thread would hold 128 da values through the epilogue,
  96 of them live beside a quantized tile's 64 values (about 64 registers more than the 128-wide
  tile's peak, which is at the 240 limit already).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint32, const_expr

from gmlp.cutedsl._quantize_kernel import _as_f32
from gmlp.cutedsl.sm90 import _quantize_epilogue
from gmlp.cutedsl.sm90._fc2_dgrad_epilogue import C_WORD_PAIRS
from gmlp.cutedsl.sm90._quantize_epilogue import quantize_tile_both_ways

__all__ = ["QuantizedDhEpilogue", "dh_segments"]

_EPILOGUE_BARRIER = 1  # named barrier of the 256 consumer threads (quantizing epilogue); 0 is the CTA's


class QuantizedDhEpilogue:
    """The MXFP8 epilogue's device methods (traced inline in ``FC2DgradSm90.kernel``)."""

    @cute.jit
    def quantized_epilogue(self, acc, values, c_words, tCcD, thr_mma, mma_tidx, tCgG, tCgU, row_probs, row_dprobs,
                           outputs, smem_q, mWarpSums, first_row, col0, ffn, limits, col_block0, sums_row):
        """The MXFP8 epilogue of one tile (module docstring): per 128-column tile of dh (gated: a
        64-column half of the da tile gives its 64 d gate and 64 d up columns; srelu: the whole
        tile), the fp32 dh of the thread's pairs into ``values``, Q_row and Q_col of it, its db1
        warp sums; the dprobs partials accumulate in row_dprobs over the halves in column order.
        ``c_words`` holds c's first batch (pairs [0, C_WORD_PAIRS), loaded before the mainloop)."""
        args = (acc, values, c_words, tCcD, thr_mma, mma_tidx, tCgG, tCgU, row_probs, row_dprobs, outputs, smem_q,
                mWarpSums, first_row, col0, ffn, limits, col_block0, sums_row)
        self.quantized_half(0, *args)
        if const_expr(self.gated):
            if limits[1] > _quantize_epilogue.SEGMENT_COLS:  # the second half has valid columns
                self.quantized_half(1, *args)

    @cute.jit
    def quantized_half(self, q: int, acc, values, c_words, tCcD, thr_mma, mma_tidx, tCgG, tCgU, row_probs, row_dprobs,
                       outputs, smem_q, mWarpSums, first_row, col0, ffn, limits, col_block0, sums_row):
        """Gated: half q of the da tile (its 64-column half q -> the d gate and d up columns of a
        quantized tile); srelu: the whole tile (q = 0)."""
        quads = _quantize_epilogue.SEGMENT_GROUPS if const_expr(self.gated) else cute.size(tCcD) // 4
        offset = q * quads * 8  # the half's first da column in the tile
        if const_expr(self.gated):
            segments = dh_segments(col0, ffn, limits[1], q)
        for jl in cutlass.range_constexpr(quads):
            j = q * quads + jl  # da column group
            if const_expr(2 * j % C_WORD_PAIRS == 0 and j > 0):  # the next batch of c (the first came before)
                self.load_c_pairs(c_words, 2 * j, C_WORD_PAIRS, tCgG, tCgU, tCcD, limits)
            for slot in cutlass.range_constexpr(2):
                i = 2 * j + slot
                if cute.elem_less(tCcD[2 * i], limits):
                    grad = (acc[2 * i], acc[2 * i + 1])
                    word = 2 * (i % C_WORD_PAIRS)
                    gate = _bf16_pair(Uint32(c_words[word]))
                    up = _bf16_pair(Uint32(c_words[word + 1])) if const_expr(self.gated) else gate
                    d0, d1 = self.pair_backward(gate, up, grad, slot, row_probs, row_dprobs)
                    # the fp32 dh (as Triton: no bf16 step); gated: d gate at tile column
                    # group jl, d up at 8 + jl (pair 2 j + slot of the quantized tile)
                    values[4 * jl + 2 * slot], values[4 * jl + 2 * slot + 1] = d0[0], d1[0]
                    if const_expr(self.gated):
                        up_pair = 4 * (quads + jl) + 2 * slot
                        values[up_pair], values[up_pair + 1] = d0[1], d1[1]
                else:  # masked: 0, not the previous half's or item's value (kept live across them)
                    values[4 * jl + 2 * slot], values[4 * jl + 2 * slot + 1] = Float32(0.0), Float32(0.0)
                    if const_expr(self.gated):
                        up_pair = 4 * (quads + jl) + 2 * slot
                        values[up_pair], values[up_pair + 1] = Float32(0.0), Float32(0.0)
        if const_expr(self.gated):
            quantize_tile_both_ways(
                values, tCcD, thr_mma, mma_tidx, outputs, smem_q, first_row, col0, limits, col_block0,
                self.e5m2, self.floor_scales, _EPILOGUE_BARRIER, column_first=True, segments=segments)
        else:
            quantize_tile_both_ways(
                values, tCcD, thr_mma, mma_tidx, outputs, smem_q, first_row, col0, limits, col_block0,
                self.e5m2, self.floor_scales, _EPILOGUE_BARRIER, column_first=True)
        if const_expr(self.bias_grad):  # the quantized tile's column sums of the warp's 16 rows
            self.warp_column_sums(values, tCcD, mma_tidx, mWarpSums, sums_row, col0 + offset, ffn, limits[0],
                                  limits[1] - offset)

    @cute.jit
    def warp_column_sums(self, values, tCcD, mma_tidx, mWarpSums, sums_row, start, ffn, rows, room):
        """db1 partials of a quantized tile: per column its two rows (masked) then the warp's 8
        quads (butterflies), written by lanes 0-3 to mWarpSums[sums_row, dh column]. Gated: tile
        columns [0, 64) are the d gate columns start + c, [64, 128) the d up columns F + start + c
        - 64, valid while c (mod 64) < room; srelu: columns start + c, valid while c < room."""
        lane = mma_tidx % 32
        for j in cutlass.range_constexpr(_quantize_epilogue.COLUMN_GROUPS):
            segment = self.segment_of_group(j)  # 0: d gate (srelu: dh), 1: d up
            shift = segment * _quantize_epilogue.SEGMENT_COLS
            for c in cutlass.range_constexpr(2):
                col = tCcD[4 * j + c][1] - shift  # the column within its segment
                total = Float32(0.0)
                for slot in cutlass.range_constexpr(2):
                    v = 4 * j + 2 * slot + c
                    total = total + cutlass.select_((tCcD[v][0] < rows) & (col < room), values[v], Float32(0.0))
                total = total + cute.arch.shuffle_sync_bfly(total, offset=4)
                total = total + cute.arch.shuffle_sync_bfly(total, offset=8)
                total = total + cute.arch.shuffle_sync_bfly(total, offset=16)
                if lane < 4 and col < room:
                    mWarpSums[sums_row, segment * ffn + start + col] = total

    def segment_of_group(self, j: int) -> int:
        """The segment of column group j of a quantized tile (gated: 0 for d gate, 1 for d up)."""
        return j // _quantize_epilogue.SEGMENT_GROUPS if self.gated else 0


def dh_segments(col0, ffn, valid_cols, q: int):
    """Gated, the quantized tile of half q of a da tile at column col0 (valid_cols = F - col0 valid
    da columns): its columns [0, 64) are d gate columns col0 + 64 q + c, [64, 128) d up columns
    F + col0 + 64 q + c - 64, each valid while c (mod 64) < valid_cols - 64 q
    (``quantize_tile_both_ways``'s segments; Python ints or DSL values)."""
    offset = q * _quantize_epilogue.SEGMENT_COLS
    return (col0 + offset, valid_cols - offset), (ffn + col0 + offset, valid_cols - offset)


def _bf16_pair(word):
    """The two bf16 halves of a 32-bit word (low first) as fp32 (exact: cvt.f32.bf16's values)."""
    return (_as_f32(word << Uint32(16)), _as_f32(word & Uint32(0xFFFF0000)))
