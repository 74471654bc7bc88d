"""The cuDNN frontend kernels of the SM100 path import with the installed cutlass-dsl, the
pinned versions are the installed ones (a new combination must be tested, then pinned), and a
missing package's reason says which extra to install."""

from __future__ import annotations

import pytest

import gmlp.system.versions
from gmlp.contract.reasons import ReasonKind
from gmlp.cutedsl.sm100 import cudnn_kernels
from gmlp.system.versions import package_version


def _installed() -> dict[str, str]:
    return {name: package_version(name) for name in cudnn_kernels.TESTED_TOGETHER}


def test_kernels_import_with_the_installed_cutlass_dsl():
    if "not installed" in _installed().values():
        pytest.skip(f"not installed here: {_installed()}")
    cudnn_kernels.import_error.cache_clear()
    assert cudnn_kernels.import_error() is None
    for step in cudnn_kernels.KERNELS:
        assert cudnn_kernels.kernel_class(step).__name__.endswith("Sm100")


def test_installed_versions_are_the_pinned_ones():
    if "not installed" in _installed().values():
        pytest.skip(f"not installed here: {_installed()}")
    assert _installed() == cudnn_kernels.TESTED_TOGETHER, (
        "a cutlass-dsl / cuDNN frontend combination other than the tested one: run the SM100 compile tests, "
        "then update TESTED_TOGETHER and pyproject.toml")


def test_an_import_failure_is_reported_with_versions_and_error(monkeypatch):
    cudnn_kernels.import_error.cache_clear()
    real = cudnn_kernels.importlib.import_module

    def import_module(name, *args):
        if name == "cudnn.gemm.cutedsl.grouped.dglu.api":
            raise ImportError("cannot import name 'LayoutEnum' from 'cutlass.utils'")
        return real(name, *args)

    monkeypatch.setattr(cudnn_kernels.importlib, "import_module", import_module)
    try:
        reason = cudnn_kernels.import_error()
        assert reason.kind is ReasonKind.SYSTEM
        reason = reason.message
        if "not installed" in _installed().values() and "No module named" in reason:
            pytest.skip("cuDNN frontend is not installed here")
        assert reason.startswith("cudnn.gemm.cutedsl.grouped.dglu.api.GroupedGemmDgluSm100 failed to import with")
        assert "nvidia-cutlass-dsl" in reason and "cannot import name 'LayoutEnum'" in reason
        with pytest.raises(ImportError, match="LayoutEnum"):
            cudnn_kernels.kernel_class("wgrad")
    finally:
        cudnn_kernels.import_error.cache_clear()


def _missing(monkeypatch, error: ModuleNotFoundError) -> str:
    """The reason when every cuDNN frontend kernel module import raises ``error``."""
    def import_module(name, *args):
        raise error

    monkeypatch.setattr(cudnn_kernels.importlib, "import_module", import_module)
    cudnn_kernels.import_error.cache_clear()
    try:
        return cudnn_kernels.import_error().message
    finally:
        cudnn_kernels.import_error.cache_clear()


def test_a_missing_package_reason_names_the_extra(monkeypatch):
    for module, distribution in (("cudnn", "nvidia-cudnn-frontend"), ("cutlass", "nvidia-cutlass-dsl")):
        reason = _missing(monkeypatch, ModuleNotFoundError(f"No module named '{module}'", name=module))
        assert reason.startswith("cudnn.gemm.cutedsl.grouped.glu.api.GroupedGemmGluSm100 failed to import with")
        assert f"ModuleNotFoundError: No module named '{module}'" in reason  # the original error text
        assert reason.endswith(f"; {distribution} not installed: pip install 'gmlp[cutedsl]'")


def test_a_missing_submodule_of_an_installed_package_is_no_install_hint(monkeypatch):
    monkeypatch.setattr(gmlp.system.versions, "package_version", lambda name: cudnn_kernels.TESTED_TOGETHER[name])
    module = "cudnn.gemm.cutedsl.grouped.glu"  # a cuDNN frontend release without the grouped kernels
    reason = _missing(monkeypatch, ModuleNotFoundError(f"No module named '{module}'", name=module))
    assert reason.endswith(f"ModuleNotFoundError: No module named '{module}'") and "gmlp[cutedsl]" not in reason
