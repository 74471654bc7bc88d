"""CuTeDSL sm_90a FC1 forward of the FP8 blockwise recipe: ``h = Q_row(x) @ W1_g^T (+ b1_g)``
with the promotion every 128 of H, and the fused epilogue ``c = bf16(h)``, ``a = act(h) * probs``
written as Q_row(a) (1 x 128 blocks) and Q_col(a) (128 x 1 blocks, block-aligned) from the same
registers.

Twin of ``gmlp.triton_ref.blockwise_fc1.fc1_forward_blockwise`` (same arguments and outputs; the
accumulators equal up to the fp8 ``wgmma`` chains' summation order, the epilogue's operations the
same: the activation's (``_epilogue_math``, bitwise Triton's) and the spec's scales, so the bytes
are Triton's wherever the accumulators are: checked bit for bit on exactly summable operands).

Kernel design:

- Mainloop: the blockwise grouped GEMM's (``_blockwise_mainloop``) with its two halves a work
  item being the gate and the up tiles of one 128-column a tile: weight tile rows n and
  F / 128 + n of W1_g (``BRows(1, F / 128)``), read in place in W1's stored [gate; up] order.
  srelu: one half (h). A slot holds x's k-tile and the two W1 k-tiles (48 KB: 4 stages beside the
  epilogue's 20 KB).
- Epilogue: FC1's activation pass (``_fc1_epilogue``: the bias, c's bf16 pairs, the activation
  times probs, the fp32 a over the gate accumulator), then ``_blockwise_epilogue`` quantizes the
  tile both ways (rows past the expert's end as zeros); the columnwise blocks past the last
  expert's are zeroed (scale 1.0) after the CTA's work items.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Float8E4M3FN, Int32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.operands import token_scalars
from gmlp.contract.outputs import FC1Output
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
from gmlp.cutedsl.sm90._fc1_epilogue import ActivationEpilogue
from gmlp.cutedsl.sm90._launch import check_activation, check_problem, check_tma_bases, run
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90.configs import BlockwiseFC1Config
from gmlp.fp8_blockwise.buffers import both_ways_buffers, no_token_columnwise, wrap_both_ways
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, require_block_shape
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["BlockwiseFC1Config", "BlockwiseFC1Sm90", "compile_blockwise_fc1", "problem_support",
           "fc1_forward_blockwise"]

_NAME = "blockwise fc1 kernel"
_EPILOGUE_BARRIER = 1  # named barrier of the 256 consumer threads; 0 is the CTA's
A_FORMAT = ElementFormat.E4M3  # the recipe quantizes a in E4M3


class BlockwiseFC1Args(NamedTuple):
    """The kernel's arguments (the engine's ``args``; A is x, B is W1)."""

    operands: PromotedArgs  # the promoted mainloop's
    mBias: cute.Tensor | None  # (E, N1) bf16 or fp32
    mProbs: cute.Tensor | None  # (T,) fp32 or bf16
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mTileStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
    mC: cute.Tensor  # (T, N1) bf16
    mRowData: cute.Tensor  # (T, F) uint8: Q_row(a)'s E4M3 bytes
    mRowScale: cute.Tensor  # (F/128, pad4(T)) fp32
    mColData: cute.Tensor  # (F, 128 n_blocks) uint8: Q_col(a)'s E4M3 bytes, block-aligned
    mColScale: cute.Tensor  # (F, pad4(n_blocks)) fp32


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    mma: PromotedOperands  # accs: gate (h), up
    thr_mma: cute.ThrMma
    mma_tidx: Int32
    # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators:
    # ((2 columns, 2 rows, 16 column groups), 1, 1)
    tCcD: cute.Tensor
    smem_q: tuple  # the quantizing epilogue's smem
    pair: cute.Tensor  # staging of one bf16 pair
    pair_bits: cute.Tensor
    row_probs: cute.Tensor


class BlockwiseFC1Sm90(PromotedTokenRows, GroupedGemmEngine, ActivationEpilogue):
    """Blockwise FC1 on the engine (module docstring): ``__call__`` the host side; the operand
    policy is ``PromotedTokenRows``, the epilogue this site's."""

    quantized = True  # the activation pass leaves the fp32 a in the gate accumulator
    tma_store = False  # c's pairs from the registers
    a_dtype = Float8E4M3FN

    def __init__(self, config: BlockwiseFC1Config):
        self.setup_engine(config, MMA_WARPGROUPS, cluster=config.cluster)
        self.halves = config.halves
        self.activation = config.activation
        self.gated = config.activation.gated
        self.has_bias = config.bias_dtype is not None
        self.has_probs = config.probs_dtype is not None

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # (T, H) uint8: Q_row(x)'s E4M3 bytes
        mXScale: cute.Tensor,  # (H/128, pad4(T)) fp32, MN-major
        mW: cute.Tensor,  # (E, N1, H) uint8: W1's E4M3 bytes in 128 x 128 tiles, K-major
        mWScale: cute.Tensor,  # (E, N1/128, H/128) fp32
        mBias: cute.Tensor | None,  # (E, N1) bf16 or fp32
        mProbs: cute.Tensor | None,  # (T,) fp32 or bf16
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
        mC: cute.Tensor,  # (T, N1) bf16
        mRowData: cute.Tensor,  # (T, F) uint8: Q_row(a)'s E4M3 bytes
        mRowScale: cute.Tensor,  # (F/128, pad4(T)) fp32
        mColData: cute.Tensor,  # (F, 128 n_blocks) uint8: Q_col(a)'s E4M3 bytes, block-aligned
        mColScale: cute.Tensor,  # (F, pad4(n_blocks)) fp32
        num_ctas: Int32,
        stream,
    ):
        ops = make_operands(mX, mXScale, mW, Float8E4M3FN, self.stages, self.cluster)
        fields = self.storage_fields(ops)  # the up tiles as sB1 (gated)
        fields.update(_quantize_epilogue.smem_fields())
        check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        args = BlockwiseFC1Args(PromotedArgs.of(ops, mWScale), mBias, mProbs, mRowStart, mTileStart, mC, mRowData,
                                mRowScale, mColData, mColScale)
        self.launch_engine(args, fields, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout, num_ctas, stream)

    def b_rows(self, args: BlockwiseFC1Args) -> BRows:
        return BRows(1, args.mRowData.shape[1] // TILE_N)  # the gate tile row n, the up tile row F / 128 + n

    def item_columns(self, args: BlockwiseFC1Args) -> tuple:
        return args.mRowData.shape[1], TILE_N  # a's columns (gate and up tiles side by side in a slot)

    def consumer_setup(self, args: BlockwiseFC1Args, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
        mma = self.promoted_operands(slots, tCrA, tCrBs, tCcD, pair_fragment(tCcD.shape))
        pair = cute.make_rmem_tensor((2,), BFloat16)
        return _Consumer(mma, thr_mma, mma_tidx, tCcD, _quantize_epilogue.smem_tensors(storage), pair,
                         cute.recast_tensor(pair, Int32), cute.make_rmem_tensor((2,), Float32))

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: BlockwiseFC1Args, tile: tuple, ahead, stores: Int32) -> Int32:
        """Rows first_row + [0, 128) (those < end_row are the expert's), a columns col0 + [0, 128)."""
        g, m_tile, n_tile, first_row, end_row = tile
        ffn = args.mRowData.shape[1]
        accs, tCcD, thr_mma = consumer.mma.accs, consumer.tCcD, consumer.thr_mma
        col0 = n_tile * TILE_N
        limits = (end_row - first_row, ffn - col0)
        if const_expr(self.has_probs):
            load_row_probs(consumer.row_probs, args.mProbs, consumer.mma.rows, first_row, limits[0])
        tCgC, tCgU = c_pair_views(thr_mma, args.mC, first_row, col0, ffn, (TILE_M, TILE_N), self.gated)
        self.activation_pass(accs[0], accs[self.halves - 1], tCcD, limits, col0, g, ffn, args.mBias,
                             consumer.row_probs, consumer.pair, consumer.pair_bits, (tCgC, tCgU, None), None)
        # a (over the gate accumulator), zero in the rows past the expert's end
        values = [cutlass.select_(tCcD[v][0] < limits[0], accs[0][v], Float32(0.0))
                  for v in range(cute.size(consumer.mma.partials[0]))]
        quantize_tile_blockwise(values, tCcD, thr_mma, consumer.mma_tidx,
                                (args.mRowData, args.mRowScale, args.mColData, args.mColScale), consumer.smem_q,
                                first_row, col0, limits[0], m_tile, A_FORMAT.max_normal, False,
                                self.config.power_of_two, _EPILOGUE_BARRIER)
        return stores

    def finish(self, consumer: _Consumer, args: BlockwiseFC1Args, work: TokenItems, bidx: Int32, grid: Int32):
        store_unused_blocks(args.mColData, args.mColScale, args.mTileStart[work.num_experts], work.n_tiles, bidx,
                            grid, consumer.mma_tidx)


def _fake_arguments(config: BlockwiseFC1Config) -> tuple:
    """Symbolic stand-ins of the kernel's arguments: T, H, F, E runtime values; H and F multiples of
    128 (the recipe's blocks), the scale rows' strides multiples of 4 (16 bytes), Q_col(a)'s rows
    of 128-byte blocks."""
    rows, hidden, ffn = cute.sym_int(), cute.sym_int(divisibility=TILE_K), cute.sym_int(divisibility=TILE_N)
    n1 = cute.sym_int(divisibility=TILE_N)
    starts, experts = cute.sym_int(), cute.sym_int()
    padded_rows, h_blocks = cute.sym_int(divisibility=4), cute.sym_int()
    x, x_scale = fake_token_rows(rows, hidden, h_blocks, padded_rows)
    w, w_scale = fake_weight_tiles(experts, n1, hidden, cute.sym_int(), h_blocks)
    bias = probs = None
    if config.bias_dtype is not None:
        bias = fake_matrix(FLOAT_DTYPES[config.bias_dtype], experts, n1, divisibility=1, align=4)
    if config.probs_dtype is not None:
        probs = fake_vector(FLOAT_DTYPES[config.probs_dtype], rows)
    row_data, row_scale, col_data, col_scale = fake_both_ways(rows, ffn, padded_rows)
    return (x, x_scale, w, w_scale, bias, probs, fake_vector(Int32, starts), fake_vector(Int32, starts),
            fake_matrix(BFloat16, rows, n1), row_data, row_scale, col_data, col_scale, Int32(1), fake_stream())


_compile = config_compiler(BlockwiseFC1Sm90, _fake_arguments)  # (config, arch) -> CompiledKernel, cached


def problem_support(num_rows: int, hidden: int, ffn: int, num_experts: int, gated: bool = True) -> Reason | None:
    """None if the kernel runs a (T, H, F, E) problem, else why not (``ffn_problem_support``)."""
    return ffn_problem_support(num_rows, hidden, ffn, num_experts, gated)


compile_blockwise_fc1 = ahead_compiler(_NAME, _compile, BlockwiseFC1Config(Activation(ActivationKind.SWIGLU)),
                                       problem_support, "T, H, F, E", gated=True)


def fc1_forward_blockwise(x: FP8BlockwiseTensor, w1: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                          ffn_hidden_size: int, activation: Activation, b1: torch.Tensor | None = None,
                          probs: torch.Tensor | None = None, power_of_two: bool = True,
                          groups: DeviceGroups | None = None, cluster: int | None = None,
                          site: str | None = None) -> FC1Output:
    """FC1 of every expert on Q_row(x) (T, H) E4M3 and W1 (E, 2F | F, H) E4M3 in 128 x 128 tiles
    ([gate; up] halves), with c = bf16(h) and a = act(h) * probs written as Q_row(a) and Q_col(a)
    (E4M3, ``power_of_two`` scales); no host sync. The contract of
    ``gmlp.triton_ref.blockwise_fc1.fc1_forward_blockwise``.
    ``cluster`` 2: CTAs in pairs along M, the weight tiles multicast (``_cluster.PairedTile``; the
    same bytes, bit for bit on the H200); None: ``launch_options``' choice (the tuned table's entry
    of ``site``)."""
    require_block_shape(x, "x", BlockShape.ROWWISE)
    require_block_shape(w1, "w1", BlockShape.TILE)
    check_activation(activation)
    for name, operand in (("x", x), ("w1", w1)):
        if operand.element_format is not ElementFormat.E4M3:
            raise ValueError(f"{name} must be E4M3 (the recipe's forward operands), got {operand.element_format.value}")
    tokens, hidden = x.source_shape
    experts, ffn = split_sizes.numel(), ffn_hidden_size
    n1 = (2 if activation.gated else 1) * ffn
    check_problem(_NAME, problem_support(tokens, hidden, ffn, experts, gated=activation.gated))
    if tuple(w1.data.shape) != (experts, n1, hidden) or not w1.data.is_contiguous():
        raise ValueError(f"w1 must be a contiguous ({experts}, {n1}, {hidden}) for {activation.name} with F={ffn}, got "
                         f"{tuple(w1.data.shape)}")
    check_tma_bases(x=x.data, x_scales=x.scale_inv, w1=w1.data)
    check_token_scales("x", x.scale_inv)
    token_scalars("probs", probs, tokens)
    if b1 is not None and (tuple(b1.shape) != (experts, n1) or not b1.is_contiguous()):
        raise ValueError(f"b1 must be a contiguous ({experts}, {n1}) tensor, got {tuple(b1.shape)}")
    cluster = launch_options.launch_options("fc1_forward_blockwise", tokens, n1, hidden, experts,
                                            dict(cluster=cluster), site=site)["cluster"]
    config = BlockwiseFC1Config(activation, bias_dtype=None if b1 is None else b1.dtype,
                                probs_dtype=None if probs is None else probs.dtype, power_of_two=power_of_two,
                                cluster=cluster)
    device = x.data.device
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    c = torch.empty(tokens, n1, dtype=torch.bfloat16, device=device)
    buffers = both_ways_buffers(tokens, ffn, experts, A_FORMAT, device)
    a, a_scales, a_col, a_col_scales = buffers
    num_ctas = _schedule.grid_size(tokens, experts, ffn // TILE_N, device, cluster)
    if num_ctas == 0:
        no_token_columnwise(a_col, a_col_scales)
    run(_compile, config, device, num_ctas, x.data.view(torch.uint8), x.scale_inv, w1.data.view(torch.uint8),
        w1.scale_inv, b1, probs, groups.row_start, groups.tile_start, c, a.view(torch.uint8), a_scales,
        a_col.view(torch.uint8), a_col_scales)
    quantized = wrap_both_ways(buffers, groups, A_FORMAT, power_of_two, split_sizes, tokens)
    return FC1Output(c=c, a=None, a_rowwise=quantized.rowwise, a_columnwise=quantized.columnwise)
