"""The persistent compile cache (``gmlp.cutedsl.compile_cache``): entries written and loaded, keys
that change with everything the code depends on, and every failure said aloud.

Without a GPU the kernel is compiled ahead of time for sm_90a (the object file is the same host
code and cubin a runtime build keeps); on the H200 a launcher's runtime build is cached, loaded in
place of a compile, and its results are the compiled kernel's bit for bit.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from gmlp.cutedsl import compile_cache, import_error
from tests.support.sm90 import assert_same_bits, on_sm90

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")


@pytest.fixture(scope="module")
def compiled():
    """The SM90 grouped GEMM's default config, compiled for sm_90a (cached per worker)."""
    from gmlp.cutedsl.sm90 import grouped_gemm

    return grouped_gemm.compile_grouped_gemm("sm_90a")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.CACHE_DIR_ENV, str(tmp_path / "gmlp"))
    monkeypatch.delenv(compile_cache.ENABLE_ENV, raising=False)
    return tmp_path / "gmlp" / "cutedsl"


def _key(compiled, **changes):
    from gmlp.cutedsl.sm90.grouped_gemm import GroupedGemmSm90

    parts = dict(kernel=GroupedGemmSm90, config=compiled.config, arch="sm_90a", options="--enable-tvm-ffi")
    parts.update(changes)
    return compile_cache.kernel_key(parts["kernel"], parts["config"], parts["arch"], parts["options"])


def _must_not_compile():
    raise AssertionError("compiled although the cache holds the kernel")


def test_a_compiled_kernel_is_kept_and_the_next_lookup_loads_it(compiled, cache_dir):
    key = _key(compiled)
    assert compile_cache.load_or_compile(key, lambda: compiled.function) is compiled.function
    assert [path.name for path in compile_cache.entries()] == [key.file_name]
    assert key.file_name.startswith("groupedgemmsm90-") and (cache_dir / key.file_name).stat().st_size > 0
    loaded = compile_cache.load_or_compile(key, _must_not_compile)
    assert loaded is not compiled.function and callable(loaded)
    assert not [path for path in cache_dir.iterdir() if path.name.startswith(".")]  # no temporary left


def test_the_key_changes_with_config_arch_options_kernel_and_sources(compiled, monkeypatch):
    from dataclasses import replace

    from gmlp.cutedsl.sm90.fc1 import FC1ForwardSm90

    base = _key(compiled)
    variants = [_key(compiled, config=replace(compiled.config, tile_n=128)), _key(compiled, arch="sm_100a"),
                _key(compiled, options="--enable-tvm-ffi --opt-level 2"), _key(compiled, kernel=FC1ForwardSm90)]
    monkeypatch.setattr(compile_cache, "source_digest", lambda: "an edited kernel")
    variants.append(_key(compiled))
    digests = {base.digest, *(key.digest for key in variants)}
    assert len(digests) == 1 + len(variants)
    assert len({base.symbol, *(key.symbol for key in variants)}) == len(digests)


def test_an_unreadable_entry_is_reported_removed_and_compiled_again(compiled, cache_dir):
    key = _key(compiled)
    cache_dir.mkdir(parents=True)
    (cache_dir / key.file_name).write_bytes(b"not an object file")
    with pytest.warns(RuntimeWarning, match="could not be loaded.*compiling the kernel again"):
        assert compile_cache.load_or_compile(key, lambda: compiled.function) is compiled.function
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_cache.load_or_compile(key, _must_not_compile) is not compiled.function  # rewritten, loadable


def test_an_unwritable_cache_is_reported_and_the_kernel_still_returned(compiled, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(compile_cache.CACHE_DIR_ENV, str(blocker))
    with pytest.warns(RuntimeWarning, match="could not keep .*next process compiles this kernel again"):
        assert compile_cache.load_or_compile(_key(compiled), lambda: compiled.function) is compiled.function


def test_turned_off_it_compiles_every_time_and_writes_nothing(compiled, cache_dir, monkeypatch):
    monkeypatch.setenv(compile_cache.ENABLE_ENV, "0")
    calls = []
    for _ in range(2):
        compile_cache.load_or_compile(_key(compiled), lambda: calls.append(1) or compiled.function)
    assert len(calls) == 2 and not cache_dir.exists()


def test_clear_removes_every_entry(compiled, cache_dir):
    compile_cache.load_or_compile(_key(compiled), lambda: compiled.function)
    compile_cache.load_or_compile(_key(compiled, arch="sm_100a"), lambda: compiled.function)
    (cache_dir / ".groupedgemmsm90-half-written.o").write_bytes(b"")
    assert len(compile_cache.entries()) == 2
    assert compile_cache.clear() == 2
    assert list(cache_dir.iterdir()) == []


def test_the_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.cache_directory() == tmp_path / "xdg" / "gmlp" / "cutedsl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache.cache_directory() == type(tmp_path)(os.path.expanduser("~/.cache/gmlp/cutedsl"))


@pytest.mark.gpu
@pytest.mark.skipif(not on_sm90(), reason="needs an SM90 GPU (the runtime build)")
def test_a_loaded_kernel_computes_the_compiled_kernels_bits(cache_dir, monkeypatch):
    """The grouped GEMM's runtime build, cold (compiled, kept) then warm (loaded): same bits."""
    from gmlp.cutedsl.sm90 import _compile, grouped_gemm

    torch.manual_seed(0)
    split_sizes = torch.tensor([5, 0, 130, 64], dtype=torch.int32, device="cuda")
    a = torch.randn(int(split_sizes.sum()), 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 384, 256, device="cuda", dtype=torch.bfloat16)
    grouped_gemm._compile.cache_clear()  # this process's copy, so that the cache is read
    cold = grouped_gemm.grouped_gemm(a, b, split_sizes)
    assert len(compile_cache.entries()) == 1
    grouped_gemm._compile.cache_clear()
    monkeypatch.setattr(_compile.cute, "compile", lambda *args, **kwargs: _must_not_compile())
    warm = grouped_gemm.grouped_gemm(a, b, split_sizes)
    assert_same_bits(warm, cold, "grouped GEMM, loaded vs compiled")
