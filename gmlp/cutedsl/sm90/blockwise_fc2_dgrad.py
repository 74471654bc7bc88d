"""CuTeDSL sm_90a FC2 dgrad of the FP8 blockwise recipe with the fused activation backward:
``da = Q_row(dy) @ W2_g`` promoted every 128 of H, then ``dprobs``, ``dh = act'(c) (da * probs)``
written as Q_row(dh) (1 x 128 blocks) and Q_col(dh) (128 x 1 blocks, block-aligned) in the
gradient format, and ``db1``.

Twin of ``gmlp.triton_ref.blockwise_fc2_dgrad.fc2_dgrad_blockwise`` (same arguments and outputs;
da equal up to the fp8 ``wgmma`` chains' summation order, the epilogue's operations the same:
the activation backward's (``_epilogue_math``, Triton's expression trees) and the spec's scales,
so the bytes are Triton's wherever da is: checked bit for bit on exactly summable operands).

Kernel design:

- Mainloop: the blockwise grouped GEMM's (``_blockwise_mainloop``), one 128-column half a work
  item: W2^T's tile row n (the transposed weight tiles, ``FP8BlockwiseTensor.transpose``). A slot
  holds dy's k-tile and one W2^T k-tile (32 KB: 6 stages beside the epilogue's 20 KB). dy may be
  E5M2 (``grad_format``): fp8 ``wgmma`` mixes it with the E4M3 weights.
- Epilogue: one pass over the thread's column pairs (c's gate and up words loaded 16 pairs at a
  time, ``DhEpilogue.load_c_pairs``, the rows' probs and, but with the pipelined promotion
  (whose second partial leaves no room: 56 bytes spilled), the first 16 pairs before the item's
  mainloop, so that their loads run beside it, as in FC2 dgrad's bf16 and MXFP8 kernels; ``pair_backward``: dprobs' row partial of da * act(c), then
  da * probs through act'), d gate into a second 64-value fragment and d up over da's (srelu: dh
  over da); rows past the expert's end as zeros. Then each 128-column tile of dh (d gate at
  column n, d up at F + n) is quantized both ways (``_blockwise_epilogue``) and, with
  ``bias_grad``, its columns summed over the warp's 16 rows into ``dh_warp_sums[m_tile * 8 +
  warp]`` (FC2 dgrad's MXFP8 scheme: the launcher adds the 8 warps, then each expert's tiles in
  order: deterministic, no atomics). dprobs: the quad's row partials to ``dprobs_partial[row,
  n]``, summed by the launcher in order. The columnwise blocks past the last expert's are zeroed
  (scale 1.0) after the CTA's items.
- Registers: the quantization of the d gate tile runs with d up's 64 values live beside it: the
  consumers run at 240 (the producer at 24), FC2 dgrad's MXFP8 split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Float8E4M3FN, Float8E5M2, Int32, Uint32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.operands import token_scalars
from gmlp.contract.outputs import FC2DgradOutput
from gmlp.contract.reasons import Reason
from gmlp.cutedsl.sm90 import _quantize_epilogue, _schedule, launch_options
from gmlp.cutedsl.sm90._blockwise_epilogue import fake_both_ways, quantize_tile_blockwise, store_unused_blocks
from gmlp.cutedsl.sm90._blockwise_mainloop import (MMA_WARPGROUPS, TILE_K, TILE_N, BRows, PromotedArgs,
                                                   PromotedOperands, PromotedTokenRows, check_token_scales,
                                                   fake_token_rows, fake_weight_tiles, ffn_problem_support,
                                                   make_operands)
from gmlp.cutedsl.sm90._compile import (FLOAT_DTYPES, ahead_compiler, config_compiler, fake_matrix, fake_stream,
                                        fake_vector)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._epilogue_math import c_pair_views, load_row_probs, pair_fragment
from gmlp.cutedsl.sm90._fc2_dgrad_epilogue import C_WORD_PAIRS, DhEpilogue
from gmlp.cutedsl.sm90._fc2_dgrad_mxfp8 import _bf16_pair
from gmlp.cutedsl.sm90._launch import check_activation, check_problem, check_tma_bases, run
from gmlp.cutedsl.sm90._pipeline import ELEMENT_ALIGN
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90.configs import BlockwiseFC2DgradConfig
from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.buffers import both_ways_buffers, no_token_columnwise, wrap_both_ways
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, require_block_shape
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat, enum_member

__all__ = ["BlockwiseFC2DgradConfig", "BlockwiseFC2DgradSm90", "compile_blockwise_fc2_dgrad", "problem_support",
           "fc2_dgrad_blockwise"]

_NAME = "blockwise fc2 dgrad kernel"
_EPILOGUE_BARRIER = 1  # named barrier of the 256 consumer threads; 0 is the CTA's
WARPS_PER_TILE = 8  # db1: one row of warp sums per consumer warp and tile
_PRODUCER_REGISTERS, _CONSUMER_REGISTERS = 24, 240  # 128 x 24 + 256 x 240 = 384 x 168


class BlockwiseFC2DgradArgs(NamedTuple):
    """The kernel's arguments (the engine's ``args``; A is dy, B is W2^T)."""

    operands: PromotedArgs  # the promoted mainloop's
    mC: cute.Tensor  # (T, N1) bf16: the saved pre-activation
    mProbs: cute.Tensor | None  # (T,) fp32 or bf16
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mTileStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
    mDprobsPartial: cute.Tensor | None  # (T, F/128) fp32
    mWarpSums: cute.Tensor | None  # (max tiles * 8, N1) fp32, zero-filled
    mRowData: cute.Tensor  # (T, N1) uint8: Q_row(dh)'s bytes
    mRowScale: cute.Tensor  # (N1/128, pad4(T)) fp32
    mColData: cute.Tensor  # (N1, 128 n_blocks) uint8: Q_col(dh)'s bytes, block-aligned
    mColScale: cute.Tensor  # (N1, pad4(n_blocks)) fp32


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    mma: PromotedOperands  # accs: (da, then d up; srelu: dh)
    thr_mma: cute.ThrMma
    mma_tidx: Int32
    # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators:
    # ((2 columns, 2 rows, 16 column groups), 1, 1)
    tCcD: cute.Tensor
    d_gate: cute.Tensor  # gated: d gate's values (srelu: the accumulator itself)
    c_words: cute.Tensor  # c's gate and up words of 16 pairs
    row_probs: cute.Tensor
    row_dprobs: cute.Tensor
    smem_q: tuple  # the quantizing epilogue's smem


class BlockwiseFC2DgradSm90(PromotedTokenRows, GroupedGemmEngine, DhEpilogue):
    """Blockwise FC2 dgrad on the engine (module docstring): ``__call__`` the host side; the
    operand policy is ``PromotedTokenRows``, the epilogue this site's."""

    halves = 1

    def __init__(self, config: BlockwiseFC2DgradConfig):
        self.setup_engine(config, MMA_WARPGROUPS, cluster=config.cluster,
                          registers=(_PRODUCER_REGISTERS, _CONSUMER_REGISTERS))
        self.activation = config.activation
        self.gated = config.activation.gated
        self.has_probs = config.probs_dtype is not None
        self.bias_grad = config.bias_grad
        self.e5m2 = config.grad_format is ElementFormat.E5M2
        self.a_dtype = Float8E5M2 if self.e5m2 else Float8E4M3FN  # dy's
        self.pipelined = config.pipelined

    @cute.jit
    def __call__(
        self,
        mDy: cute.Tensor,  # (T, H) uint8: Q_row(dy)'s fp8 bytes (grad_format)
        mDyScale: cute.Tensor,  # (H/128, pad4(T)) fp32, MN-major
        mW: cute.Tensor,  # (E, F, H) uint8: W2^T's E4M3 bytes in 128 x 128 tiles, K-major
        mWScale: cute.Tensor,  # (E, F/128, H/128) fp32
        mC: cute.Tensor,  # (T, N1) bf16: the saved pre-activation
        mProbs: cute.Tensor | None,  # (T,) fp32 or bf16
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
        mDprobsPartial: cute.Tensor | None,  # (T, F/128) fp32
        mWarpSums: cute.Tensor | None,  # (max tiles * 8, N1) fp32, zero-filled
        mRowData: cute.Tensor,  # (T, N1) uint8: Q_row(dh)'s bytes
        mRowScale: cute.Tensor,  # (N1/128, pad4(T)) fp32
        mColData: cute.Tensor,  # (N1, 128 n_blocks) uint8: Q_col(dh)'s bytes, block-aligned
        mColScale: cute.Tensor,  # (N1, pad4(n_blocks)) fp32
        num_ctas: Int32,
        stream,
    ):
        ops = make_operands(mDy, mDyScale, mW, self.a_dtype, self.stages, self.cluster)
        fields = self.storage_fields(ops)
        fields.update(_quantize_epilogue.smem_fields())
        check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        args = BlockwiseFC2DgradArgs(PromotedArgs.of(ops, mWScale), mC, mProbs, mRowStart, mTileStart,
                                     mDprobsPartial, mWarpSums, mRowData, mRowScale, mColData, mColScale)
        self.launch_engine(args, fields, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout, num_ctas, stream)

    def b_rows(self, args: BlockwiseFC2DgradArgs) -> BRows:
        return BRows(1, 0)  # weight tile row n

    def item_columns(self, args: BlockwiseFC2DgradArgs) -> tuple:
        return args.operands.mB.shape[0], TILE_N  # da's columns

    def consumer_setup(self, args: BlockwiseFC2DgradArgs, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
        fragment = pair_fragment(tCcD.shape)
        mma = self.promoted_operands(slots, tCrA, tCrBs, tCcD, fragment)
        d_gate = cute.make_rmem_tensor(fragment, Float32) if const_expr(self.gated) else mma.accs[0]
        return _Consumer(mma, thr_mma, mma_tidx, tCcD, d_gate, cute.make_rmem_tensor((2 * C_WORD_PAIRS,), Int32),
                         cute.make_rmem_tensor((2,), Float32), cute.make_rmem_tensor((2,), Float32),
                         _quantize_epilogue.smem_tensors(storage))

    @cute.jit
    def before_mainloop(self, consumer: _Consumer, args: BlockwiseFC2DgradArgs, tile: tuple):
        """Rows first_row + [0, 128) (those < end_row are the expert's), da columns col0 + [0, 128):
        loaded here, their loads running beside the mainloop, the rows' probs and (not pipelined)
        c's first batch of pairs. Returns (limits, c's gate and up views)."""
        _, _, n_tile, first_row, end_row = tile
        ffn = args.operands.mB.shape[0]
        col0 = n_tile * TILE_N
        limits = (end_row - first_row, ffn - col0)
        if const_expr(self.has_probs):
            load_row_probs(consumer.row_probs, args.mProbs, consumer.mma.rows, first_row, limits[0],
                           consumer.row_dprobs)
        tCgG, tCgU = c_pair_views(consumer.thr_mma, args.mC, first_row, col0, ffn, (TILE_M, TILE_N), self.gated)
        if const_expr(not self.pipelined):
            self.load_c_pairs(consumer.c_words, 0, C_WORD_PAIRS, tCgG, tCgU, consumer.tCcD, limits)
        return limits, tCgG, tCgU

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: BlockwiseFC2DgradArgs, tile: tuple, ahead: tuple,
                 stores: Int32) -> Int32:
        """The pass over the pairs (the probs and c's first batch, not pipelined, loaded by
        ``before_mainloop``), then dh's two tiles quantized both ways."""
        g, m_tile, n_tile, first_row, end_row = tile
        limits, tCgG, tCgU = ahead
        ffn = args.operands.mB.shape[0]
        acc, d_gate, c_words = consumer.mma.accs[0], consumer.d_gate, consumer.c_words
        tCcD, thr_mma, mma_tidx = consumer.tCcD, consumer.thr_mma, consumer.mma_tidx
        lane = mma_tidx % 32
        col0 = n_tile * TILE_N
        for i in cutlass.range_constexpr(cute.size(tCcD) // 2):  # pair i: row slot i % 2 of column group i // 2
            if const_expr(i % C_WORD_PAIRS == 0 and (i > 0 or self.pipelined)):  # batch 0: before the mainloop
                self.load_c_pairs(c_words, i, C_WORD_PAIRS, tCgG, tCgU, tCcD, limits)
            if cute.elem_less(tCcD[2 * i], limits):
                word = 2 * (i % C_WORD_PAIRS)
                gate = _bf16_pair(Uint32(c_words[word]))
                up = _bf16_pair(Uint32(c_words[word + 1])) if const_expr(self.gated) else gate
                # (d gate, d up) of the pair's two columns (srelu: (dh, None))
                d0, d1 = self.pair_backward(gate, up, (acc[2 * i], acc[2 * i + 1]), i % 2, consumer.row_probs,
                                            consumer.row_dprobs)
                d_gate[2 * i], d_gate[2 * i + 1] = d0[0], d1[0]
                if const_expr(self.gated):
                    acc[2 * i], acc[2 * i + 1] = d0[1], d1[1]
            else:  # rows past the expert's end: zeros in both tiles
                d_gate[2 * i], d_gate[2 * i + 1] = Float32(0.0), Float32(0.0)
                if const_expr(self.gated):
                    acc[2 * i], acc[2 * i + 1] = Float32(0.0), Float32(0.0)
        if const_expr(self.has_probs):
            self.store_dprobs_partials(consumer.row_dprobs, tCcD, lane, limits, args.mDprobsPartial, first_row, n_tile)
        sums_row = m_tile * WARPS_PER_TILE + mma_tidx // 32
        halves = ((d_gate, col0), (acc, ffn + col0)) if const_expr(self.gated) else ((d_gate, col0),)
        for h in cutlass.range_constexpr(len(halves)):
            values = [halves[h][0][v] for v in range(cute.size(consumer.mma.partials[0]))]
            quantize_tile_blockwise(values, tCcD, thr_mma, mma_tidx,
                                    (args.mRowData, args.mRowScale, args.mColData, args.mColScale), consumer.smem_q,
                                    first_row, halves[h][1], limits[0], m_tile, self.config.grad_format.max_normal,
                                    self.e5m2, self.config.power_of_two, _EPILOGUE_BARRIER)
            if const_expr(self.bias_grad):
                _warp_column_sums(values, tCcD, lane, args.mWarpSums, sums_row, halves[h][1])
        return stores

    def finish(self, consumer: _Consumer, args: BlockwiseFC2DgradArgs, work: TokenItems, bidx: Int32, grid: Int32):
        store_unused_blocks(args.mColData, args.mColScale, args.mTileStart[work.num_experts],
                            args.mRowData.shape[1] // TILE_N, bidx, grid, consumer.mma_tidx)


@cute.jit
def _warp_column_sums(values: list, tCcD: cute.Tensor, lane: Int32, mWarpSums: cute.Tensor, sums_row: Int32,
                      col0: Int32):
    """db1's partials of a dh tile: per column the thread's two rows (zeros past the expert's
    end), the warp's 8 quads by butterflies, written by lanes 0-3 to mWarpSums[sums_row, col0 + c]."""
    for j in cutlass.range_constexpr(cute.size(tCcD) // 4):
        for c in cutlass.range_constexpr(2):
            total = values[4 * j + c] + values[4 * j + 2 + c]  # row slots 0 and 1 of column 8j + 2 (lane % 4) + c
            total = total + cute.arch.shuffle_sync_bfly(total, offset=4)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=8)
            total = total + cute.arch.shuffle_sync_bfly(total, offset=16)
            if lane < 4:
                mWarpSums[sums_row, col0 + tCcD[4 * j + c][1]] = total


def _fake_arguments(config: BlockwiseFC2DgradConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments: T, H, F, E runtime values; H and F multiples of
    128 (the recipe's blocks), the scale rows' strides multiples of 4 (16 bytes), c's row stride a
    multiple of 8, Q_col(dh)'s rows of 128-byte blocks."""
    rows, hidden, ffn = cute.sym_int(), cute.sym_int(divisibility=TILE_K), cute.sym_int(divisibility=TILE_N)
    n1 = cute.sym_int(divisibility=TILE_N)
    starts, experts, sum_rows = cute.sym_int(), cute.sym_int(), cute.sym_int()
    padded_rows, h_blocks, f_blocks = cute.sym_int(divisibility=4), cute.sym_int(), cute.sym_int()
    dy, dy_scale = fake_token_rows(rows, hidden, h_blocks, padded_rows)
    w, w_scale = fake_weight_tiles(experts, ffn, hidden, f_blocks, h_blocks)
    probs = dprobs_partial = warp_sums = None
    if config.probs_dtype is not None:
        probs = fake_vector(FLOAT_DTYPES[config.probs_dtype], rows)
        dprobs_partial = fake_matrix(Float32, rows, f_blocks, divisibility=1, align=4)
    if config.bias_grad:
        warp_sums = fake_matrix(Float32, sum_rows, n1, divisibility=1, align=4)
    row_data, row_scale, col_data, col_scale = fake_both_ways(rows, n1, padded_rows)
    return (dy, dy_scale, w, w_scale, fake_matrix(BFloat16, rows, n1), probs, fake_vector(Int32, starts),
            fake_vector(Int32, starts), dprobs_partial, warp_sums, row_data, row_scale, col_data, col_scale, Int32(1),
            fake_stream())


_compile = config_compiler(BlockwiseFC2DgradSm90, _fake_arguments)  # (config, arch) -> CompiledKernel, cached


def problem_support(num_rows: int, hidden: int, ffn: int, num_experts: int, gated: bool = True) -> Reason | None:
    """None if the kernel runs a (T, H, F, E) problem, else why not (``ffn_problem_support``)."""
    return ffn_problem_support(num_rows, hidden, ffn, num_experts, gated)


compile_blockwise_fc2_dgrad = ahead_compiler(_NAME, _compile,
                                             BlockwiseFC2DgradConfig(Activation(ActivationKind.SWIGLU)),
                                             problem_support, "T, H, F, E", gated=True)


def fc2_dgrad_blockwise(dy: FP8BlockwiseTensor, w2t: FP8BlockwiseTensor, c: torch.Tensor, split_sizes: torch.Tensor,
                        *, activation: Activation, grad_format: ElementFormat | str = ElementFormat.E4M3,
                        probs: torch.Tensor | None = None, bias_grad: bool = False, power_of_two: bool = True,
                        groups: DeviceGroups | None = None, cluster: int | None = None,
                        pipelined: bool | None = None, site: str | None = None) -> FC2DgradOutput:
    """Steps 5-6 of the dataflow on Q_row(dy) (T, H) in ``grad_format`` and W2^T (E, F, H) E4M3 in
    128 x 128 tiles, with the saved c (T, 2F | F) bf16: dprobs (deterministic), dh as Q_row(dh)
    and Q_col(dh) in ``grad_format``, db1 with ``bias_grad``; no host sync. The contract of
    ``gmlp.triton_ref.blockwise_fc2_dgrad.fc2_dgrad_blockwise``.
    ``cluster`` 2: CTAs in pairs along M, the weight tiles multicast (``_cluster.PairedTile``; the
    same bytes, bit for bit on the H200); ``pipelined``: each k-tile promoted while the next one's
    wgmmas run (``BlockwiseFC2DgradConfig.pipelined``; the same bytes by construction); None:
    ``launch_options``' choice (the tuned table's entry of ``site``)."""
    require_block_shape(dy, "dy", BlockShape.ROWWISE)
    require_block_shape(w2t, "w2t", BlockShape.TILE)
    check_activation(activation)
    grad_format = enum_member(ElementFormat, grad_format, "grad_format")
    if dy.element_format is not grad_format:
        raise ValueError(f"dy must be in grad_format ({grad_format.value}), got {dy.element_format.value}")
    if w2t.element_format is not ElementFormat.E4M3:
        raise ValueError(f"w2t must be E4M3 (the recipe's weights), got {w2t.element_format.value}")
    tokens, hidden = dy.source_shape
    experts = split_sizes.numel()
    if w2t.data.dim() != 3 or w2t.data.shape[0] != experts or w2t.data.shape[2] != hidden \
            or not w2t.data.is_contiguous():
        raise ValueError(f"w2t must be a contiguous (E={experts}, F, H={hidden}), got {tuple(w2t.data.shape)}")
    ffn = w2t.data.shape[1]
    check_problem(_NAME, problem_support(tokens, hidden, ffn, experts, gated=activation.gated))
    n1 = (2 if activation.gated else 1) * ffn
    if tuple(c.shape) != (tokens, n1) or c.dtype != torch.bfloat16 or c.stride(1) != 1 or c.stride(0) % ELEMENT_ALIGN:
        raise ValueError(f"c must be bf16 row-major ({tokens}, {n1}) with a row stride a multiple of {ELEMENT_ALIGN}, "
                         f"got {c.dtype} {tuple(c.shape)} strides {c.stride()}")
    check_tma_bases(dy=dy.data, dy_scales=dy.scale_inv, w2t=w2t.data, c=c)
    check_token_scales("dy", dy.scale_inv)
    token_scalars("probs", probs, tokens)
    knobs = launch_options.launch_options("fc2_dgrad_blockwise", tokens, ffn, hidden, experts,
                                          dict(cluster=cluster, pipelined=pipelined), site=site)
    config = BlockwiseFC2DgradConfig(activation, grad_format=grad_format,
                                     probs_dtype=None if probs is None else probs.dtype, bias_grad=bias_grad,
                                     power_of_two=power_of_two, cluster=knobs["cluster"], pipelined=knobs["pipelined"])
    device = dy.data.device
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    num_tiles = layout.columnwise_blocks(tokens, experts)
    n_tiles = ffn // TILE_N
    # every (row, n-tile) partial is written (each row below its expert's end, by every n-tile of
    # its m-tile): no zero fill
    dprobs_partial = torch.empty(tokens, n_tiles, dtype=torch.float32, device=device) if probs is not None else None
    warp_sums = (torch.zeros(max(num_tiles, 1) * WARPS_PER_TILE, n1, dtype=torch.float32, device=device)
                 if bias_grad else None)
    buffers = both_ways_buffers(tokens, n1, experts, grad_format, device)
    dh, dh_scales, dh_col, dh_col_scales = buffers
    num_ctas = _schedule.grid_size(tokens, experts, n_tiles, device, config.cluster)
    if num_ctas == 0:
        no_token_columnwise(dh_col, dh_col_scales)
    run(_compile, config, device, num_ctas, dy.data.view(torch.uint8), dy.scale_inv, w2t.data.view(torch.uint8),
        w2t.scale_inv, c, probs, groups.row_start, groups.tile_start, dprobs_partial, warp_sums, dh.view(torch.uint8),
        dh_scales, dh_col.view(torch.uint8), dh_col_scales)
    dh_quantized = wrap_both_ways(buffers, groups, grad_format, power_of_two, split_sizes, tokens)
    dprobs = dprobs_partial.sum(dim=1) if probs is not None else None  # fixed order: deterministic
    db1 = None
    if bias_grad:
        tile_sums = warp_sums.view(-1, WARPS_PER_TILE, n1).sum(dim=1)  # fixed order
        # each expert's tiles in order, one thread per output element: deterministic, no atomics
        db1 = torch.segment_reduce(tile_sums, "sum", offsets=groups.tile_start, axis=0)
    return FC2DgradOutput(dprobs=dprobs, dh=None, db1=db1, dh_rowwise=dh_quantized.rowwise,
                          dh_columnwise=dh_quantized.columnwise)
