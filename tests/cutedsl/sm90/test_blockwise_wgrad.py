"""The CuTeDSL sm_90a weight gradient of the FP8 blockwise recipe
(gmlp.cutedsl.sm90.blockwise_wgrad), compiled without a GPU, with checks on its PTX and the
cubin's resources, its problem rules and launcher errors, and (marker ``gpu``, H100/H200 only)
run against the Triton twin within their two summation orders' bound, its 256-column (``wide``)
and 128-column n-tiles, its TMA-store and register-store epilogues and clusters bit for bit
alike."""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.cutedsl import import_error
from tests.support.blockwise import summation_error
from tests.support.cases import parametrize_quick
from tests.support.sm90 import assert_same_bits, check_fp8_binary, check_weight_gradient_tma_stores, on_sm90

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

CONFIGS = {"fp32": dict(), "bf16": dict(out_dtype=torch.bfloat16), "main-grad": dict(accumulate=True),
           "e5m2-a": dict(a_format="e5m2"), "wide": dict(wide=True), "wide-main-grad": dict(wide=True, accumulate=True),
           "wide-bf16": dict(wide=True, out_dtype=torch.bfloat16), "tma-store": dict(store="tma"),
           "wide-tma-store-bf16": dict(wide=True, store="tma", out_dtype=torch.bfloat16),
           "wide-tma-store-main-grad": dict(wide=True, store="tma", accumulate=True),
           "wide-tma-store-cluster": dict(wide=True, store="tma", cluster=2, out_dtype=torch.bfloat16)}


@parametrize_quick("options", list(CONFIGS.values()), ids=list(CONFIGS))
def test_compiles_to_fp8_wgmma_with_no_spills(options):
    from gmlp.cutedsl.sm90.blockwise_wgrad import (
        BlockwiseWgradConfig,
        compile_blockwise_wgrad,
    )
    from gmlp.mxfp8.spec import ElementFormat

    a_format = options.get("a_format", "e4m3")
    config = BlockwiseWgradConfig(**{**options, "a_format": ElementFormat(a_format)})
    compiled = compile_blockwise_wgrad(config=config)
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx and ".reqntid 384, 1, 1" in ptx  # a producer and two consumer warpgroups
    # fp8 wgmma, both operands K-major from shared memory (the tokens), fp32 accumulators; four k32 a block
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.{a_format}\.e4m3 \{{[^}}]*\}}, %rd\d+, "
                        r"%rd\d+, %?\w+, 1,\s*1;", ptx)
    assert len(wgmmas) == 4 * config.halves, len(wgmmas)
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)  # the promotion waits for the block's sums
    # A's and B's boxes: plain 2-D (features, block-aligned tokens) descriptors
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert not re.search(r"cp\.async\.bulk\.tensor\.[345]d\.shared", ptx)
    if config.store == "tma":  # each half's tile through the subtile ring: 3 slots wide (55 KB each), 5 narrow
        check_weight_gradient_tma_stores(ptx, config.accumulate, config.out_dtype == torch.bfloat16)
        assert config.num_stages() == (3 if config.wide else 5), config.num_stages()
    check_fp8_binary(compiled)


def test_problem_rules():
    from gmlp.cutedsl.sm90.blockwise_wgrad import problem_support

    assert problem_support(32768, 7168, 2048, 32) is None  # DeepSeek-V3's FC2 wgrad (dW2: H x F)
    assert problem_support(0, 128, 128, 1) is None  # an empty batch
    assert "multiples of 128" in problem_support(100, 7168, 2000, 32).message
    assert "at least one expert" in problem_support(100, 128, 128, 0).message


def test_launcher_argument_errors():
    from gmlp.cutedsl.sm90.blockwise_wgrad import grouped_wgrad_fp8_blockwise
    from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref

    splits = torch.tensor([100, 28])
    a = quantize_fp8_blockwise_ref(torch.randn(128, 256).bfloat16(), columnwise=True, split_sizes=splits)
    b = quantize_fp8_blockwise_ref(torch.randn(120, 128).bfloat16(), columnwise=True,
                                   split_sizes=torch.tensor([100, 20])).columnwise
    with pytest.raises(TypeError, match="a must be an FP8BlockwiseTensor with 128x1 blocks"):
        grouped_wgrad_fp8_blockwise(a.rowwise, a.columnwise, splits)
    with pytest.raises(ValueError, match="a and b must have the same tokens, got 128 and 120"):
        grouped_wgrad_fp8_blockwise(a.columnwise, b, splits)
    with pytest.raises(ValueError, match=r"out must be a contiguous fp32 \(2, 256, 256\) tensor"):
        grouped_wgrad_fp8_blockwise(a.columnwise, a.columnwise, splits, out=torch.zeros(2, 256, 256).bfloat16())
    with pytest.raises(ValueError, match="a, b, a_scales and b_scales must be 16-byte aligned CUDA tensors, got a on cpu"):
        grouped_wgrad_fp8_blockwise(a.columnwise, a.columnwise, splits)
    narrow = quantize_fp8_blockwise_ref(torch.randn(128, 128).bfloat16(), columnwise=True, split_sizes=splits)
    with pytest.raises(ValueError, match="wide=True needs N a multiple of 256 .*, got N=128"):
        grouped_wgrad_fp8_blockwise(a.columnwise, narrow.columnwise, splits, wide=True)
    assert not grouped_wgrad_fp8_blockwise(  # no tokens: zeros, nothing launched
        *(quantize_fp8_blockwise_ref(torch.zeros(0, 128).bfloat16(), columnwise=True,
                                     split_sizes=torch.tensor([0, 0])).columnwise,) * 2, torch.tensor([0, 0])).any()


# launches whose bytes must be the default register-store kernel's (wide where N allows it)
STORE_VARIANTS = {"narrow": dict(wide=False, store="regs"), "tma-store": dict(store="tma"),
                  "narrow-tma-store": dict(wide=False, store="tma"), "tma-store-cluster": dict(store="tma", cluster=2)}


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("out", ["fp32", "bf16", "main-grad"])
@pytest.mark.parametrize("a_format", ["e4m3", "e5m2"])
@pytest.mark.parametrize("splits", [[0, 1, 127, 128, 129, 0], [300], [64, 0, 200, 36, 0]],
                         ids=["edges", "one", "mixed"])
@pytest.mark.parametrize("n", [256, 384])
def test_matches_the_triton_twin_within_the_bound(splits, a_format, out, n):
    """Against the Triton kernel on the same operands: both promote every 128 tokens in the same
    order, so they differ only by their fp8 wgmma chains' and fp32 sums' rounding (twice the
    bound of ``crosscheck._blockwise_delta``) and each output's rounding. At N = 256 the default
    is the wide kernel, whose bytes must be the 128-column kernel's; the TMA-store epilogue's (alone
    and in clusters of two) must be the register stores'."""
    from gmlp.cutedsl.sm90.blockwise_wgrad import grouped_wgrad_fp8_blockwise as cutedsl_wgrad
    from gmlp.fp8_blockwise.gemm import grouped_wgrad_blockwise_ref
    from gmlp.fp8_blockwise.tensor import absolute
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_wgrad import grouped_wgrad_fp8_blockwise

    torch.manual_seed(0)
    tokens, m = sum(splits), 384
    split_sizes = torch.tensor(splits, device="cuda")

    def q_col(features: int, fmt: str):
        value = torch.randn(tokens, features, device="cuda").bfloat16()
        return quantize_fp8_blockwise(value, rowwise=False, columnwise=True, split_sizes=split_sizes,
                                      element_format=fmt).columnwise

    a, b = q_col(m, a_format), q_col(n, "e4m3")
    out_dtype = torch.bfloat16 if out == "bf16" else torch.float32
    if out == "main-grad":
        start = torch.randn(len(splits), m, n, device="cuda")
        want = grouped_wgrad_fp8_blockwise(a, b, split_sizes, out=start.clone())
        got = cutedsl_wgrad(a, b, split_sizes, out=start.clone(), store="regs")
        variants = {name: cutedsl_wgrad(a, b, split_sizes, out=start.clone(), **knobs)
                    for name, knobs in STORE_VARIANTS.items()}
    else:
        want = grouped_wgrad_fp8_blockwise(a, b, split_sizes, out_dtype=out_dtype)
        got = cutedsl_wgrad(a, b, split_sizes, out_dtype=out_dtype, store="regs")
        variants = {name: cutedsl_wgrad(a, b, split_sizes, out_dtype=out_dtype, **knobs)
                    for name, knobs in STORE_VARIANTS.items()}
    for name, variant in variants.items():
        assert_same_bits(variant, got, name)
    magnitude = grouped_wgrad_blockwise_ref(absolute(a), absolute(b), split_sizes, out_dtype=torch.float64)
    rounding = 2.0**-8 if out == "bf16" else 2.0**-24  # each output's rounding to its dtype
    bound = 2 * summation_error(max(splits), True) * magnitude + rounding * (got.double().abs() + want.double().abs())
    excess = (got.double() - want.double()).abs() > bound
    assert not excess.any(), f"{int(excess.sum())} elements past the bound, first at {excess.nonzero()[:3].tolist()}"
    for g, size in enumerate(splits):
        if size == 0:  # an empty expert: zeros, or main_grad untouched
            assert torch.equal(got[g], start[g] if out == "main-grad" else torch.zeros_like(got[g]))
