"""Installed versions of the packages gmlp depends on, for reasons, reports and results."""

from __future__ import annotations

import importlib.metadata

__all__ = ["package_version", "REPORTED_PACKAGES"]

REPORTED_PACKAGES = ("torch", "triton", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend")


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or "not installed"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
