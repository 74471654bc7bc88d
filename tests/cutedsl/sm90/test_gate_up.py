"""W1's gate and up stored apart (``gmlp.contract.gate_up``: torchtitan's two (E, F, H) tensors, its
interleaved (E, F, 2, H) one) on the SM90 kernels, read in place: FC1 loads the up tiles through a
second TMA descriptor (``FC1Config.up_apart``), FC1 dgrad takes W1^T as two parts along K
(``KernelConfig.k_split``, ``_pipeline.KSplit``), FC1 wgrad writes dW1's gate and up rows apart
(``split_rows``: a launch per part of dh's columns). Compiled without a GPU (the PTX checks of
their kernels, the second descriptor's loads, no spills); on an H100/H200 (marker ``gpu``) bit for
bit the outputs of gmlp's own (E, 2F, H) W1 with the same values, at every layout."""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.contract.activations import activation_from
from gmlp.contract.gate_up import GateUpLayout, gate_up_views
from gmlp.cutedsl import import_error
from gmlp.mxfp8.recipe import MXFP8Recipe
from tests.support.cases import parametrize_quick, stored_gate_up
from tests.support.sm90 import SPLITS, assert_same_bits, check_fc1_ptx, check_ptx, on_sm90

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

_TMA_LOADS = r"cp\.async\.bulk\.tensor\.3d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes"


@parametrize_quick("variant", [{}, dict(store="tma")], ids=["regs", "tma-store"])
def test_fc1_with_up_apart_compiles(variant):
    """FC1 with gate and up apart: the same wgmmas as from one W1, the B loads as many (3-D TMA
    loads of each expert's tiles, a second descriptor for the up tiles), no spills."""
    from gmlp.cutedsl.sm90.fc1 import FC1Config, compile_fc1

    activation = activation_from("swiglu")
    knobs = dict(probs_dtype=torch.float32, **variant)
    apart = compile_fc1("sm_90a", FC1Config(activation, up_apart=True, **knobs))
    together = compile_fc1("sm_90a", FC1Config(activation, **knobs))
    check_fc1_ptx(apart, gated=True)
    assert len(re.findall(_TMA_LOADS, apart.ptx)) == len(re.findall(_TMA_LOADS, together.ptx))
    # the kernel takes the two descriptors: one more prefetched than with one W1
    assert len(re.findall(r"prefetch\.tensormap", apart.ptx)) == len(re.findall(r"prefetch\.tensormap",
                                                                                 together.ptx)) + 1


def test_up_apart_is_refused_where_it_cannot_run():
    from gmlp.cutedsl.sm90.fc1 import FC1Config

    with pytest.raises(ValueError, match="up_apart needs a gated activation and K-major gate and up views"):
        FC1Config(activation_from("srelu"), up_apart=True)
    with pytest.raises(ValueError, match="b_k_major=False"):
        FC1Config(activation_from("swiglu"), up_apart=True, b_k_major=False)


@parametrize_quick("b_k_major", [False, True], ids=["n-major", "k-major"])
def test_grouped_gemm_with_k_split_compiles(b_k_major):
    """FC1 dgrad's B in two parts along K: the grouped GEMM's PTX checks, twice the B loads of one
    B's kernel (each k-tile's loads sit once in the producer's loop per part)."""
    from gmlp.cutedsl.sm90.grouped_gemm import KernelConfig, compile_grouped_gemm

    split = compile_grouped_gemm("sm_90a", KernelConfig(b_k_major=b_k_major, k_split=True, store="tma"))
    whole = compile_grouped_gemm("sm_90a", KernelConfig(b_k_major=b_k_major, store="tma"))
    check_ptx(split, tile_n=256, b_k_major=b_k_major)
    b_loads = len(re.findall(_TMA_LOADS, whole.ptx))
    assert len(re.findall(_TMA_LOADS, split.ptx)) == 2 * b_loads


def _gate_up(experts: int, ffn: int, hidden: int, layout: GateUpLayout):
    """gmlp's (E, 2F, H) W1 and the same values' views in ``layout``."""
    gate, up = ((torch.randn(experts, ffn, hidden, device="cuda") / 8).bfloat16() for _ in range(2))
    views = gate_up_views(layout, *stored_gate_up(layout, gate, up))
    return torch.cat([gate, up], 1), views


LAYOUTS = [GateUpLayout.INTERLEAVED, GateUpLayout.SEPARATE]


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.value)
@pytest.mark.parametrize("variant", [dict(store="regs"), dict(store="tma"), dict(recipe=MXFP8Recipe())],
                         ids=["regs", "tma-store", "mxfp8"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (512, 256)], ids=["H64-F96", "H512-F256"])
@pytest.mark.parametrize("splits", [SPLITS["ragged-with-empty"], SPLITS["many-tiny"]], ids=["ragged", "many-tiny"])
@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_fc1_reads_gate_and_up_apart_bitwise(layout, variant, hidden, ffn, splits, activation):
    """FC1 on the gate and up views: c and a (or Q_row(a), Q_col(a)) bit for bit those of the
    (E, 2F, H) W1 with the same values."""
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    tokens = sum(splits)
    x = torch.randn(tokens, hidden, device="cuda").bfloat16()
    w1, views = _gate_up(len(splits), ffn, hidden, layout)
    kwargs = dict(ffn_hidden_size=ffn, activation=activation_from(activation), recipe=None,
                  b1=(torch.randn(len(splits), 2 * ffn, device="cuda") * 0.1).bfloat16(),
                  probs=torch.rand(tokens, device="cuda")) | variant
    got, want = fc1_forward(x, views, split_sizes, **kwargs), fc1_forward(x, w1, split_sizes, **kwargs)
    assert_same_bits(got.c, want.c, "c")
    if want.a is not None:
        assert_same_bits(got.a, want.a, "a")
        return
    for axis in ("a_rowwise", "a_columnwise"):
        assert_same_bits(getattr(got, axis).data.view(torch.uint8), getattr(want, axis).data.view(torch.uint8), axis)
        assert_same_bits(getattr(got, axis).scales, getattr(want, axis).scales, f"{axis} scales")


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.value)
@pytest.mark.parametrize("store", ["regs", "tma"])
@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (512, 256), (96, 32)], ids=["H64-F96", "H512-F256", "H96-F32"])
@pytest.mark.parametrize("splits", [SPLITS["ragged-with-empty"], SPLITS["many-tiny"]], ids=["ragged", "many-tiny"])
def test_fc1_dgrad_reads_gate_and_up_apart_bitwise(layout, store, tile_n, hidden, ffn, splits):
    """FC1 dgrad, dx = dh @ W1 with W1^T as the gate's and the up's transposed views side by side
    along K: bit for bit dx of the (E, 2F, H) W1's transposed view, also where F is not a multiple
    of the 64-wide k-tile (the gate part's last k-tile meets TMA's zero fill past F)."""
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    dh = torch.randn(sum(splits), 2 * ffn, device="cuda").bfloat16()
    w1, views = _gate_up(len(splits), ffn, hidden, layout)
    kwargs = dict(tile_n=tile_n, store=store)
    got = grouped_gemm(dh, (views.gate.transpose(1, 2), views.up.transpose(1, 2)), split_sizes, **kwargs)
    assert_same_bits(got, grouped_gemm(dh, w1.transpose(1, 2), split_sizes, **kwargs), "dx")


def test_grouped_gemm_refuses_parts_that_do_not_fit():
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, split_sizes = torch.zeros(4, 64, dtype=torch.bfloat16, device=device), torch.tensor([4], device=device)
    part = torch.zeros(1, 32, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"b\[1\] must hold 1 experts' \(N=32, K=32\) matrices, got \(32, 16\)"):
        grouped_gemm(a, (part, part[:, :, :16]), split_sizes)
    with pytest.raises(ValueError, match="both be K-major or both N-major"):
        grouped_gemm(a, (part, part.transpose(1, 2)), split_sizes)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("accumulate", [False, True], ids=["new", "main-grad"])
@pytest.mark.parametrize("store", ["regs", "tma"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (512, 256)], ids=["H64-F96", "H512-F256"])
@pytest.mark.parametrize("splits", [SPLITS["ragged-with-empty"], SPLITS["many-tiny"]], ids=["ragged", "many-tiny"])
def test_fc1_wgrad_writes_gate_and_up_apart_bitwise(accumulate, store, hidden, ffn, splits):
    """FC1 wgrad with ``split_rows=F``: dW1's gate rows and up rows as two tensors (or added to two
    main_grads), bit for bit the halves of the one-tensor dW1, also where F is not a multiple of the
    128-row tile."""
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    dh = torch.randn(sum(splits), 2 * ffn, device="cuda").bfloat16()
    x = torch.randn(sum(splits), hidden, device="cuda").bfloat16()
    experts = len(splits)
    start = torch.randn(experts, 2 * ffn, hidden, device="cuda") if accumulate else None
    whole = grouped_wgrad(dh, x, split_sizes, out=None if start is None else start.clone(), store=store)
    out = None if start is None else tuple(part.contiguous() for part in start.chunk(2, dim=1))
    gate, up = grouped_wgrad(dh, x, split_sizes, out=out, split_rows=ffn, store=store)
    if out is not None:
        assert gate is out[0] and up is out[1]
    assert_same_bits(gate, whole[:, :ffn], "dW1 gate")
    assert_same_bits(up, whole[:, ffn:], "dW1 up")


def test_split_rows_is_refused_where_it_cannot_run():
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dh, x = torch.zeros(4, 64, dtype=torch.bfloat16, device=device), torch.zeros(4, 32, dtype=torch.bfloat16,
                                                                                 device=device)
    split_sizes = torch.tensor([4], device=device)
    with pytest.raises(ValueError, match=r"split_rows must be a multiple of 8 in \[0, 64\].*got 36"):
        grouped_wgrad(dh, x, split_sizes, split_rows=36)
    with pytest.raises(ValueError, match="out must be a pair of tensors when split_rows is given"):
        grouped_wgrad(dh, x, split_sizes, split_rows=32, out=torch.zeros(1, 64, 32, device=device))
