"""The CuTeDSL sm_90a grouped GEMM of the FP8 blockwise recipe (gmlp.cutedsl.sm90.blockwise_gemm),
compiled without a GPU, with checks on its PTX and the cubin's resources, its problem rules, and
(marker ``gpu``, H100/H200 only) run against the Triton twin within their two summation orders'
bound, its 256-column (``wide``) and 128-column work items, its TMA-store and register-store
epilogues bit for bit alike."""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.cutedsl import import_error
from tests.support.blockwise import (KERNEL_SPLIT_IDS, KERNEL_SPLITS, PIPELINED_SPLIT_IDS, PIPELINED_SPLITS,
                                     pipelined_gpu_cases, summation_error)
from tests.support.cases import parametrize_quick
from tests.support.sm90 import assert_same_bits, check_fp8_binary, on_sm90

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")


@parametrize_quick(("bias", "a_format", "wide"),
                   [(None, "e4m3", False), (torch.bfloat16, "e4m3", False), (torch.float32, "e4m3", False),
                    (None, "e5m2", False), (None, "e4m3", True), (torch.float32, "e5m2", True)],
                   ids=["plain", "bias", "fp32-bias", "e5m2-a", "wide", "wide-fp32-bias-e5m2-a"])
def test_compiles_to_fp8_wgmma_with_no_spills(bias, a_format, wide):
    from gmlp.cutedsl.sm90.blockwise_gemm import (
        BlockwiseGemmConfig,
        compile_blockwise_gemm,
    )
    from gmlp.mxfp8.spec import ElementFormat

    config = BlockwiseGemmConfig(bias_dtype=bias, a_format=ElementFormat(a_format), wide=wide)
    compiled = compile_blockwise_gemm(config=config)
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx and ".reqntid 384, 1, 1" in ptx  # a producer and two consumer warpgroups
    # fp8 wgmma, both operands K-major from shared memory, fp32 accumulators; four k32 steps a k-tile
    # and 128-column half
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.{a_format}\.e4m3 \{{[^}}]*\}}, %rd\d+, "
                        r"%rd\d+, %?\w+, 1,\s*1;", ptx)
    assert len(wgmmas) == 4 * config.halves, len(wgmmas)
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)  # the promotion waits for the k-tile's sums
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    code = check_fp8_binary(compiled)
    if code is not None:
        assert not re.search(r"@!?U?P\w+\s+R2UR", code)


@parametrize_quick("knobs", [dict(wide=True), dict(wide=False), dict(wide=True, cluster=2),
                             dict(wide=False, pipelined=True)], ids=["wide", "narrow", "wide-cluster", "pipelined"])
def test_the_tma_store_configs_compile(knobs):
    """The TMA-store epilogue: bf16 subtiles through shared memory by stmatrix, TMA-stored through
    D's ragged view; no global stores, no spills; 3 slots wide (48 KB each beside the 32 KB of
    subtiles), 5 narrow."""
    from gmlp.cutedsl.sm90.blockwise_gemm import BlockwiseGemmConfig, compile_blockwise_gemm

    config = BlockwiseGemmConfig(store="tma", **knobs)
    compiled = compile_blockwise_gemm(config=config)
    ptx = compiled.ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta\.tile\.bulk_group", ptx)
    assert "stmatrix.sync.aligned" in ptx and "st.global" not in ptx
    assert config.num_stages() == (3 if config.wide else 5), config.num_stages()
    check_fp8_binary(compiled)


def test_the_tma_store_takes_no_bias():
    from gmlp.cutedsl.sm90.blockwise_gemm import BlockwiseGemmConfig

    with pytest.raises(ValueError, match="store='tma' needs no bias .*, got bias_dtype=torch.float32"):
        BlockwiseGemmConfig(store="tma", bias_dtype=torch.float32)


_WAIT_ONE = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+1;")


@pytest.mark.slow
@pytest.mark.parametrize("cluster", [1, 2])
def test_the_pipelined_promotion_overlaps_the_next_k_tile(cluster):
    """``pipelined``: a k-tile's wgmmas are committed before the previous k-tile is promoted
    (``wait_group 1``, absent from the default mainloop): four k-tiles' wgmmas (the first, the
    loop unrolled by two, an even count's last) and five promotions of 64 FMAs (two in the loop,
    two after an even count, one after an odd one) against the default's one and one; no spills
    within the consumer's 232 registers."""
    from gmlp.cutedsl.sm90.blockwise_gemm import BlockwiseGemmConfig, compile_blockwise_gemm

    compiled = compile_blockwise_gemm(config=BlockwiseGemmConfig(pipelined=True, cluster=cluster))
    default = compile_blockwise_gemm(config=BlockwiseGemmConfig(cluster=cluster)).ptx
    ptx = compiled.ptx
    assert len(_WAIT_ONE.findall(ptx)) == 3 and not _WAIT_ONE.search(default)
    assert len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)) == 2
    assert ptx.count("wgmma.mma_async") == 4 * default.count("wgmma.mma_async") == 16
    assert ptx.count("fma.rn.f32") == 5 * default.count("fma.rn.f32") == 5 * 64
    check_fp8_binary(compiled)


def test_the_pipelined_promotion_takes_one_half():
    from gmlp.cutedsl.sm90.blockwise_gemm import BlockwiseGemmConfig

    with pytest.raises(ValueError, match=r"BlockwiseGemmConfig: pipelined=True needs wide=False: its second fp32 "
                                         r"partial fragment fits a consumer thread's 232 registers beside one "
                                         r"128-column half's accumulators, not two"):
        BlockwiseGemmConfig(wide=True, pipelined=True)


def test_problem_rules():
    from gmlp.cutedsl.sm90.blockwise_gemm import problem_support

    assert problem_support(16384, 7168, 2048, 32) is None  # DeepSeek-V3's FC2
    assert "multiples of 128" in problem_support(100, 7168, 2000, 32).message
    assert problem_support(0, 128, 128, 1) is None  # an empty batch


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize(("bias_dtype", "a_format"), [(torch.bfloat16, "e4m3"), (torch.float32, "e4m3"),
                                                      (None, "e5m2")], ids=["bf16-bias", "fp32-bias", "e5m2-a"])
@pytest.mark.parametrize("splits", KERNEL_SPLITS, ids=KERNEL_SPLIT_IDS)
@pytest.mark.parametrize("n", [384, 512])
def test_matches_the_triton_twin_within_the_bound(splits, bias_dtype, a_format, n):
    """Against the Triton kernel on the same operands: both promote every 128 of K in the same
    order, so they differ only by their fp8 wgmma chains' and fp32 sums' rounding (twice the
    bound of ``crosscheck._blockwise_delta``). At N = 512 the default is the wide kernel, whose
    bytes must be the 128-column kernel's."""
    from gmlp.cutedsl.sm90.blockwise_gemm import (
        grouped_gemm_fp8_blockwise as cutedsl_gemm,
    )
    from gmlp.fp8_blockwise.gemm import grouped_gemm_blockwise_ref
    from gmlp.fp8_blockwise.tensor import absolute
    from gmlp.triton_ref.blockwise_gemm import grouped_gemm_fp8_blockwise
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    torch.manual_seed(0)
    experts, tokens, k = len(splits), sum(splits), 512
    split_sizes = torch.tensor(splits, device="cuda")
    a = quantize_fp8_blockwise(torch.randn(tokens, k, device="cuda").bfloat16(), element_format=a_format).rowwise
    b = quantize_weights_fp8_blockwise(torch.randn(experts, n, k, device="cuda").bfloat16())
    bias = None if bias_dtype is None else torch.randn(experts, n, device="cuda").to(bias_dtype)
    want = grouped_gemm_fp8_blockwise(a, b, split_sizes, bias=bias)
    got = cutedsl_gemm(a, b, split_sizes, bias=bias)
    if n % 256 == 0:
        assert torch.equal(got, cutedsl_gemm(a, b, split_sizes, bias=bias, wide=False))
    magnitude = grouped_gemm_blockwise_ref(absolute(a), absolute(b), split_sizes, out_dtype=torch.float64).float()
    bound = 2 * summation_error(k, True) * magnitude + 2.0**-7 * want.float().abs()
    assert ((got.float() - want.float()).abs() <= bound).all()


@pipelined_gpu_cases("k")
def test_the_pipelined_promotion_is_bitwise_the_default(splits, k, cluster):
    """The same wgmmas and promotions in the same order: the same bytes, at 1, 3, 4 and 16
    k-tiles (odd and even counts, more than the ring's slots), experts starting off a 4-row
    boundary (edges, many-items), and with more items than CTAs (many-items: 312 at N = 1536, the
    slots' phases carried from item to item)."""
    from gmlp.cutedsl.sm90.blockwise_gemm import grouped_gemm_fp8_blockwise
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    torch.manual_seed(0)
    experts, tokens = len(splits), sum(splits)
    n = 1536 if tokens > 2048 else 384
    split_sizes = torch.tensor(splits, device="cuda")
    a = quantize_fp8_blockwise(torch.randn(tokens, k, device="cuda").bfloat16()).rowwise
    b = quantize_weights_fp8_blockwise(torch.randn(experts, n, k, device="cuda").bfloat16())
    bias = torch.randn(experts, n, device="cuda")
    run = dict(bias=bias, wide=False, cluster=cluster)
    assert_same_bits(grouped_gemm_fp8_blockwise(a, b, split_sizes, pipelined=True, **run),
                     grouped_gemm_fp8_blockwise(a, b, split_sizes, pipelined=False, **run), "d")


def test_launcher_argument_errors():
    from gmlp.cutedsl.sm90.blockwise_gemm import grouped_gemm_fp8_blockwise
    from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref, quantize_weights_fp8_blockwise_ref

    x = quantize_fp8_blockwise_ref(torch.randn(8, 256).bfloat16(), columnwise=True, element_format="e5m2")
    w = quantize_weights_fp8_blockwise_ref(torch.randn(2, 128, 256).bfloat16())
    with pytest.raises(TypeError, match="a must be an FP8BlockwiseTensor with 1x128 blocks"):
        grouped_gemm_fp8_blockwise(x.columnwise, w, torch.tensor([4, 4]))
    w_e5m2 = quantize_weights_fp8_blockwise_ref(torch.randn(2, 128, 256).bfloat16(), element_format="e5m2")
    with pytest.raises(ValueError, match="b must be E4M3 \\(the recipe's weights\\), got e5m2"):
        grouped_gemm_fp8_blockwise(x.rowwise, w_e5m2, torch.tensor([4, 4]))
    with pytest.raises(ValueError, match="a, a_scales and b must be 16-byte aligned CUDA tensors, got a on cpu"):
        grouped_gemm_fp8_blockwise(x.rowwise, w, torch.tensor([4, 4]))  # an E5M2 a (dh) is taken
    with pytest.raises(ValueError, match="wide=True needs N a multiple of 256 .*, got N=128"):
        grouped_gemm_fp8_blockwise(x.rowwise, w, torch.tensor([4, 4]), wide=True)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", PIPELINED_SPLITS, ids=PIPELINED_SPLIT_IDS)
@pytest.mark.parametrize("knobs", [dict(wide=True), dict(wide=False), dict(wide=True, cluster=2),
                                   dict(wide=False, pipelined=True)], ids=["wide", "narrow", "wide-cluster", "pipelined"])
def test_the_tma_store_is_bitwise_the_register_store(splits, knobs):
    """The same roundings of the same accumulators, stored through shared memory and TMA instead of
    from the registers: the same bytes, with experts ending mid-tile (the ragged view stops the
    stores there), empty experts, and more items than CTAs (the subtile ring carried across items)."""
    from gmlp.cutedsl.sm90.blockwise_gemm import grouped_gemm_fp8_blockwise
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    torch.manual_seed(0)
    experts, tokens, k, n = len(splits), sum(splits), 384, 2048
    split_sizes = torch.tensor(splits, device="cuda")
    a = quantize_fp8_blockwise(torch.randn(tokens, k, device="cuda").bfloat16()).rowwise
    b = quantize_weights_fp8_blockwise(torch.randn(experts, n, k, device="cuda").bfloat16())
    assert_same_bits(grouped_gemm_fp8_blockwise(a, b, split_sizes, store="tma", **knobs),
                     grouped_gemm_fp8_blockwise(a, b, split_sizes, store="regs", **knobs), "d")
