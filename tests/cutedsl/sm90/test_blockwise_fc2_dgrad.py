"""The CuTeDSL sm_90a FC2 dgrad of the FP8 blockwise recipe (gmlp.cutedsl.sm90.blockwise_fc2_dgrad),
compiled without a GPU, with checks on its PTX and the cubin's resources, its problem rules and
argument errors, and (marker ``gpu``, H100/H200 only) run against the Triton twin: bit for bit
(Q_row(dh), Q_col(dh)) on operands whose sums are exact (both kernels' da are then the same fp32
values, and the epilogues' operations the same), dprobs and db1 (sums in other orders) within
the cross-check's bounds; within the cross-check's bound on random operands."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from gmlp.contract.activations import Activation, ActivationKind, activation_from
from gmlp.cutedsl import import_error
from gmlp.mxfp8.spec import ElementFormat
from tests.support.blockwise import KERNEL_SPLIT_IDS, KERNEL_SPLITS, exact_operands, pipelined_gpu_cases
from tests.support.cases import parametrize_quick
from tests.support.sm90 import assert_same_outputs, check_fp8_binary, on_sm90

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")


@parametrize_quick(("activation", "grad_format", "probs", "bias_grad"),
                   [("swiglu", "e4m3", torch.float32, True), ("srelu", "e5m2", None, False),
                    ("geglu", "e4m3", torch.bfloat16, True)],
                   ids=["swiglu-probs-db1", "srelu-e5m2", "geglu-bf16"])
def test_compiles_to_fp8_wgmma_with_no_spills(activation, grad_format, probs, bias_grad):
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import BlockwiseFC2DgradConfig, compile_blockwise_fc2_dgrad

    config = BlockwiseFC2DgradConfig(activation_from(activation), grad_format=ElementFormat(grad_format),
                                     probs_dtype=probs, bias_grad=bias_grad)
    compiled = compile_blockwise_fc2_dgrad(config=config)
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx and ".reqntid 384, 1, 1" in ptx
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.{grad_format}\.e4m3 \{{[^}}]*\}}, "
                        r"%rd\d+, %rd\d+, %?\w+, 1,\s*1;", ptx)
    assert len(wgmmas) == 4, len(wgmmas)  # four k32 steps a k-tile
    tiles = 2 if activation_from(activation).gated else 1  # d gate and d up, each quantized both ways
    assert len(re.findall(r"div\.rn\.f32", ptx)) >= tiles * 2 * (2 + 4)
    check_fp8_binary(compiled, producer=24, consumer=240)


@pytest.mark.slow
def test_the_pipelined_promotion_overlaps_the_next_k_tile():
    """``pipelined`` (FC2 dgrad has one half): a k-tile's wgmmas are committed before the
    previous k-tile is promoted (``wait_group 1``, absent from the default mainloop), four k-tiles'
    wgmmas (``test_blockwise_gemm``'s twin); no spills within the consumer's 240 registers."""
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import BlockwiseFC2DgradConfig, compile_blockwise_fc2_dgrad

    config = BlockwiseFC2DgradConfig(activation_from("swiglu"), probs_dtype=torch.float32, bias_grad=True)
    compiled = compile_blockwise_fc2_dgrad(config=dataclasses.replace(config, pipelined=True))
    default = compile_blockwise_fc2_dgrad(config=config).ptx
    wait_one = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+1;")
    assert len(wait_one.findall(compiled.ptx)) == 3 and not wait_one.search(default)
    assert compiled.ptx.count("wgmma.mma_async") == 4 * default.count("wgmma.mma_async") == 16
    check_fp8_binary(compiled, producer=24, consumer=240)


def test_problem_rules():
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import problem_support

    assert problem_support(16384, 7168, 2048, 32) is None  # DeepSeek-V3's FC2 dgrad
    assert problem_support(0, 128, 128, 1) is None
    assert "multiples of 128" in problem_support(100, 7168, 2000, 32).message


def test_launcher_argument_errors():
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import fc2_dgrad_blockwise
    from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref, quantize_weights_fp8_blockwise_ref

    swiglu = Activation(ActivationKind.SWIGLU)
    splits = torch.tensor([4, 4])
    dy = quantize_fp8_blockwise_ref(torch.randn(8, 256).bfloat16(), columnwise=True)
    w2t = quantize_weights_fp8_blockwise_ref(torch.randn(2, 128, 256).bfloat16())
    c = torch.zeros(8, 256, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dy must be an FP8BlockwiseTensor with 1x128 blocks"):
        fc2_dgrad_blockwise(dy.columnwise, w2t, c, splits, activation=swiglu)
    with pytest.raises(ValueError, match=r"dy must be in grad_format \(e5m2\), got e4m3"):
        fc2_dgrad_blockwise(dy.rowwise, w2t, c, splits, activation=swiglu, grad_format="e5m2")
    with pytest.raises(ValueError, match=r"c must be bf16 row-major \(8, 256\)"):
        fc2_dgrad_blockwise(dy.rowwise, w2t, c[:, :128], splits, activation=swiglu)
    with pytest.raises(ValueError, match="dy, dy_scales, w2t and c must be 16-byte aligned CUDA tensors, got dy on cpu"):
        fc2_dgrad_blockwise(dy.rowwise, w2t, c, splits, activation=swiglu)


# ---------------------------------------------------------------------------------------------
# On the GPU, against the Triton twin
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", KERNEL_SPLITS, ids=KERNEL_SPLIT_IDS)
@pytest.mark.parametrize(("activation", "grad_format", "probs_dtype", "power_of_two"),
                         [("swiglu", "e4m3", torch.float32, True), ("geglu", "e5m2", torch.bfloat16, False),
                          ("srelu", "e4m3", None, True)], ids=["swiglu", "geglu-e5m2-fp32-scales", "srelu"])
def test_bit_exact_with_the_triton_twin_on_exact_sums(splits, activation, grad_format, probs_dtype, power_of_two):
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import fc2_dgrad_blockwise as cutedsl_dgrad
    from gmlp.debug.crosscheck import _compare
    from gmlp.dispatch.sites import Op
    from gmlp.triton_ref.blockwise_fc2_dgrad import fc2_dgrad_blockwise as triton_dgrad

    torch.manual_seed(0)
    activation = activation_from(activation)
    hidden, ffn = 512, 384
    n1 = (2 if activation.gated else 1) * ffn
    dy, w2t, split_sizes = exact_operands(splits, hidden, ffn, ElementFormat(grad_format))
    tokens = dy.source_shape[0]
    c = torch.randn(tokens, n1, device="cuda").bfloat16()
    probs = None if probs_dtype is None else torch.rand(tokens, device="cuda").to(probs_dtype)
    kwargs = dict(activation=activation, grad_format=grad_format, probs=probs, bias_grad=True,
                  power_of_two=power_of_two)
    got = cutedsl_dgrad(dy, w2t, c, split_sizes, **kwargs)
    want = triton_dgrad(dy, w2t, c, split_sizes, **kwargs)
    for name in ("dh_rowwise", "dh_columnwise"):
        g, w = getattr(got, name), getattr(want, name)
        assert torch.equal(g.data.view(torch.uint8), w.data.view(torch.uint8)), name
        assert torch.equal(g.scale_inv.view(torch.int32), w.scale_inv.view(torch.int32)), name
    # dprobs and db1: sums of the same fp32 values in other orders, within the cross-check's bounds
    comparison = _compare(Op.BLOCKWISE_FC2_DGRAD, got, want, (dy, w2t, c, split_sizes), kwargs, None)
    assert not comparison.mismatches, comparison.outputs


@pipelined_gpu_cases("hidden")
def test_the_pipelined_promotion_is_bitwise_the_default(splits, hidden, cluster):
    """Every output bit for bit the default mainloop's, at 1, 3, 4 and 16 k-tiles of H, experts
    starting off a 4-row boundary, and with more items than CTAs (many-items at F = 1536)."""
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import fc2_dgrad_blockwise
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    torch.manual_seed(0)
    experts, tokens = len(splits), sum(splits)
    ffn = 1536 if tokens > 2048 else 256
    split_sizes = torch.tensor(splits, device="cuda")
    dy = quantize_fp8_blockwise(torch.randn(tokens, hidden, device="cuda").bfloat16()).rowwise
    w2t = quantize_weights_fp8_blockwise(torch.randn(experts, ffn, hidden, device="cuda").bfloat16() / 16)
    c = torch.randn(tokens, 2 * ffn, device="cuda").bfloat16()
    kwargs = dict(activation=Activation(ActivationKind.SWIGLU), probs=torch.rand(tokens, device="cuda"),
                  bias_grad=True, cluster=cluster)
    assert_same_outputs(fc2_dgrad_blockwise(dy, w2t, c, split_sizes, pipelined=True, **kwargs),
                        fc2_dgrad_blockwise(dy, w2t, c, split_sizes, pipelined=False, **kwargs),
                        ("dprobs", "db1", "dh_rowwise", "dh_columnwise"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", KERNEL_SPLITS, ids=KERNEL_SPLIT_IDS)
def test_within_the_cross_check_bound_on_random_operands(splits):
    """Random operands: da differs by the two kernels' summation orders, so the cross-check's
    comparison (Q_row(dh), Q_col(dh), dprobs, db1 within the bounds through the activation's
    derivative) must find nothing."""
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import fc2_dgrad_blockwise as cutedsl_dgrad
    from gmlp.debug.crosscheck import _compare
    from gmlp.dispatch.sites import Op
    from gmlp.triton_ref.blockwise_fc2_dgrad import fc2_dgrad_blockwise as triton_dgrad
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    torch.manual_seed(0)
    hidden, ffn, experts, tokens = 512, 256, len(splits), sum(splits)
    split_sizes = torch.tensor(splits, device="cuda")
    dy = quantize_fp8_blockwise(torch.randn(tokens, hidden, device="cuda").bfloat16()).rowwise
    w2t = quantize_weights_fp8_blockwise(torch.randn(experts, ffn, hidden, device="cuda").bfloat16() / 16)
    c = torch.randn(tokens, 2 * ffn, device="cuda").bfloat16()
    args = (dy, w2t, c, split_sizes)
    kwargs = dict(activation=Activation(ActivationKind.SWIGLU), probs=torch.rand(tokens, device="cuda"),
                  bias_grad=True)
    got, want = cutedsl_dgrad(*args, **kwargs), triton_dgrad(*args, **kwargs)
    comparison = _compare(Op.BLOCKWISE_FC2_DGRAD, got, want, args, kwargs, None)
    assert not comparison.mismatches, comparison.outputs
