"""Triton's interpreter evaluates kernels with numpy, which warns on floating-point exceptions
(an all-zero FP8 blockwise block's ``FMAX / amax``, an overflowing product) where the GPU
computes the IEEE result silently: under gmlp's interpreter fixes a layer step prints no
RuntimeWarning, and numpy's own error state is left as it was outside the kernels."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch

import gmlp
import gmlp.triton_ref  # noqa: F401  (installs the interpreter fixes when TRITON_INTERPRET is on)


def _runtime_warnings(recipe, x: torch.Tensor, splits: list[int]) -> list[str]:
    """The RuntimeWarnings of one forward + backward of a small layer on ``x``."""
    mlp = gmlp.GroupedMLP(len(splits), x.shape[1], 128, recipe=recipe)
    x = x.requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlp(x, torch.tensor(splits)).sum().backward()
    return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.fixture(autouse=True)
def _interpreted():
    if "gmlp.triton_ref._interpreter_fixes" not in sys.modules:
        pytest.skip("the Triton kernels are compiled here (TRITON_INTERPRET is off): no interpreter to warn")


@pytest.mark.parametrize("splits", [[0, 0], [3, 2]], ids=["no-tokens", "five-tokens"])
def test_fp8_blockwise_layer_prints_no_divide_by_zero(splits):
    x = torch.randn(sum(splits), 128, dtype=torch.bfloat16)
    assert _runtime_warnings(gmlp.FP8BlockwiseRecipe(), x, splits) == []


def test_mxfp8_layer_with_a_huge_input_prints_no_overflow():
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    x[3, 3] = 3e38  # its products overflow fp32 in FC1
    assert _runtime_warnings(gmlp.MXFP8Recipe(), x, [32, 32]) == []


def test_numpy_still_warns_outside_the_kernels():
    gmlp.quantize_mxfp8(torch.randn(32, 64, dtype=torch.bfloat16), rowwise=True)  # an interpreted launch
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        np.float32(1.0) / np.float32(0.0)
