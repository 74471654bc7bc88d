"""The CuTeDSL sm_90a FC1 of the FP8 blockwise recipe (gmlp.cutedsl.sm90.blockwise_fc1), compiled
without a GPU, with checks on its PTX and the cubin's resources, its problem rules and argument
errors, a CPU model of its quantizing epilogue (the shuffle steps and index functions on a
simulated warp, against the spec), and (marker ``gpu``, H100/H200 only) run against the Triton
twin: bit for bit on operands whose sums are exact (both kernels' accumulators are then the same
fp32 values, and the epilogues' operations are the same), within the cross-check's bound on
random operands."""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.contract.activations import Activation, ActivationKind, activation_from
from gmlp.cutedsl import import_error
from gmlp.mxfp8.spec import ElementFormat
from tests.support.blockwise import KERNEL_SPLIT_IDS, KERNEL_SPLITS, exact_operands
from tests.support.cases import parametrize_quick
from tests.support.sm90 import check_fp8_binary, on_sm90
from tests.support.warp import THREADS, WarpOps, amax_keys, amax_of_keys

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")


@parametrize_quick(("activation", "bias", "probs", "power_of_two"),
                   [("swiglu", torch.float32, torch.float32, True),
                    ("srelu", torch.bfloat16, torch.bfloat16, True), ("geglu", None, None, False)],
                   ids=["swiglu-fp32", "srelu-bf16", "geglu-fp32-scales"])
def test_compiles_to_fp8_wgmma_with_no_spills(activation, bias, probs, power_of_two):
    from gmlp.cutedsl.sm90.blockwise_fc1 import BlockwiseFC1Config, compile_blockwise_fc1

    config = BlockwiseFC1Config(activation_from(activation), bias_dtype=bias, probs_dtype=probs,
                                power_of_two=power_of_two)
    compiled = compile_blockwise_fc1(config=config)
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx and ".reqntid 384, 1, 1" in ptx  # a producer and two consumer warpgroups
    # fp8 wgmma from shared memory, fp32 accumulators: four k32 steps a k-tile and half (gate, up)
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3 \{[^}]*\}, %rd\d+, "
                        r"%rd\d+, %?\w+, 1,\s*1;", ptx)
    assert len(wgmmas) == 4 * config.halves, len(wgmmas)
    # the scales: IEEE divisions (no flush of a subnormal amax or scale_inv), fmax / amax and 1 / s
    # of a row slot's two rows and a lane's four columns
    assert len(re.findall(r"div\.rn\.f32", ptx)) >= 2 * (2 + 4)
    assert re.search(r"bar\.sync\s+1, 256;", ptx)  # the epilogue's named barrier of the consumers
    check_fp8_binary(compiled)


def test_problem_rules():
    from gmlp.cutedsl.sm90.blockwise_fc1 import problem_support

    assert problem_support(16384, 7168, 2048, 32) is None  # DeepSeek-V3's FC1
    assert problem_support(0, 128, 128, 1) is None  # an empty batch
    assert "multiples of 128" in problem_support(100, 7168, 2000, 32).message
    assert "multiples of 128" in problem_support(100, 7100, 2048, 32).message
    assert "outside [1," in problem_support(100, 128, 128, 0).message


def test_launcher_argument_errors():
    from gmlp.cutedsl.sm90.blockwise_fc1 import fc1_forward_blockwise
    from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref, quantize_weights_fp8_blockwise_ref

    swiglu = Activation(ActivationKind.SWIGLU)
    splits = torch.tensor([4, 4])
    x = quantize_fp8_blockwise_ref(torch.randn(8, 256).bfloat16(), columnwise=True)
    w1 = quantize_weights_fp8_blockwise_ref(torch.randn(2, 256, 256).bfloat16())
    kwargs = dict(ffn_hidden_size=128, activation=swiglu)
    with pytest.raises(TypeError, match="x must be an FP8BlockwiseTensor with 1x128 blocks"):
        fc1_forward_blockwise(x.columnwise, w1, splits, **kwargs)
    x_e5m2 = quantize_fp8_blockwise_ref(torch.randn(8, 256).bfloat16(), element_format="e5m2")
    with pytest.raises(ValueError, match="x must be E4M3 .*, got e5m2"):
        fc1_forward_blockwise(x_e5m2.rowwise, w1, splits, **kwargs)
    with pytest.raises(ValueError, match=r"w1 must be a contiguous \(2, 512, 256\) for swiglu with F=256"):
        fc1_forward_blockwise(x.rowwise, w1, splits, ffn_hidden_size=256, activation=swiglu)
    with pytest.raises(ValueError, match="F=100 must be positive multiples of 128"):
        fc1_forward_blockwise(x.rowwise, w1, splits, ffn_hidden_size=100, activation=activation_from("srelu"))
    with pytest.raises(ValueError, match="x, x_scales and w1 must be 16-byte aligned CUDA tensors, got x on cpu"):
        fc1_forward_blockwise(x.rowwise, w1, splits, **kwargs)


def _bits(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _floats(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def blockwise_epilogue_model(tile: torch.Tensor, valid_rows: int, element_format, power_of_two: bool):
    """What ``_blockwise_epilogue.quantize_tile_blockwise`` writes for a (128, 128) fp32 tile whose
    rows from ``valid_rows`` on are past the expert's end: (row data (128, 128) fp8 bytes, -1
    where not written; row scale_inv (128,), NaN where not written; column scale_inv (128,); the
    transposed tile read back from sQ (128 columns, 128 rows)), by its shuffle steps and index
    functions on a simulated warp, with the spec's scale."""
    from gmlp.cutedsl.sm90 import _quantize_epilogue as epi
    from gmlp.fp8_blockwise.spec import scale_from_amax, scale_inverse
    from gmlp.mxfp8.spec import cast_to_element

    lane, warp = THREADS % 32, THREADS // 32
    v = epi._value
    coordinates = torch.tensor([[epi._fragment_coordinate(t, i) for i in range(64)] for t in range(256)])
    rows, cols = coordinates[..., 0], coordinates[..., 1]  # (256, 64)
    values = torch.where(rows < valid_rows, tile[rows, cols], torch.zeros(()))
    keys = amax_keys(values)
    scale = lambda key: scale_from_amax(amax_of_keys(key), element_format, power_of_two, torch.float32)  # noqa: E731
    cast = lambda x: cast_to_element(x, element_format).view(torch.uint8).to(torch.int64)  # noqa: E731

    # rows: a slot's 32 values in-thread, then the quad (xor 1, 2)
    row_data = torch.full((128, 128), -1, dtype=torch.int64)
    row_scales = torch.full((128,), float("nan"))
    for s in range(2):
        key = torch.stack([keys[:, v(s, j, h)] for j in range(16) for h in (0, 1)]).amax(0)
        for offset in (1, 2):
            key = torch.maximum(key, WarpOps.shuffle_xor(key, offset))
        multiplier = scale(key)
        row = rows[:, v(s, 0, 0)]
        for j in range(16):
            for h in (0, 1):
                store = row < valid_rows
                row_data[row[store], cols[store, v(s, j, h)]] = cast(values[:, v(s, j, h)] * multiplier)[store]
        store = (row < valid_rows) & (lane % 4 == s)
        row_scales[row[store]] = scale_inverse(multiplier)[store]

    # columns: the column keys to sKeys, each lane's 4 columns maxed over the 8 warps' words
    owned = epi._reduce_scatter([torch.maximum(keys[:, v(0, k // 2, k % 2)], keys[:, v(1, k // 2, k % 2)])
                                 for k in range(32)], lane, epi.column_offsets(), WarpOps)
    multipliers = [scale(key.view(8, 32).amax(0).repeat(8)) for key in owned]  # sKeys[w, lane], w = 0..7
    col_scales = torch.full((128,), float("nan"))
    for r in range(4):
        first_warp = warp == 0
        col_scales[epi.owned_column(lane, r)[first_warp]] = scale_inverse(multipliers[r])[first_warp]
    words = epi._all_gather([_bits(m) for m in multipliers], lane, epi.column_offsets()[::-1], WarpOps)
    sq = torch.full((128 * 128,), -1, dtype=torch.int64)
    for j in range(16):
        for s in range(2):
            for h in (0, 1):
                address = torch.tensor([epi.sq_byte(8 * j + 2 * (t % 4) + h, t // 32, (t % 32) // 4 + 8 * s)
                                        for t in range(256)])
                sq[address] = cast(values[:, v(s, j, h)] * _floats(words[2 * j + h]))
    assert bool((sq >= 0).all())
    transposed = torch.tensor([[int(sq[epi.sq_byte(c, r // 16, r % 16)]) for r in range(128)] for c in range(128)])
    return row_data, row_scales, col_scales, transposed


@pytest.mark.parametrize(("valid_rows", "element_format", "power_of_two"),
                         [(128, "e4m3", True), (77, "e4m3", False), (1, "e5m2", True)])
def test_epilogue_model_equals_the_spec(valid_rows, element_format, power_of_two):
    """The blockwise epilogue's design on a simulated warp (its shuffle steps, the 8-warp exchange,
    the multipliers' gather and the sQ positions the kernel traces) assembles exactly the spec's
    quantization of the tile both ways, rows past the expert's end as zeros (checked on the GPU
    against the Triton twin bit for bit)."""
    from gmlp.fp8_blockwise.spec import quantize_blocks

    fmt = ElementFormat(element_format)
    torch.manual_seed(valid_rows)
    tile = torch.randn(128, 128) * 2.0 ** torch.randint(-20, 20, (128, 1)).float()  # rows of any magnitude
    tile[3, 5], tile[9, 9] = float("nan"), float("inf")  # NaN ignored by the amax; inf: a NaN block, scale_inv inf
    row_data, row_scales, col_scales, transposed = blockwise_epilogue_model(tile, valid_rows, fmt, power_of_two)
    masked = torch.where(torch.arange(128)[:, None] < valid_rows, tile, torch.zeros(()))
    want_rows, want_row_scales = quantize_blocks(masked[:valid_rows], fmt, power_of_two)
    assert torch.equal(row_data[:valid_rows], want_rows.view(torch.uint8).to(torch.int64))
    assert bool((row_data[valid_rows:] == -1).all())  # rows past the expert's end: not written
    assert torch.equal(row_scales[:valid_rows], want_row_scales) and bool(row_scales[valid_rows:].isnan().all())
    want_cols, want_col_scales = quantize_blocks(masked.t().contiguous(), fmt, power_of_two)
    assert torch.equal(transposed, want_cols.view(torch.uint8).to(torch.int64))  # the zeros' padding included
    assert torch.equal(col_scales, want_col_scales)


# ---------------------------------------------------------------------------------------------
# On the GPU, against the Triton twin
# ---------------------------------------------------------------------------------------------

def _assert_same_outputs(got, want) -> None:
    assert torch.equal(got.c.view(torch.int16), want.c.view(torch.int16))
    for name in ("a_rowwise", "a_columnwise"):
        g, w = getattr(got, name), getattr(want, name)
        assert torch.equal(g.data.view(torch.uint8), w.data.view(torch.uint8)), name
        assert torch.equal(g.scale_inv.view(torch.int32), w.scale_inv.view(torch.int32)), name


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", KERNEL_SPLITS, ids=KERNEL_SPLIT_IDS)
@pytest.mark.parametrize(("activation", "bias_dtype", "probs_dtype", "power_of_two"),
                         [("swiglu", torch.float32, torch.float32, True), ("geglu", torch.bfloat16, None, False),
                          ("srelu", None, torch.bfloat16, True)], ids=["swiglu", "geglu-fp32-scales", "srelu"])
def test_bit_exact_with_the_triton_twin_on_exact_sums(splits, activation, bias_dtype, probs_dtype, power_of_two):
    from gmlp.cutedsl.sm90.blockwise_fc1 import fc1_forward_blockwise as cutedsl_fc1
    from gmlp.triton_ref.blockwise_fc1 import fc1_forward_blockwise as triton_fc1

    torch.manual_seed(0)
    activation = activation_from(activation)
    hidden, ffn = 512, 384
    n1 = (2 if activation.gated else 1) * ffn
    x, w1, split_sizes = exact_operands(splits, hidden, n1, ElementFormat.E4M3)
    tokens, experts = x.source_shape[0], len(splits)
    b1 = None if bias_dtype is None else torch.randn(experts, n1, device="cuda").to(bias_dtype)
    probs = None if probs_dtype is None else torch.rand(tokens, device="cuda").to(probs_dtype)
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, b1=b1, probs=probs, power_of_two=power_of_two)
    _assert_same_outputs(cutedsl_fc1(x, w1, split_sizes, **kwargs), triton_fc1(x, w1, split_sizes, **kwargs))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("splits", KERNEL_SPLITS, ids=KERNEL_SPLIT_IDS)
def test_within_the_cross_check_bound_on_random_operands(splits):
    """Random operands: the accumulators differ by the two kernels' summation orders, so the
    cross-check's comparison (c, Q_row(a), Q_col(a) within the bound of their GEMM's error through
    the activation) must find nothing."""
    from gmlp.cutedsl.sm90.blockwise_fc1 import fc1_forward_blockwise as cutedsl_fc1
    from gmlp.debug.crosscheck import _compare
    from gmlp.dispatch.sites import Op
    from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_fc1 import fc1_forward_blockwise as triton_fc1
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    torch.manual_seed(0)
    hidden, ffn, experts = 512, 256, len(splits)
    split_sizes = torch.tensor(splits, device="cuda")
    x = quantize_fp8_blockwise(torch.randn(sum(splits), hidden, device="cuda").bfloat16()).rowwise
    w1 = quantize_weights_fp8_blockwise(torch.randn(experts, 2 * ffn, hidden, device="cuda").bfloat16() / 16)
    probs = torch.rand(sum(splits), device="cuda")
    args = (x, w1, split_sizes)
    kwargs = dict(ffn_hidden_size=ffn, activation=Activation(ActivationKind.SWIGLU), probs=probs)
    got, want = cutedsl_fc1(*args, **kwargs), triton_fc1(*args, **kwargs)
    comparison = _compare(Op.BLOCKWISE_FC1, got, want, args, kwargs, None)
    assert not comparison.mismatches, comparison.outputs
