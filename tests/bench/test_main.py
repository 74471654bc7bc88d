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
    with pytest.raises(SystemExit, match=r"unknown bench 'nope'\nusage: python -m gmlp.bench BENCH") as exit_:
        bench_main.main()
    assert all(f"  {name} " in str(exit_.value) for name in bench_main.BENCHES)


def test_help_lists_every_bench_with_a_line_each(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gmlp.bench", "--help"])
    bench_main.main()
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in lines if line.startswith("  ")}
    assert set(listed) == {"quantize", "mlp", "gemm", "tune", "profile", "memory", "ncu", "host", "torchtitan", "ep",
                           "standings"}
    assert "--device cpu" in listed["torchtitan"]  # the smoke run that works without a GPU


@pytest.mark.parametrize("name, label", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                         ("NVIDIA GeForce RTX 4090", "geforce"), ("Tesla-X", "teslax")])
def test_result_files_name_the_gpu_they_ran_on(name, label, monkeypatch):
    import torch

    from gmlp.bench.common import device_label

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert device_label(torch.device("cuda")) == label
    assert device_label(torch.device("cpu")) == "cpu"
