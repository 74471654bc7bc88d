"""The CuTeDSL sm_90a grouped weight gradient (gmlp.cutedsl.sm90.wgrad) compiled without a GPU,
with checks on its PTX, SASS and the cubin's resources, and (marker ``gpu``, H100/H200 only) run
against the reference and the Triton twin.

The kernel is shape-generic (T, M, N, E are runtime values): one compile serves every shape of a
config, so the compile tests are parametrized by config (each compiled and checked once, about 3
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
from tests.support.ptx import check_register_split, kernel_resources, sass
from tests.support.sm90 import assert_same_bits, check_weight_gradient_tma_stores, on_sm90, tuned_knobs

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

# (E, T, H, F) design shapes: dW2 = dy^T a is M = H, N = F; dW1 = dh^T x is M = 2F, N = H.
DESIGN_SHAPES = [(8, 16384, 4096, 14336), (32, 32768, 7168, 2048), (128, 65536, 2048, 768)]
# (T, M, N, E) of dW2 and dW1 at the design shapes
WGRAD_SHAPES = [(t, m, n, e) for e, t, h, f in DESIGN_SHAPES for m, n in ((h, f), (2 * f, h))]
# Odd problems (T, M, N, E): one row, M and N not multiples of the tile, many experts.
ODD_SHAPES = [(1, 8, 8, 1), (37 + 64 + 1 + 90, 40, 96, 5), (3, 264, 72, 4096), (300, 520, 136, 3)]
OUTPUTS = {"fp32": dict(), "bf16": dict(out_dtype=torch.bfloat16), "accumulate": dict(accumulate=True)}
K_TAILS = {"ragged-tma": dict(), "smem-mask": dict(ragged_tma=False)}
# launcher options of the GPU tests: tile width x K-tail handling, and the TMA store
VARIANTS = {f"{tail}-{tile_n}": dict(tile_n=tile_n, **options) for tail, options in K_TAILS.items()
            for tile_n in (128, 256)}
VARIANTS.update({f"tma-store-{tile_n}": dict(tile_n=tile_n, store="tma") for tile_n in (128, 256)})


def _config(**kwargs):
    from gmlp.cutedsl.sm90.wgrad import WgradConfig

    return WgradConfig(**kwargs)


def check_ptx(compiled) -> None:
    """What every config's PTX must show: the target, 128 + 128 * (tile_n / 128) threads, bf16
    wgmma with fp32 accumulators and both operands MN-major (transpose bits 1, 1), 4-D TMA loads
    (the ragged token view) or 2-D ones and the consumers' smem zeroing of the K tail (a proxy
    fence and a named barrier of the consumer threads), the epilogue's pair accesses, no local
    memory, no spills (the cubin's resources where a cuobjdump reads them, else the PTX's
    ld/st.local), no
    predicated R2UR in the SASS."""

    config, ptx = compiled.config, compiled.ptx
    assert ".target sm_90a" in ptx
    assert f".reqntid {128 * (1 + config.tile_n // 128)}, 1, 1" in ptx
    # wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.bf16.bf16 {d...}, a-desc, b-desc, scale-d,
    # imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{config.tile_n}k16\.f32\.bf16\.bf16 \{{[^}}]*\}}, "
                        r"%rd\d+, %rd\d+, %?\w+, 1,\s*1, (\d), (\d);", ptx)
    assert wgmmas and all(trans == ("1", "1") for trans in wgmmas), wgmmas[:2]
    assert "wgmma.mma_async" not in re.sub(rf"wgmma\.mma_async\.sync\.aligned\.m64n{config.tile_n}k16\.f32\.bf16\.bf16",
                                           "", ptx)
    loads = re.findall(r"cp\.async\.bulk\.tensor\.(\d)d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert loads and set(loads) == {"4" if config.ragged_tma else "2"}, set(loads)
    consumers = 128 * (config.tile_n // 128)
    masks = re.search(rf"bar\.sync\s+1, {consumers};", ptx) and "fence.proxy.async.shared::cta;" in ptx
    assert bool(masks) == (not config.ragged_tma) and ("st.shared" in ptx) == (not config.ragged_tma)
    assert "ld.local" not in ptx and "st.local" not in ptx
    stores = set(re.findall(r"st\.global\.(\w+)", ptx))
    assert stores == ({"b32"} if config.out_dtype == torch.bfloat16 else {"b64"}), stores
    pair_loads = re.search(r"ld\.global\.(v2\.b32|v2\.f32|b64)", ptx)
    assert bool(pair_loads) == config.accumulate  # out's fp32 pairs, read back
    code = sass(compiled.cubin)
    if code is not None:
        assert f"HGMMA.64x{config.tile_n}x16.F32.BF16" in code
        assert not re.search(r"@!?U?P\w+\s+R2UR", code)  # illegal on sm_90a near TMA issue
        assert "LDL" not in code and "STL" not in code
    resources = kernel_resources(compiled.cubin)
    check_register_split(ptx, resources)
    if resources is not None:  # else the PTX check above is the spill check
        assert resources["stack"] == resources["local"] == 0, resources
        assert resources["registers"] <= 232, resources


def _compiled(knobs: dict):
    from gmlp.cutedsl.sm90.wgrad import compile_wgrad

    return compile_wgrad("sm_90a", _config(**knobs))


@parametrize_quick("knobs", [dict(tile_n=256, **OUTPUTS[output], **K_TAILS[k_tail])
                             for k_tail in K_TAILS for output in OUTPUTS], ids=config_id)
def test_layer_configs_compile(knobs):
    """The layer's weight gradients: 256-wide tiles, as many stages as fit, each output and K tail."""
    check_ptx(_compiled(knobs))


@pytest.mark.slow
@parametrize_quick("knobs", [dict(tile_n=tile_n, stages=3, **OUTPUTS[output], **K_TAILS[k_tail])
                             for k_tail in K_TAILS for output in OUTPUTS for tile_n in (128, 256)], ids=config_id)
def test_three_stage_configs_compile(knobs):
    """Both tile widths with three pipeline stages, each output and K tail."""
    check_ptx(_compiled(knobs))


@pytest.mark.slow
@parametrize_quick("knobs", tuned_knobs("grouped_wgrad"), ids=config_id)
def test_tuned_configs_compile(knobs):
    """Every config the tuned table chooses for the weight gradients (``gmlp.cutedsl.sm90.tuned``)."""
    compiled = _compiled(knobs)
    (check_tma_store_ptx if compiled.config.store == "tma" else check_ptx)(compiled)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(tile_n=256, store="tma", **OUTPUTS[output]) for output in OUTPUTS]
                   + [dict(tile_n=128, store="tma")], ids=config_id)
def test_tma_store_configs_compile(knobs):
    check_tma_store_ptx(_compiled(knobs))


def check_tma_store_ptx(compiled) -> None:
    """The TMA-store epilogue: subtiles through shared memory (stmatrix for bf16, 32-bit shared
    stores for fp32), then 3-D TMA stores of out (E, M, N), reduce-adds with accumulate; no
    global stores or pair loads of out, no spills; 4 (tile_n 256) and 6 (128) pipeline stages."""
    config, ptx = compiled.config, compiled.ptx
    check_weight_gradient_tma_stores(ptx, config.accumulate, config.out_dtype == torch.bfloat16)
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert config.num_stages() == {256: 4, 128: 6}[config.tile_n]
    resources = kernel_resources(compiled.cubin)
    check_register_split(ptx, resources)
    if resources is not None:
        assert resources["stack"] == resources["local"] == 0, resources


def test_design_and_odd_shapes_are_supported():
    """The shapes the configs compiled here stand for are ones the kernel runs (its only shape
    check: the code is shape-generic)."""
    from gmlp.cutedsl.sm90.wgrad import problem_support

    shapes = WGRAD_SHAPES + ODD_SHAPES
    assert {shape: problem_support(*shape) for shape in shapes} == dict.fromkeys(shapes)


@pytest.mark.parametrize("shape,match", [
    ((64, 12, 64, 2), r"M=12 and N=64 must be multiples of 8"),
    ((64, 16, 20, 2), r"M=16 and N=20"),
    ((64, 16, 16, 0), r"E=0: needs at least one expert"),
    ((2**30, 16, 16, 2), r"too large"),
])
def test_unsupported_shapes_are_refused(shape, match):
    from gmlp.cutedsl.sm90.wgrad import compile_wgrad

    with pytest.raises(ValueError, match=match):
        compile_wgrad("sm_90a", shape=shape)


def test_invalid_configs_are_refused():
    from gmlp.cutedsl.sm90.wgrad import compile_wgrad

    with pytest.raises(ValueError, match="tile_n must be 128 or 256"):
        _config(tile_n=64)
    with pytest.raises(ValueError, match=r"stages must be in \[2, 4\] for tile_n=256"):
        _config(stages=5)
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        _config(out_dtype=torch.float16)
    with pytest.raises(ValueError, match="accumulate adds into an fp32 out"):
        _config(accumulate=True, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="arch must be one of"):
        compile_wgrad("sm_100a")
    with pytest.raises(ValueError, match=r"store must be one of \('regs', 'tma'\), got 'smem'"):
        _config(store="smem")


def test_no_tokens_gives_zeros_without_a_launch():
    """T = 0 (no TMA descriptor can be built): zeros of out_dtype, or out left as it is."""
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    a, b, splits = torch.zeros(0, 16, dtype=torch.bfloat16), torch.zeros(0, 24, dtype=torch.bfloat16), torch.zeros(3)
    got = grouped_wgrad(a, b, splits, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, torch.zeros(3, 16, 24, dtype=torch.bfloat16))
    main_grad = torch.full((3, 16, 24), -0.0)
    assert grouped_wgrad(a, b, splits, out=main_grad) is main_grad
    assert torch.equal(main_grad.view(torch.int32), torch.full((3, 16, 24), -0.0).view(torch.int32))


def test_launcher_refuses_bad_operands():
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    a, b = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16)
    splits = torch.tensor([4, 4])
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):
        grouped_wgrad(a, b, splits)
    with pytest.raises(ValueError, match="same rows, got 8 and 7"):
        grouped_wgrad(a, b[:7], splits)
    with pytest.raises(TypeError, match="must be bf16 \\(T, M\\) and \\(T, N\\) matrices with contiguous rows"):
        grouped_wgrad(a.float(), b, splits)
    with pytest.raises(TypeError, match="must be bf16 \\(T, M\\) and \\(T, N\\) matrices with contiguous rows"):
        grouped_wgrad(a.t(), b, splits)
    with pytest.raises(ValueError, match=r"out must be a contiguous fp32 \(2, 64, 16\) tensor"):
        grouped_wgrad(a, b, splits, out=torch.zeros(2, 64, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out_dtype must be"):
        grouped_wgrad(a, b, splits, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="M=64 and N=12 must be multiples of 8"):
        grouped_wgrad(a, b[:, :12].contiguous(), splits)


# ---------------------------------------------------------------------------------------------
# On an sm_90 GPU: against the reference and the Triton twin
# ---------------------------------------------------------------------------------------------


SPLITS = {
    "ragged-with-empty": [0, 37, 64, 1, 90],  # empty, below one k-step, one k-step, one row
    "one-expert-gets-all": [0, 0, 300, 0],
    "all-empty-but-last": [0, 0, 0, 5],
    "k-step-multiples": [128, 256, 0, 64],
    "many-tiny": [1, 2, 3, 0, 5, 8, 13, 0, 21, 34, 55, 0, 89, 1, 1, 1],
    "long": [1000, 7, 2049],
}


def _bound(a: torch.Tensor, b: torch.Tensor) -> float:
    """tests/triton_ref/test_wgrad.py's delta: fp32 sums in another order move a result by at most
    T * 2**-24 * max(|A|^T |B|)."""
    return gemm_delta((a.float().abs().t() @ b.float().abs()).max().item(), max(a.shape[0], 1))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("m,n", [(64, 96), (40, 264), (264, 40), (136, 520), (512, 256)], ids=str)
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_wgrad_matches_reference_and_triton(splits, m, n, variant):
    """Every expert's whole (M, N) block is compared (an empty expert's is zeros): fp32 within
    twice the reorder bound of the reference (torch, per expert) and of the Triton twin; bf16
    out is within one bf16 step; out= adds the same sums (within one fp32 step of the add), and
    an empty expert's block of out is left bit for bit as it was."""
    from gmlp.contract.reference import grouped_wgrad_ref
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad
    from gmlp.triton_ref.wgrad import grouped_wgrad as triton_grouped_wgrad

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    tokens = sum(splits)
    a = torch.randn(tokens, m, device="cuda").bfloat16()
    b = torch.randn(tokens, n, device="cuda").bfloat16()
    delta = 2 * _bound(a, b) + 1e-30
    options = VARIANTS[variant]
    got = grouped_wgrad(a, b, split_sizes, **options)
    want = grouped_wgrad_ref(a, b, split_sizes)
    twin = triton_grouped_wgrad(a, b, split_sizes)
    assert got.shape == want.shape == (len(splits), m, n) and got.dtype == torch.float32
    for other in (want, twin):
        assert bool(((got - other).abs() <= delta).all())
    for g, rows in enumerate(splits):
        if rows == 0:
            assert torch.equal(got[g], torch.zeros_like(got[g]))

    rounded = grouped_wgrad(a, b, split_sizes, out_dtype=torch.bfloat16, **options)
    assert rounded.dtype == torch.bfloat16
    assert bool(((rounded.float() - want).abs() <= 2.0**-8 * want.abs() + delta).all())

    main_grad = torch.randn(len(splits), m, n, device="cuda")
    before = main_grad.clone()
    assert grouped_wgrad(a, b, split_sizes, out=main_grad, **options) is main_grad
    expected = before + want
    assert bool(((main_grad - expected).abs() <= delta + 2.0**-23 * expected.abs()).all())
    for g, rows in enumerate(splits):
        if rows == 0:
            assert torch.equal(main_grad[g].view(torch.int32), before[g].view(torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("variant", ["ragged-tma-256", "smem-mask-256", "ragged-tma-128", "tma-store-128"])
def test_wgrad_design_like_problem(variant):
    """A dW1-like problem (M = 2F, N = H) with uneven experts, as the layer sizes it, in both
    output modes."""
    from gmlp.contract.reference import grouped_wgrad_ref
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    torch.manual_seed(0)
    splits = [700, 0, 1300, 33, 2000, 63, 0, 4096 - 700 - 1300 - 33 - 2000 - 63]
    split_sizes = torch.tensor(splits, device="cuda")
    a = torch.randn(4096, 1536, device="cuda").bfloat16()
    b = torch.randn(4096, 2048, device="cuda").bfloat16()
    want = grouped_wgrad_ref(a, b, split_sizes)
    delta = 2 * _bound(a, b)
    options = VARIANTS[variant]
    assert bool(((grouped_wgrad(a, b, split_sizes, **options) - want).abs() <= delta).all())
    main_grad = torch.ones_like(want)
    grouped_wgrad(a, b, split_sizes, out=main_grad, **options)
    assert bool(((main_grad - 1 - want).abs() <= delta + 2.0**-23 * (want.abs() + 1)).all())


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("m,n", [(64, 96), (264, 40), (136, 520)], ids=str)
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_tma_store_is_bitwise_the_register_store(splits, m, n, tile_n):
    """The TMA-store epilogue writes the same bytes as the register stores: fp32 sums, their bf16
    roundings, and with out= the TMA reduce-add gives the same single fp32 add old + sum as the
    load-add-store (an empty expert's block of out left as it was)."""
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    a = torch.randn(sum(splits), m, device="cuda").bfloat16()
    b = torch.randn(sum(splits), n, device="cuda").bfloat16()
    for out_dtype in (torch.float32, torch.bfloat16):
        regs = grouped_wgrad(a, b, split_sizes, out_dtype=out_dtype, tile_n=tile_n)
        tma = grouped_wgrad(a, b, split_sizes, out_dtype=out_dtype, tile_n=tile_n, store="tma")
        assert torch.equal(regs.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                           tma.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32)), out_dtype
    main_grad = torch.randn(len(splits), m, n, device="cuda")
    by_regs, by_tma = main_grad.clone(), main_grad.clone()
    grouped_wgrad(a, b, split_sizes, out=by_regs, tile_n=tile_n)
    grouped_wgrad(a, b, split_sizes, out=by_tma, tile_n=tile_n, store="tma")
    assert torch.equal(by_regs.view(torch.int32), by_tma.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("variant", ["ragged-tma-256", "smem-mask-128", "tma-store-256"])
@pytest.mark.parametrize("m,n", [(136, 520), (264, 40), (520, 1032)], ids=str)
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
def test_cluster_is_bitwise_alone(splits, m, n, variant):
    """A cluster of two (adjacent n-tiles of one expert's m-tile, their A tile multicast) writes
    the bytes of CTAs alone: fp32 sums and, with out=, the single fp32 add. Odd n-tile counts give
    the pair's shadow items; 1032 rows of an expert run past the ring."""
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad

    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    a = torch.randn(sum(splits), m, device="cuda").bfloat16()
    b = torch.randn(sum(splits), n, device="cuda").bfloat16()
    options = VARIANTS[variant]
    assert_same_bits(grouped_wgrad(a, b, split_sizes, cluster=2, **options),
                     grouped_wgrad(a, b, split_sizes, cluster=1, **options), "dW")
    main_grad = torch.randn(len(splits), m, n, device="cuda")
    paired, alone = main_grad.clone(), main_grad.clone()
    grouped_wgrad(a, b, split_sizes, out=paired, cluster=2, **options)
    grouped_wgrad(a, b, split_sizes, out=alone, cluster=1, **options)
    assert_same_bits(paired, alone, "main_grad")


@pytest.mark.slow
@parametrize_quick("knobs", [dict(), dict(tile_n=128, accumulate=True), dict(ragged_tma=False)], ids=config_id)
def test_cluster_configs_compile_with_a_multicast(knobs):
    """A cluster of two: A's TMA loads multicast to the pair, B's each CTA's own; the slots'
    empty barriers arrived on in both CTAs; the cluster's barriers at the start and before exit."""
    compiled = _compiled(dict(cluster=2, **knobs))
    check_ptx(compiled)
    ptx = compiled.ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                     r"\.multicast::cluster", ptx)
    assert "mbarrier.arrive.shared::cluster.b64" in ptx and ptx.count("barrier.cluster.wait") == 2


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_wgrad_is_deterministic_and_syncless():
    """Same inputs, bitwise the same output; no host sync in the launch (split sizes stay on the device)."""
    from gmlp.cutedsl.sm90.wgrad import grouped_wgrad
    from gmlp.mxfp8.routing import device_groups

    splits = torch.tensor([0, 300, 7, 129], device="cuda")
    a = torch.randn(436, 256, device="cuda").bfloat16()
    b = torch.randn(436, 512, device="cuda").bfloat16()
    groups = device_groups(splits, 436)
    for options in (dict(), VARIANTS["ragged-tma-128"], VARIANTS["tma-store-256"]):
        first, second = twice_without_sync(lambda: grouped_wgrad(a, b, splits, groups=groups, **options))
        assert torch.equal(first, second), options
