"""The TransformerEngine side of ``bench mlp`` (``gmlp.bench.te_blockwise``) wired to a stand-in TE on
the CPU: which weights, rows and recipe it hands TE. What TE computes is TE's (the side runs on the
GPU machine with TE installed); here a per-expert bf16 linear stands in for ``GroupedLinear``."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from gmlp.bench import mlp, te_blockwise

EXPERTS, TOKENS, HIDDEN, FFN = 3, 40, 32, 32


class _GroupedLinear(torch.nn.Module):
    """TE's ``GroupedLinear`` contract: ``weight{g}`` (out, in) per expert, rows split by a host list."""

    def __init__(self, num_gemms, in_features, out_features, *, bias, params_dtype, device):
        super().__init__()
        assert bias is False and params_dtype == torch.bfloat16
        for g in range(num_gemms):
            self.register_parameter(f"weight{g}", torch.nn.Parameter(torch.empty(out_features, in_features,
                                                                                 dtype=params_dtype, device=device)))
        self.num_gemms = num_gemms

    def forward(self, x, m_splits):
        assert isinstance(m_splits, list) and all(isinstance(m, int) for m in m_splits)
        assert all(m % te_blockwise.ALIGN == 0 for m in m_splits), "TE's block-scaled GEMMs refuse these rows"
        assert _FakeTE.recipes, "called outside fp8_autocast"
        return torch.cat([part @ getattr(self, f"weight{g}").t() for g, part in enumerate(x.split(m_splits))])


class _Fp8Padding(torch.nn.Module):
    """TE's ``Fp8Padding``: every expert's rows padded with zero rows to a multiple of ``align_size``."""

    def __init__(self, num_gemms, align_size):
        super().__init__()
        self.align_size = align_size

    def padded_splits(self, m_splits):
        return [-(-m // self.align_size) * self.align_size for m in m_splits]

    def forward(self, x, m_splits):
        padded = self.padded_splits(m_splits)
        _FakeTE.padded.append(padded)
        return torch.cat([torch.cat([part, part.new_zeros(p - m, *part.shape[1:])])
                          for part, m, p in zip(x.split(m_splits), m_splits, padded)]), padded


class _Fp8Unpadding(_Fp8Padding):
    """TE's ``Fp8Unpadding``: the padding rows dropped."""

    def forward(self, x, m_splits):
        return torch.cat([part[:m] for part, m in zip(x.split(self.padded_splits(m_splits)), m_splits)])


class _FakeTE:
    padded: list = []
    recipes: list = []
    available = (True, "")

    @staticmethod
    @contextlib.contextmanager
    def fp8_autocast(enabled, fp8_recipe):
        assert enabled
        _FakeTE.recipes.append(fp8_recipe)
        try:
            yield
        finally:
            _FakeTE.recipes.pop()

    @staticmethod
    def is_fp8_block_scaling_available(return_reason):
        return _FakeTE.available


@pytest.fixture
def fake_te(monkeypatch):
    modules = {"transformer_engine.pytorch": types.SimpleNamespace(
                   GroupedLinear=_GroupedLinear, Fp8Padding=_Fp8Padding, Fp8Unpadding=_Fp8Unpadding,
                   fp8_autocast=_FakeTE.fp8_autocast,
                   is_fp8_block_scaling_available=_FakeTE.is_fp8_block_scaling_available),
               "transformer_engine.common.recipe": types.SimpleNamespace(Float8BlockScaling=lambda: "block-scaling")}
    real = te_blockwise.importlib.import_module
    monkeypatch.setattr(te_blockwise.importlib, "import_module", lambda name, *a: modules.get(name) or real(name, *a))
    monkeypatch.setattr(_FakeTE, "available", (True, ""))
    monkeypatch.setattr(_FakeTE, "padded", [])
    return _FakeTE


@pytest.mark.parametrize("sizes, padded", [([25, 0, 15], [32, 0, 16]), ([16, 0, 32], None)],
                         ids=["rows-padded-to-16", "rows-aligned"])
def test_the_side_runs_the_baselines_layer_through_grouped_linear(fake_te, sizes, padded):
    """TE's modules hold the bf16 weights in their (out, in) orientation, take the routing as a host
    list (each expert's rows padded to a multiple of 16 by TE's own padding where they are not, with
    zero probabilities), run under the block-scaling recipe, and train x, probs and their own weights."""
    tokens = sum(sizes)
    x, dy = mlp.layer_tensors(tokens, HIDDEN, torch.device("cpu"))
    probs = mlp.router_probs(tokens, torch.device("cpu"))
    split_sizes = torch.tensor(sizes)
    layers, (w1, w2) = mlp.make_layers(EXPERTS, HIDDEN, FFN, torch.device("cpu"))
    forward, leaves = te_blockwise.te_run(w1, w2, x, probs, split_sizes, mlp.swiglu_probs)
    baseline = mlp.baseline_layer(x, probs, w1, w2, mlp.expert_offsets(split_sizes), mlp.swiglu_probs)
    torch.testing.assert_close(forward(), baseline, rtol=0, atol=0)  # the same bf16 products in the stand-in
    assert fake_te.padded == ([] if padded is None else [padded])
    mlp.training_step(forward, leaves, dy)
    assert x.grad is not None and probs.grad is not None and all(leaf.grad is not None for leaf in leaves[2:])
    assert len(leaves) == 2 + 2 * EXPERTS and te_blockwise.SIDE in mlp.SIDES


def test_the_side_refuses_where_te_cannot_run_block_scaling(fake_te):
    fake_te.available = (False, "needs compute capability 9.0")
    x = torch.zeros(4, HIDDEN, dtype=torch.bfloat16)
    w1, w2 = torch.zeros(1, 2 * FFN, HIDDEN, dtype=torch.bfloat16), torch.zeros(1, HIDDEN, FFN, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="cannot run Float8BlockScaling here: needs compute capability 9.0"):
        te_blockwise.te_run(w1, w2, x, torch.zeros(4), torch.tensor([4]), mlp.swiglu_probs)
