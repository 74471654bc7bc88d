"""``python -m gmlp.bench``: the benches' command line."""

from __future__ import annotations

import sys

import pytest

from gmlp.bench import __main__ as bench_main


@pytest.mark.parametrize("bench", ["torchtitan", "ep"])
def test_a_torchtitan_bench_without_torchtitan_says_how_to_install_it(bench, monkeypatch):
    # an import of torchtitan or any of its modules (some already imported) fails as if not installed
    for module in ["torchtitan", *(name for name in sys.modules if name.startswith("torchtitan."))]:
        monkeypatch.setitem(sys.modules, module, None)
    for module in ("gmlp.bench.ep", "gmlp.bench.torchtitan"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(sys, "argv", ["gmlp.bench", bench])
    with pytest.raises(SystemExit, match=r"not installed: pip install -e '\.\[torchtitan\]'"):
        bench_main.main()


def test_an_unknown_bench_lists_the_benches(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gmlp.bench", "nope"])
    with pytest.raises(SystemExit, match="usage: python -m gmlp.bench {quantize,mlp,gemm,profile,host,torchtitan,ep}"):
        bench_main.main()
