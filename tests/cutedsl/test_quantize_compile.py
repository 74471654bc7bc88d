"""The CuTeDSL quantize kernel compiled for sm_90a and sm_100a without a GPU, with checks on its PTX.

Each compile takes a few seconds (cutlass-dsl 4.8.1, CPU only). Skipped, with the import error,
where cutlass-dsl is missing or broken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

from gmlp.cutedsl import import_error
from gmlp.mxfp8.problem import validate_quantize_args
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from tests.support.cases import parametrize_quick
from tests.support.ptx import kernel_resources

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

ARCHS = ["sm_90a", "sm_100a"]


@dataclass(frozen=True)
class Case:
    name: str
    dtype: torch.dtype
    rowwise: bool
    columnwise: bool
    swizzle: bool
    num_experts: int | None  # None: ungrouped
    element_format: ElementFormat = ElementFormat.E4M3
    scale_mode: ScaleMode = ScaleMode.RCEIL


CASES = [
    # the fused training configuration (benchmarked): bf16, both orientations, swizzled
    Case("bf16_both_swizzled_grouped", torch.bfloat16, True, True, True, 32),
    Case("bf16_both_swizzled", torch.bfloat16, True, True, True, None),
    # the other formats, modes, layouts and input dtype
    Case("fp32_both_compact_grouped_e5m2_floor", torch.float32, True, True, False, 5, ElementFormat.E5M2, ScaleMode.FLOOR),
    Case("bf16_rowwise_compact_e5m2", torch.bfloat16, True, False, False, None, ElementFormat.E5M2),
    Case("fp32_columnwise_swizzled_grouped_floor", torch.float32, False, True, True, 3, scale_mode=ScaleMode.FLOOR),
]


def vector_bytes(ptx: str, op: str) -> int:
    """Bytes moved by the global vector loads ("ld") or stores ("st") of one thread's code."""
    widths = {"v2.b64": 16, "v4.b32": 16, "v4.b64": 32, "v8.b32": 32}
    return sum(n * len(re.findall(rf"\b{op}\.global\.{re.escape(kind)}\b", ptx)) for kind, n in widths.items())


def compile_case(arch: str, case: Case):
    from gmlp.cutedsl import quantize

    return quantize.compile_quantize_kernel(
        arch, num_rows=4099, num_cols=7168, num_experts=case.num_experts, dtype=case.dtype, rowwise=case.rowwise,
        columnwise=case.columnwise, swizzle=case.swizzle, element_format=case.element_format,
        scale_mode=case.scale_mode,
    )


@parametrize_quick("case", CASES, ids=lambda c: c.name)
@parametrize_quick("arch", ARCHS)
def test_quantize_kernel_ptx(arch, case):
    compiled = compile_case(arch, case)
    ptx = compiled.ptx
    assert f".target {arch}" in ptx
    assert ".reqntid 256, 1, 1" in ptx
    # The spec's cast (round to nearest even, saturating, NaN -> 0x7F), and only that one.
    cvt, other = ("e4m3x2", "e5m2x2") if case.element_format is ElementFormat.E4M3 else ("e5m2x2", "e4m3x2")
    assert f"cvt.rn.satfinite.{cvt}.f32" in ptx
    assert other not in ptx
    # The multiplier 2**-127 of scale byte 254 is an fp32 subnormal: nothing may flush it.
    assert ".ftz" not in ptx
    assert re.search(r"\bmul(\.rn)?\.f32\b", ptx)
    # x is read once, straight into shared memory with 16-byte cp.async that bypass L1 (.cg):
    # 128 x 128 elements per tile and CTA of 256 threads, one load site, one wait for all copies.
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16", ptx)
    assert len(copies) == 128 * 128 * case.dtype.itemsize // 16 // 256, len(copies)
    waits = re.findall(r"cp\.async\.wait_group\s+(\d+);", ptx)
    assert waits == ["0"], waits
    assert vector_bytes(ptx, "ld") == 0
    # Register fragments stay in registers: no local memory in the PTX, no spills in the cubin,
    # and registers within the budget of the CTAs per SM it is built for.
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert compiled.smem_bytes * compiled.min_blocks_per_sm <= 228 * 1024
    resources = kernel_resources(compiled.cubin)
    if resources is not None:
        assert resources["stack"] == resources["local"] == 0, resources
        assert resources["registers"] * 256 * compiled.min_blocks_per_sm <= 65536, (resources, compiled.min_blocks_per_sm)
    # rowwise: one 16-byte data store per pass; columnwise: 16-byte transposed chunks (4 passes,
    # and the tail pass where the compiler cannot rule it out); swizzled: one 16-byte store of
    # each 512-byte scale tile.
    expected = 4 * case.rowwise + 4 * case.columnwise + case.swizzle * (case.rowwise + case.columnwise)
    stores = vector_bytes(ptx, "st") // 16
    assert expected <= stores <= expected + case.columnwise, (stores, expected)
    if case.columnwise:
        assert "bar.sync" in ptx  # the transposition goes through shared memory


def test_compile_rejects_unknown_arch():
    from gmlp.cutedsl.quantize import compile_quantize_kernel

    with pytest.raises(ValueError, match=r"arch must be one of .*'sm_80'"):
        compile_quantize_kernel("sm_80", num_rows=128, num_cols=128, num_experts=None, dtype=torch.bfloat16,
                                rowwise=True, columnwise=False, swizzle=True, element_format=ElementFormat.E4M3,
                                scale_mode=ScaleMode.RCEIL)


def _problem(rows, cols, experts=None, dtype=torch.bfloat16):
    x = torch.empty(rows, cols, dtype=dtype, device="meta")
    splits = None if experts is None else torch.empty(experts, dtype=torch.int32, device="meta")
    return validate_quantize_args(x, rowwise=True, columnwise=True, swizzle=True, split_sizes=splits,
                                  element_format=ElementFormat.E4M3, scale_mode=ScaleMode.RCEIL)


def test_problem_support():
    from gmlp.cutedsl.quantize import problem_support

    assert problem_support(_problem(65536, 2048, 128)) is None
    assert problem_support(_problem(0, 32, 7, torch.float32)) is None
    reason = problem_support(_problem(2**31 - 100, 32, 4))
    assert reason is not None and "T=2147483548" in str(reason) and "E=4" in str(reason)


def test_launcher_needs_cuda_tensors():
    from gmlp.cutedsl.quantize import quantize_mxfp8

    with pytest.raises(ValueError, match=r"needs CUDA tensors, got x.device=device\(type='cpu'\)"):
        quantize_mxfp8(torch.zeros(4, 32, dtype=torch.bfloat16))
