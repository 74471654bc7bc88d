"""Compilation of the sm_90a kernels, shared by every kernel module: the cached compile of a config
(for the current GPU, the launchers' runtime build, or ahead of time without a GPU, for the tests,
with the PTX and cubin kept) and the symbolic stand-ins of the kernels' arguments it compiles on."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from typing import Callable

import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from gmlp.contract.reasons import Reason
from gmlp.cutedsl import compile_cache
from gmlp.cutedsl.quantize import artifact_text  # the quantize kernel's compile reads its artifacts the same way
from gmlp.cutedsl.sm90._launch import check_problem
from gmlp.cutedsl.sm90._pipeline import ALIGN, ELEMENT_ALIGN

__all__ = ["SUPPORTED_ARCHS", "FLOAT_DTYPES", "CompiledKernel", "sym_stride", "fake_stream", "fake_matrix",
           "fake_vector", "fake_experts", "compile_kernel", "config_compiler", "compile_ahead", "ahead_compiler"]

SUPPORTED_ARCHS = ("sm_90a",)
_OPTIONS = "--enable-tvm-ffi"
# torch -> cutlass dtype of the float operands a config names (a bias, probs): bf16 or fp32
FLOAT_DTYPES = {torch.bfloat16: BFloat16, torch.float32: Float32}


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


def fake_matrix(dtype, rows, cols, *, divisibility: int = ELEMENT_ALIGN, align: int = ALIGN):
    """A row-major (rows, cols) stand-in: its row stride symbolic, a multiple of ``divisibility``
    elements, its base ``align``-byte aligned (defaults: what TMA needs)."""
    return make_fake_tensor(dtype, (rows, cols), stride=(sym_stride(divisibility), 1), assumed_align=align)


def fake_vector(dtype, length):
    """A dense (length,) stand-in (the expert prefix sums, probs), 4-byte aligned."""
    return make_fake_tensor(dtype, (length,), stride=(1,), assumed_align=4)


def fake_experts(experts, n, k, k_major: bool):
    """A bf16 (E, N, K) stand-in of per-expert matrices B_g read through TMA: K-major (strides (.,
    K', 1)) or N-major (strides (., 1, N')), as ``_pipeline.b_is_k_major`` tells them apart."""
    strides = (sym_stride(), sym_stride(), 1) if k_major else (sym_stride(), 1, sym_stride())
    return make_fake_tensor(BFloat16, (experts, n, k), stride=strides, assumed_align=ALIGN)


def compile_kernel(kernel, arguments: tuple, config, arch: str | None) -> CompiledKernel:
    """Compile ``kernel`` (a ``@cute.jit`` callable object) on symbolic ``arguments``; arch None
    targets the current GPU (the runtime path, through the persistent ``compile_cache``), else e.g.
    "sm_90a" with the PTX and cubin kept."""
    if arch is None:
        function = compile_cache.compile_for_this_gpu(kernel, arguments, config, _OPTIONS)
        return CompiledKernel(config, "native", function, ptx="", cubin=b"")
    with tempfile.TemporaryDirectory(prefix="gmlp_cutedsl_") as dump_dir:
        function = cute.compile(kernel, *arguments,
                                options=f"{_OPTIONS} --gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}")
        ptx = artifact_text(function.__ptx__)
        cubin = function.__cubin__
        cubin = cubin if isinstance(cubin, bytes) else open(cubin, "rb").read()  # bytes or a path
    return CompiledKernel(config, arch, function, ptx, cubin)


def config_compiler(kernel_class: type, fake_arguments: Callable) -> Callable[[object, str | None], CompiledKernel]:
    """A kernel module's compile of a config, cached per config and architecture: ``(config,
    arch) -> CompiledKernel`` of ``kernel_class(config)`` on ``fake_arguments(config)`` (arch None:
    the current GPU, the runtime path)."""

    @functools.lru_cache(maxsize=None)
    def compile_config(config, arch: str | None) -> CompiledKernel:
        return compile_kernel(kernel_class(config), fake_arguments(config), config, arch)

    return compile_config


def compile_ahead(kernel: str, compile_config, config, arch: str, shape_reason: Reason | None) -> CompiledKernel:
    """The checks behind each kernel module's ``compile_*`` (ahead of time, no GPU): ``arch`` one
    of ``SUPPORTED_ARCHS``, then no ``shape_reason`` (the module's ``problem_support`` of a shape
    given), then ``compile_config(config, arch)`` (the module's cached compile)."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch must be one of {SUPPORTED_ARCHS}, got {arch=}")
    check_problem(kernel, shape_reason)
    return compile_config(config, arch)


def ahead_compiler(kernel: str, compile_config, default_config, problem_support: Callable, shape_names: str,
                   gated: bool = False) -> Callable[..., CompiledKernel]:
    """A kernel module's public ``compile_*(arch="sm_90a", config=None, *, shape=None)``: its
    cached ``compile_config`` of ``config`` (None: ``default_config``) for ``arch``, without a
    GPU, with the PTX and cubin kept. The code is shape-generic, so one compile serves every
    shape of a config; ``shape`` (``shape_names``), when given, is checked against the module's
    ``problem_support`` (``gated``: which also takes the config's activation's ``gated``)."""

    def compile_for(arch: str = "sm_90a", config=None, *, shape: tuple[int, ...] | None = None) -> CompiledKernel:
        config = config if config is not None else default_config
        reason = None
        if shape is not None:
            reason = problem_support(*shape, gated=config.activation.gated) if gated else problem_support(*shape)
        return compile_ahead(kernel, compile_config, config, arch, reason)

    compile_for.__doc__ = (f"Compile the sm90 {kernel} for ``arch`` without a GPU (default config: {default_config}); "
                           f"returns it with its PTX and cubin. ``shape`` ({shape_names}), when given, is checked "
                           "against ``problem_support``.")
    return compile_for
