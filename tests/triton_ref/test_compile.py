"""The Triton kernels compiled for sm_90a and sm_100a without a GPU, with checks on their PTX (the quick run
compiles and checks the first config of each test)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.support.cases import parametrize_quick
from tests.support.triton_aot import configs

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ptx_dir(request, tmp_path_factory) -> pathlib.Path:
    """The PTX of the configs that this module's selected tests read, compiled in one process (all 33
    configs: about 50 s of CPU, which every xdist worker that runs one of these tests pays)."""
    names = sorted({item.callspec.params["name"] for item in request.session.items if item.module is request.module})
    folder = tmp_path_factory.mktemp("ptx")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"
    result = subprocess.run([sys.executable, "-m", "tests.support.triton_aot", str(folder), *names], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"ahead-of-time compile failed:\n{result.stdout}\n{result.stderr}"
    return folder


@parametrize_quick("name", [n for n in configs() if n.startswith("quantize")])
def test_quantize_kernel_ptx(ptx_dir, name):
    ptx = (ptx_dir / f"{name}.ptx").read_text()
    capability = configs()[name][3]
    assert f".target sm_{capability}a" in ptx
    cvt = "e4m3x2" if "e4nv" in name else "e5m2x2"
    # The spec's cast: round to nearest even, saturating (what the interpreter shim emulates).
    assert f"cvt.rn.satfinite.{cvt}.f32" in ptx
    # The multiplier 2**-127 of scale byte 254 is an fp32 subnormal: nothing may flush it.
    assert ".ftz" not in ptx
    # One read of x: 16-byte vector loads of the bf16 input.
    assert "ld.global.v4.b32" in ptx or "ld.global.v4.u32" in ptx


@parametrize_quick("name", [n for n in configs() if n.startswith(("blockwise_quantize", "blockwise_weights"))])
def test_blockwise_quantize_kernel_ptx(ptx_dir, name):
    ptx = (ptx_dir / f"{name}.ptx").read_text()
    assert ".target sm_90a" in ptx
    cvt = "e5m2x2" if "fp8e5" in name else "e4m3x2"
    assert f"cvt.rn.satfinite.{cvt}.f32" in ptx  # the spec's saturating round to nearest even
    # fmax / amax and 1 / s in fp64, rounded once to fp32, nothing flushed: a subnormal amax and
    # the subnormal scale_inv 2**-127 of s = 2**127 survive
    assert "div.rn.f64" in ptx and "cvt.rn.f32.f64" in ptx
    assert ".ftz" not in ptx


@parametrize_quick("name", [n for n in configs() if n.startswith(("blockwise_gemm", "blockwise_wgrad",
                                                                    "blockwise_fc1", "blockwise_fc2"))])
def test_blockwise_gemms_use_fp8_wgmma(ptx_dir, name):
    ptx = (ptx_dir / f"{name}.ptx").read_text()
    assert ".ftz" not in ptx  # scales below 2**-126 (fp32 subnormals) are applied, not flushed
    # fp8 warpgroup MMAs with fp32 accumulators (e5m2 gradients times e4m3 activations in the mixed wgrad)
    operands = "e5m2.e4m3" if "e5m2" in name else "e4m3.e4m3"
    assert "wgmma.mma_async" in ptx and f".f32.{operands}" in ptx, name


@parametrize_quick("name", [n for n in configs() if n.startswith("dequantize")])
def test_dequantize_kernel_ptx(ptx_dir, name):
    ptx = (ptx_dir / f"{name}.ptx").read_text()
    assert f".target sm_{configs()[name][3]}a" in ptx
    # fp8 -> bf16 through fp32 without flushing: the 2**-127 scale multiplier is an fp32 subnormal
    assert ".ftz" not in ptx
    assert "cvt.rn.bf16" in ptx or "cvt.rn.bf16x2" in ptx


@parametrize_quick("name", [n for n in configs() if n.startswith(("fc1", "gemm", "dgrad", "wgrad"))])
def test_gemm_kernels_use_tensor_cores(ptx_dir, name):
    ptx = (ptx_dir / f"{name}.ptx").read_text()
    capability = configs()[name][3]
    assert f".target sm_{capability}a" in ptx
    # bf16 tensor-core MMAs of the generation: Hopper warpgroup MMA, Blackwell tcgen05 MMA
    assert ("wgmma.mma_async" in ptx) if capability == 90 else ("tcgen05.mma" in ptx)
