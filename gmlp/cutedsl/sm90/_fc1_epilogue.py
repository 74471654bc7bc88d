"""FC1's epilogue pass from the accumulators (``gmlp.cutedsl.sm90.fc1``'s docstring): per column pair
of a thread, the bias, c (gate, up) rounded to bf16, the activation times probs, then ``a`` in
bf16 (stored from the registers or staged for the TMA store) or, with a recipe, the fp32 ``a``
written over the accumulators for the quantizing epilogue. A mixin of ``FC1ForwardSm90``, which
supplies the config attributes (``activation``, ``gated``, ``has_bias``, ``has_probs``,
``quantized``, ``tma_store``); traced inline in its kernel.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr

from gmlp.cutedsl.sm90._epilogue_math import activation_forward

__all__ = ["ActivationEpilogue"]


class ActivationEpilogue:
    """FC1's pass over a tile's accumulators (module docstring)."""

    @cute.jit
    def activation_pass(self, acc, acc_up, tCcD, limits, col0, g, ffn, mBias, row_probs, pair,
                        pair_bits, regs, store):
        """One pass over the thread's pairs: ``regs`` (tCgC, tCgU, tCgA: c gate's, c up's and a's
        pair words, None where not written) stores from the registers, ``store`` (tile_store,
        c_stage, up_stage, a_stage, order, destinations, subtiles_done) stages each 32-column
        subtile for the TMA store. Returns the TMA store's subtile count (None without it)."""
        tCgC, tCgU, tCgA = regs if const_expr(regs is not None) else (None, None, None)
        if const_expr(self.tma_store):
            tile_store, c_stage, up_stage, a_stage, order, destinations, subtiles_done = store
        else:
            subtiles_done = None
        for i in cutlass.range_constexpr(cute.size(tCcD) // 2):
            staged = 2 * (i % 8)  # the pair's place in its subtile's staging
            if const_expr(self.tma_store):  # a masked pair's values are never stored
                for stage in (c_stage, up_stage, a_stage):
                    stage[staged], stage[staged + 1] = BFloat16(0.0), BFloat16(0.0)
            if cute.elem_less(tCcD[2 * i], limits):
                col = col0 + tCcD[2 * i][1]
                gate = (acc[2 * i], acc[2 * i + 1])
                up = (acc_up[2 * i], acc_up[2 * i + 1])
                if const_expr(self.has_bias):
                    gate = (gate[0] + mBias[g, col].to(Float32), gate[1] + mBias[g, col + 1].to(Float32))
                    if const_expr(self.gated):
                        up = (up[0] + mBias[g, ffn + col].to(Float32),
                              up[1] + mBias[g, ffn + col + 1].to(Float32))
                if const_expr(self.tma_store):
                    c_stage[staged], c_stage[staged + 1] = gate[0].to(BFloat16), gate[1].to(BFloat16)
                    if const_expr(self.gated):
                        up_stage[staged], up_stage[staged + 1] = up[0].to(BFloat16), up[1].to(BFloat16)
                else:
                    pair[0], pair[1] = gate[0].to(BFloat16), gate[1].to(BFloat16)
                    tCgC[i] = pair_bits[0]
                    if const_expr(self.gated):
                        pair[0], pair[1] = up[0].to(BFloat16), up[1].to(BFloat16)
                        tCgU[i] = pair_bits[0]
                act = (activation_forward(self.activation, gate[0], up[0]),
                       activation_forward(self.activation, gate[1], up[1]))
                if const_expr(self.has_probs):
                    p = row_probs[i % 2]  # pair i = (row v1, column group v2): v1 = i % 2
                    act = (act[0] * p, act[1] * p)
                if const_expr(self.quantized):  # the fp32 a, quantized below (as Triton: no bf16 step)
                    acc[2 * i], acc[2 * i + 1] = act[0], act[1]
                elif const_expr(self.tma_store):
                    a_stage[staged], a_stage[staged + 1] = act[0].to(BFloat16), act[1].to(BFloat16)
                else:
                    pair[0], pair[1] = act[0].to(BFloat16), act[1].to(BFloat16)
                    tCgA[i] = pair_bits[0]
            if const_expr(self.tma_store and i % 8 == 7):
                # the subtile's 8 pairs are staged: into smem, then TMA-stored unless its
                # 32 columns lie past F (F % 32 == 0: all or none of them)
                s = i // 8
                staged_outputs = (c_stage, up_stage, a_stage) if const_expr(self.gated) else (c_stage, a_stage)
                tile_store.write(staged_outputs, destinations, order.get_hier_coord(s), subtiles_done,
                                 col0 + 32 * s < ffn)
                subtiles_done += 1
        return subtiles_done
