"""Installed versions of the packages gmlp depends on, for reasons, reports and results."""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["package_version", "REPORTED_PACKAGES", "OLDEST_TESTED", "too_old", "CUTEDSL_PACKAGES",
           "INSTALL_COMMANDS", "missing_package_hint"]

REPORTED_PACKAGES = ("torch", "triton", "numpy", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend", "torchtitan")
# The oldest releases the kernels are tested with (the H200 machine's Triton; the cutlass-dsl the
# CuTeDSL kernels were written and compiled against).
OLDEST_TESTED = {"triton": "3.6.0", "nvidia-cutlass-dsl": "4.8.1"}
# The packages of the ``cutedsl`` extra (``pip install 'gmlp[cutedsl]'``): top-level module -> distribution.
CUTEDSL_PACKAGES = {"cutlass": "nvidia-cutlass-dsl", "cudnn": "nvidia-cudnn-frontend"}
CUTEDSL_INSTALL = "pip install 'gmlp[cutedsl]'"
# How to install each reported package that a core install may lack (torch comes first, by hand).
INSTALL_COMMANDS = {"triton": "pip install triton", "numpy": "pip install numpy",
                    **{name: CUTEDSL_INSTALL for name in CUTEDSL_PACKAGES.values()},
                    "torchtitan": "pip install 'gmlp[torchtitan]' (Python 3.11+)"}


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or "not installed"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def missing_package_hint(error: BaseException) -> str | None:
    """"<distribution> not installed: pip install 'gmlp[cutedsl]'" if ``error`` is a
    ModuleNotFoundError for a package of the ``cutedsl`` extra, else None.

    A missing top-level module (``cutlass``, ``cudnn``) names its distribution; a missing submodule
    of one does only where the distribution is not installed (else it is a version mismatch).
    """
    if not isinstance(error, ModuleNotFoundError):
        return None
    name = error.name
    if name is None:  # raised without name=: read it from the message
        match = re.search(r"No module named '([^']+)'", str(error))
        name = match.group(1) if match else None
    if name is None:
        return None
    top = name.split(".")[0]
    distribution = CUTEDSL_PACKAGES.get(top)
    if distribution is None or (name != top and package_version(distribution) != "not installed"):
        return None
    return f"{distribution} not installed: {CUTEDSL_INSTALL}"


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "3.7.0rc1+git1a2b" -> (3, 7, 0)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:  # a pre-release or local suffix ends the release
            break
    return tuple(numbers)


def too_old(name: str, installed: str | None = None) -> str | None:
    """A reason if the installed ``name`` is older than the oldest release gmlp is tested with."""
    installed = installed if installed is not None else package_version(name)
    oldest = OLDEST_TESTED[name]
    if installed == "not installed" or _release(installed) >= _release(oldest):
        return None
    return f"{name} {installed} is older than {oldest}, the oldest release gmlp's kernels are tested with"
