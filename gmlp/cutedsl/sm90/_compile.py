"""Ahead-of-time compilation of the sm_90a kernels without a GPU, shared by every kernel module:
symbolic stand-ins of the arguments, and the compile that keeps the PTX and cubin."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream

from gmlp.contract.reasons import Reason
from gmlp.cutedsl.quantize import artifact_text  # the quantize kernel's compile reads its artifacts the same way
from gmlp.cutedsl.sm90._pipeline import ELEMENT_ALIGN

__all__ = ["SUPPORTED_ARCHS", "CompiledKernel", "sym_stride", "fake_stream", "compile_kernel", "compile_ahead"]

SUPPORTED_ARCHS = ("sm_90a",)
_OPTIONS = "--enable-tvm-ffi"


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel compiled ahead of time: the callable (runs on a matching GPU), its PTX and cubin."""

    config: object
    arch: str
    function: object
    ptx: str
    cubin: bytes  # b"" for the native (runtime) build


def sym_stride(divisibility: int = ELEMENT_ALIGN):
    """A symbolic 64-bit stride (the launchers guarantee multiples of 8 elements for TMA)."""
    return cute.sym_int64(divisibility=divisibility)


def fake_stream():
    return make_fake_stream(use_tvm_ffi_env_stream=True)


def compile_kernel(kernel, arguments: tuple, config, arch: str | None) -> CompiledKernel:
    """Compile ``kernel`` (a ``@cute.jit`` callable object) on symbolic ``arguments``; arch None
    targets the current GPU (the runtime path), else e.g. "sm_90a" with the PTX and cubin kept."""
    if arch is None:
        return CompiledKernel(config, "native", cute.compile(kernel, *arguments, options=_OPTIONS), ptx="", cubin=b"")
    with tempfile.TemporaryDirectory(prefix="gmlp_cutedsl_") as dump_dir:
        function = cute.compile(kernel, *arguments,
                                options=f"{_OPTIONS} --gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}")
        ptx = artifact_text(function.__ptx__)
        cubin = function.__cubin__
        cubin = cubin if isinstance(cubin, bytes) else open(cubin, "rb").read()  # bytes or a path
    return CompiledKernel(config, arch, function, ptx, cubin)


def compile_ahead(kernel: str, compile_config, config, arch: str, shape_reason: Reason | None) -> CompiledKernel:
    """The checks behind each kernel module's ``compile_*`` (ahead of time, no GPU): ``arch`` one
    of ``SUPPORTED_ARCHS``, then no ``shape_reason`` (the module's ``problem_support`` of a shape
    given), then ``compile_config(config, arch)`` (the module's cached compile)."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch must be one of {SUPPORTED_ARCHS}, got {arch=}")
    if shape_reason is not None:
        raise ValueError(f"the sm90 {kernel} cannot run this problem: {shape_reason.message}")
    return compile_config(config, arch)
