"""The CuTeDSL sm_90a FC1 forward (gmlp.cutedsl.sm90.fc1) compiled without a GPU, with checks on
its PTX, SASS and the cubin's resources (tests/support/ptx.py, tests/support/sm90.py), and (marker
``gpu``, H100/H200 only) run against the reference and the Triton twin with the tolerances of
tests/triton_ref/test_fc1.py (bf16 a) or bit for bit (MXFP8: Q_row(a), Q_col(a) and c).

The MXFP8 epilogue (gmlp.cutedsl.sm90._quantize_epilogue) is also checked on the CPU by a model:
its shuffle steps and index functions run on a simulated warp (torch), with the spec's block math,
and the assembled tile must equal the spec's quantization of it (this checks the design and the
index code the kernel traces; the GPU tests check the kernel).

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
from gmlp.mxfp8.reference import quantize_columnwise_ref, quantize_rowwise_ref
from gmlp.mxfp8.spec import ElementFormat, ScaleMode, e8m0_from_amax, quantize_multiplier
from tests.support.backends import twice_without_sync
from tests.support.cases import BANDED_SPLITS, adversarial_matrix, config_id, parametrize_quick
from tests.support.sm90 import (assert_same_bits, assert_same_outputs, check_fc1_ptx, fc1_operands, on_sm90,
                                  tuned_knobs)
from tests.support.warp import THREADS, WarpOps, amax_keys, amax_of_keys

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
    from gmlp.cutedsl.sm90.fc1 import FC1Config

    return FC1Config(activation_from(activation), **kwargs)


def check_activation_math(ptx: str, activation: Activation) -> None:
    """The epilogue's transcendental ops are Triton's (ex2.approx.f32, div.full.f32: see the
    Triton FC1 PTX), one of each per element of a thread's 64 a values; none for srelu. Its fused
    multiply-adds are those of the Triton FC1 PTX (Triton 3.9, FP fusion on, its default): geglu's
    two per element (x + c x^3 and 2 s - 1), none elsewhere; geglu's 2 x is one exact mul.rn
    (LLVM would otherwise fuse x + x into a third fma, which Triton does not: its -2 x is a
    multiply), so that the MXFP8 bytes can equal Triton's."""
    expected = 0 if activation.kind is ActivationKind.SRELU else 64  # geglu's tanh is 2 sigmoid(2x) - 1
    assert len(re.findall(r"ex2\.approx\.f32", ptx)) == expected
    assert len(re.findall(r"div\.full\.f32", ptx)) == expected
    assert "ex2.approx.ftz" not in ptx
    geglu = activation.kind is ActivationKind.GEGLU
    assert len(re.findall(r"\bfma\.rn\.f32", ptx)) == (128 if geglu else 0)
    assert len(re.findall(r"\bmul\.rn\.f32", ptx)) == (64 if geglu else 0)


def _compiled(knobs: dict):
    from gmlp.cutedsl.sm90.fc1 import compile_fc1

    return compile_fc1("sm_90a", _config(**knobs))


# The layer's FC1: stacked W1 (K-major), bf16 b1, fp32 probs
LAYER = dict(bias_dtype=torch.bfloat16, probs_dtype=torch.float32)
# The other configs: the defaults (no b1, no probs, as many stages as fit), and fp32 b1 with bf16
# probs, the transposed view of W1 (N-major) with fp32 probs, two stages
VARIANTS = [{}, dict(bias_dtype=torch.float32, probs_dtype=torch.bfloat16),
            dict(b_k_major=False, probs_dtype=torch.float32), dict(stages=2)]


@parametrize_quick("knobs", [dict(activation=activation, **LAYER) for activation in ACTIVATIONS], ids=config_id)
def test_layer_configs_compile(knobs):
    """The layer's FC1, each activation."""
    compiled = _compiled(knobs)
    check_fc1_ptx(compiled, gated=compiled.config.activation.gated)
    check_activation_math(compiled.ptx, compiled.config.activation)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **variant) for variant in VARIANTS
                             for activation in VARIANT_ACTIVATIONS], ids=config_id)
def test_variant_configs_compile(knobs):
    compiled = _compiled(knobs)
    check_fc1_ptx(compiled, gated=compiled.config.activation.gated, b_k_major=compiled.config.b_k_major)


@pytest.mark.slow
@parametrize_quick("knobs", tuned_knobs("fc1_forward"), ids=config_id)
def test_tuned_configs_compile(knobs):
    """Every config the tuned table chooses for FC1 (``gmlp.cutedsl.sm90.tuned``)."""
    compiled = _compiled(knobs)
    check_fc1_ptx(compiled, gated=True, b_k_major=compiled.config.b_k_major)
    check_activation_math(compiled.ptx, compiled.config.activation)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **LAYER, b_k_major=b_k_major, store="tma")
                             for activation, b_k_major in (("swiglu", False), ("srelu", True))], ids=config_id)
def test_tma_store_configs_compile(knobs):
    """bf16 c and a through the TMA-store epilogue: per 32-column subtile c gate, c up (gated) and
    a staged by stmatrix (two 4-matrix stmatrix a thread each) and stored as one bulk group of 4-D
    TMA stores through the ragged views; no st.global left; 4 (gated) and 6 (srelu) stages beside
    the 32 KB of subtile buffers."""
    compiled = _compiled(knobs)
    config = compiled.config
    check_fc1_ptx(compiled, gated=config.activation.gated, b_k_major=config.b_k_major)
    ptx = compiled.ptx
    assert re.search(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta\.tile\.bulk_group", ptx)
    assert len(re.findall(r"stmatrix\.sync\.aligned", ptx)) == 4 * 2 * (3 if config.activation.gated else 2)
    assert "st.global" not in ptx
    assert config.num_stages() == (4 if config.activation.gated else 6)


def check_quantized_ptx(compiled, *, floor_scales: bool) -> None:
    """What the MXFP8 epilogue adds (on top of check_fc1_ptx): 64 e4m3 pair conversions a thread
    (32 column pairs of Q_row, 32 of Q_col) and no e5m2; the scale rule: RCEIL's multiply by
    fp32(1/448) once per scale a thread computes (2 rowwise, 4 columnwise), FLOOR's exponent
    without it; nothing flushes subnormals (the multiplier of scale 254 is 2**-127); the shuffles
    (rowwise 2 x 3, columnwise 28 + 7 butterflies; 4 index shuffles gathering the quad's scales);
    two 256-thread named barriers; 64 byte stores into the transposed tile, one 16-byte store of
    the amax keys."""
    ptx = compiled.ptx
    assert len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)) == 64
    assert "e5m2x2" not in ptx and ".ftz" not in ptx
    reciprocal = len(re.findall(r"mul(\.rn)?\.f32\s+%r\d+, %r\d+, 0f3B124925;", ptx))
    assert reciprocal == (0 if floor_scales else 6), reciprocal
    if floor_scales:
        assert re.search(r"shr\.u32\s+%r\d+, %r\d+, 23;", ptx)
    assert len(re.findall(r"shfl\.sync\.bfly\.b32", ptx)) == 2 * 3 + 16 + 8 + 4 + 1 + 2 + 4
    assert len(re.findall(r"shfl\.sync\.idx\.b32", ptx)) >= 4
    assert len(re.findall(r"bar\.sync\s+1, 256;", ptx)) == 2
    assert len(re.findall(r"st\.shared\.b8", ptx)) == 64
    assert len(re.findall(r"st\.shared\.v4\.b32", ptx)) == 1
    assert len(re.findall(r"st\.global\.v4\.b32", ptx)) >= 4  # the transposed store's aligned chunks


def test_stage_counts():
    """A 48 KB slot (x tile + gate and up tiles) gets 4 stages; srelu's 32 KB slot 7. The MXFP8
    epilogue's 20 KB (transposed fp8 tile, amax keys) still leaves 4 (gated), srelu 6."""
    assert _config("swiglu").num_stages() == 4
    assert _config("srelu").num_stages() == 7
    assert _config("swiglu", quantized=True).num_stages() == 4
    assert _config("srelu", quantized=True, floor_scales=True).num_stages() == 6
    with pytest.raises(ValueError, match=r"stages must be in \[2, 6\] for srelu \(quantized\)"):
        _config("srelu", quantized=True, stages=7)
    with pytest.raises(ValueError, match="floor_scales needs quantized=True"):
        _config("swiglu", floor_scales=True)
    with pytest.raises(ValueError, match=r"stages must be in \[2, 4\] for swiglu"):
        _config("swiglu", stages=5)
    with pytest.raises(ValueError, match="bias_dtype must be one of"):
        _config("swiglu", bias_dtype=torch.float16)
    with pytest.raises(TypeError, match="activation must be"):
        from gmlp.cutedsl.sm90.fc1 import FC1Config

        FC1Config("swiglu")


def _quantized(scale_mode: ScaleMode) -> dict:
    """The config knobs of an MXFP8 a (E4M3) with ``scale_mode``'s scale bytes (RCEIL: the default)."""
    return dict(quantized=True, **({"floor_scales": True} if scale_mode is ScaleMode.FLOOR else {}))


# the scale mode of each variant config in MXFP8
VARIANT_SCALE_MODES = [ScaleMode.RCEIL, ScaleMode.RCEIL, ScaleMode.FLOOR, ScaleMode.RCEIL]


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **LAYER, **_quantized(scale_mode))
                             for scale_mode in ScaleMode for activation in ACTIVATIONS], ids=config_id)
def test_layer_configs_compile_mxfp8(knobs):
    """The MXFP8 layer's FC1: a written as Q_row(a) and Q_col(a) from the epilogue."""
    compiled = _compiled(knobs)
    check_fc1_ptx(compiled, gated=compiled.config.activation.gated)
    check_activation_math(compiled.ptx, compiled.config.activation)
    check_quantized_ptx(compiled, floor_scales=compiled.config.floor_scales)


@pytest.mark.slow
@parametrize_quick("knobs", [dict(activation=activation, **variant, **_quantized(scale_mode))
                             for variant, scale_mode in zip(VARIANTS, VARIANT_SCALE_MODES)
                             for activation in VARIANT_ACTIVATIONS], ids=config_id)
def test_variant_configs_compile_mxfp8(knobs):
    compiled = _compiled(knobs)
    check_fc1_ptx(compiled, gated=compiled.config.activation.gated, b_k_major=compiled.config.b_k_major)
    check_quantized_ptx(compiled, floor_scales=compiled.config.floor_scales)


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "not-gated"])
def test_design_and_odd_shapes_are_supported(gated):
    """The shapes the configs compiled above stand for are ones the kernel runs (its only shape
    check: the code is shape-generic)."""
    from gmlp.cutedsl.sm90.fc1 import problem_support

    shapes = [(tokens, hidden, ffn, experts) for experts, tokens, hidden, ffn in DESIGN_SHAPES] + ODD_SHAPES
    assert {shape: problem_support(*shape, gated=gated) for shape in shapes} == dict.fromkeys(shapes)


@pytest.mark.parametrize("shape,match", [
    ((64, 48, 64, 2), r"H=48 and F=64 must be positive multiples of 32"),
    ((64, 64, 0, 2), r"H=64 and F=0"),
    ((64, 64, 64, 4097), r"E=4097 outside \[1, 4096\]"),
])
def test_unsupported_shapes_are_refused(shape, match):
    from gmlp.cutedsl.sm90.fc1 import compile_fc1

    with pytest.raises(ValueError, match=match):
        compile_fc1("sm_90a", shape=shape)


def test_launcher_refuses_bad_operands():
    from gmlp.contract.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    x, w1 = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    splits = torch.tensor([4, 4])
    kwargs = dict(ffn_hidden_size=32, activation=SWIGLU, recipe=None)
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):
        fc1_forward(x, w1, splits, **kwargs)
    with pytest.raises(ValueError, match=r"w1 must hold 2 experts' \(N1=64, H=64\) matrices, got \(64, 32\) each"):
        fc1_forward(x, w1[:, :, :32], splits, **kwargs)
    with pytest.raises(ValueError, match="H=64 and F=48"):
        fc1_forward(x, torch.zeros(2, 96, 64, dtype=torch.bfloat16), splits, **{**kwargs, "ffn_hidden_size": 48})
    with pytest.raises(TypeError, match="recipe must be None or a gmlp.MXFP8Recipe"):
        fc1_forward(x, w1, splits, **{**kwargs, "recipe": "mxfp8"})
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):  # MXFP8 is taken: the same checks
        fc1_forward(x, w1, splits, **{**kwargs, "recipe": MXFP8Recipe(ScaleMode.FLOOR)})
    with pytest.raises(ValueError, match=r"w1 \(E, N, K\) must be K-major"):
        fc1_forward(x, torch.zeros(2, 64, 128, dtype=torch.bfloat16)[:, :, ::2], splits, **kwargs)


# ---------------------------------------------------------------------------------------------
# CPU model of the MXFP8 epilogue: its shuffle steps and index functions on a simulated warp
# ---------------------------------------------------------------------------------------------

def _cast(values: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
    from gmlp.mxfp8.spec import cast_to_element

    return cast_to_element(values * multiplier, ElementFormat.E4M3).view(torch.uint8).to(torch.int64)


def epilogue_model(tile: torch.Tensor, limits: tuple[int, int], scale_mode: ScaleMode):
    """What quantize_tile_both_ways writes for a (128, 128) fp32 tile with (valid rows, valid
    columns) ``limits``: (row data (128, 128), row scales (128, 4), col scales (128, 4), the
    transposed tile read back from sQ (128 columns, 128 rows)); -1 where nothing is written."""
    from gmlp.cutedsl.sm90 import _quantize_epilogue as epi

    lane, warp = THREADS % 32, THREADS // 32
    valid_rows = min(limits[0], 128)
    coordinates = torch.tensor([[epi._fragment_coordinate(t, v) for v in range(64)] for t in range(256)])
    rows, cols = coordinates[..., 0], coordinates[..., 1]  # (256, 64)
    inside = (rows < limits[0]) & (cols < limits[1])
    values = torch.where(inside, tile[rows, cols], torch.zeros(()))  # the masked values
    keys = amax_keys(values)
    scale = lambda key: e8m0_from_amax(amax_of_keys(key), ElementFormat.E4M3, scale_mode).to(torch.int64)  # noqa: E731
    multiplier = lambda e: quantize_multiplier(e)  # noqa: E731
    v = epi._value

    # Q_row: per row slot, block keys, reduce-scatter over the quad, scale of block lane % 4
    row_data = torch.full((128, 128), -1, dtype=torch.int64)
    row_scales = torch.full((128, 4), -1, dtype=torch.int64)
    slot_scales = []
    for s in range(2):
        block_keys = [torch.stack([keys[:, v(s, j, h)] for j in range(4 * b, 4 * b + 4) for h in (0, 1)]).amax(0)
                      for b in range(4)]
        (key,) = epi._reduce_scatter(block_keys, lane, epi.row_block_offsets(), WarpOps)
        assert all(epi.owned_index(t % 32, epi.row_block_offsets(), 0, 4) == t % 4 for t in range(256))
        slot_scales.append(scale(key))
        row = rows[:, v(s, 0, 0)]
        store = (row < limits[0]) & (32 * (lane % 4) < limits[1])
        row_scales[row[store], (lane % 4)[store]] = slot_scales[s][store]
    packed = slot_scales[0] | (slot_scales[1] << 8)
    quad = [packed[(THREADS & ~3) | b] for b in range(4)]  # the index shuffles of the quad
    for s in range(2):
        for j in range(16):
            for h in (0, 1):
                q = _cast(values[:, v(s, j, h)], multiplier((quad[j // 4] >> (8 * s)) & 0xFF))
                i = v(s, j, h)
                store = inside[:, i]
                row_data[rows[store, i], cols[store, i]] = q[store]

    # Q_col: per column its two slots, reduce-scatter over the column's lanes, the other warp's keys
    column_keys = [torch.maximum(keys[:, v(0, k // 2, k % 2)], keys[:, v(1, k // 2, k % 2)]) for k in range(32)]
    owned = epi._reduce_scatter(column_keys, lane, epi.column_offsets(), WarpOps)
    partner = (warp ^ 1) * 32 + lane  # sKeys[warp ^ 1, lane]
    scales = [scale(torch.maximum(k, k[partner])) for k in owned]
    col_scales = torch.full((128, 4), -1, dtype=torch.int64)
    block = warp // 2
    for r in range(4):
        column = epi.owned_column(lane, r)
        assert torch.equal(column, torch.tensor([cols[t, v(0, epi.owned_index(t % 32, epi.column_offsets(), r, 32) // 2,
                                                        epi.owned_index(t % 32, epi.column_offsets(), r, 32) % 2)]
                                                 for t in range(256)]))
        store = (warp % 2 == 0) & (32 * block < valid_rows) & (column < limits[1])
        col_scales[column[store], block[store]] = scales[r][store]
    packed = scales[0] | (scales[1] << 8) | (scales[2] << 16) | (scales[3] << 24)
    words = epi._all_gather([packed], lane, epi.column_offsets()[::-1], WarpOps)
    sq = torch.full((128 * 128,), -1, dtype=torch.int64)
    for j in range(16):
        for s in range(2):
            for h in (0, 1):
                k = 2 * j + h
                q = _cast(values[:, v(s, j, h)], multiplier((words[k // 4] >> (8 * (k % 4))) & 0xFF))
                address = torch.tensor([epi.sq_byte(8 * j + 2 * (t % 4) + h, t // 32, (t % 32) // 4 + 8 * s)
                                        for t in range(256)])
                assert bool((sq[address] == -1).all()), "a byte of sQ written twice"
                sq[address] = q
                for w in range(8):  # one st.shared.u8 of a warp: lanes sharing a bank share its word
                    word = address[32 * w : 32 * w + 32] // 4
                    for bank in range(32):
                        assert len(set(word[word % 32 == bank].tolist())) <= 1, "bank conflict"
    assert bool((sq >= 0).all())
    transposed = torch.tensor([[int(sq[epi.sq_byte(c, r // 16, r % 16)]) for r in range(128)] for c in range(128)])
    return row_data, row_scales, col_scales, transposed


@parametrize_quick("limits", [(128, 128), (37, 96), (1, 32), (300, 64), (100, 128), (64, 160)],
                   ids=lambda l: f"rows{l[0]}-cols{l[1]}")
@pytest.mark.parametrize("scale_mode", list(ScaleMode), ids=lambda m: m.value)
@pytest.mark.parametrize("kind", ["adversarial", "lognormal"])
def test_epilogue_model_matches_spec(kind, scale_mode, limits):
    """The epilogue's steps assemble the spec's Q_row and Q_col of the masked tile (zeros outside
    the limits), write nothing outside them, and the transposed tile reads back through sQ."""
    torch.manual_seed(0)
    if kind == "adversarial":  # every special block (NaN, inf, ties, subnormal scales) along rows and columns
        tile = adversarial_matrix(ElementFormat.E4M3, scale_mode, rows=128)[:, :128].contiguous()
    else:
        tile = torch.exp(torch.randn(128, 128) * 3) * torch.sign(torch.randn(128, 128))
    row_data, row_scales, col_scales, transposed = epilogue_model(tile, limits, scale_mode)
    rows, cols = min(limits[0], 128), min(limits[1], 128)
    masked = torch.zeros(128, 128)
    masked[:rows, :cols] = tile[:rows, :cols]
    want_data, want_scales = quantize_rowwise_ref(masked, ElementFormat.E4M3, scale_mode)
    assert torch.equal(row_data[:rows, :cols], want_data.view(torch.uint8)[:rows, :cols].long())
    assert bool((row_data[rows:] == -1).all()) and bool((row_data[:, cols:] == -1).all())
    assert torch.equal(row_scales[:rows, : cols // 32], want_scales[:rows, : cols // 32].long())
    assert bool((row_scales[rows:] == -1).all()) and bool((row_scales[:, cols // 32 :] == -1).all())
    want_data, want_scales = quantize_columnwise_ref(masked[:rows], None, ElementFormat.E4M3, scale_mode)
    blocks = want_scales.shape[1]  # ceil(rows / 32)
    assert torch.equal(transposed[:cols, :rows], want_data.view(torch.uint8)[:cols].long())
    assert torch.equal(col_scales[:cols, :blocks], want_scales[:cols].long())
    assert bool((col_scales[cols:] == -1).all()) and bool((col_scales[:, blocks:] == -1).all())


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
@pytest.mark.parametrize("bias,with_probs", [(True, True), (False, False), (True, False)],
                         ids=["bias-probs", "plain", "bias"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (96, 160), (512, 256)], ids=["H64-F96", "H96-F160", "H512-F256"])
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("transposed", [False, True], ids=["stacked", "transposed-weight"])
def test_fc1_matches_reference_and_triton(activation, bias, with_probs, hidden, ffn, splits, transposed):
    """Tolerance of tests/triton_ref/test_fc1.py (bf16 recipe): c within one bf16 step (2**-7 |v|) +
    delta_h = H * 2**-24 * max sum_k |x_k w_k| of the fp64 reference, a within one bf16 step +
    delta_a = delta_h * (2 max|h| + 2); against the Triton kernel the same bound (both are fp32
    accumulations, each within delta_h of the exact h). Every row and column is compared, so an
    unwritten (torch.empty) or misplaced element fails."""
    from gmlp.contract.reference import fc1_forward_ref
    from gmlp.cutedsl.sm90.fc1 import fc1_forward
    from gmlp.triton_ref.fc1 import fc1_forward as triton_fc1_forward
    from tests.support.tolerances import within_steps

    activation = activation_from(activation)
    x, w1, split_sizes, b1, probs = fc1_operands(splits, hidden, ffn, activation, bias, with_probs, transposed)
    tokens, experts = sum(splits), len(splits)
    n1 = (2 if activation.gated else 1) * ffn
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, recipe=None, b1=b1, probs=probs)
    got = fc1_forward(x, w1, split_sizes, **kwargs)
    want = fc1_forward_ref(x, w1, split_sizes, **kwargs)
    twin = triton_fc1_forward(x, w1, split_sizes, **kwargs)
    magnitude = max((x.float().abs() @ w1[g].float().abs().t()).max().item() for g in range(experts))
    delta_h = gemm_delta(magnitude, hidden)
    delta_a = delta_h * (2 * want.c.float().abs().max().item() + 2)
    assert got.c.shape == want.c.shape == (tokens, n1) and got.c.dtype == torch.bfloat16
    assert got.a.shape == want.a.shape == (tokens, ffn) and got.a.dtype == torch.bfloat16
    assert got.a_rowwise is None and got.a_columnwise is None
    for other, factor in ((want, 1), (twin, 2)):  # the twin is itself within the bound of the reference
        assert within_steps(got.c, other.c, 2.0**-7, factor * delta_h)
        assert within_steps(got.a, other.a, 2.0**-7, factor * delta_a)

@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
def test_fc1_over_several_bands(activation):
    """20 m-tiles (bands of 8, 8, 4 in the schedule) x several n-tiles, an empty expert."""
    test_fc1_matches_reference_and_triton(activation, True, True, 256, 384, BANDED_SPLITS, False)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("bias,with_probs", [(True, True), (False, False)], ids=["bias-probs", "plain"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (96, 160), (512, 256)], ids=["H64-F96", "H96-F160", "H512-F256"])
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
def test_tma_store_is_bitwise_the_register_store(activation, bias, with_probs, hidden, ffn, splits):
    """The TMA-store epilogue computes and rounds c and a the same way: both bit for bit the
    register-store kernel's (from torch.empty: a row or column left unwritten, or the next expert's
    rows or c's up half overwritten, fails)."""
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    activation = activation_from(activation)
    x, w1, split_sizes, b1, probs = fc1_operands(splits, hidden, ffn, activation, bias, with_probs, True)
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, recipe=None, b1=b1, probs=probs)
    regs = fc1_forward(x, w1, split_sizes, store="regs", **kwargs)
    tma = fc1_forward(x, w1, split_sizes, store="tma", **kwargs)
    assert_same_bits(tma.c, regs.c, "c")
    assert_same_bits(tma.a, regs.a, "a")


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
@pytest.mark.parametrize("variant", ["bf16-regs", "bf16-tma", "mxfp8"])
@pytest.mark.parametrize("hidden,ffn", [(96, 160), (512, 384)], ids=["H96-F160", "H512-F384"])
@pytest.mark.parametrize("splits", list(SPLITS.values()) + [BANDED_SPLITS], ids=list(SPLITS) + ["banded"])
def test_cluster_is_bitwise_alone(activation, variant, hidden, ffn, splits):
    """A cluster of two (W1's tiles multicast where a pair's items share them) computes every
    output bit for bit as CTAs alone: c, and a in bf16 or its two MXFP8 orientations."""
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    activation = activation_from(activation)
    x, w1, split_sizes, b1, probs = fc1_operands(splits, hidden, ffn, activation, True, True, True)
    recipe = MXFP8Recipe() if variant == "mxfp8" else None
    store = None if recipe else variant.removeprefix("bf16-")
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, recipe=recipe, b1=b1, probs=probs, store=store)
    alone = fc1_forward(x, w1, split_sizes, cluster=1, **kwargs)
    paired = fc1_forward(x, w1, split_sizes, cluster=2, **kwargs)
    assert_same_outputs(paired, alone, ("c", "a", "a_rowwise", "a_columnwise"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_fc1_is_deterministic_and_syncless():
    """Same inputs, bitwise the same outputs; no host sync in the launch."""
    from gmlp.contract.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    splits = torch.tensor([0, 300, 7, 129], device="cuda")
    x = torch.randn(436, 256, device="cuda").bfloat16()
    w1 = (torch.randn(4, 512, 256, device="cuda") / 8).bfloat16()
    probs = torch.rand(436, device="cuda")
    kwargs = dict(ffn_hidden_size=256, activation=SWIGLU, recipe=None, probs=probs)
    for options in (dict(store="regs"), dict(store="tma")):
        first, second = twice_without_sync(lambda: fc1_forward(x, w1, splits, **options, **kwargs))
        assert torch.equal(first.c, second.c) and torch.equal(first.a, second.a), options


# ---------------------------------------------------------------------------------------------
# On an sm_90 GPU, MXFP8: bit for bit the Triton twin
# ---------------------------------------------------------------------------------------------


def assert_fc1_mxfp8_matches_triton(x, w1, split_sizes, **kwargs) -> None:
    """The SM90 kernel and the Triton twin with the same recipe: c, and the data and scale bytes of
    Q_row(a) and Q_col(a) (all of them: the unused columnwise scale columns are 0 in both)."""
    from gmlp.cutedsl.sm90.fc1 import fc1_forward
    from gmlp.mxfp8.tensor import QuantAxis
    from gmlp.triton_ref.fc1 import fc1_forward as triton_fc1_forward

    got = fc1_forward(x, w1, split_sizes, **kwargs)
    twin = triton_fc1_forward(x, w1, split_sizes, **kwargs)
    assert got.a is None and twin.a is None
    assert_same_bits(got.c, twin.c, "c")
    for name, mine, theirs, axis in (("Q_row(a)", got.a_rowwise, twin.a_rowwise, QuantAxis.ROWWISE),
                                     ("Q_col(a)", got.a_columnwise, twin.a_columnwise, QuantAxis.COLUMNWISE)):
        assert mine.axis is theirs.axis is axis and not mine.swizzled
        assert mine.element_format is theirs.element_format is ElementFormat.E4M3
        assert mine.scale_mode is theirs.scale_mode is kwargs["recipe"].scale_mode
        assert mine.split_sizes is split_sizes
        assert_same_bits(mine.scales, theirs.scales, f"{name} scales")
        assert_same_bits(mine.data, theirs.data, f"{name} data")


MXFP8_SPLITS = {**SPLITS, "banded": BANDED_SPLITS}


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("scale_mode", list(ScaleMode), ids=lambda m: m.value)
@pytest.mark.parametrize("bias,with_probs", [(True, True), (False, False), (True, False), (False, True)],
                         ids=["bias-probs", "plain", "bias", "probs"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (512, 256)], ids=["H64-F96", "H512-F256"])
@pytest.mark.parametrize("splits", list(MXFP8_SPLITS.values()), ids=list(MXFP8_SPLITS))
def test_fc1_mxfp8_matches_triton_bitwise(activation, scale_mode, bias, with_probs, hidden, ffn, splits):
    """Both kernels accumulate h in fp32 with the same m64n128k16 wgmma sequence over K (Triton's
    FC1 tiling for quantized a: 128 x 128 x 64, 8 warps) and run the same fp32 epilogue operations
    (the module docstring of gmlp.cutedsl.sm90._epilogue_math), then the spec's block math: every
    byte must agree. If c differs, the accumulation does (not the epilogue)."""
    activation = activation_from(activation)
    x, w1, split_sizes, b1, probs = fc1_operands(splits, hidden, ffn, activation, bias, with_probs)
    assert_fc1_mxfp8_matches_triton(x, w1, split_sizes, ffn_hidden_size=ffn, activation=activation,
                                    recipe=MXFP8Recipe(scale_mode), b1=b1, probs=probs)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
@pytest.mark.parametrize("scale_mode", list(ScaleMode), ids=lambda m: m.value)
def test_fc1_mxfp8_transposed_weight_and_special_values(activation, scale_mode):
    """N-major W1, and x rows that make a NaN, +-inf, huge or zero (probs 0): NaN skipped by the
    amax and written as 0x7F, saturation, scale bytes 0 and 254, as Triton writes them."""
    activation = activation_from(activation)
    x, w1, split_sizes, b1, probs = fc1_operands([0, 37, 200, 63, 0], 128, 160, activation, True, True,
                                                  transposed=True)
    x[3] = float("nan")
    x[40, :7] = float("inf")
    x[41] = -float("inf")
    x[100] = 3.0e38
    x[150] *= 1e-30
    probs[200:232] = 0.0  # an all-zero columnwise block
    probs[250] = float("inf")
    assert_fc1_mxfp8_matches_triton(x, w1, split_sizes, ffn_hidden_size=160, activation=activation,
                                    recipe=MXFP8Recipe(scale_mode), b1=b1, probs=probs)


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_fc1_mxfp8_is_deterministic_and_syncless():
    from gmlp.contract.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    x, w1, split_sizes, _, probs = fc1_operands([0, 300, 7, 129], 256, 256, SWIGLU, False, True)
    kwargs = dict(ffn_hidden_size=256, activation=SWIGLU, recipe=MXFP8Recipe(), probs=probs)
    first, second = twice_without_sync(lambda: fc1_forward(x, w1, split_sizes, **kwargs))
    assert_same_bits(first.c, second.c, "c")
    for a, b in ((first.a_rowwise, second.a_rowwise), (first.a_columnwise, second.a_columnwise)):
        assert_same_bits(a.data, b.data, "data")
        assert_same_bits(a.scales, b.scales, "scales")
