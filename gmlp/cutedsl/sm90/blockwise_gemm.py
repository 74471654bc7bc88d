"""CuTeDSL sm_90a grouped GEMM of the FP8 blockwise recipe ``D[rows of g] = A[rows of g] @ B_g^T
(+ bias_g)``, the scales promoted every 128 of K (FC2 forward, FC1 dgrad).

Twin of ``gmlp.triton_ref.blockwise_gemm`` (same operands: A a rowwise ``FP8BlockwiseTensor`` (T, K)
E4M3 with MN-major scales (K/128, pad4(T)); B (E, N, K) E4M3 in 128 x 128 tiles with scales (E,
N/128, K/128); same promotion ``acc += (sa * sb) * P``, the result up to the summation order).
A is E4M3, or E5M2 (FC1 dgrad's dh under ``grad_format=E5M2``: fp8 ``wgmma`` mixes the two
formats); B is E4M3. Compiled for sm_90a on the CPU (its PTX checked), run against the Triton twin
on the H100/H200; the layer's FC2 and FC1 dgrad sites take it on 9.x.

Kernel design (``_schedule``'s work items, ``_pipeline``'s roles, slots and barriers):

- Tiles: BM = 128 rows (an expert-aligned tile), BN = 128 columns (one weight tile row: one B
  scale per k-tile), BK = 128 fp8 elements: one 128-byte swizzle row and one scale block.
  ``wide`` (the default where N % 256 == 0): a work item is two such tiles side by side, 256
  columns, whose slots hold one A k-tile and two B k-tiles: A is read from L2 once per 256
  columns instead of 128 (the 128-wide kernel is L2-bound: 32 KB a 128 x 128 x 128 step, ncu
  2026-12-05), 48 KB a slot, 4 stages.
- Mainloop: ``_blockwise_mainloop``'s (a TMA producer warp, two consumer warpgroups of 64 rows,
  the promotion every k-tile, DeepGEMM's 1D2D form), the halves of a work item being weight tile
  rows ``2n`` and ``2n + 1`` (``BRows(halves, 1)``).
- Epilogue: bf16 pairs (+ the bias row) from the registers, predicated at the expert's end
  (``grouped_gemm.store_bf16_pairs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float8E4M3FN, Float8E5M2, Float32, Int32, const_expr

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90 import _schedule
from gmlp.cutedsl.sm90._blockwise_mainloop import (
    MMA_WARPGROUPS,
    TILE_K,
    TILE_N,
    BRows,
    check_token_scales,
    fake_token_rows,
    fake_weight_tiles,
    make_operands,
    produce_items,
    promoted_k_tiles,
    scaled_slot_tensors,
    slot_bytes,
    storage_fields,
)
from gmlp.cutedsl.sm90._compile import (
    FLOAT_DTYPES,
    CompiledKernel,
    compile_ahead,
    config_compiler,
    fake_matrix,
    fake_stream,
    fake_vector,
)
from gmlp.cutedsl.sm90._launch import (
    check_optional,
    check_problem,
    check_tma_bases,
    run,
)
from gmlp.cutedsl.sm90._pipeline import (
    THREADS_PER_WARPGROUP,
    StagedConfig,
    WideItems,
    consumer_fragments,
    consumer_states,
    cta_roles,
    launch,
    make_mainloop_pipeline,
    register_split,
    shared_storage,
    smem_array,
)
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.cutedsl.sm90.grouped_gemm import store_bf16_pairs
from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseTensor,
    require_block_shape,
)
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["BlockwiseGemmConfig", "BlockwiseGemmSm90", "compile_blockwise_gemm", "problem_support",
           "grouped_gemm_fp8_blockwise"]

_NAME = "blockwise GEMM"


@dataclass(frozen=True)
class BlockwiseGemmConfig(StagedConfig, WideItems):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    bias_dtype: torch.dtype | None = None  # FC2's b2 (E, N), bf16 or fp32, added before the rounding; None: none
    a_format: ElementFormat = ElementFormat.E4M3  # A's fp8 format (B is E4M3)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    wide: bool = False  # two 128-column halves a work item (N % 256 == 0; see the module docstring)

    def __post_init__(self):
        if self.bias_dtype is not None and self.bias_dtype not in FLOAT_DTYPES:
            raise ValueError(f"bias dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.bias_dtype}")
        self.check_stages()

    def stage_bytes(self) -> int:
        """One slot: an A k-tile and a B k-tile a half, of fp8 bytes, and A's scale box."""
        return slot_bytes(self.halves)


class BlockwiseGemmSm90:
    """The jit code (``__call__`` the host side, ``kernel`` the device side; see the module docstring)."""

    def __init__(self, config: BlockwiseGemmConfig):
        self.config = config
        self.stages = config.num_stages()
        self.a_dtype = Float8E5M2 if config.a_format is ElementFormat.E5M2 else Float8E4M3FN
        self.threads = (1 + MMA_WARPGROUPS) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads)

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
        ops = make_operands(mA, mAScale, mB, self.a_dtype, self.stages)
        fields = storage_fields(self.stages, ops, self.a_dtype)
        if const_expr(self.config.wide):
            fields["sB1"] = smem_array(Float8E4M3FN, cute.cosize(ops.b_smem_layout))  # the second half's B tiles
        self.shared_storage = shared_storage(fields)
        launch(self.kernel(ops.tma_atom_a, ops.tma_a, ops.tma_atom_sa, ops.tma_sa, ops.tma_atom_b, ops.tma_b,
                           mBScale, mBias, mRowStart, mTileStart, mD, ops.tiled_mma, ops.a_smem_layout,
                           ops.b_smem_layout),
               num_ctas, self.threads, stream)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,  # TMA coordinates of A (T, K)
        tma_atom_sa: cute.CopyAtom,
        mAScale: cute.Tensor,  # TMA coordinates of its scales (pad4(T), K/128)
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,  # TMA coordinates of B (N, K, E)
        mBScale: cute.Tensor,
        mBias: cute.Tensor | None,
        mRowStart: cute.Tensor,
        mTileStart: cute.Tensor,
        mD: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem_layout: cute.ComposedLayout,
        b_smem_layout: cute.ComposedLayout,
    ):
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles((tma_atom_a, tma_atom_sa, tma_atom_b))
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        halves = self.config.halves
        sA, sB, sAScale, stage_bytes = scaled_slot_tensors(storage, self.stages, a_smem_layout, b_smem_layout,
                                                           halves, self.a_dtype)
        sBs = [sB]
        if const_expr(halves == 2):
            sBs.append(storage.sB1.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner))
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages, MMA_WARPGROUPS,
                                          stage_bytes)
        items = TokenItems.of(mRowStart, mTileStart, mD.shape[1], TILE_N * halves)
        k_tiles = (mA.shape[1] + TILE_K - 1) // TILE_K

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every (A, B) k-tile of this CTA's items
            produce_items(mainloop, self.stages, items, bidx, grid, k_tiles, tma_atom_a, mA, sA, tma_atom_sa,
                          mAScale, sAScale, tma_atom_b, mB, sBs, BRows(halves, 1))

        if warpgroup > 0:  # consumers: promoted wgmma mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            mma_tidx = tidx - THREADS_PER_WARPGROUP
            tCrA, tCrBs = consumer_fragments(tiled_mma, warpgroup, sA, sBs)
            thr_mma = tiled_mma.get_slice(mma_tidx)
            # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators
            tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
            accs = [cute.make_rmem_tensor(tCcD.shape, Float32) for _ in range(halves)]
            partial = cute.make_rmem_tensor(tCcD.shape, Float32)
            out = cute.make_rmem_tensor(tCcD.shape, BFloat16)  # staging of the bf16 pairs
            read_state, _ = consumer_states(self.stages)
            # the thread's two accumulator rows (m64 layout: elements 4j, 4j+1 and 4j+2, 4j+3)
            rows = (tCcD[0][0], tCcD[2][0])
            item = bidx
            while item < items.count:
                g, _, n_tile, first_row, end_row = items.tile(item)
                rows_b = BRows(halves, 1).of(n_tile, halves)
                tiled_mma, read_state = promoted_k_tiles(tiled_mma, mainloop, read_state, k_tiles, tCrA, tCrBs, accs,
                                                         partial, sAScale, mBScale, g, rows_b, first_row, rows)
                for h in cutlass.range_constexpr(halves):
                    store_bf16_pairs(accs[h], out, thr_mma, tCcD, mD, mBias, g, rows_b[h], first_row, end_row,
                                     TILE_N)
                item += grid


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


def compile_blockwise_gemm(arch: str = "sm_90a", config: BlockwiseGemmConfig = BlockwiseGemmConfig(), *,
                           shape: tuple[int, int, int, int] | None = None) -> CompiledKernel:
    """Compile the kernel for ``arch`` without a GPU; returns it with its PTX and cubin."""
    return compile_ahead(_NAME, _compile, config, arch, None if shape is None else problem_support(*shape))


def grouped_gemm_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                               bias: torch.Tensor | None = None, groups: DeviceGroups | None = None,
                               wide: bool | None = None) -> torch.Tensor:
    """(T, N) bf16: each expert's tokens of ``a`` (rowwise E4M3 or E5M2, (T, K)) times its
    tile-quantized weight ``b`` (E4M3 (E, N, K), contiguous) transposed, plus ``bias`` (E, N) bf16
    or fp32 (added in fp32 before the rounding); no host sync. The contract of
    ``gmlp.triton_ref.blockwise_gemm.grouped_gemm_fp8_blockwise``. ``wide``: 256-column work items
    (``BlockwiseGemmConfig.wide``; needs N % 256 == 0); None: wide wherever N allows it. The
    bytes are the same either way (each column's sums and promotions do not depend on it)."""
    require_block_shape(a, "a", BlockShape.ROWWISE)
    require_block_shape(b, "b", BlockShape.TILE)
    if b.element_format is not ElementFormat.E4M3:
        raise ValueError(f"b must be E4M3 (the recipe's weights), got {b.element_format.value}")
    (tokens, k), experts = a.source_shape, split_sizes.numel()
    if b.data.dim() != 3 or b.data.shape[0] != experts or b.data.shape[2] != k or not b.data.is_contiguous():
        raise ValueError(f"b must be a contiguous (E={experts}, N, K={k}), got {tuple(b.data.shape)}")
    n = b.data.shape[1]
    if wide is None:
        wide = n % (2 * TILE_N) == 0
    elif wide and n % (2 * TILE_N):
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
    config = BlockwiseGemmConfig(bias_dtype=None if bias is None else bias.dtype, a_format=a.element_format, wide=wide)
    num_ctas = _schedule.grid_size(tokens, experts, scale_layout.ceil_div(n, config.tile_n), a.data.device)
    run(_compile, config, a.data.device, num_ctas, a.data.view(torch.uint8), a.scale_inv, b.data.view(torch.uint8),
        b.scale_inv, bias, groups.row_start, groups.tile_start, out)
    return out
