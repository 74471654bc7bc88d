"""The Triton FC2 dgrad kernel (grouped GEMM + fused activation backward) against its twin.

Tolerance (as in tests/triton_ref/test_fc1.py): the fp32 accumulation order moves da by at most
delta_da = H * 2**-24 * max sum_k |dy_k w_k|; through act' that becomes delta_dh = delta_da * L
with L = 2 * max|c| + 2 bounding |d act / d h| * 2 (probs <= 1); dprobs sums F such terms times
|act(c)| <= L * max|c|. Outputs may round one step of their format away from the reference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gmlp.contract.activations import activation_from
from gmlp.contract.reference import fc2_dgrad_ref
from gmlp.debug.compare import gemm_delta
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat
from tests.support.backends import SMALL_GEMM, assert_outputs_bitwise_equal, kernel_device, triton_op
from tests.support.cases import parametrize_quick
from tests.support.tolerances import within_steps


@pytest.fixture
def fc2_dgrad():
    return triton_op("fc2_dgrad", "fc2_dgrad")



@parametrize_quick("activation", ["swiglu", "geglu", "qgeglu", "srelu"])
@pytest.mark.parametrize("recipe", [None, MXFP8Recipe(), MXFP8Recipe(grad_format=ElementFormat.E5M2)],
                         ids=["bf16", "mxfp8", "mxfp8-e5m2-grads"])
@parametrize_quick("with_probs", [True, False], ids=["probs", "no-probs"])
def test_fc2_dgrad_matches_reference(fc2_dgrad, activation, recipe, with_probs):
    activation = activation_from(activation)
    device = kernel_device()
    splits = [0, 37, 64, 1, 90]
    tokens, hidden, ffn = sum(splits), 64, 96
    fc1_outputs = (2 if activation.gated else 1) * ffn
    split_sizes = torch.tensor(splits, device=device)
    dy = torch.randn(tokens, hidden, device=device).bfloat16()
    w2t = (torch.randn(len(splits), ffn, hidden, device=device) / 8).bfloat16()
    c = torch.randn(tokens, fc1_outputs, device=device).bfloat16()
    probs = torch.rand(tokens, device=device) if with_probs else None
    if recipe is not None:  # MXFP8 operands as the layer hands them over: quantized values, dequantized
        dy = quantize_mxfp8_ref(dy, rowwise=True, swizzle=False, element_format=recipe.grad_format).rowwise
        w2t = quantize_mxfp8_ref(w2t.reshape(-1, hidden), rowwise=True, swizzle=False).rowwise
        dy, w2t = dy.dequantize().bfloat16(), w2t.dequantize().bfloat16().view(len(splits), ffn, hidden)
    kwargs = dict(activation=activation, recipe=recipe, probs=probs)
    got = fc2_dgrad(dy, w2t, c, split_sizes, tiling=SMALL_GEMM, **kwargs)
    # the other launch order computes every tile the same way
    assert_outputs_bitwise_equal(
        got, fc2_dgrad(dy, w2t, c, split_sizes, tiling=dataclasses.replace(SMALL_GEMM, n_fastest=not SMALL_GEMM.n_fastest), **kwargs))
    want = fc2_dgrad_ref(dy, w2t, c, split_sizes, **kwargs)
    magnitude = max((dy.float().abs() @ w2t[g].float().abs().t()).max().item() for g in range(len(splits)))
    lipschitz = 2 * c.float().abs().max().item() + 2
    delta_dh = gemm_delta(magnitude, hidden) * lipschitz
    if with_probs:
        assert within_steps(got.dprobs, want.dprobs, 2.0**-20, ffn * delta_dh * lipschitz)
    else:
        assert got.dprobs is None and want.dprobs is None
    if recipe is None:
        assert within_steps(got.dh, want.dh, 2.0**-7, delta_dh)
        return
    step = 2.0 ** -recipe.grad_format.mantissa_bits
    for axis in ("dh_rowwise", "dh_columnwise"):
        mine, ref = getattr(got, axis), getattr(want, axis)
        assert mine.data.shape == ref.data.shape and mine.scales.shape == ref.scales.shape, axis
        scale_steps = (mine.scales.int() - ref.scales.int()).abs()
        assert int(scale_steps.max()) <= 1, axis
        assert within_steps(mine.dequantize(), ref.dequantize(), 1.0 if scale_steps.any() else step, delta_dh), axis
