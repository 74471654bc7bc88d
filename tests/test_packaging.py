"""Packaging: the core install is the reference (torch, triton, einops, and numpy for Triton's
interpreter, which runs the main job's Triton kernels on a CPU); the CuTeDSL packages are
the ``cutedsl`` extra, pinned together, which the ``test`` extra (CI) includes with the
``torchtitan`` extra (Python 3.11+); and a missing
CuTeDSL package's fallback reason says which extra to install."""

from __future__ import annotations

import pathlib

import pytest
from packaging.requirements import Requirement

import gmlp.cutedsl
import gmlp.system.versions
from gmlp.contract.reasons import ReasonKind
from gmlp.cutedsl.sm100 import cudnn_kernels
from gmlp.system.versions import CUTEDSL_PACKAGES, missing_package_hint

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def _requirements(lines: list[str]) -> dict[str, Requirement]:
    return {req.name: req for req in map(Requirement, lines)}


def test_core_dependencies_are_the_reference_only():
    core = _requirements(_project()["dependencies"])
    assert set(core) == {"torch", "triton", "einops", "numpy"}
    assert not [name for name in core if "cutlass" in name or "cudnn" in name]


def test_the_cutedsl_extra_pins_the_tested_combination():
    cutedsl = _requirements(_project()["optional-dependencies"]["cutedsl"])
    assert {name: str(req.specifier) for name, req in cutedsl.items()} == {
        name: f"=={version}" for name, version in cudnn_kernels.TESTED_TOGETHER.items()}
    assert set(cutedsl) == set(CUTEDSL_PACKAGES.values())


def test_the_test_extra_includes_the_cutedsl_and_torchtitan_extras():
    lines = _project()["optional-dependencies"]["test"]
    own = [req for req in map(Requirement, lines) if req.name == _project()["name"]]
    extras = {extra: req for req in own for extra in req.extras}
    assert "cutedsl" in extras  # CI compiles the CuTeDSL kernels on the CPU
    assert "torchtitan" in extras and extras["torchtitan"].marker.evaluate({"python_version": "3.11"})
    assert not extras["torchtitan"].marker.evaluate({"python_version": "3.10"})  # torchtitan needs 3.11
    assert "pytest" in _requirements(lines)


def test_the_torchtitan_extra_pins_the_tested_release():
    torchtitan = _requirements(_project()["optional-dependencies"]["torchtitan"])
    assert {name: str(req.specifier) for name, req in torchtitan.items()} == {"torchtitan": "==0.3.0"}


def test_missing_package_hint():
    hint = "pip install 'gmlp[cutedsl]'"
    assert missing_package_hint(ModuleNotFoundError("No module named 'cutlass'", name="cutlass")) == (
        f"nvidia-cutlass-dsl not installed: {hint}")
    # raised without name=: the module is read from the message
    assert missing_package_hint(ModuleNotFoundError("No module named 'cudnn'")) == (
        f"nvidia-cudnn-frontend not installed: {hint}")
    assert missing_package_hint(ModuleNotFoundError("No module named 'numpy'", name="numpy")) is None
    assert missing_package_hint(ImportError("cannot import name 'LayoutEnum' from 'cutlass.utils'")) is None
    assert missing_package_hint(RuntimeError("No module named 'cutlass'")) is None


def test_a_missing_submodule_names_the_extra_only_where_the_package_is_not_installed(monkeypatch):
    error = ModuleNotFoundError("No module named 'cutlass.cute'", name="cutlass.cute")
    monkeypatch.setattr(gmlp.system.versions, "package_version", lambda name: "not installed")
    assert missing_package_hint(error) == "nvidia-cutlass-dsl not installed: pip install 'gmlp[cutedsl]'"
    monkeypatch.setattr(gmlp.system.versions, "package_version", lambda name: "4.8.1")
    assert missing_package_hint(error) is None


def test_the_cutedsl_import_reason_names_the_extra(monkeypatch):
    def import_module(name, *args):
        raise ModuleNotFoundError("No module named 'cutlass'", name="cutlass")

    monkeypatch.setattr(gmlp.cutedsl.importlib, "import_module", import_module)
    gmlp.cutedsl.import_error.cache_clear()
    try:
        reason = gmlp.cutedsl.import_error()
    finally:
        gmlp.cutedsl.import_error.cache_clear()
    assert reason.kind is ReasonKind.SYSTEM
    reason = reason.message
    assert reason.startswith("gmlp.cutedsl.quantize failed to import with nvidia-cutlass-dsl ")
    assert "ModuleNotFoundError: No module named 'cutlass'" in reason  # the original error text
    assert reason.endswith("; nvidia-cutlass-dsl not installed: pip install 'gmlp[cutedsl]'")
