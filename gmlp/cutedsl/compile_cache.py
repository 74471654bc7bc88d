"""The persistent cache of compiled CuTeDSL kernels: a second process starts warm.

A kernel built for the current GPU (the launchers' runtime build) is written, as the host object
file CuTeDSL exports with its cubin inside, to ``<cache dir>/cutedsl/<kernel>-<key>.o`` and loaded
from there by every later process instead of being compiled again (tens of seconds per config
become a few milliseconds). The key is a SHA-256 over everything the compiled code depends on:

- the kernel (its module and class) and its config (the frozen dataclass's repr, which names
  every field), the compile options;
- the GPU architecture (``sm_90a``) and the host machine (the object file is host code);
- the versions of cutlass-dsl and tvm-ffi, and a digest of gmlp's kernel sources: every ``.py``
  file of the floors a kernel may import (``gmlp.system``, ``gmlp.mxfp8``, ``gmlp.contract``,
  ``gmlp.cutedsl``; ``tests/test_layering.py`` holds kernels to them), so an edited kernel is
  never served from a stale entry.

Where: ``$GMLP_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/gmlp``, else ``~/.cache/gmlp``.
``GMLP_COMPILE_CACHE=0`` turns the cache off (every process compiles). ``python -m gmlp cache``
reports the directory and its entries, ``python -m gmlp cache clear`` empties it, ``python -m
gmlp cache warm`` compiles a layer's kernels ahead of a run. Entries are written atomically
(several ranks may compile the same kernel at once); an entry that cannot be read is reported by
a warning, removed and compiled again, and an entry that cannot be written is reported by a
warning: never silently.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import pathlib
import platform
import tempfile
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from gmlp.system.env import setting

__all__ = ["CACHE_DIR_ENV", "ENABLE_ENV", "cache_directory", "cache_enabled", "current_arch", "CacheKey", "kernel_key",
           "load_or_compile", "compile_for_this_gpu", "entries", "clear", "source_digest"]

CACHE_DIR_ENV = "GMLP_CACHE_DIR"
ENABLE_ENV = "GMLP_COMPILE_CACHE"
_KERNEL_FLOORS = ("system", "mxfp8", "contract", "cutedsl")  # what a kernel's code may import (test_layering)
_SUFFIX = ".o"


def cache_directory() -> pathlib.Path:
    """Where compiled kernels are kept: ``$GMLP_CACHE_DIR``, ``$XDG_CACHE_HOME/gmlp`` or
    ``~/.cache/gmlp``, then ``cutedsl/``."""
    root = setting(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gmlp")
    return pathlib.Path(root) / "cutedsl"


def cache_enabled() -> bool:
    """False when ``GMLP_COMPILE_CACHE`` is a false spelling (``0``, ``off``...); on by default."""
    return setting(ENABLE_ENV)


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """SHA-256 of gmlp's kernel sources (path and bytes of every ``.py`` file under the floors a
    kernel may import), computed once per process."""
    package = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for floor in _KERNEL_FLOORS:
        for path in sorted((package / floor).rglob("*.py")):
            digest.update(str(path.relative_to(package)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def current_arch(device: torch.device | None = None) -> str:
    """The architecture the runtime build targets: ``sm_<major><minor>a`` of the current GPU."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


@dataclass(frozen=True)
class CacheKey:
    """What names one cache entry: the kernel's short name (in the file name, for people) and the
    digest of everything its code depends on."""

    kernel: str
    digest: str

    @property
    def file_name(self) -> str:
        return f"{self.kernel}-{self.digest[:32]}{_SUFFIX}"

    @property
    def symbol(self) -> str:
        """The entry function's name inside the object file (unique per entry)."""
        return f"gmlp_{self.kernel}_{self.digest[:32]}"


def kernel_key(kernel: type, config: object, arch: str, options: str) -> CacheKey:
    """The key of ``kernel`` (a kernel class, or any object naming the compiled code by its module
    and qualified name) compiled for ``config`` and ``arch`` with ``options``."""
    parts = {
        "kernel": f"{kernel.__module__}.{kernel.__qualname__}",
        "config": repr(config),
        "arch": arch,
        "options": options,
        "machine": platform.machine(),
        "cutlass-dsl": _version("nvidia-cutlass-dsl"),
        "tvm-ffi": _version("apache-tvm-ffi"),
        "sources": source_digest(),
    }
    text = "\n".join(f"{name}={value}" for name, value in parts.items())
    return CacheKey(kernel.__qualname__.lower(), hashlib.sha256(text.encode()).hexdigest())


def _load(path: pathlib.Path, symbol: str) -> Callable:
    from cutlass.runtime import load_module  # a CuTeDSL import, as the compile's

    return getattr(load_module(str(path), enable_tvm_ffi=True), symbol)


def _store(function, path: pathlib.Path, symbol: str) -> None:
    """Write ``function``'s object file to ``path`` atomically: a reader sees all of it or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=_SUFFIX)
    os.close(handle)
    try:
        function.export_to_c(temporary, function_name=symbol)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def load_or_compile(key: CacheKey, compile_kernel: Callable[[], object]) -> Callable:
    """The compiled kernel of ``key``: loaded from the cache if there, else ``compile_kernel()``
    (a ``cute.compile`` result built with ``--enable-tvm-ffi``), written to the cache for the
    next process. Both are called the same way (a tvm-ffi function of the kernel's arguments)."""
    if not cache_enabled():
        return compile_kernel()
    path = cache_directory() / key.file_name
    if path.is_file():
        try:
            return _load(path, key.symbol)
        except Exception as error:  # a truncated or foreign file: say so, drop it, compile again
            warnings.warn(f"gmlp: compile cache entry {path} could not be loaded ({type(error).__name__}: {error}); "
                          "removed, compiling the kernel again", RuntimeWarning, stacklevel=2)
            path.unlink(missing_ok=True)
    function = compile_kernel()
    try:
        _store(function, path, key.symbol)
    except Exception as error:  # the kernel compiled; only the next process pays: say so
        warnings.warn(f"gmlp: the compile cache could not keep {path} ({type(error).__name__}: {error}); the "
                      f"next process compiles this kernel again (set {CACHE_DIR_ENV} to a writable directory, "
                      f"or {ENABLE_ENV}=0 to turn the cache off)", RuntimeWarning, stacklevel=2)
    return function


def compile_for_this_gpu(kernel, arguments: tuple, config: object, options: str) -> Callable:
    """``cute.compile(kernel, *arguments, options=options)`` for the current GPU (``kernel``: a
    ``@cute.jit`` callable object built from ``config``), through the cache: every launcher's
    runtime build."""
    import cutlass.cute as cute  # a CuTeDSL import, as the launchers'

    key = kernel_key(type(kernel), config, current_arch(), options)
    return load_or_compile(key, lambda: cute.compile(kernel, *arguments, options=options))


def entries(directory: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The cache's entries (compiled kernels), sorted by name."""
    directory = directory or cache_directory()
    found = directory.glob(f"*{_SUFFIX}") if directory.is_dir() else []
    return sorted(path for path in found if not path.name.startswith("."))  # not a file being written


def clear(directory: pathlib.Path | None = None) -> int:
    """Remove every entry (and any half-written file) of the cache; the number of entries removed."""
    directory = directory or cache_directory()
    removed = entries(directory)
    for path in directory.glob(f"*{_SUFFIX}") if directory.is_dir() else []:
        path.unlink(missing_ok=True)
    return len(removed)
