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

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, const_expr

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.operands import token_scalars
from gmlp.contract.outputs import FC1Output
from gmlp.contract.reasons import Reason
from gmlp.cutedsl.sm90 import _quantize_epilogue, _schedule
from gmlp.cutedsl.sm90._blockwise_epilogue import fake_both_ways, quantize_tile_blockwise, store_unused_blocks
from gmlp.cutedsl.sm90._blockwise_mainloop import (
    MMA_WARPGROUPS,
    TILE_K,
    TILE_N,
    BRows,
    check_token_scales,
    fake_token_rows,
    fake_weight_tiles,
    ffn_problem_support,
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
from gmlp.cutedsl.sm90._epilogue_math import c_pair_views, load_row_probs, pair_fragment
from gmlp.cutedsl.sm90._fc1_epilogue import ActivationEpilogue
from gmlp.cutedsl.sm90._launch import check_activation, check_problem, check_tma_bases, run
from gmlp.cutedsl.sm90._pipeline import (
    THREADS_PER_WARPGROUP,
    StagedConfig,
    consumer_fragments,
    consumer_states,
    cta_roles,
    launch,
    make_mainloop_pipeline,
    register_split,
    shared_storage,
    smem_array,
)
from gmlp.cutedsl.sm90._quantize_epilogue import check_fragment_layout
from gmlp.cutedsl.sm90._schedule import TILE_M, TokenItems
from gmlp.fp8_blockwise.buffers import both_ways_buffers, no_token_columnwise, wrap_both_ways
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, require_block_shape
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["BlockwiseFC1Config", "BlockwiseFC1Sm90", "compile_blockwise_fc1", "problem_support",
           "fc1_forward_blockwise"]

_NAME = "blockwise fc1 kernel"
_EPILOGUE_BARRIER = 1  # named barrier of the 256 consumer threads; 0 is the CTA's
A_FORMAT = ElementFormat.E4M3  # the recipe quantizes a in E4M3


@dataclass(frozen=True)
class BlockwiseFC1Config(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    bias_dtype: torch.dtype | None = None  # None: no b1
    probs_dtype: torch.dtype | None = None  # None: no probs
    power_of_two: bool = True  # a's scales truncated to powers of two (the recipe's default)
    stages: int | None = None  # smem pipeline depth; None: as many as fit

    def __post_init__(self):
        check_activation(self.activation)
        for name in ("bias_dtype", "probs_dtype"):
            dtype = getattr(self, name)
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(f"{name} must be one of {tuple(FLOAT_DTYPES)}, got {dtype}")
        self.check_stages()

    @property
    def halves(self) -> int:
        """B tiles a slot: gate and up for the gated activations, h for srelu."""
        return 2 if self.activation.gated else 1

    def stage_bytes(self) -> int:
        """One slot: x's k-tile and a W1 k-tile a half, of fp8 bytes, and x's scale box."""
        return slot_bytes(self.halves)

    def fixed_bytes(self) -> int:
        return _quantize_epilogue.SMEM_BYTES  # the transposed fp8 tile and the amax keys

    def slot_name(self) -> str:
        return self.activation.name


class BlockwiseFC1Sm90(ActivationEpilogue):
    """The jit code (``__call__`` the host side, ``kernel`` the device side; module docstring)."""

    quantized = True  # the activation pass leaves the fp32 a in the gate accumulator
    tma_store = False  # c's pairs from the registers

    def __init__(self, config: BlockwiseFC1Config):
        self.config = config
        self.activation = config.activation
        self.gated = config.activation.gated
        self.has_bias = config.bias_dtype is not None
        self.has_probs = config.probs_dtype is not None
        self.stages = config.num_stages()
        self.threads = (1 + MMA_WARPGROUPS) * THREADS_PER_WARPGROUP
        self.registers = register_split(self.threads)

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
        ops = make_operands(mX, mXScale, mW, Float8E4M3FN, self.stages)
        fields = storage_fields(self.stages, ops, Float8E4M3FN)
        if const_expr(self.gated):
            fields["sU"] = smem_array(Float8E4M3FN, cute.cosize(ops.b_smem_layout))  # the up tiles
        fields.update(_quantize_epilogue.smem_fields())
        self.shared_storage = shared_storage(fields)
        check_fragment_layout(ops.tiled_mma)  # the layout the epilogue's shuffles assume
        launch(self.kernel(ops.tma_atom_a, ops.tma_a, ops.tma_atom_sa, ops.tma_sa, ops.tma_atom_b, ops.tma_b,
                           mWScale, mBias, mProbs, mRowStart, mTileStart, mC, mRowData, mRowScale, mColData,
                           mColScale, ops.tiled_mma, ops.a_smem_layout, ops.b_smem_layout),
               num_ctas, self.threads, stream)

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mX: cute.Tensor,  # TMA coordinates of x (T, H)
        tma_atom_sa: cute.CopyAtom,
        mXScale: cute.Tensor,  # TMA coordinates of its scales (pad4(T), K/128)
        tma_atom_b: cute.CopyAtom,
        mW: cute.Tensor,  # TMA coordinates of W1 (N1, H, E)
        mWScale: cute.Tensor,
        mBias: cute.Tensor | None,
        mProbs: cute.Tensor | None,
        mRowStart: cute.Tensor,
        mTileStart: cute.Tensor,
        mC: cute.Tensor,
        mRowData: cute.Tensor,
        mRowScale: cute.Tensor,
        mColData: cute.Tensor,
        mColScale: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem_layout: cute.ComposedLayout,
        b_smem_layout: cute.ComposedLayout,
    ):
        tidx, bidx, grid, warp_idx, warpgroup = cta_roles((tma_atom_a, tma_atom_sa, tma_atom_b))
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        halves = self.config.halves
        sA, sB, sAScale, stage_bytes = scaled_slot_tensors(storage, self.stages, a_smem_layout, b_smem_layout,
                                                           halves, Float8E4M3FN)
        sBs = [sB]
        if const_expr(self.gated):
            sBs.append(storage.sU.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner))
        mainloop = make_mainloop_pipeline(storage.pipeline_barriers.data_ptr(), self.stages, MMA_WARPGROUPS,
                                          stage_bytes)
        ffn = mRowData.shape[1]
        items = TokenItems.of(mRowStart, mTileStart, ffn, TILE_N)
        k_tiles = (mX.shape[1] + TILE_K - 1) // TILE_K
        b_rows = BRows(1, ffn // TILE_N)  # the gate tile row n, the up tile row F / 128 + n

        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(self.registers[0])
        if warp_idx == 0:  # producer: TMA loads of every (x, W1 gate [, up]) k-tile of this CTA's items
            produce_items(mainloop, self.stages, items, bidx, grid, k_tiles, tma_atom_a, mX, sA, tma_atom_sa,
                          mXScale, sAScale, tma_atom_b, mW, sBs, b_rows)

        if warpgroup > 0:  # consumers: promoted wgmma mainloop and epilogue
            cute.arch.setmaxregister_increase(self.registers[1])
            mma_tidx = tidx - THREADS_PER_WARPGROUP
            tCrA, tCrBs = consumer_fragments(tiled_mma, warpgroup, sA, sBs)
            thr_mma = tiled_mma.get_slice(mma_tidx)
            # (MMA, MMA_M, MMA_N) tile coordinates (row, column) of this thread's accumulators:
            # ((2 columns, 2 rows, 16 column groups), 1, 1)
            tCcD = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, TILE_N)))
            fragment = pair_fragment(tCcD.shape)
            accs = [cute.make_rmem_tensor(fragment, Float32) for _ in range(halves)]  # gate (h), up
            partial = cute.make_rmem_tensor(fragment, Float32)
            smem_q = _quantize_epilogue.smem_tensors(storage)
            pair = cute.make_rmem_tensor((2,), BFloat16)  # staging of one bf16 pair
            pair_bits = cute.recast_tensor(pair, Int32)
            row_probs = cute.make_rmem_tensor((2,), Float32)
            read_state, _ = consumer_states(self.stages)
            rows = (tCcD[0][0], tCcD[2][0])  # the thread's two accumulator rows
            outputs = (mRowData, mRowScale, mColData, mColScale)
            item = bidx
            while item < items.count:
                g, m_tile, n_tile, first_row, end_row = items.tile(item)
                tiled_mma, read_state = promoted_k_tiles(tiled_mma, mainloop, read_state, k_tiles, tCrA, tCrBs, accs,
                                                         partial, sAScale, mWScale, g, b_rows.of(n_tile, halves),
                                                         first_row, rows)
                # epilogue at rows first_row + [0, 128) (those < end_row are the expert's), a columns col0 + [0, 128)
                col0 = n_tile * TILE_N
                limits = (end_row - first_row, ffn - col0)
                if const_expr(self.has_probs):
                    load_row_probs(row_probs, mProbs, rows, first_row, limits[0])
                tCgC, tCgU = c_pair_views(thr_mma, mC, first_row, col0, ffn, (TILE_M, TILE_N), self.gated)
                self.activation_pass(accs[0], accs[halves - 1], tCcD, limits, col0, g, ffn, mBias, row_probs, pair,
                                     pair_bits, (tCgC, tCgU, None), None)
                # a (over the gate accumulator), zero in the rows past the expert's end
                values = [cutlass.select_(tCcD[v][0] < limits[0], accs[0][v], Float32(0.0))
                          for v in range(cute.size(partial))]
                quantize_tile_blockwise(values, tCcD, thr_mma, mma_tidx, outputs, smem_q, first_row, col0, limits[0],
                                        m_tile, A_FORMAT.max_normal, False, self.config.power_of_two,
                                        _EPILOGUE_BARRIER)
                item += grid
            store_unused_blocks(mColData, mColScale, mTileStart[items.num_experts], items.n_tiles, bidx, grid,
                                mma_tidx)


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


def compile_blockwise_fc1(arch: str = "sm_90a", config: BlockwiseFC1Config | None = None, *,
                          shape: tuple[int, int, int, int] | None = None) -> CompiledKernel:
    """Compile the kernel for ``arch`` without a GPU (default config: swiglu, no bias, no probs);
    returns it with its PTX and cubin. ``shape`` (T, H, F, E), when given, is checked against
    ``problem_support``."""
    config = config if config is not None else BlockwiseFC1Config(Activation(ActivationKind.SWIGLU))
    reason = None if shape is None else problem_support(*shape, gated=config.activation.gated)
    return compile_ahead(_NAME, _compile, config, arch, reason)


def fc1_forward_blockwise(x: FP8BlockwiseTensor, w1: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                          ffn_hidden_size: int, activation: Activation, b1: torch.Tensor | None = None,
                          probs: torch.Tensor | None = None, power_of_two: bool = True,
                          groups: DeviceGroups | None = None) -> FC1Output:
    """FC1 of every expert on Q_row(x) (T, H) E4M3 and W1 (E, 2F | F, H) E4M3 in 128 x 128 tiles
    ([gate; up] halves), with c = bf16(h) and a = act(h) * probs written as Q_row(a) and Q_col(a)
    (E4M3, ``power_of_two`` scales); no host sync. The contract of
    ``gmlp.triton_ref.blockwise_fc1.fc1_forward_blockwise``."""
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
    config = BlockwiseFC1Config(activation, bias_dtype=None if b1 is None else b1.dtype,
                                probs_dtype=None if probs is None else probs.dtype, power_of_two=power_of_two)
    device = x.data.device
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    c = torch.empty(tokens, n1, dtype=torch.bfloat16, device=device)
    buffers = both_ways_buffers(tokens, ffn, experts, A_FORMAT, device)
    a, a_scales, a_col, a_col_scales = buffers
    num_ctas = _schedule.grid_size(tokens, experts, ffn // TILE_N, device)
    if num_ctas == 0:
        no_token_columnwise(a_col, a_col_scales)
    run(_compile, config, device, num_ctas, x.data.view(torch.uint8), x.scale_inv, w1.data.view(torch.uint8),
        w1.scale_inv, b1, probs, groups.row_start, groups.tile_start, c, a.view(torch.uint8), a_scales,
        a_col.view(torch.uint8), a_col_scales)
    quantized = wrap_both_ways(buffers, groups, A_FORMAT, power_of_two, split_sizes, tokens)
    return FC1Output(c=c, a=None, a_rowwise=quantized.rowwise, a_columnwise=quantized.columnwise)
