"""The FP8 blockwise kernels in clusters of two CTAs (the engine's ``_cluster.PairedTile``): the
token-row kernels (grouped GEMM, FC1, FC2 dgrad) paired along M, their E4M3 weight tiles
multicast where a pair's items share one; the weight gradient paired along N, its A tiles
multicast. Compiled for sm_90a here; on an sm_90 GPU every output bit for bit the unclustered
kernel's (the same fp8 wgmmas and promotions on the same tiles)."""

import re

import pytest
import torch

from gmlp.contract.activations import activation_from
from gmlp.cutedsl import import_error
from tests.support.blockwise import KERNEL_SPLIT_IDS, KERNEL_SPLITS
from tests.support.cases import BANDED_SPLITS, parametrize_quick
from tests.support.sm90 import assert_same_bits, assert_same_outputs, check_fp8_binary, on_sm90

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

SPLITS, SPLIT_IDS = KERNEL_SPLITS + [BANDED_SPLITS], KERNEL_SPLIT_IDS + ["banded"]


def _compiled(site: str, cluster: int):
    """(compiled kernel, its (producer, consumer) registers) of a site's layer config."""
    activation = activation_from("swiglu")
    if site == "gemm":
        from gmlp.cutedsl.sm90.blockwise_gemm import BlockwiseGemmConfig, compile_blockwise_gemm

        return compile_blockwise_gemm(config=BlockwiseGemmConfig(wide=True, cluster=cluster)), (40, 232)
    if site == "wgrad":
        from gmlp.cutedsl.sm90.blockwise_wgrad import BlockwiseWgradConfig, compile_blockwise_wgrad

        return compile_blockwise_wgrad(config=BlockwiseWgradConfig(wide=True, cluster=cluster)), (40, 232)
    if site == "fc1":
        from gmlp.cutedsl.sm90.blockwise_fc1 import BlockwiseFC1Config, compile_blockwise_fc1

        config = BlockwiseFC1Config(activation, probs_dtype=torch.float32, cluster=cluster)
        return compile_blockwise_fc1(config=config), (40, 232)
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import BlockwiseFC2DgradConfig, compile_blockwise_fc2_dgrad

    config = BlockwiseFC2DgradConfig(activation, probs_dtype=torch.float32, bias_grad=True, cluster=cluster)
    return compile_blockwise_fc2_dgrad(config=config), (24, 240)


@pytest.mark.slow
@parametrize_quick("site", ["gemm", "fc1", "fc2_dgrad", "wgrad"])
def test_a_cluster_multicasts_the_shared_tiles(site):
    """The shared tiles' TMA loads multicast to the cluster (the token-row kernels' 3-D weight
    tiles, the weight gradient's 2-D A tiles), the others and the scale boxes stay each CTA's own;
    the slots' empty barriers are arrived on in both CTAs; the cluster's barriers at the start and
    before exit; no spills, the register split of the CTA alone."""
    compiled, (producer, consumer) = _compiled(site, 2)
    ptx = compiled.ptx
    shared = 2 if site == "wgrad" else 3
    assert re.search(rf"cp\.async\.bulk\.tensor\.{shared}d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::"
                     r"bytes\.multicast::cluster", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert "mbarrier.arrive.shared::cluster.b64" in ptx and ptx.count("barrier.cluster.wait") == 2
    check_fp8_binary(compiled, producer, consumer)
    alone = _compiled(site, 1)[0].ptx
    assert "multicast" not in alone and "barrier.cluster" not in alone


def test_a_cluster_is_one_or_two_ctas():
    from gmlp.cutedsl.sm90.blockwise_gemm import BlockwiseGemmConfig

    with pytest.raises(ValueError, match=r"cluster must be one of \(1, 2\), got 3"):
        BlockwiseGemmConfig(cluster=3)


def _tokens(tokens: int, cols: int, grad: bool = False):
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise

    return quantize_fp8_blockwise(torch.randn(tokens, cols, device="cuda").bfloat16(),
                                  element_format="e5m2" if grad else "e4m3").rowwise


def _weights(experts: int, n: int, k: int):
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    return quantize_weights_fp8_blockwise(torch.randn(experts, n, k, device="cuda").bfloat16() / 16)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("n,wide", [(384, False), (512, True)], ids=["narrow", "wide"])
def test_the_gemm_in_clusters_is_bitwise_alone(splits, n, wide):
    """Odd item counts (a pair's shadow) with K = 1024 (8 k-tiles, past the ring)."""
    from gmlp.cutedsl.sm90.blockwise_gemm import grouped_gemm_fp8_blockwise

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    a, b = _tokens(sum(splits), 1024), _weights(len(splits), n, 1024)
    bias = torch.randn(len(splits), n, device="cuda")
    assert_same_bits(grouped_gemm_fp8_blockwise(a, b, split_sizes, bias=bias, wide=wide, cluster=2),
                     grouped_gemm_fp8_blockwise(a, b, split_sizes, bias=bias, wide=wide, cluster=1), "d")


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
def test_fc1_in_clusters_is_bitwise_alone(splits, activation):
    from gmlp.cutedsl.sm90.blockwise_fc1 import fc1_forward_blockwise

    torch.manual_seed(0)
    activation = activation_from(activation)
    hidden, ffn, tokens = 1024, 384, sum(splits)
    x, w1 = _tokens(tokens, hidden), _weights(len(splits), (2 if activation.gated else 1) * ffn, hidden)
    split_sizes = torch.tensor(splits, device="cuda")
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, probs=torch.rand(tokens, device="cuda"))
    assert_same_outputs(fc1_forward_blockwise(x, w1, split_sizes, cluster=2, **kwargs),
                        fc1_forward_blockwise(x, w1, split_sizes, cluster=1, **kwargs),
                        ("c", "a", "a_rowwise", "a_columnwise"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("grad_format", ["e4m3", "e5m2"])
def test_fc2_dgrad_in_clusters_is_bitwise_alone(splits, grad_format):
    from gmlp.cutedsl.sm90.blockwise_fc2_dgrad import fc2_dgrad_blockwise

    torch.manual_seed(0)
    hidden, ffn, tokens = 1024, 384, sum(splits)
    dy, w2t = _tokens(tokens, hidden, grad_format == "e5m2"), _weights(len(splits), ffn, hidden)
    c = torch.randn(tokens, 2 * ffn, device="cuda").bfloat16()
    split_sizes = torch.tensor(splits, device="cuda")
    kwargs = dict(activation=activation_from("swiglu"), grad_format=grad_format,
                  probs=torch.rand(tokens, device="cuda"), bias_grad=True)
    assert_same_outputs(fc2_dgrad_blockwise(dy, w2t, c, split_sizes, cluster=2, **kwargs),
                        fc2_dgrad_blockwise(dy, w2t, c, split_sizes, cluster=1, **kwargs),
                        ("dh", "dprobs", "db1", "dh_rowwise", "dh_columnwise"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("n,wide", [(384, False), (512, True), (1280, True)], ids=["narrow", "wide", "odd-wide"])
@pytest.mark.parametrize("out", ["fp32", "main-grad"])
def test_the_weight_gradient_in_clusters_is_bitwise_alone(splits, n, wide, out):
    """Odd n-tile counts (the pair's shadow items: N = 384 narrow, 1280 wide) and experts past
    the ring (up to 700 tokens, 6 blocks); with out= the single fp32 add."""
    from gmlp.cutedsl.sm90.blockwise_wgrad import grouped_wgrad_fp8_blockwise
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise

    torch.manual_seed(0)
    split_sizes, tokens = torch.tensor(splits, device="cuda"), sum(splits)

    def columnwise(cols: int):
        value = torch.randn(tokens, cols, device="cuda").bfloat16()
        return quantize_fp8_blockwise(value, rowwise=False, columnwise=True, split_sizes=split_sizes).columnwise

    a, b = columnwise(256), columnwise(n)
    if out == "fp32":
        assert_same_bits(grouped_wgrad_fp8_blockwise(a, b, split_sizes, wide=wide, cluster=2),
                         grouped_wgrad_fp8_blockwise(a, b, split_sizes, wide=wide, cluster=1), "dW")
        return
    main_grad = torch.randn(len(splits), 256, n, device="cuda")
    paired, alone = main_grad.clone(), main_grad.clone()
    grouped_wgrad_fp8_blockwise(a, b, split_sizes, out=paired, wide=wide, cluster=2)
    grouped_wgrad_fp8_blockwise(a, b, split_sizes, out=alone, wide=wide, cluster=1)
    assert_same_bits(paired, alone, "main_grad")
