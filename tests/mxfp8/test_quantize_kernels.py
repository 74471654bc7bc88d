"""Every quantize kernel against the spec, bit for bit: data, scale bytes, shapes and padding.

On the CPU the Triton kernels run in Triton's interpreter (tiny shapes); on a GPU every kernel
path runs compiled, on the same cases plus larger ones.
"""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized
from tests.support.backends import KERNEL_PATHS, kernel_device, quantize_launcher
from tests.support.cases import SPLIT_CASES, adversarial_matrix, parametrize_quick, random_matrix

ON_GPU = torch.cuda.is_available()


def assert_bit_exact(actual: MXFP8Quantized, expected: MXFP8Quantized) -> None:
    for axis in ("rowwise", "columnwise"):
        got, want = getattr(actual, axis), getattr(expected, axis)
        assert (got is None) == (want is None), axis
        if want is None:
            continue
        assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape, (axis, got, want)
        assert got.scales.dtype == torch.uint8 and got.scales.shape == want.scales.shape, (axis, got, want)
        data_mismatch = (got.data.view(torch.uint8).cpu() != want.data.view(torch.uint8).cpu())
        scale_mismatch = (got.scales.cpu() != want.scales.cpu())
        where = data_mismatch.nonzero()[:5].tolist()
        assert data_mismatch.sum() == 0, f"{axis} data: {int(data_mismatch.sum())} mismatches, first at {where}"
        assert scale_mismatch.sum() == 0, f"{axis} scales: {int(scale_mismatch.sum())} mismatches, first at {scale_mismatch.nonzero()[:5].tolist()}"


def run_both(path, x, **kwargs):
    launcher = quantize_launcher(path)
    device = kernel_device()
    x = x.to(device)
    if kwargs.get("split_sizes") is not None:
        kwargs["split_sizes"] = kwargs["split_sizes"].to(device)
    return launcher(x, **kwargs), quantize_mxfp8_ref(x, **kwargs)


@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
@parametrize_quick("element_format", list(ElementFormat), ids=lambda f: f.value)
@parametrize_quick("scale_mode", list(ScaleMode), ids=lambda m: m.value)
@parametrize_quick("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_adversarial_blocks(path, element_format, scale_mode, dtype):
    x = adversarial_matrix(element_format, scale_mode, rows=64).to(dtype)
    for source in (x, x.t()):
        got, want = run_both(path, source.contiguous(), rowwise=True, columnwise=True, swizzle=True,
                             element_format=element_format, scale_mode=scale_mode)
        assert_bit_exact(got, want)


@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
@parametrize_quick("split_case", list(SPLIT_CASES), keep=3, ids=str)
@parametrize_quick("swizzle", [True, False], ids=["swizzled", "compact"])
@parametrize_quick("distribution", ["normal", "uniform_wide", "outliers", "lognormal"])
def test_grouped_random(path, split_case, swizzle, distribution):
    splits = SPLIT_CASES[split_case]
    x = random_matrix(distribution, 300, 96, torch.bfloat16)
    split_sizes = None if splits is None else torch.tensor(splits, dtype=torch.int32)
    got, want = run_both(path, x, rowwise=True, columnwise=True, swizzle=swizzle, split_sizes=split_sizes)
    assert_bit_exact(got, want)


@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
@pytest.mark.parametrize("rowwise,columnwise", [(True, False), (False, True)], ids=["rowwise", "columnwise"])
@parametrize_quick("shape", [(0, 64), (1, 32), (33, 160), (129, 32), (257, 224)], keep=2, ids=str)
def test_odd_shapes_one_direction(path, rowwise, columnwise, shape):
    x = random_matrix("normal", *shape, torch.float32)
    for split_sizes in (None, torch.tensor([shape[0] // 3, 0, shape[0] - shape[0] // 3], dtype=torch.int64)):
        for swizzle in (True, False):
            got, want = run_both(path, x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=split_sizes)
            assert_bit_exact(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
@pytest.mark.parametrize("shape,splits", [((4096, 2048), [0, 1000, 77, 3019]), ((8192, 7168), None),
                                          ((5000, 1024), [128] * 8 + [0] * 8 + [3976])], ids=str)
def test_large_gpu(path, shape, splits):
    x = random_matrix("outliers", *shape, torch.bfloat16)
    split_sizes = None if splits is None else torch.tensor(splits, dtype=torch.int32)
    got, want = run_both(path, x, rowwise=True, columnwise=True, swizzle=True, split_sizes=split_sizes)
    assert_bit_exact(got, want)


@parametrize_quick("swizzle", [True, False], ids=["swizzled", "compact"])
@pytest.mark.parametrize("split_case", ["zeros_and_odd", "ungrouped"])
def test_triton_weight_config_is_bit_exact(swizzle, split_case):
    """The layer's weight config (chunks fastest, 4 chunks per program; a launch order and tiling,
    nothing else) gives the spec's bytes, grouped or not, with partial chunk groups (K = 160)."""
    from gmlp.triton_ref.quantize import WEIGHT_QUANTIZE_CONFIG, quantize_mxfp8

    device = kernel_device()
    splits = SPLIT_CASES[split_case]
    rows = sum(splits) if splits else 200
    x = random_matrix("outliers", rows, 160, torch.bfloat16).to(device)
    split_sizes = None if splits is None else torch.tensor(splits, dtype=torch.int32, device=device)
    kwargs = dict(rowwise=True, columnwise=True, swizzle=swizzle, split_sizes=split_sizes)
    assert_bit_exact(quantize_mxfp8(x, config=WEIGHT_QUANTIZE_CONFIG, **kwargs), quantize_mxfp8_ref(x, **kwargs))


@pytest.mark.parametrize("swizzle", [True, False], ids=["swizzled", "compact"])
def test_triton_reads_rows_further_apart_than_k(swizzle):
    """W1's gate rows in its interleaved (E, F, 2, H) layout, a (E * F, H) view with row stride
    2H (``gmlp.contract.gate_up``), quantized in place: the bytes of its contiguous copy, both ways."""
    from gmlp.contract.gate_up import GateUpLayout, gate_up_views
    from gmlp.triton_ref.quantize import WEIGHT_QUANTIZE_CONFIG, quantize_mxfp8

    device = kernel_device()
    experts, ffn, hidden = 2, 64, 96
    w13 = random_matrix("outliers", experts * ffn * 2, hidden, torch.bfloat16).to(device).view(experts, ffn, 2, hidden)
    for view in gate_up_views(GateUpLayout.INTERLEAVED, w13).gate, gate_up_views(GateUpLayout.INTERLEAVED, w13).up:
        rows = view.reshape(experts * ffn, hidden)
        assert rows.stride() == (2 * hidden, 1) and rows.data_ptr() == view.data_ptr()  # a view, read in place
        kwargs = dict(rowwise=True, columnwise=True, swizzle=swizzle)
        want = quantize_mxfp8_ref(rows.contiguous(), **kwargs)
        assert_bit_exact(quantize_mxfp8(rows, config=WEIGHT_QUANTIZE_CONFIG, **kwargs), want)
        assert_bit_exact(quantize_mxfp8_ref(rows, **kwargs), want)


def test_only_readers_of_strided_rows_take_them():
    """The validator refuses a view whose rows are further apart than K unless its caller reads
    rows by their stride (the Triton kernel and the spec do; the CuTeDSL quantize and the public
    dispatcher do not, so it is refused there, not misread); columns stay contiguous for all."""
    from gmlp.mxfp8.problem import validate_quantize_args

    rows = torch.zeros(4, 64, dtype=torch.bfloat16)[:, :32]
    common = dict(rowwise=True, columnwise=False, swizzle=False, split_sizes=None, element_format=ElementFormat.E4M3,
                  scale_mode=ScaleMode.RCEIL)
    with pytest.raises(ValueError, match="x must be contiguous"):
        validate_quantize_args(rows, **common)
    assert validate_quantize_args(rows, strided_rows=True, **common).num_cols == 32
    with pytest.raises(ValueError, match="x must have contiguous rows"):
        validate_quantize_args(torch.zeros(64, 32, dtype=torch.bfloat16).t(), strided_rows=True, **common)


@pytest.mark.parametrize("path", KERNEL_PATHS, ids=lambda p: p.value)
def test_given_groups_are_the_ones_read(path):
    """The layer hands its quantizes the device prefix sums it computed once per step: a launcher
    reads the ``groups`` it is given (here those of another routing of the same rows, so that
    recomputing them from ``split_sizes`` would show), and refuses groups without split sizes."""
    from gmlp.mxfp8.routing import device_groups

    device = kernel_device()
    torch.manual_seed(5)
    x = random_matrix("normal", 96, 64, torch.bfloat16, device)
    given, other = (torch.tensor(sizes, dtype=torch.int32, device=device) for sizes in ([40, 0, 56], [8, 80, 8]))
    args = {"rowwise": True, "columnwise": True, "swizzle": False}
    launcher = quantize_launcher(path)
    got = launcher(x, split_sizes=other, groups=device_groups(given, 96), **args)
    want = quantize_mxfp8_ref(x, split_sizes=given, **args)
    assert_bit_exact(got, want)
    with pytest.raises(ValueError, match="groups .* without split_sizes"):
        launcher(x, groups=device_groups(given, 96), **args)
