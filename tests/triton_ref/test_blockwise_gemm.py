"""The Triton grouped FP8 blockwise GEMMs (forward / dgrad and weight gradient) against the fp64
oracle (gmlp.fp8_blockwise.gemm), within a bound derived from each element's sum of |products|;
expert groups of 0, 1, 127, 128 and 129 tokens, E = 1, E5M2 gradients, main_grad accumulation."""

from __future__ import annotations

import pytest
import torch

from gmlp.fp8_blockwise.gemm import (
    grouped_gemm_blockwise_ref,
    grouped_wgrad_blockwise_ref,
)
from gmlp.fp8_blockwise.reference import (
    quantize_fp8_blockwise_ref,
    quantize_weights_fp8_blockwise_ref,
)
from gmlp.fp8_blockwise.tensor import absolute
from tests.support.backends import kernel_device, triton_op
from tests.support.blockwise import on_device, summation_error
from tests.support.cases import parametrize_quick

SPLITS = {"edges": [0, 1, 127, 128, 129, 0], "one-expert": [200], "all-on-one": [0, 0, 256]}


def _summation_error(k: int) -> float:
    """Relative bound (to the sum of |products|) of a kernel's summation error over k values: fp32
    sums (k * 2**-24, the interpreter's numpy and the promoted accumulator), plus, on the GPU, each
    128-block's fp8 ``wgmma`` chain at Hopper's reduced accumulation precision
    (``gmlp.debug.compare.FP8_WGMMA_BLOCK_ERROR``)."""
    return summation_error(k, kernel_device().type == "cuda")


def _assert_within_bound(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor, k: int, out_rounding: float):
    """|got - want| <= out_rounding * |want| (the output's rounding) + the summation error of the
    sum of |products| ``magnitude``, plus the output's rounding of that error."""
    bound = (out_rounding * want.abs() + _summation_error(k) * magnitude) * (1 + out_rounding)
    error = (got.double().cpu() - want.double()).abs()
    assert got.shape == want.shape
    excess = error > bound
    assert not excess.any(), f"{int(excess.sum())} of {excess.numel()} elements beyond the bound, first at " \
                             f"{excess.nonzero()[:3].tolist()}: {error[excess][:3].tolist()} > {bound[excess][:3].tolist()}"



def _operands(tokens: int, features: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-8, 8, (tokens, 1), generator=generator).float())
    return (torch.randn(tokens, features, generator=generator) * scale).bfloat16()



@pytest.mark.parametrize("transposed", [False, True], ids=["forward", "dgrad"])
@parametrize_quick("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@parametrize_quick("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_grouped_gemm_within_the_derived_bound(splits, power_of_two, transposed):
    gemm = triton_op("blockwise_gemm", "grouped_gemm_fp8_blockwise")
    tokens, experts, k, n = sum(splits), len(splits), 256, 384
    x = _operands(tokens, k, seed=len(splits))
    generator = torch.Generator().manual_seed(1)
    w = torch.randn(experts, k, n, generator=generator) if transposed else torch.randn(experts, n, k, generator=generator)
    # a different power of two in every 128 x 128 tile, so that each tile's scale matters
    w = (w * torch.exp2(torch.randint(-6, 6, (experts, w.shape[1] // 128, 1, w.shape[2] // 128, 1), generator=generator)
                        .float()).repeat_interleave(128, 2).repeat_interleave(128, 4).flatten(1, 2).flatten(2, 3)).bfloat16()
    q_w = quantize_weights_fp8_blockwise_ref(w, power_of_two=power_of_two)
    if transposed:  # dgrad: the weight (E, K_w, N_w) read as its exact transpose (E, N_w, K_w)
        q_w = q_w.transpose()
    q_x = quantize_fp8_blockwise_ref(x, power_of_two=power_of_two).rowwise
    split_sizes = torch.tensor(splits)
    bias = None if transposed else torch.randn(experts, n, generator=generator).bfloat16()  # FC2's b2
    want = grouped_gemm_blockwise_ref(q_x, q_w, split_sizes, bias=bias, out_dtype=torch.float64)
    magnitude = grouped_gemm_blockwise_ref(absolute(q_x), absolute(q_w), split_sizes, out_dtype=torch.float64)
    device = kernel_device()
    for block_n in (128, 64):
        got = gemm(on_device(q_x, device), on_device(q_w, device), split_sizes.to(device), block_n=block_n,
                   bias=None if bias is None else bias.to(device))
        assert got.dtype == torch.bfloat16
        _assert_within_bound(got, want, magnitude, k, 2.0**-8)


@parametrize_quick("grad_format", ["e4m3", "e5m2"])
@parametrize_quick("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_grouped_wgrad_within_the_derived_bound(splits, grad_format):
    wgrad = triton_op("blockwise_wgrad", "grouped_wgrad_fp8_blockwise")
    tokens, m, n = sum(splits), 384, 256
    split_sizes = torch.tensor(splits)
    dy = quantize_fp8_blockwise_ref(_operands(tokens, m, seed=2), rowwise=False, columnwise=True,
                                    split_sizes=split_sizes, element_format=grad_format).columnwise
    x = quantize_fp8_blockwise_ref(_operands(tokens, n, seed=3), rowwise=False, columnwise=True,
                                   split_sizes=split_sizes).columnwise
    want = grouped_wgrad_blockwise_ref(dy, x, split_sizes, out_dtype=torch.float64)
    magnitude = grouped_wgrad_blockwise_ref(absolute(dy), absolute(x), split_sizes, out_dtype=torch.float64)
    device = kernel_device()
    longest = max(splits)
    got = wgrad(on_device(dy, device), on_device(x, device), split_sizes.to(device))
    assert got.dtype == torch.float32
    _assert_within_bound(got, want, magnitude, longest, 2.0**-24)
    if tokens:
        assert torch.equal(got[torch.tensor(splits) == 0].cpu(), torch.zeros_like(got[torch.tensor(splits) == 0].cpu()))
    main_grad = torch.ones(len(splits), m, n, device=device)
    wgrad(on_device(dy, device), on_device(x, device), split_sizes.to(device), out=main_grad)
    _assert_within_bound(main_grad.double() - 1, want, magnitude + 1, longest, 2.0**-23)


def test_argument_errors_name_the_argument():
    gemm = triton_op("blockwise_gemm", "grouped_gemm_fp8_blockwise")
    x = quantize_fp8_blockwise_ref(torch.randn(8, 256).bfloat16(), columnwise=True)
    w = quantize_weights_fp8_blockwise_ref(torch.randn(2, 128, 256).bfloat16())
    with pytest.raises(TypeError, match="a must be an FP8BlockwiseTensor with 1x128 blocks"):
        gemm(x.columnwise, w, torch.tensor([4, 4]))
    with pytest.raises(ValueError, match=r"b must be \(E=3, N, K=256\), got \(2, 128, 256\)"):
        gemm(x.rowwise, w, torch.tensor([4, 4, 0]))
    with pytest.raises(ValueError, match="block_n must divide 128"):
        gemm(x.rowwise, w, torch.tensor([4, 4]), block_n=96)
