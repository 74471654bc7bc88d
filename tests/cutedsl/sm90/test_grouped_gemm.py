"""The CuTeDSL sm_90a grouped GEMM (gmlp.cutedsl.sm90.grouped_gemm) compiled without a GPU, with
checks on its PTX and the cubin's resources, and (marker ``gpu``, H100/H200 only) run against
the reference and the Triton twin.

The kernel is shape-generic (T, N, K, E are runtime values): one compile serves every shape of a
config, so the compile tests are parametrized by config (each compiled and checked once, about 2-3
s with its cuobjdump checks), and the design and odd shapes are checked against the kernel's
support without compiling. Skipped, with the import error, where cutlass-dsl is missing or broken.
"""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.cutedsl import import_error
from gmlp.debug.compare import gemm_delta
from tests.support.backends import twice_without_sync
from tests.support.cases import BANDED_SPLITS, config_id, parametrize_quick
from tests.support.ptx import check_register_split
from tests.support.sm90 import SPLITS, assert_same_bits, check_ptx, expert_weights, on_sm90, tuned_knobs

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

# (E, T, H, F) design shapes: FC2 forward is N = H, K = F; FC1 dgrad N = H, K = 2F.
DESIGN_SHAPES = [(8, 16384, 4096, 14336), (32, 32768, 7168, 2048), (128, 65536, 2048, 768)]
# (T, N, K, E) of the layer's GEMMs at the design shapes: FC2 forward, FC1 dgrad
GEMM_SHAPES = [(t, h, k, e) for e, t, h, f in DESIGN_SHAPES for k in (f, 2 * f)]
# Odd problems: tiny and empty experts, T and N not multiples of the tile, K below one k-tile.
ODD_SHAPES = [(1, 8, 8, 1), (37 + 64 + 1 + 90, 40, 96, 5), (3, 264, 72, 4096)]


def _config(**kwargs):
    from gmlp.cutedsl.sm90.grouped_gemm import KernelConfig

    return KernelConfig(**kwargs)


def _compiled(knobs: dict):
    from gmlp.cutedsl.sm90.grouped_gemm import compile_grouped_gemm

    return compile_grouped_gemm("sm_90a", _config(**knobs))


@parametrize_quick("knobs", [dict(b_k_major=True, bias_dtype=torch.bfloat16), dict(b_k_major=False, bias_dtype=None)],
                   ids=config_id)
def test_layer_configs_compile(knobs):
    """FC2 forward reads stacked W2 (K-major B) and adds b2; FC1 dgrad reads W1^T in place (N-major B)."""
    compiled = _compiled(knobs)
    check_ptx(compiled, tile_n=compiled.config.tile_n, b_k_major=compiled.config.b_k_major)


TILE_WIDTHS = [128, 256]  # one or two consumer warpgroups per tile


@pytest.mark.slow
@parametrize_quick("knobs", [dict(tile_n=tile_n, bias_dtype=torch.float32, stages=3) for tile_n in TILE_WIDTHS],
                   ids=config_id)
def test_tiling_configs_compile(knobs):
    compiled = _compiled(knobs)
    check_ptx(compiled, tile_n=compiled.config.tile_n, b_k_major=True)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(store="tma", tile_n=256), dict(store="tma", tile_n=128, b_k_major=False)],
                   ids=config_id)
def test_tma_store_configs_compile(knobs):
    """The TMA-store epilogue: D's subtiles through stmatrix into shared memory, then 4-D TMA
    stores (the ragged view) as bulk groups; no st.global of D; its 32 KB (tile_n 256: 4 subtiles
    of 128 x 32) or 16 KB of buffers leave 4 and 6 pipeline stages."""
    compiled = _compiled(knobs)
    config = compiled.config
    check_ptx(compiled, tile_n=config.tile_n, b_k_major=config.b_k_major)
    ptx = compiled.ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta\.tile\.bulk_group", ptx)
    assert "stmatrix.sync.aligned" in ptx and "cp.async.bulk.commit_group" in ptx
    assert not re.search(r"st\.global\.(b32|v\d)", ptx)
    assert config.num_stages() == {256: 4, 128: 6}[config.tile_n]


@pytest.mark.slow
@parametrize_quick("knobs", tuned_knobs("grouped_gemm"), ids=config_id)
def test_tuned_configs_compile(knobs):
    """Every config the tuned table chooses for FC2 and FC1 dgrad (``gmlp.cutedsl.sm90.tuned``)."""
    compiled = _compiled(knobs)
    check_ptx(compiled, tile_n=compiled.config.tile_n, b_k_major=compiled.config.b_k_major)


def test_design_and_odd_shapes_are_supported():
    """The shapes the configs compiled here stand for are ones the kernel runs (its only shape
    check: the code is shape-generic)."""
    from gmlp.cutedsl.sm90.grouped_gemm import problem_support

    shapes = GEMM_SHAPES + ODD_SHAPES
    assert {shape: problem_support(*shape) for shape in shapes} == dict.fromkeys(shapes)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(tile_n=256, store="tma"), dict(tile_n=128, b_k_major=False),
                             dict(tile_n=256, store="tma", k_split=True)], ids=config_id)
def test_cluster_compiles_with_b_multicast(knobs):
    """A cluster of two: B's TMA loads multicast (each CTA's half to both, or both halves to
    itself), the slots' empty barriers arrived on in both CTAs (mbarrier.arrive.shared::cluster),
    and the cluster's barriers at the start (its mbarriers initialized) and at the end (neither
    CTA leaves while its peer may still arrive on its barriers)."""
    from gmlp.cutedsl.sm90.grouped_gemm import compile_grouped_gemm

    config = _config(cluster=2, **knobs)
    compiled = compile_grouped_gemm("sm_90a", config)
    check_ptx(compiled, tile_n=config.tile_n, b_k_major=config.b_k_major)
    alone = compile_grouped_gemm("sm_90a", _config(**knobs)).ptx
    assert "barrier.cluster" not in alone and "multicast" not in alone
    assert "mbarrier.arrive.shared::cluster.b64" in compiled.ptx
    assert compiled.ptx.count("barrier.cluster.wait") == 2


@pytest.mark.parametrize("shape,match", [
    ((64, 12, 64, 2), r"K=64 and N=12 must be positive multiples of 8"),
    ((64, 16, 0, 2), r"K=0 and N=16"),
    ((64, 16, 64, 4097), r"E=4097 outside \[1, 4096\]"),
])
def test_unsupported_shapes_are_refused(shape, match):
    from gmlp.cutedsl.sm90.grouped_gemm import compile_grouped_gemm

    with pytest.raises(ValueError, match=match):
        compile_grouped_gemm("sm_90a", shape=shape)


def test_invalid_configs_are_refused():
    with pytest.raises(ValueError, match=r"cluster must be one of \(1, 2\), got 4"):
        _config(cluster=4)
    with pytest.raises(ValueError, match="tile_n must be 128 or 256"):
        _config(tile_n=64)
    with pytest.raises(ValueError, match=r"stages must be in \[2, 4\] for tile_n=256"):
        _config(stages=5)
    with pytest.raises(ValueError, match=r"store must be one of \('regs', 'tma'\), got 'smem'"):
        _config(store="smem")
    with pytest.raises(ValueError, match=r"store='tma' needs no bias"):
        _config(store="tma", bias_dtype=torch.float32)


def test_b_layouts():
    """K-major stacked weights and N-major transposed views are read in place; other strides are refused."""
    from gmlp.cutedsl.sm90.grouped_gemm import _b_layout

    assert _b_layout(torch.empty(4, 40, 96, dtype=torch.bfloat16)) is True  # B_g (N, K) row-major
    assert _b_layout(torch.empty(4, 96, 40, dtype=torch.bfloat16).transpose(1, 2)) is False  # W (E, K, N) viewed
    with pytest.raises(ValueError, match=r"must be K-major .* or N-major"):
        _b_layout(torch.empty(4, 40, 192, dtype=torch.bfloat16)[:, :, ::2])
    with pytest.raises(ValueError, match=r"other strides multiples of 8"):
        _b_layout(torch.empty(4, 40, 100, dtype=torch.bfloat16)[:, :, :96])


def test_launcher_refuses_bad_operands():
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm

    a, b = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(2, 16, 64, dtype=torch.bfloat16)
    splits = torch.tensor([4, 4])
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):
        grouped_gemm(a, b, splits)
    with pytest.raises(ValueError, match=r"b must hold 2 experts' \(N, K=64\) matrices, got \(16, 32\) each"):
        grouped_gemm(a, b[:, :, :32], splits)
    with pytest.raises(TypeError, match=r"a must be a contiguous bf16 \(T, features\) tensor, got torch.float32 "
                                        r"\(8, 64\)"):
        grouped_gemm(a.float(), b, splits)
    with pytest.raises(TypeError, match=r"got torch.bfloat16 \(64, 8\) \(not contiguous\)"):
        grouped_gemm(a.t(), b, splits)


# ---------------------------------------------------------------------------------------------
# On an sm_90 GPU: against the reference and the Triton twin
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("tile_n", TILE_WIDTHS)
@pytest.mark.parametrize("transposed", [False, True], ids=["stacked", "transposed-weight"])
@pytest.mark.parametrize("n,k,bias", [(64, 96, True), (264, 64, False), (40, 520, True), (512, 2048, False)],
                         ids=["fc2-like", "dgrad-like", "odd-n-long-k", "wide"])
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_grouped_gemm_matches_reference_and_triton(splits, n, k, bias, transposed, tile_n):
    """Tolerance of tests/triton_ref/test_grouped_gemm.py: fp32 accumulation orders differ by at most
    delta = K * 2**-24 * max sum_k |a_k b_k|, then one bf16 rounding step (2**-7 |v|). Every row
    is compared, so a row left unwritten (torch.empty) or overwritten by the previous expert's
    tile fails."""
    from gmlp.contract.reference import grouped_gemm_ref
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm
    from gmlp.triton_ref.grouped_gemm import grouped_gemm as triton_grouped_gemm

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    a = torch.randn(sum(splits), k, device="cuda").bfloat16()
    b = expert_weights(len(splits), n, k, transposed)
    bias_values = (torch.randn(len(splits), n, device="cuda") * 0.1).bfloat16() if bias else None
    store = "regs" if bias else None  # the TMA store takes no bias
    got = grouped_gemm(a, b, split_sizes, bias=bias_values, tile_n=tile_n, store=store)
    want = grouped_gemm_ref(a, b, split_sizes, bias=bias_values)
    twin = triton_grouped_gemm(a, b, split_sizes, bias=bias_values)
    magnitude = max((a.float().abs() @ b[g].float().abs().t()).max().item() for g in range(len(splits)))
    delta = gemm_delta(magnitude, k)
    assert got.shape == want.shape == (sum(splits), n) and got.dtype == torch.bfloat16
    for other in (want, twin):
        assert bool(((got.float() - other.float()).abs() <= 2.0**-7 * other.float().abs() + delta).all())

@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("tile_n", TILE_WIDTHS)
def test_grouped_gemm_over_several_bands(tile_n):
    """20 m-tiles (bands of 8, 8, 4 in the schedule) x several n-tiles, an empty expert, k-tiles
    past the stages (the slot ring wraps within an item)."""
    test_grouped_gemm_matches_reference_and_triton(BANDED_SPLITS, 520, 1032, False, False, tile_n)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("transposed", [False, True], ids=["stacked", "transposed-weight"])
@pytest.mark.parametrize("n,k", [(64, 96), (264, 64), (40, 520), (512, 2048)])
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
def test_tma_store_is_bitwise_the_register_store(splits, n, k, transposed, tile_n):
    """The TMA-store epilogue rounds the same fp32 accumulators the same way: every byte of D equals
    the register-store kernel's, so rows past an expert's end (the next expert's) were not
    overwritten and no row or column was left unwritten (D comes from torch.empty)."""
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    a = torch.randn(sum(splits), k, device="cuda").bfloat16()
    b = expert_weights(len(splits), n, k, transposed)
    regs = grouped_gemm(a, b, split_sizes, tile_n=tile_n)
    tma = grouped_gemm(a, b, split_sizes, tile_n=tile_n, store="tma")
    assert torch.equal(regs, tma)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("tile_n,store", [(128, "regs"), (256, "tma")])
@pytest.mark.parametrize("transposed", [False, True], ids=["stacked", "transposed-weight"])
@pytest.mark.parametrize("n,k,k_split", [(64, 96, False), (264, 1032, False), (512, 2048, False), (384, 520, True)],
                         ids=["one-n-tile", "odd-n-tiles", "wide", "k-split"])
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
def test_cluster_is_bitwise_alone(splits, n, k, k_split, transposed, tile_n, store):
    """A cluster of two runs the same wgmmas on the same tiles as CTAs alone, its B tiles
    multicast where a pair's items share one: every byte of D equals the unclustered kernel's.
    The splits give pairs within one expert, pairs across an expert's end, empty experts, an odd
    count of m-tiles (a last item without its pair) and, in the last band, pairs across n-tiles."""
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    a = torch.randn(sum(splits), k, device="cuda").bfloat16()
    b = expert_weights(len(splits), n, k, transposed)
    if k_split:  # B_g = [B_g[:, :K1] | B_g[:, K1:]], read as two tensors (views of one)
        b = (b[:, :, :264], b[:, :, 264:])
    alone = grouped_gemm(a, b, split_sizes, tile_n=tile_n, store=store, cluster=1)
    paired = grouped_gemm(a, b, split_sizes, tile_n=tile_n, store=store, cluster=2)
    assert_same_bits(paired, alone, "d")


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_grouped_gemm_is_deterministic_and_syncless():
    """Same inputs, bitwise the same output; no host sync in the launch (split sizes stay on the device)."""
    from gmlp.cutedsl.sm90.grouped_gemm import grouped_gemm

    splits = torch.tensor([0, 300, 7, 129], device="cuda")
    a = torch.randn(436, 256, device="cuda").bfloat16()
    b = (torch.randn(4, 512, 256, device="cuda") / 8).bfloat16()
    for options in (dict(), dict(tile_n=128), dict(store="tma")):
        first, second = twice_without_sync(lambda: grouped_gemm(a, b, splits, **options))
        assert torch.equal(first, second), options


def test_register_split_fits_the_launch_allocation():
    """Every kernel's setmaxnreg counts go through ``register_split``: FC2 dgrad's MXFP8 split
    (24 / 240) and the default (40 / 232) fit a 384-thread CTA's 168 registers a thread; the split
    that hung on the H200 (32 / 240: 1024 registers over the pool) is refused, and the PTX check
    of the tests catches it."""
    from gmlp.cutedsl.sm90._pipeline import register_split

    assert register_split(384) == (40, 232) and register_split(256) == (40, 232)
    assert register_split(384, 24, 240) == (24, 240)
    with pytest.raises(ValueError, match="384-thread CTA has 168 registers a thread.*ask for 512"):
        register_split(384, 32, 240)
    hung = ".reqntid 384, 1, 1\nsetmaxnreg.dec.sync.aligned.u32 \t32;\nsetmaxnreg.inc.sync.aligned.u32 \t240;\n"
    with pytest.raises(AssertionError):
        check_register_split(hung, dict(registers=168), 32, 240)
    check_register_split(hung.replace("32;", "24;"), dict(registers=168), 24, 240)
