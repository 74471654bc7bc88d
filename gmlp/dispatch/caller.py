"""Warnings that point at the caller's line: the first frame outside gmlp and torch.

A fallback or cross-check warning is raised deep inside the layer (the forward op, the plan
cache, autograd's engine); a fixed ``stacklevel`` would name a gmlp or torch file, which tells
the user nothing. ``warn_at_caller`` walks the stack instead.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

__all__ = ["warn_at_caller"]

_GMLP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gmlp/, this file in gmlp/dispatch/
_INTERNAL_DIRS = (_GMLP_DIR + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def _internal(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_INTERNAL_DIRS)


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost frame outside gmlp and torch
    (the user's call; the outermost frame if every frame is internal)."""
    frame, level = sys._getframe(1), 2  # stacklevel 2: the function that called warn_at_caller
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
