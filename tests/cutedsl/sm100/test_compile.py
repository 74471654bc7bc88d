"""The SM100 path's kernels compile for sm_100a with the arguments gmlp passes, on the CPU.

No Blackwell GPU runs them here. The composition itself (``gmlp.cutedsl.sm100.layer``) runs,
forward and backward, for the design shapes on ``meta`` tensors (its quantizes only allocate, as
gmlp's quantize kernels do), and every kernel call it makes is compiled for sm_100a under
``simulated_sm100`` and its PTX checked. ``tests/cutedsl/sm100/test_layer.py`` runs the same composition
on real tensors with the kernels' own argument checks and torch twins of the kernels; a GPU test
runs it where an SM100 GPU is present.
"""

from __future__ import annotations

import re

import pytest
import torch

import gmlp
from gmlp.bench.mlp import SHAPES
from gmlp.contract.activations import activation_from
from gmlp.cutedsl.sm100 import cudnn_kernels
from gmlp.cutedsl.sm100.layer import sm100_backward, sm100_forward
from gmlp.layer.autograd import allocating_quantize
from tests.support.blackwell import BLOCK_SCALED_MMA, CompilingLauncher
from tests.support.cases import parametrize_quick

pytestmark = pytest.mark.skipif(cudnn_kernels.import_error() is not None,
                                reason=f"cuDNN frontend's kernels do not import: {cudnn_kernels.import_error()}")

SCALE_ROUNDED_UP = re.compile(r"cvt\.rp(\.satfinite)?\.ue8m0x2\.f32")
SITES = ["fc1", "fc2", "fc2 dgrad", "fc1 dgrad", "fc2 wgrad", "fc1 wgrad"]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory) -> CompilingLauncher:
    """One compiling launcher for the module: a kernel with the same signature compiles once."""
    return CompilingLauncher(tmp_path_factory.mktemp("sm100-ptx"))


def _layer_on_meta(shape: str, activation: str, launcher: CompilingLauncher, probs: bool = True) -> None:
    """The SM100 composition, forward and backward, for a design shape on meta tensors."""
    experts, tokens, hidden, ffn = SHAPES[shape]
    act = activation_from(activation)
    n1 = 2 * ffn if act.gated else ffn
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, w1, w2 = torch.empty(tokens, hidden, **meta), torch.empty(experts, n1, hidden, **meta), torch.empty(experts, hidden, ffn, **meta)
    split_sizes = torch.empty(experts, dtype=torch.int64, device="meta")
    prob = torch.empty(tokens, dtype=torch.float32, device="meta") if probs else None
    recipe = gmlp.MXFP8Recipe()
    y, saved = sm100_forward(allocating_quantize, x, split_sizes, prob, w1, None, w2, None, act, recipe, launch=launcher)
    grads = sm100_backward(allocating_quantize, torch.empty_like(y), saved, act, recipe, launch=launcher)
    assert y.shape == x.shape and grads.dx.shape == x.shape
    assert grads.dw1.shape == w1.shape and grads.dw2.shape == w2.shape


@parametrize_quick("shape", list(SHAPES))
def test_every_kernel_of_the_layer_compiles_for_sm100(shape, launcher):
    _layer_on_meta(shape, "swiglu", launcher)
    assert sorted(launcher.ptx) == sorted(SITES)
    for site, ptx in launcher.ptx.items():
        assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), f"{site}: no block-scaled tcgen05 MMA"
    for site in ("fc1", "fc2 dgrad"):  # the epilogue computes the scales (rounded up) and the fp8 elements
        assert SCALE_ROUNDED_UP.search(launcher.ptx[site]) and "cvt.rn.satfinite.e4m3x2.f32" in launcher.ptx[site], site


@pytest.mark.slow
@parametrize_quick("activation", ["qgeglu", "srelu"])
def test_the_other_activations_compile_for_sm100(activation, launcher):
    """The clamped GeGLU (the GLU kernels' "geglu") and srelu (the srelu kernels), and a layer
    without probs; the smallest design shape."""
    launcher.ptx.clear()
    _layer_on_meta("qwen3-30b-a3b", activation, launcher, probs=activation == "srelu")
    assert sorted(launcher.ptx) == sorted(SITES)
    for site in ("fc1", "fc2 dgrad"):
        ptx = launcher.ptx[site]
        assert ".target sm_100a" in ptx and BLOCK_SCALED_MMA.search(ptx), f"{site}: no block-scaled tcgen05 MMA"


def test_operands_outside_the_contract_are_refused():
    from gmlp.cutedsl.sm100.steps import grouped_gemm_call
    from gmlp.mxfp8 import scale_layout
    from gmlp.mxfp8.spec import ElementFormat, ScaleMode
    from gmlp.mxfp8.tensor import MXFP8Tensor, QuantAxis

    def rowwise(rows: int, cols: int) -> MXFP8Tensor:
        data = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device="meta")
        scales = torch.empty(scale_layout.ceil_div(rows, 128) * scale_layout.swizzled_size(128, cols // 32),
                             dtype=torch.uint8, device="meta")
        return MXFP8Tensor(data, scales, QuantAxis.ROWWISE, True, ElementFormat.E4M3, ScaleMode.RCEIL, None)

    offsets = torch.zeros(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="multiple of 128"):
        grouped_gemm_call(rowwise(512, 64), rowwise(3 * 96, 64), offsets)
    with pytest.raises(ValueError, match="padded layout"):
        grouped_gemm_call(rowwise(300, 64), rowwise(3 * 128, 64), offsets)
    with pytest.raises(TypeError, match="int32"):
        grouped_gemm_call(rowwise(512, 64), rowwise(3 * 128, 64), offsets.long())
