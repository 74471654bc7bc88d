"""Every SM90 kernel is a site of the one kernel skeleton (``gmlp.cutedsl.sm90._engine``): its class
derives from ``GroupedGemmEngine`` and defines no ``@cute.kernel`` of its own, so a lever built
into the skeleton (a schedule, clusters) reaches every site. The skeleton's code itself is checked
by each site's compile and GPU tests and by the golden PTX test."""

from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest

from gmlp.cutedsl import import_error
from tests.support.cases import parametrize_quick

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

SITES = {  # kernel module -> its kernel class
    "grouped_gemm": "GroupedGemmSm90",
    "fc1": "FC1ForwardSm90",
    "fc2_dgrad": "FC2DgradSm90",
    "wgrad": "GroupedWgradSm90",
    "blockwise_gemm": "BlockwiseGemmSm90",
    "blockwise_fc1": "BlockwiseFC1Sm90",
    "blockwise_fc2_dgrad": "BlockwiseFC2DgradSm90",
    "blockwise_wgrad": "BlockwiseWgradSm90",
}
HOOKS = ("tma_atoms", "slots", "work", "produce", "mainloop", "consumer_setup", "epilogue", "finish")


def _site(module_name: str) -> type:
    return getattr(importlib.import_module(f"gmlp.cutedsl.sm90.{module_name}"), SITES[module_name])


@parametrize_quick("module_name", list(SITES))
def test_every_kernel_is_a_site_of_the_engine(module_name):
    from gmlp.cutedsl.sm90._engine import GroupedGemmEngine

    site = _site(module_name)
    assert issubclass(site, GroupedGemmEngine)
    assert "kernel" not in vars(site), f"{site.__name__} defines its own kernel instead of the engine's"
    for hook in HOOKS:  # each hook resolves (the site's or a policy's or the engine's default)
        assert callable(getattr(site, hook, None)), f"{site.__name__} lacks the hook {hook}"


def test_every_kernel_module_is_listed():
    """A kernel class (``*Sm90``) in any public module of the package is one of ``SITES``."""
    import gmlp.cutedsl.sm90 as package

    found = set()
    for file in pathlib.Path(package.__file__).parent.glob("*.py"):
        if file.stem.startswith("_"):
            continue
        module = importlib.import_module(f"gmlp.cutedsl.sm90.{file.stem}")
        found.update({(file.stem, name) for name, value in vars(module).items()
                      if inspect.isclass(value) and name.endswith("Sm90") and value.__module__ == module.__name__})
    assert found == {(module, name) for module, name in SITES.items()}
