"""The SM100 path's kernels compile for sm_100a with the arguments gmlp passes, on the CPU.

No Blackwell GPU runs them here: each test builds the kernel's arguments with the adapter's own
functions (for the DESIGN shapes, as meta tensors of the shapes gmlp allocates; and, for the
contract, from tensors gmlp's quantize really produced), compiles under ``simulated_sm100`` and
asserts on the generated code. A GPU test runs the path where an SM100 GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from gmlp import scale_layout
from gmlp.bench.mlp import SHAPES
from gmlp.cutedsl import cudnn_kernels
from gmlp.mxfp8 import ElementFormat, ScaleMode
from gmlp.quantize_ref import quantize_mxfp8_ref
from gmlp.quantized import MXFP8Tensor, QuantAxis
from tests.blackwell import BLOCK_SCALED_MMA, ptx_text, simulated_sm100

pytestmark = pytest.mark.skipif(cudnn_kernels.import_error() is not None,
                                reason=f"cuDNN frontend's kernels do not import: {cudnn_kernels.import_error()}")


def _swizzled_rowwise_meta(rows: int, cols: int) -> MXFP8Tensor:
    """An ungrouped rowwise MXFP8Tensor with swizzled scales, as gmlp's quantize allocates it, on meta."""
    data = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device="meta")
    scales = torch.empty(scale_layout.ceil_div(rows, 128) * scale_layout.swizzled_size(128, cols // 32),
                         dtype=torch.uint8, device="meta")
    return MXFP8Tensor(data, scales, QuantAxis.ROWWISE, True, ElementFormat.E4M3, ScaleMode.RCEIL, None)


def _compiled_ptx(kernel, tmp_path) -> str:
    with simulated_sm100(tmp_path) as compiled:
        kernel.check_support()
        kernel.compile()
    assert len(compiled) == 1
    return ptx_text(compiled[0])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_fc2_forward_grouped_gemm_compiles_for_sm100(shape, tmp_path):
    from gmlp.cutedsl.sm100_steps import grouped_gemm_args, grouped_gemm_kernel
    from gmlp.cutedsl.sm100_layout import padded_rows

    experts, tokens, hidden, ffn = SHAPES[shape]
    rows = padded_rows(torch.full((experts,), tokens // experts), tokens)  # the bound depends on T and E only
    a = _swizzled_rowwise_meta(rows.num_rows, ffn)  # Q_row(a) of the padded rows
    w2 = _swizzled_rowwise_meta(experts * hidden, ffn)  # Q_row of the (E * H, F) stack of W2
    args = grouped_gemm_args(a, w2, rows.offsets.to("meta"), torch.empty(rows.num_rows, hidden, dtype=torch.bfloat16,
                                                                          device="meta"))
    ptx = _compiled_ptx(grouped_gemm_kernel(args), tmp_path)
    assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), "no block-scaled tcgen05 MMA in the PTX"


def test_the_operands_gmlp_quantizes_meet_the_kernels_contract(tmp_path):
    """Real tensors from gmlp's quantize and layout functions (small shapes, on the CPU) pass the
    kernels' own checks: FC1 (x, interleaved W1, padded probs), FC2 (its a, W2) and dW2 (Q_col
    of the padded dy, grouped by the padded sizes, with FC1's D_col) and FC2 dgrad (Q_row of the
    padded dy, Q_col of the W2 stack grouped by [H] * E, FC1's C) and FC1 dgrad (its dh, Q_col of
    the interleaved W1 stack grouped by [2F] * E)."""
    from gmlp.cutedsl.sm100_layout import interleave_gate_up, padded_rows, to_padded
    from gmlp.cutedsl.sm100_steps import (fc1_dgrad_args, fc1_glu_args, fc1_glu_kernel, fc2_dgrad_glu_args,
                                          fc2_dgrad_glu_kernel, fc2_wgrad_args, grouped_gemm_args, grouped_gemm_kernel,
                                          wgrad_kernel)

    experts, hidden, ffn = 3, 128, 64
    split_sizes = torch.tensor([5, 0, 300])
    tokens = int(split_sizes.sum())
    rows = padded_rows(split_sizes, tokens)

    def q_row(t):
        return quantize_mxfp8_ref(t, rowwise=True, swizzle=True).rowwise

    x, probs = torch.randn(tokens, hidden).bfloat16(), torch.rand(tokens)
    w1, w2 = torch.randn(experts, 2 * ffn, hidden).bfloat16(), torch.randn(experts, hidden, ffn).bfloat16()
    a = torch.randn(tokens, ffn).bfloat16()
    fc1_args = fc1_glu_args(q_row(to_padded(x, rows)), q_row(interleave_gate_up(w1).reshape(-1, hidden)),
                            rows.offsets, to_padded(probs, rows))
    fc2 = grouped_gemm_kernel(grouped_gemm_args(q_row(to_padded(a, rows)), q_row(w2.reshape(-1, ffn)), rows.offsets))
    padded_sizes = torch.diff(rows.offsets, prepend=rows.offsets.new_zeros(1))
    padded_sizes = torch.cat([padded_sizes, padded_sizes.new_tensor([rows.num_rows - int(rows.offsets[-1])])])
    dy_padded = to_padded(torch.randn(tokens, hidden).bfloat16(), rows)
    dy_col = quantize_mxfp8_ref(dy_padded, rowwise=False, columnwise=True, swizzle=True,
                                split_sizes=padded_sizes).columnwise
    w2_col = quantize_mxfp8_ref(w2.reshape(-1, ffn), rowwise=False, columnwise=True, swizzle=True,
                                split_sizes=torch.full((experts,), hidden)).columnwise
    dgrad_args = fc2_dgrad_glu_args(q_row(dy_padded), w2_col, fc1_args)
    w1_col = quantize_mxfp8_ref(interleave_gate_up(w1).reshape(-1, hidden), rowwise=False, columnwise=True,
                                swizzle=True, split_sizes=torch.full((experts,), 2 * ffn)).columnwise
    fc1_dgrad = grouped_gemm_kernel(fc1_dgrad_args(dgrad_args, w1_col))
    main_grad = torch.zeros(experts, hidden, ffn)
    dw2 = wgrad_kernel(fc2_wgrad_args(dy_col, fc1_args, rows.offsets, main_grad))
    with simulated_sm100(tmp_path):
        for kernel in (fc1_glu_kernel(fc1_args), fc2, dw2, fc2_dgrad_glu_kernel(dgrad_args), fc1_dgrad):
            assert kernel.check_support(), kernel


def test_operands_outside_the_contract_are_refused():
    from gmlp.cutedsl.sm100_steps import grouped_gemm_args

    a = _swizzled_rowwise_meta(512, 64)
    with pytest.raises(ValueError, match="multiple of 128"):
        grouped_gemm_args(a, _swizzled_rowwise_meta(3 * 96, 64), torch.zeros(3, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="padded layout"):
        grouped_gemm_args(_swizzled_rowwise_meta(300, 64), _swizzled_rowwise_meta(3 * 128, 64),
                          torch.zeros(3, dtype=torch.int32, device="meta"))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_fc1_glu_compiles_for_sm100(shape, tmp_path):
    from gmlp.cutedsl.sm100_layout import padded_rows
    from gmlp.cutedsl.sm100_steps import fc1_glu_args, fc1_glu_kernel

    experts, tokens, hidden, ffn = SHAPES[shape]
    rows = padded_rows(torch.full((experts,), tokens // experts), tokens)
    x = _swizzled_rowwise_meta(rows.num_rows, hidden)  # Q_row(x) of the padded rows
    w1 = _swizzled_rowwise_meta(experts * 2 * ffn, hidden)  # Q_row of the interleaved (E * 2F, H) stack
    prob = torch.empty(rows.num_rows, dtype=torch.float32, device="meta")
    ptx = _compiled_ptx(fc1_glu_kernel(fc1_glu_args(x, w1, rows.offsets.to("meta"), prob)), tmp_path)
    assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), "no block-scaled tcgen05 MMA in the PTX"
    assert "cvt.rp.ue8m0" in ptx  # the quantized outputs' scales are computed in the epilogue


def _swizzled_columnwise_meta(rows: int, cols: int, experts: int) -> MXFP8Tensor:
    """A grouped columnwise MXFP8Tensor with swizzled scales, as gmlp's quantize allocates it, on meta."""
    data = torch.empty(cols, rows, dtype=torch.float8_e4m3fn, device="meta")
    scales = torch.empty(scale_layout.max_row_tiles(rows, experts) * scale_layout.swizzled_size(cols, 4),
                         dtype=torch.uint8, device="meta")
    split_sizes = torch.empty(experts, dtype=torch.int64, device="meta")
    return MXFP8Tensor(data, scales, QuantAxis.COLUMNWISE, True, ElementFormat.E4M3, ScaleMode.RCEIL, split_sizes)


def _fc1_call_meta(shape: str):
    """The padded rows and FC1's call for a DESIGN shape, on meta (what the backward steps read)."""
    from gmlp.cutedsl.sm100_layout import padded_rows
    from gmlp.cutedsl.sm100_steps import fc1_glu_args

    experts, tokens, hidden, ffn = SHAPES[shape]
    rows = padded_rows(torch.full((experts,), tokens // experts), tokens)
    fc1 = fc1_glu_args(_swizzled_rowwise_meta(rows.num_rows, hidden), _swizzled_rowwise_meta(experts * 2 * ffn, hidden),
                       rows.offsets.to("meta"), torch.empty(rows.num_rows, dtype=torch.float32, device="meta"))
    return rows, fc1


@pytest.mark.parametrize("shape", list(SHAPES))
def test_fc2_wgrad_compiles_for_sm100(shape, tmp_path):
    from gmlp.cutedsl.sm100_steps import fc2_wgrad_args, wgrad_kernel

    experts, _, hidden, ffn = SHAPES[shape]
    rows, fc1 = _fc1_call_meta(shape)
    dy_col = _swizzled_columnwise_meta(rows.num_rows, hidden, experts)  # Q_col of the padded dy rows
    main_grad = torch.empty(experts, hidden, ffn, dtype=torch.float32, device="meta")
    ptx = _compiled_ptx(wgrad_kernel(fc2_wgrad_args(dy_col, fc1, rows.offsets, main_grad)), tmp_path)
    assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), "no block-scaled tcgen05 MMA in the PTX"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_fc2_dgrad_glu_compiles_for_sm100(shape, tmp_path):
    from gmlp.cutedsl.sm100_steps import fc2_dgrad_glu_args, fc2_dgrad_glu_kernel

    experts, _, hidden, ffn = SHAPES[shape]
    rows, fc1 = _fc1_call_meta(shape)
    dy = _swizzled_rowwise_meta(rows.num_rows, hidden)  # Q_row of the padded dy rows
    w2_col = _swizzled_columnwise_meta(experts * hidden, ffn, experts)  # Q_col of the (E * H, F) stack, [H] * E
    ptx = _compiled_ptx(fc2_dgrad_glu_kernel(fc2_dgrad_glu_args(dy, w2_col, fc1)), tmp_path)
    assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), "no block-scaled tcgen05 MMA in the PTX"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_fc1_dgrad_compiles_for_sm100(shape, tmp_path):
    from gmlp.cutedsl.sm100_steps import fc1_dgrad_args, fc2_dgrad_glu_args, grouped_gemm_kernel

    experts, _, hidden, ffn = SHAPES[shape]
    rows, fc1 = _fc1_call_meta(shape)
    dgrad = fc2_dgrad_glu_args(_swizzled_rowwise_meta(rows.num_rows, hidden),
                               _swizzled_columnwise_meta(experts * hidden, ffn, experts), fc1)
    w1_col = _swizzled_columnwise_meta(experts * 2 * ffn, hidden, experts)  # Q_col of the interleaved W1 stack
    ptx = _compiled_ptx(grouped_gemm_kernel(fc1_dgrad_args(dgrad, w1_col)), tmp_path)
    assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), "no block-scaled tcgen05 MMA in the PTX"
