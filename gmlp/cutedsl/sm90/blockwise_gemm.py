"""CuTeDSL sm_90a grouped GEMM of the FP8 blockwise recipe ``D[rows of g] = A[rows of g] @ B_g^T
(+ bias_g)``, the scales promoted every 128 of K (FC2 forward, FC1 dgrad).

Twin of ``gmlp.triton_ref.blockwise_gemm`` (same operands: A a rowwise ``FP8BlockwiseTensor`` (T, K)
E4M3 with MN-major scales (K/128, pad4(T)); B (E, N, K) E4M3 in 128 x 128 tiles with scales (E,
N/128, K/128); same promotion ``acc += (sa * sb) * P``, the result up to the summation order).
A is E4M3, or E5M2 (FC1 dgrad's dh under ``grad_format=E5M2``: fp8 ``wgmma`` mixes the two
formats); B is E4M3. Compiled for sm_90a on the CPU (its PTX checked), run against the Triton twin
on the H100/H200; the layer's FC2 and FC1 dgrad sites take it on 9.x.

Kernel design (a site of the engine, ``_engine``: ``_schedule``'s work items, the skeleton's roles,
slots and barriers):

- Tiles: BM = 128 rows (an expert-aligned tile), BN = 128 columns (one weight tile row: one B
  scale per k-tile), BK = 128 fp8 elements: one 128-byte swizzle row and one scale block.
  ``wide`` (the default where N % 256 == 0): a work item is two such tiles side by side, 256
  columns, whose slots hold one A k-tile and two B k-tiles: A is read from L2 once per 256
  columns instead of 128 (the 128-wide kernel is L2-bound: 32 KB a 128 x 128 x 128 step, ncu
  2026-12-05), 48 KB a slot, 4 stages.
- Mainloop: ``_blockwise_mainloop``'s (a TMA producer warp, two consumer warpgroups of 64 rows,
  the promotion every k-tile, DeepGEMM's 1D2D form), the halves of a work item being weight tile
  rows ``2n`` and ``2n + 1`` (``BRows(halves, 1)``).
- Epilogue (``BlockwiseGemmConfig.store``): "regs", bf16 pairs (+ the bias row) from the
  registers, predicated at the expert's end (``grouped_gemm.store_bf16_pairs``), the tensor pipe
  idle meanwhile; "tma" (no bias), the engine's TMA-store epilogue (``_store``): each half's tile
  rounded into shared-memory subtiles and TMA-stored through the ragged view of D that ends at the
  expert's last row (``_tma.ragged_rows``), the halves through one ring of buffers, draining while
  the next item's mainloop runs. The same roundings: the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float8E4M3FN, Float8E5M2, Int32, const_expr

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90 import _schedule, _store, launch_options
from gmlp.cutedsl.sm90._blockwise_mainloop import (MMA_WARPGROUPS, TILE_K, TILE_N, BRows, PromotedArgs,
                                                   PromotedOperands, PromotedTokenRows, check_token_scales,
                                                   fake_token_rows, fake_weight_tiles, make_operands)
from gmlp.cutedsl.sm90._compile import (FLOAT_DTYPES, ahead_compiler, config_compiler, fake_matrix, fake_stream,
                                        fake_vector)
from gmlp.cutedsl.sm90._engine import GroupedGemmEngine, Slots
from gmlp.cutedsl.sm90._launch import check_optional, check_problem, check_tma_bases, run
from gmlp.cutedsl.sm90._pipeline import smem_array
from gmlp.cutedsl.sm90._schedule import TILE_M
from gmlp.cutedsl.sm90._tma import expert_rows, ragged_rows
from gmlp.cutedsl.sm90.grouped_gemm import store_bf16_pairs
from gmlp.cutedsl.sm90.configs import BlockwiseGemmConfig
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, require_block_shape
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["BlockwiseGemmConfig", "BlockwiseGemmSm90", "compile_blockwise_gemm", "problem_support",
           "grouped_gemm_fp8_blockwise"]

_NAME = "blockwise GEMM"


class BlockwiseGemmArgs(NamedTuple):
    """The kernel's arguments (the engine's ``args``)."""

    operands: PromotedArgs  # the promoted mainloop's
    mBias: cute.Tensor | None  # (E, N) bf16 or fp32
    mRowStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} m_h
    mTileStart: cute.Tensor  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
    mD: cute.Tensor  # (T, N) bf16, row-major
    tma_atom_d: cute.CopyAtom | None  # store="tma": the subtiles' TMA store
    mD_tma: cute.Tensor | None  # store="tma": TMA coordinates of D's ragged view
    d_smem_layout: cute.ComposedLayout | None  # store="tma": (epi rows, epi cols, _store.STAGES) bf16


@dataclass(frozen=True)  # frozen: the DSL's loops do not carry it, only read it
class _Consumer:
    """A consumer thread's state, built once before the item loop."""

    mma: PromotedOperands
    thr_mma: cute.ThrMma
    tCcD: cute.Tensor  # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
    out: cute.Tensor  # staging of the bf16 pairs
    half_stores: tuple  # store="tma": a half's TMA-store epilogue (one ring and pipeline for both), else ()

    @property
    def tile_store(self) -> _store.TileStore | None:
        """The store the engine drains after the last item (the halves share its pipeline)."""
        return self.half_stores[0] if self.half_stores else None


class BlockwiseGemmSm90(PromotedTokenRows, GroupedGemmEngine):
    """The blockwise grouped GEMM on the engine (see the module docstring): ``__call__`` the host
    side; the operand policy is ``PromotedTokenRows``, the epilogue this site's."""

    def __init__(self, config: BlockwiseGemmConfig):
        self.setup_engine(config, MMA_WARPGROUPS, cluster=config.cluster)
        self.halves = config.halves
        self.a_dtype = Float8E5M2 if config.a_format is ElementFormat.E5M2 else Float8E4M3FN
        self.pipelined = config.pipelined
        self.tma_store = config.store == "tma"

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,  # (T, K) uint8: fp8 bytes (config.a_format), row-major (Q_row's data)
        mAScale: cute.Tensor,  # (K/128, pad4(T)) fp32, MN-major (Q_row's scale_inv)
        mB: cute.Tensor,  # (E, N, K) uint8: E4M3 bytes, K-major (the weight's tiles)
        mBScale: cute.Tensor,  # (E, N/128, K/128) fp32 (the tiles' scale_inv)
        mBias: cute.Tensor | None,  # (E, N) bf16 or fp32
        mRowStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} m_h
        mTileStart: cute.Tensor,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128)
        mD: cute.Tensor,  # (T, N) bf16, row-major
        num_ctas: Int32,
        stream,
    ):
        ops = make_operands(mA, mAScale, mB, self.a_dtype, self.stages, self.cluster)
        fields = self.storage_fields(ops)
        store = None  # store="tma": the subtiles' smem layout and TMA store
        if const_expr(self.tma_store):
            store = _store.make_store_operands(ragged_rows(mD), MMA_WARPGROUPS)
            fields["sD"] = smem_array(BFloat16, cute.cosize(store.smem_layout))
        args = BlockwiseGemmArgs(PromotedArgs.of(ops, mBScale), mBias, mRowStart, mTileStart, mD,
                                 *_store.kernel_arguments(store))
        self.launch_engine(args, fields, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout, num_ctas, stream)

    def tma_atoms(self, args: BlockwiseGemmArgs) -> tuple:
        return super().tma_atoms(args) + ((args.tma_atom_d,) if const_expr(self.tma_store) else ())

    def b_rows(self, args: BlockwiseGemmArgs) -> BRows:
        return BRows(self.halves, 1)  # weight tile rows 2n and 2n + 1 (wide), or n

    def item_columns(self, args: BlockwiseGemmArgs) -> tuple:
        return args.mD.shape[1], TILE_N * self.halves

    def consumer_setup(self, args: BlockwiseGemmArgs, storage, tiled_mma, mma_tidx, warp_idx, slots: Slots, tCrA,
                       tCrBs) -> _Consumer:
        thr_mma = tiled_mma.get_slice(mma_tidx)
        tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
        mma = self.promoted_operands(slots, tCrA, tCrBs, tCcD, tCcD.shape)
        half_stores = ()
        if const_expr(self.tma_store):
            store = self.tile_store(storage, args.d_smem_layout, tiled_mma, mma.accs[0], mma_tidx, warp_idx)
            half_stores = store.over(mma.accs)
        return _Consumer(mma, thr_mma, tCcD, cute.make_rmem_tensor(tCcD.shape, BFloat16), half_stores)

    @cute.jit
    def epilogue(self, consumer: _Consumer, args: BlockwiseGemmArgs, tile: tuple, ahead, stores: Int32) -> Int32:
        g, _, n_tile, first_row, end_row = tile
        rows_b = self.b_rows(args).of(n_tile, self.halves)
        for h in cutlass.range_constexpr(self.halves):
            if const_expr(self.tma_store):
                # the ragged view: rows from end_row on (the next expert's) are not written
                gD = cute.local_tile(expert_rows(args.mD_tma, first_row, end_row - first_row), (TILE_M, TILE_N),
                                     (0, rows_b[h]))
                consumer.half_stores[h].store(args.tma_atom_d, gD, stores)
                stores = stores + 1
            else:
                store_bf16_pairs(consumer.mma.accs[h], consumer.out, consumer.thr_mma, consumer.tCcD, args.mD,
                                 args.mBias, g, rows_b[h], first_row, end_row, TILE_N)
        return stores


def _fake_arguments(config: BlockwiseGemmConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments: T, N, K, E runtime values; K and N multiples
    of 128 (the recipe's blocks), the scale rows' strides multiples of 4 (16 bytes)."""
    rows, n, k = cute.sym_int(), cute.sym_int(divisibility=TILE_N), cute.sym_int(divisibility=TILE_K)
    starts, experts = cute.sym_int(), cute.sym_int()
    n_blocks, k_blocks, padded_rows = cute.sym_int(), cute.sym_int(), cute.sym_int(divisibility=4)
    a, a_scale = fake_token_rows(rows, k, k_blocks, padded_rows)
    b, b_scale = fake_weight_tiles(experts, n, k, n_blocks, k_blocks)
    bias = None
    if config.bias_dtype is not None:
        bias = fake_matrix(FLOAT_DTYPES[config.bias_dtype], experts, n, divisibility=1, align=4)
    return (a, a_scale, b, b_scale, bias, fake_vector(Int32, starts), fake_vector(Int32, starts),
            fake_matrix(BFloat16, rows, n), Int32(1), fake_stream())


_compile = config_compiler(BlockwiseGemmSm90, _fake_arguments)  # (config, arch) -> CompiledKernel, cached


def problem_support(num_rows: int, n: int, k: int, num_experts: int) -> Reason | None:
    """None if the kernel runs a (T, N, K, E) problem, else why not."""
    reason = _schedule.expert_count_reason(num_experts)
    if reason is not None:
        return reason
    if k <= 0 or k % TILE_K or n % TILE_N:
        return Reason(ReasonKind.SHAPE, f"K={k} and N={n} must be positive multiples of 128 (the recipe's blocks)")
    if max(num_rows, n, k) >= 2**31:
        return Reason(ReasonKind.SHAPE, f"T={num_rows}, N={n}, K={k} too large for 32-bit tile coordinates")
    return None


compile_blockwise_gemm = ahead_compiler(_NAME, _compile, BlockwiseGemmConfig(), problem_support, "T, N, K, E")


def grouped_gemm_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                               bias: torch.Tensor | None = None, groups: DeviceGroups | None = None,
                               wide: bool | None = None, cluster: int | None = None, pipelined: bool | None = None,
                               store: str | None = None, site: str | None = None) -> torch.Tensor:
    """(T, N) bf16: each expert's tokens of ``a`` (rowwise E4M3 or E5M2, (T, K)) times its
    tile-quantized weight ``b`` (E4M3 (E, N, K), contiguous) transposed, plus ``bias`` (E, N) bf16
    or fp32 (added in fp32 before the rounding); no host sync. The contract of
    ``gmlp.triton_ref.blockwise_gemm.grouped_gemm_fp8_blockwise``. ``wide``: 256-column work items
    (``BlockwiseGemmConfig.wide``; needs N % 256 == 0). The bytes are the same either way (each
    column's sums and promotions do not depend on it). A knob left None is ``launch_options``'
    choice (the tuned table's entry of ``site``, wide wherever N allows it).
    ``cluster`` 2: CTAs in pairs along M, the weight tiles multicast (``_cluster.PairedTile``; the
    same bytes, bit for bit on the H200). ``pipelined``: each k-tile promoted while the next one's
    wgmmas run (``BlockwiseGemmConfig.pipelined``; needs wide=False), the same bytes by
    construction. ``store``: the epilogue's, "regs" or "tma" (``BlockwiseGemmConfig.store``; no
    bias), the same bytes."""
    require_block_shape(a, "a", BlockShape.ROWWISE)
    require_block_shape(b, "b", BlockShape.TILE)
    if b.element_format is not ElementFormat.E4M3:
        raise ValueError(f"b must be E4M3 (the recipe's weights), got {b.element_format.value}")
    (tokens, k), experts = a.source_shape, split_sizes.numel()
    if b.data.dim() != 3 or b.data.shape[0] != experts or b.data.shape[2] != k or not b.data.is_contiguous():
        raise ValueError(f"b must be a contiguous (E={experts}, N, K={k}), got {tuple(b.data.shape)}")
    n = b.data.shape[1]
    knobs = launch_options.launch_options("grouped_gemm_fp8_blockwise", tokens, n, k, experts,
                                          dict(wide=wide, cluster=cluster, pipelined=pipelined, store=store),
                                          bias=bias is not None, site=site)
    wide, cluster, pipelined, store = knobs["wide"], knobs["cluster"], knobs["pipelined"], knobs["store"]
    if wide and n % (2 * TILE_N):
        raise ValueError(f"wide=True needs N a multiple of {2 * TILE_N} (two 128-column halves a work item), "
                         f"got N={n}")
    check_problem(_NAME, problem_support(tokens, n, k, experts))
    check_tma_bases(a=a.data, a_scales=a.scale_inv, b=b.data)
    check_token_scales("a", a.scale_inv)
    check_optional("bias", bias, (experts, n))
    if bias is not None and bias.dtype not in FLOAT_DTYPES:
        raise TypeError(f"bias must be one of {tuple(FLOAT_DTYPES)}, got {bias.dtype}")
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a.data.device)
    config = BlockwiseGemmConfig(bias_dtype=None if bias is None else bias.dtype, a_format=a.element_format, wide=wide,
                                 cluster=cluster, pipelined=pipelined, store=store)
    num_ctas = _schedule.grid_size(tokens, experts, scale_layout.ceil_div(n, config.tile_n), a.data.device, cluster)
    run(_compile, config, a.data.device, num_ctas, a.data.view(torch.uint8), a.scale_inv, b.data.view(torch.uint8),
        b.scale_inv, bias, groups.row_start, groups.tile_start, out)
    return out
