"""The CuTeDSL sm_90a FC2 dgrad (gmlp.cutedsl.sm90.fc2_dgrad) compiled without a GPU, with checks
on its PTX, SASS and the cubin's resources (tests/support/ptx.py, tests/support/sm90.py),
and (marker ``gpu``, H100/H200 only) run against the reference and the Triton twin with the
tolerances of tests/triton_ref/test_fc2_dgrad.py (bf16 dh) or bit for bit (MXFP8: the data and scale
bytes of Q_row(dh) and Q_col(dh); dprobs and db1 within the bf16 tests' bounds).

The kernel is shape-generic (T, H, F, E are runtime values): one compile serves every shape of a
config, so the compile tests are parametrized by config (each compiled and checked once, about 2
s with its cuobjdump checks), and the design and odd shapes are checked against the kernel's
support without compiling. Skipped, with the import error, where cutlass-dsl is missing or broken.
"""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.contract.activations import Activation, ActivationKind, activation_from
from gmlp.cutedsl import import_error
from gmlp.debug.compare import gemm_delta
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from tests.support.backends import twice_without_sync
from tests.support.cases import BANDED_SPLITS, config_id, parametrize_quick
from tests.support.sm90 import (assert_same_bits, assert_same_outputs, check_fc2_dgrad_ptx, fc2_dgrad_operands, on_sm90,
                                  tuned_knobs)

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

# (E, T, H, F) design shapes
DESIGN_SHAPES = [(8, 16384, 4096, 14336), (32, 32768, 7168, 2048), (128, 65536, 2048, 768)]
# Odd problems (T, H, F, E): one token, tiny and empty experts, F not a multiple of the 128-column
# tile, H below one 64-wide k-tile, many experts.
ODD_SHAPES = [(1, 32, 32, 1), (37 + 64 + 1 + 90, 64, 96, 5), (3, 32, 160, 4096), (300, 96, 32, 4)]
ACTIVATIONS = ["swiglu", "geglu", "qgeglu", "srelu"]
# of the variant configs: gated, not gated, and qgeglu with a tight clamp
VARIANT_ACTIVATIONS = ["swiglu", "srelu", Activation(ActivationKind.QGEGLU, limit=0.5)]


def _config(activation="swiglu", **kwargs):
    from gmlp.cutedsl.sm90.fc2_dgrad import FC2DgradConfig

    return FC2DgradConfig(activation_from(activation), **kwargs)


def check_quantized_ptx(compiled) -> None:
    """What the MXFP8 epilogue adds (on top of check_fc2_dgrad_ptx), per quantized 128 x 128 tile
    (two gated: d gate and d up of each 64-column half of the da tile; one srelu): 64 pair
    conversions in the gradient format and none in the other; the scale rule (RCEIL's multiply by
    fp32(1 / max_normal) once per scale a thread computes, 2 rowwise + 4 columnwise; FLOOR's
    exponent shift without it); nothing flushes subnormals; two 256-thread named barriers; 64 byte
    stores into the transposed tile and one 16-byte store of the amax keys; 32 16-bit stores of
    Q_row's column pairs; the quad's 4 index shuffles; the transposed store's 16-byte chunks (once
    per 64-row segment gated)."""
    ptx, config = compiled.ptx, compiled.config
    tiles = 2 if config.activation.gated else 1
    fmt, other = ("e5m2", "e4m3") if config.e5m2 else ("e4m3", "e5m2")
    assert len(re.findall(rf"cvt\.rn\.satfinite\.{fmt}x2\.f32", ptx)) == 64 * tiles
    assert f"{other}x2" not in ptx and ".ftz" not in ptx
    reciprocal = "0f37924925" if config.e5m2 else "0f3B124925"  # fp32(1 / 57344), fp32(1 / 448)
    count = len(re.findall(rf"mul(\.rn)?\.f32\s+%r\d+, %r\d+, {reciprocal};", ptx))
    assert count == (0 if config.floor_scales else 6 * tiles), count
    if config.floor_scales:
        assert re.search(r"shr\.u32\s+%r\d+, %r\d+, 23;", ptx)
    assert len(re.findall(r"bar\.sync\s+1, 256;", ptx)) == 2 * tiles
    assert len(re.findall(r"st\.shared\.b8", ptx)) == 64 * tiles
    assert len(re.findall(r"st\.shared\.v4\.b32", ptx)) == tiles
    assert len(re.findall(r"st\.global\.b16", ptx)) == 32 * tiles
    assert len(re.findall(r"shfl\.sync\.idx\.b32", ptx)) >= 4 * tiles
    assert len(re.findall(r"st\.global\.v4\.b32", ptx)) >= 4 * tiles * (2 if config.activation.gated else 1)


def check_activation_math(compiled) -> None:
    """The epilogue's transcendental ops are Triton's (ex2.approx.f32, div.full.f32): one sigmoid
    per element of a thread's tile_n / 2 da values, shared by act(c) (dprobs, with probs) and
    act'(c); none for srelu."""
    ptx, config = compiled.ptx, compiled.config
    expected = 0 if config.activation.kind is ActivationKind.SRELU else config.tile_n // 2
    assert len(re.findall(r"ex2\.approx\.f32", ptx)) == expected
    assert len(re.findall(r"div\.full\.f32", ptx)) == expected
    assert "ex2.approx.ftz" not in ptx


def _compiled(knobs: dict):
    from gmlp.cutedsl.sm90.fc2_dgrad import compile_fc2_dgrad

    return compile_fc2_dgrad("sm_90a", _config(**knobs))


# The layer's FC2 dgrad: w2t the transposed view of the stacked W2 (N-major), fp32 probs, db1
LAYER = dict(b_k_major=False, probs_dtype=torch.float32, bias_grad=True)
# The other configs: the defaults (K-major w2t, no probs, no db1, as many stages as fit), and
# bf16 probs, fp32 probs on a K-major w2t, db1 with two stages
VARIANTS = [{}, dict(b_k_major=False, probs_dtype=torch.bfloat16), dict(probs_dtype=torch.float32),
            dict(b_k_major=False, bias_grad=True, stages=2)]


@parametrize_quick("knobs", [dict(activation=activation, **LAYER, tile_n=tile_n)
                             for tile_n in (128, 256) for activation in ACTIVATIONS], ids=config_id)
def test_layer_configs_compile(knobs):
    """The layer's FC2 dgrad, both tile widths (the db1 sums written over the accumulators: no
    spills at 256)."""
    compiled = _compiled(knobs)
    check_fc2_dgrad_ptx(compiled)
    check_activation_math(compiled)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **variant) for variant in VARIANTS
                             for activation in VARIANT_ACTIVATIONS], ids=config_id)
def test_variant_configs_compile(knobs):
    compiled = _compiled(knobs)
    check_fc2_dgrad_ptx(compiled)
    check_activation_math(compiled)


@pytest.mark.slow
@parametrize_quick("knobs", tuned_knobs("fc2_dgrad"), ids=config_id)
def test_tuned_configs_compile(knobs):
    """Every config the tuned table chooses for FC2 dgrad (``gmlp.cutedsl.sm90.tuned``)."""
    compiled = _compiled(knobs)
    check_fc2_dgrad_ptx(compiled)
    check_activation_math(compiled)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **LAYER, tile_n=tile_n, store="tma")
                             for tile_n in (128, 256) for activation in ("swiglu", "srelu")]
                   + [dict(activation="geglu", tile_n=256, store="tma")], ids=config_id)
def test_tma_store_configs_compile(knobs):
    """A bf16 dh through the TMA-store epilogue: d gate and d up of each 32-column subtile staged
    by stmatrix and stored as one bulk group of 4-D TMA stores; the dprobs partials and db1 sums as
    before; no spills; 4 (tile_n 256) and 6 (128) stages beside the 32 KB of subtile buffers."""
    compiled = _compiled(knobs)
    check_fc2_dgrad_ptx(compiled)
    check_activation_math(compiled)
    assert compiled.config.num_stages() == {256: 4, 128: 6}[compiled.config.tile_n]


GRAD_RECIPES = {"e4m3-rceil": (ElementFormat.E4M3, ScaleMode.RCEIL),
                "e5m2-floor": (ElementFormat.E5M2, ScaleMode.FLOOR),
                "e5m2-rceil": (ElementFormat.E5M2, ScaleMode.RCEIL),
                "e4m3-floor": (ElementFormat.E4M3, ScaleMode.FLOOR)}


# the gradient recipe of each variant config in MXFP8: every format and scale mode
VARIANT_GRAD_RECIPES = ["e4m3-rceil", "e5m2-rceil", "e4m3-floor", "e5m2-floor"]


def _quantized(grad_recipe: str) -> dict:
    """The config knobs of an MXFP8 dh in ``grad_recipe``'s format and scale mode (those not
    E4M3, RCEIL)."""
    fmt, mode = GRAD_RECIPES[grad_recipe]
    return dict(quantized=True, **({"e5m2": True} if fmt is ElementFormat.E5M2 else {}),
                **({"floor_scales": True} if mode is ScaleMode.FLOOR else {}))


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **LAYER, **_quantized(grad_recipe))
                             for grad_recipe in ("e4m3-rceil", "e5m2-floor") for activation in ACTIVATIONS],
                   ids=config_id)
def test_layer_configs_compile_mxfp8(knobs):
    """The MXFP8 layer's FC2 dgrad: dh written as Q_row(dh) and Q_col(dh) in the gradient format
    (no spills in the cubin)."""
    compiled = _compiled(knobs)
    check_fc2_dgrad_ptx(compiled)
    check_activation_math(compiled)
    check_quantized_ptx(compiled)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **variant, **_quantized(grad_recipe))
                             for variant, grad_recipe in zip(VARIANTS, VARIANT_GRAD_RECIPES)
                             for activation in VARIANT_ACTIVATIONS], ids=config_id)
def test_variant_configs_compile_mxfp8(knobs):
    """Every gradient format and scale mode, probs and db1 on and off (the default: E4M3, RCEIL)."""
    compiled = _compiled(knobs)
    check_fc2_dgrad_ptx(compiled)
    check_activation_math(compiled)
    check_quantized_ptx(compiled)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "not-gated"])
def test_design_and_odd_shapes_are_supported(gated):
    """The shapes the configs compiled above stand for are ones the kernel runs (its only shape
    check: the code is shape-generic)."""
    from gmlp.cutedsl.sm90.fc2_dgrad import problem_support

    shapes = [(tokens, hidden, ffn, experts) for experts, tokens, hidden, ffn in DESIGN_SHAPES] + ODD_SHAPES
    assert {shape: problem_support(*shape, gated=gated) for shape in shapes} == dict.fromkeys(shapes)


@pytest.mark.parametrize("ffn", [32, 64, 96, 128, 160, 192, 256, 352])
def test_quantized_tiles_cover_dh_once(ffn):
    """The gated MXFP8 epilogue's column map (_fc2_dgrad_mxfp8.dh_segments, the segments given to the
    quantization and the db1 sums): over the n-tiles and their two halves, every column of dh (T, 2F)
    is written exactly once, d gate column f from da column f and d up column F + f from da column
    f, each quantized tile's 32-column blocks inside one segment; columns past F are never valid."""
    from gmlp.cutedsl.sm90 import _quantize_epilogue as epi
    from gmlp.cutedsl.sm90._fc2_dgrad_mxfp8 import dh_segments
    from gmlp.cutedsl.sm90.fc2_dgrad import QUANTIZED_TILE_N

    written = {}
    for col0 in range(0, ffn, QUANTIZED_TILE_N):
        valid = ffn - col0
        for q in range(2):
            if q == 1 and not valid > epi.SEGMENT_COLS:  # the kernel skips a half without valid columns
                continue
            segments = dh_segments(col0, ffn, valid, q)
            for c in range(epi.TILE_COLS):  # the quantized tile's column
                b = c // epi.SEGMENT_COLS
                start, room = segments[b]
                local = c - b * epi.SEGMENT_COLS
                da_column = col0 + q * epi.SEGMENT_COLS + local  # the pass's pair column (kernel: 8 j + ...)
                inside = local < room
                assert inside == (da_column < ffn)
                if inside:
                    out = start + local
                    assert out not in written, out
                    written[out] = (b, da_column)
            for block in range(epi.ROW_BLOCKS):  # a row block's 32 columns share the segment
                assert len({(block * 32 + k) // epi.SEGMENT_COLS for k in range(32)}) == 1
    assert sorted(written) == list(range(2 * ffn))
    assert all(written[f] == (0, f) and written[ffn + f] == (1, f) for f in range(ffn))


def test_stage_counts():
    """A 32 KB slot (dy tile + w2t tile) gets 7 stages; with 256-wide tiles, 48 KB, 4. The MXFP8
    epilogue's 20 KB (transposed fp8 tile, amax keys) leave 6; it needs 128-wide tiles."""
    assert _config("swiglu").num_stages() == 7
    assert _config("srelu", bias_grad=True).num_stages() == 7
    assert _config("swiglu", tile_n=256).num_stages() == 4
    assert _config("swiglu", quantized=True).num_stages() == 6
    assert _config("srelu", quantized=True, e5m2=True, floor_scales=True).num_stages() == 6
    with pytest.raises(ValueError, match=r"stages must be in \[2, 6\] for tile_n=128 \(quantized\)"):
        _config("swiglu", quantized=True, stages=7)
    with pytest.raises(ValueError, match=r"MXFP8 epilogue needs tile_n=128, got tile_n=256: a thread holds 128"):
        _config("swiglu", quantized=True, tile_n=256)
    with pytest.raises(ValueError, match="e5m2 and floor_scales need quantized=True"):
        _config("swiglu", e5m2=True)
    with pytest.raises(ValueError, match="e5m2 and floor_scales need quantized=True"):
        _config("srelu", floor_scales=True)
    with pytest.raises(ValueError, match=r"tile_n must be one of \(128, 256\)"):
        _config("swiglu", tile_n=64)
    with pytest.raises(ValueError, match=r"stages must be in \[2, 7\]"):
        _config("swiglu", stages=8)
    with pytest.raises(ValueError, match="probs_dtype must be one of"):
        _config("swiglu", probs_dtype=torch.float16)
    with pytest.raises(TypeError, match="activation must be"):
        from gmlp.cutedsl.sm90.fc2_dgrad import FC2DgradConfig

        FC2DgradConfig("swiglu")


@pytest.mark.parametrize("shape,match", [
    ((64, 48, 64, 2), r"H=48 and F=64 must be positive multiples of 32"),
    ((64, 64, 0, 2), r"H=64 and F=0"),
    ((64, 64, 64, 4097), r"E=4097 outside \[1, 4096\]"),
])
def test_unsupported_shapes_are_refused(shape, match):
    from gmlp.cutedsl.sm90.fc2_dgrad import compile_fc2_dgrad

    with pytest.raises(ValueError, match=match):
        compile_fc2_dgrad("sm_90a", shape=shape)


def test_launcher_refuses_bad_operands():
    from gmlp.contract.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad

    dy, w2t = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(2, 32, 64, dtype=torch.bfloat16)
    c = torch.zeros(8, 64, dtype=torch.bfloat16)
    splits = torch.tensor([4, 4])
    kwargs = dict(activation=SWIGLU, recipe=None)
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):
        fc2_dgrad(dy, w2t, c, splits, **kwargs)
    with pytest.raises(ValueError, match=r"w2t must hold 2 experts' \(F, H=64\) matrices, got \(32, 32\) each"):
        fc2_dgrad(dy, w2t[:, :, :32], c, splits, **kwargs)
    with pytest.raises(ValueError, match=r"c must be bf16 row-major \(8, 64\)"):
        fc2_dgrad(dy, w2t, c[:, :32], splits, **kwargs)
    with pytest.raises(ValueError, match="H=64 and F=48"):
        fc2_dgrad(dy, torch.zeros(2, 48, 64, dtype=torch.bfloat16), torch.zeros(8, 96, dtype=torch.bfloat16), splits,
                  **kwargs)
    with pytest.raises(TypeError, match="recipe must be None or a gmlp.MXFP8Recipe"):
        fc2_dgrad(dy, w2t, c, splits, **{**kwargs, "recipe": "mxfp8"})
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):  # MXFP8 is taken: the same checks
        fc2_dgrad(dy, w2t, c, splits, **{**kwargs, "recipe": MXFP8Recipe(ScaleMode.FLOOR, ElementFormat.E5M2)})
    with pytest.raises(ValueError, match=r"MXFP8 epilogue needs tile_n=128, got tile_n=256"):
        fc2_dgrad(dy, w2t, c, splits, **{**kwargs, "recipe": MXFP8Recipe()}, tile_n=256)
    with pytest.raises(ValueError, match=r"w2t \(E, N, K\) must be K-major"):
        fc2_dgrad(dy, torch.zeros(2, 32, 128, dtype=torch.bfloat16)[:, :, ::2], c, splits, **kwargs)


# ---------------------------------------------------------------------------------------------
# On an sm_90 GPU: against the reference and the Triton twin
# ---------------------------------------------------------------------------------------------


SPLITS = {
    "ragged-with-empty": [0, 37, 64, 1, 90],
    "one-expert-gets-all": [0, 0, 300, 0],
    "tile-multiples": [128, 256, 0, 128],
    "many-tiny": [1, 2, 3, 0, 5, 8, 13, 0, 21, 34, 55, 0, 89, 1, 1, 1],
}
GPU_ACTIVATIONS = ["swiglu", "geglu", "qgeglu", "srelu", Activation(ActivationKind.QGEGLU, limit=0.5)]


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("with_probs,bias_grad", [(True, True), (False, False), (True, False)],
                         ids=["probs-db1", "plain", "probs"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (96, 160), (512, 256)], ids=["H64-F96", "H96-F160", "H512-F256"])
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("transposed", [False, True], ids=["stacked-w2t", "transposed-w2"])
def test_fc2_dgrad_matches_reference_and_triton(activation, with_probs, bias_grad, hidden, ffn, splits, transposed,
                                                tile_n=128):
    """Tolerance of tests/triton_ref/test_fc2_dgrad.py (bf16 recipe): delta_dh = H * 2**-24 * max sum_k
    |dy_k w_k| * L with L = 2 max|c| + 2; dh within one bf16 step + delta_dh, dprobs within 2**-20
    + F * delta_dh * L; db1 (fp32 sums of the fp32 dh over an expert's rows, not in the Triton
    test) within 2**-20 + m_g-fold delta_dh plus the bf16 rounding the reference's dh carries
    (2**-8 of the sum of |dh|); against the Triton kernel twice the bounds. Every element is
    compared, so an unwritten (torch.empty) or misplaced one fails."""
    from gmlp.contract.reference import fc2_dgrad_ref
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad
    from gmlp.triton_ref.fc2_dgrad import fc2_dgrad as triton_fc2_dgrad
    from tests.support.tolerances import within_steps

    activation = activation_from(activation)
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands(splits, hidden, ffn, activation, with_probs, transposed)
    tokens, experts = sum(splits), len(splits)
    n1 = (2 if activation.gated else 1) * ffn
    kwargs = dict(activation=activation, recipe=None, probs=probs, bias_grad=bias_grad)
    got = fc2_dgrad(dy, w2t, c, split_sizes, tile_n=tile_n, **kwargs)
    want = fc2_dgrad_ref(dy, w2t, c, split_sizes, **kwargs)
    twin = triton_fc2_dgrad(dy, w2t, c, split_sizes, **kwargs)
    magnitude = max((dy.float().abs() @ w2t[g].float().abs().t()).max().item() for g in range(experts))
    lipschitz = 2 * c.float().abs().max().item() + 2
    delta_dh = gemm_delta(magnitude, hidden) * lipschitz
    assert got.dh.shape == (tokens, n1) and got.dh.dtype == torch.bfloat16
    assert got.dh_rowwise is None and got.dh_columnwise is None
    for other, factor in ((want, 1), (twin, 2)):
        assert within_steps(got.dh, other.dh, 2.0**-7, factor * delta_dh)
        if with_probs:
            assert got.dprobs.dtype == torch.float32
            assert within_steps(got.dprobs, other.dprobs, 2.0**-20, factor * ffn * delta_dh * lipschitz)
        else:
            assert got.dprobs is None and other.dprobs is None
    if bias_grad:
        assert got.db1.shape == (experts, n1) and got.db1.dtype == torch.float32
        dh_abs = want.dh.float().abs()
        bound = torch.stack([dh_abs[sum(splits[:g]):sum(splits[:g + 1])].sum(0) for g in range(experts)])
        slack = 2.0**-7 * bound + max(splits) * delta_dh + 1e-6
        assert ((got.db1 - want.db1.float()).abs() <= slack).all()
        assert ((got.db1 - twin.db1).abs() <= 2 * slack).all()
    else:
        assert got.db1 is None

@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
@pytest.mark.parametrize("tile_n", [128, 256])
def test_fc2_dgrad_over_several_bands(activation, tile_n):
    """20 m-tiles (bands of 8, 8, 4 in the schedule) x several n-tiles, an empty expert: the
    per-tile db1 sums are indexed by m-tile, not by work item."""
    test_fc2_dgrad_matches_reference_and_triton(activation, True, True, 256, 384, BANDED_SPLITS, False, tile_n)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("with_probs,bias_grad", [(True, True), (False, False)], ids=["probs-db1", "plain"])
@pytest.mark.parametrize("hidden,ffn", [(96, 160), (512, 256)], ids=["H96-F160", "H512-F256"])
@pytest.mark.parametrize("splits", [SPLITS["ragged-with-empty"], SPLITS["many-tiny"]], ids=["ragged-with-empty",
                                                                                               "many-tiny"])
def test_fc2_dgrad_wide_tiles(activation, with_probs, bias_grad, hidden, ffn, splits):
    """256-wide tiles (m64n256 wgmmas, partial n-tiles at F = 160): the same bounds."""
    test_fc2_dgrad_matches_reference_and_triton(activation, with_probs, bias_grad, hidden, ffn, splits, True, 256)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("with_probs,bias_grad", [(True, True), (False, False)], ids=["probs-db1", "plain"])
@pytest.mark.parametrize("hidden,ffn", [(96, 160), (512, 256), (64, 96)], ids=["H96-F160", "H512-F256", "H64-F96"])
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
@pytest.mark.parametrize("tile_n", [128, 256])
def test_tma_store_is_bitwise_the_register_store(activation, with_probs, bias_grad, hidden, ffn, splits, tile_n):
    """The TMA-store epilogue computes the same fp32 dh, dprobs partials and db1 sums in the same
    order and rounds dh the same way: dh, dprobs and db1 bit for bit the register-store kernel's
    (dh from torch.empty: a row or column left unwritten, or the next expert's rows or the up
    half overwritten, fails)."""
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad

    activation = activation_from(activation)
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands(splits, hidden, ffn, activation, with_probs, True)
    kwargs = dict(activation=activation, recipe=None, probs=probs, bias_grad=bias_grad, tile_n=tile_n)
    regs = fc2_dgrad(dy, w2t, c, split_sizes, store="regs", **kwargs)
    tma = fc2_dgrad(dy, w2t, c, split_sizes, store="tma", **kwargs)
    assert torch.equal(regs.dh.view(torch.int16), tma.dh.view(torch.int16))
    for name in ("dprobs", "db1"):
        first, second = getattr(regs, name), getattr(tma, name)
        assert (first is None) == (second is None) and (first is None or torch.equal(first, second)), name


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
@pytest.mark.parametrize("variant", ["bf16-128-regs", "bf16-256-tma", "mxfp8"])
@pytest.mark.parametrize("hidden,ffn", [(96, 160), (512, 384)], ids=["H96-F160", "H512-F384"])
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
def test_cluster_is_bitwise_alone(activation, variant, hidden, ffn, splits):
    """A cluster of two (w2t's tiles multicast where a pair's items share them) computes dh (bf16
    or both MXFP8 orientations), dprobs and db1 bit for bit as CTAs alone."""
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad

    activation = activation_from(activation)
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands(splits, hidden, ffn, activation, True, True)
    recipe = MXFP8Recipe() if variant == "mxfp8" else None
    tile_n, store = (None, None) if recipe else (int(variant.split("-")[1]), variant.split("-")[2])
    kwargs = dict(activation=activation, recipe=recipe, probs=probs, bias_grad=True, tile_n=tile_n, store=store)
    alone = fc2_dgrad(dy, w2t, c, split_sizes, cluster=1, **kwargs)
    paired = fc2_dgrad(dy, w2t, c, split_sizes, cluster=2, **kwargs)
    assert_same_outputs(paired, alone, ("dh", "dprobs", "db1", "dh_rowwise", "dh_columnwise"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_fc2_dgrad_is_deterministic_and_syncless():
    """Same inputs, bitwise the same outputs; no host sync in the launch."""
    from gmlp.contract.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad

    splits = torch.tensor([0, 300, 7, 129], device="cuda")
    dy = torch.randn(436, 256, device="cuda").bfloat16()
    w2t = (torch.randn(4, 256, 256, device="cuda") / 8).bfloat16()
    c = torch.randn(436, 512, device="cuda").bfloat16()
    probs = torch.rand(436, device="cuda")
    kwargs = dict(activation=SWIGLU, recipe=None, probs=probs, bias_grad=True)
    for tile_n, store in ((128, "regs"), (256, "regs"), (256, "tma")):
        first, second = twice_without_sync(lambda: fc2_dgrad(dy, w2t, c, splits, tile_n=tile_n, store=store, **kwargs))
        assert torch.equal(first.dh, second.dh) and torch.equal(first.dprobs, second.dprobs), (tile_n, store)
        assert torch.equal(first.db1, second.db1), (tile_n, store)


# ---------------------------------------------------------------------------------------------
# On an sm_90 GPU, MXFP8: bit for bit the Triton twin
# ---------------------------------------------------------------------------------------------

MXFP8_SPLITS = {**SPLITS, "banded": BANDED_SPLITS}
# (gradient recipe, probs, bias_grad): every format, scale mode, probs and db1 on and off
MXFP8_VARIANTS = {"e4m3-rceil-probs-db1": ("e4m3-rceil", True, True), "e5m2-floor-plain": ("e5m2-floor", False, False),
                  "e4m3-floor-probs": ("e4m3-floor", True, False), "e5m2-rceil-db1": ("e5m2-rceil", False, True)}


def assert_fc2_dgrad_mxfp8_matches_triton(dy, w2t, c, split_sizes, *, activation, recipe, probs, bias_grad,
                                          finite: bool = True) -> None:
    """The SM90 kernel and the Triton twin with the same recipe: the data and scale bytes of
    Q_row(dh) and Q_col(dh), all of them (the unused columnwise scale columns are 0 in both);
    dprobs and db1 within twice the bounds of test_fc2_dgrad_matches_reference_and_triton (the
    twin's dprobs partials are 64 columns wide, ours 128; db1 sums in other orders), with dh's
    magnitudes from the bf16 reference (``finite``: not with non-finite operands, whose bounds are
    not finite; then only their shapes and dtypes)."""
    from gmlp.contract.reference import fc2_dgrad_ref
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad
    from gmlp.mxfp8.tensor import QuantAxis
    from gmlp.triton_ref.fc2_dgrad import fc2_dgrad as triton_fc2_dgrad
    from tests.support.tolerances import within_steps

    kwargs = dict(activation=activation, probs=probs, bias_grad=bias_grad)
    got = fc2_dgrad(dy, w2t, c, split_sizes, recipe=recipe, **kwargs)
    twin = triton_fc2_dgrad(dy, w2t, c, split_sizes, recipe=recipe, **kwargs)
    assert got.dh is None and twin.dh is None
    for name, mine, theirs, axis in (("Q_row(dh)", got.dh_rowwise, twin.dh_rowwise, QuantAxis.ROWWISE),
                                     ("Q_col(dh)", got.dh_columnwise, twin.dh_columnwise, QuantAxis.COLUMNWISE)):
        assert mine.axis is theirs.axis is axis and not mine.swizzled
        assert mine.element_format is theirs.element_format is recipe.grad_format
        assert mine.scale_mode is theirs.scale_mode is recipe.scale_mode
        assert mine.split_sizes is split_sizes
        assert_same_bits(mine.scales, theirs.scales, f"{name} scales")
        assert_same_bits(mine.data, theirs.data, f"{name} data")

    if not finite:
        for mine, theirs in ((got.dprobs, twin.dprobs), (got.db1, twin.db1)):
            assert (mine is None) == (theirs is None)
            if mine is not None:  # sums in other orders: where they overflow may differ
                assert mine.shape == theirs.shape and mine.dtype == theirs.dtype == torch.float32
        return
    tokens, hidden = dy.shape
    experts, ffn = w2t.shape[0], w2t.shape[1]
    splits = split_sizes.tolist()
    magnitude = max((dy.float().abs() @ w2t[g].float().abs().t()).max().item() for g in range(experts))
    lipschitz = 2 * c.float().abs().max().item() + 2
    delta_dh = gemm_delta(magnitude, hidden) * lipschitz
    if probs is not None:
        assert got.dprobs.dtype == torch.float32
        assert within_steps(got.dprobs, twin.dprobs, 2.0**-20, 2 * ffn * delta_dh * lipschitz)
    else:
        assert got.dprobs is None and twin.dprobs is None
    if bias_grad:
        want = fc2_dgrad_ref(dy, w2t, c, split_sizes, recipe=None, **kwargs)
        assert got.db1.shape == twin.db1.shape and got.db1.dtype == torch.float32
        dh_abs = want.dh.float().abs()
        bound = torch.stack([dh_abs[sum(splits[:g]):sum(splits[:g + 1])].sum(0) for g in range(experts)])
        slack = 2.0**-7 * bound + max(splits) * delta_dh + 1e-6
        assert ((got.db1 - twin.db1).abs() <= 2 * slack).all()
    else:
        assert got.db1 is None and twin.db1 is None


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("variant", list(MXFP8_VARIANTS))
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (512, 256)], ids=["H64-F96", "H512-F256"])
@pytest.mark.parametrize("splits", list(MXFP8_SPLITS.values()), ids=list(MXFP8_SPLITS))
def test_fc2_dgrad_mxfp8_matches_triton_bitwise(activation, variant, hidden, ffn, splits):
    """Both kernels accumulate da in fp32 with bf16 wgmma k16 steps in K order (Triton's FC2 dgrad
    tiling for quantized dh: 128 x 64 x 128, 8 warps, m64n64k16; ours m64n128k16) and compute the
    same fp32 dh (the expression trees of gmlp.cutedsl.sm90._epilogue_math), then the spec's block
    math: every byte must agree. If the bf16 dh of the two kernels (recipe=None) differs too, the
    accumulation does (not the epilogue). The splits include an empty expert and 20 m-tiles over
    several bands (the compact columnwise scale blocks indexed by m-tile)."""
    activation = activation_from(activation)
    grad_recipe, with_probs, bias_grad = MXFP8_VARIANTS[variant]
    fmt, mode = GRAD_RECIPES[grad_recipe]
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands(splits, hidden, ffn, activation, with_probs)
    assert_fc2_dgrad_mxfp8_matches_triton(dy, w2t, c, split_sizes, activation=activation,
                                          recipe=MXFP8Recipe(mode, fmt), probs=probs, bias_grad=bias_grad)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
@pytest.mark.parametrize("grad_recipe", list(GRAD_RECIPES))
def test_fc2_dgrad_mxfp8_transposed_weight_and_special_values(activation, grad_recipe):
    """N-major w2t (the transposed view of W2), F = 160 (a partial n-tile with an empty second
    half), and dy rows that make a NaN, +-inf, huge or tiny dh, probs 0 and inf: NaN skipped by
    the amax and written as the format's NaN byte, saturation, scale bytes 0 and 254, as Triton
    writes them."""
    activation = activation_from(activation)
    fmt, mode = GRAD_RECIPES[grad_recipe]
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands([0, 37, 200, 63, 0], 128, 160, activation, True,
                                                         transposed=True)
    dy[3] = float("nan")
    dy[40, :7] = float("inf")
    dy[41] = -float("inf")
    dy[100] = 3.0e38
    dy[150] *= 1e-30
    probs[200:232] = 0.0  # an all-zero columnwise block
    probs[250] = float("inf")
    assert_fc2_dgrad_mxfp8_matches_triton(dy, w2t, c, split_sizes, activation=activation,
                                          recipe=MXFP8Recipe(mode, fmt), probs=probs, bias_grad=True, finite=False)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("grad_recipe", ["e4m3-rceil", "e5m2-floor"])
def test_fc2_dgrad_mxfp8_is_deterministic_and_syncless(grad_recipe):
    """Same inputs, bitwise the same outputs (both orientations' data and scales, dprobs, db1);
    no host sync in the launch."""
    from gmlp.contract.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc2_dgrad import fc2_dgrad

    fmt, mode = GRAD_RECIPES[grad_recipe]
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands([0, 300, 7, 129], 256, 256, SWIGLU, True)
    kwargs = dict(activation=SWIGLU, recipe=MXFP8Recipe(mode, fmt), probs=probs, bias_grad=True)
    first, second = twice_without_sync(lambda: fc2_dgrad(dy, w2t, c, split_sizes, **kwargs))
    for a, b in ((first.dh_rowwise, second.dh_rowwise), (first.dh_columnwise, second.dh_columnwise)):
        assert_same_bits(a.data, b.data, "data")
        assert_same_bits(a.scales, b.scales, "scales")
    assert torch.equal(first.dprobs, second.dprobs) and torch.equal(first.db1, second.db1)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("routing", ["balanced", "skewed"])
@pytest.mark.parametrize("shape", DESIGN_SHAPES, ids=lambda s: "E{}-T{}-H{}-F{}".format(*s))
def test_fc2_dgrad_mxfp8_at_design_shapes(shape, routing):
    """The quantizing epilogue at the layer's real sizes, bit for bit the Triton twin: with its
    first register split (producer 32, consumers 240: over the CTA's launch allocation) it passed
    every small-shape test and hung at the DeepSeek-V3 shape on the H200. A hang here blocks the
    process: run this file under ``timeout``. Swiglu with probs and db1, E4M3 RCEIL, the bench's
    routings (``gmlp.bench.mlp.split_sizes_for``)."""
    from gmlp.bench.mlp import split_sizes_for
    from gmlp.contract.activations import SWIGLU

    experts, tokens, hidden, ffn = shape
    splits = split_sizes_for(routing, experts, tokens, torch.device("cpu")).tolist()
    dy, w2t, c, split_sizes, probs = fc2_dgrad_operands(splits, hidden, ffn, SWIGLU, True)
    assert_fc2_dgrad_mxfp8_matches_triton(dy, w2t, c, split_sizes, activation=SWIGLU, recipe=MXFP8Recipe(),
                                          probs=probs, bias_grad=True)
