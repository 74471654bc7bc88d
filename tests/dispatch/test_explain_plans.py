"""The layer plan's ``explain()`` for every simulated system and a spread of problems, pinned
against a committed text (tests/dispatch/explain_plans.txt): a change to the dispatcher that
changes a path or a reason shows up as a diff of that file. After an intended change, write the
file again with ``GMLP_UPDATE_GOLDEN=1 python -m pytest tests/dispatch/test_explain_plans.py`` and
review the diff.

Systems are simulated as in tests/dispatch/test_plan.py (capability, TRITON_INTERPRET, an
import that fails); the SM90 and SM100 answers need cutlass-dsl and cuDNN frontend to import
(the ``[test]`` install has both), so the test skips, saying why, where they do not."""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path as FilePath

import pytest
import torch

import gmlp
import gmlp.cutedsl
from gmlp.contract.gate_up import GateUpLayout
from gmlp.cutedsl.sm100 import cudnn_kernels
from gmlp.cutedsl.sm90 import support as sm90_support
from gmlp.dispatch import paths
from gmlp.dispatch.paths import FallbackError
from gmlp.dispatch.plan_cache import layer_problem
from gmlp.dispatch.plan import plan_layer

GOLDEN = FilePath(__file__).parent / "explain_plans.txt"
CACHED_ANSWERS = (paths._device_system_reason, gmlp.cutedsl.import_error, sm90_support.import_error,
                  cudnn_kernels.import_error)


def _problem(recipe=gmlp.MXFP8Recipe(), dtype=torch.bfloat16, activation="swiglu", hidden=128, bias=False,
             gate_up=GateUpLayout.HALVES, experts=4):
    mlp = gmlp.GroupedMLP(4, hidden, 128, activation=activation, recipe=recipe, dtype=dtype, bias=bias)
    config = dataclasses.replace(mlp._config(None, None), gate_up=gate_up)
    return layer_problem(config, 96, experts, hidden, 128, dtype, dtype, torch.device("cpu"))


PROBLEMS = {
    "mxfp8 swiglu": dict(),
    "mxfp8 e5m2-grads floor-scales srelu bias": dict(
        recipe=gmlp.MXFP8Recipe(grad_format=gmlp.ElementFormat.E5M2, scale_mode=gmlp.ScaleMode.FLOOR),
        activation="srelu", bias=True),
    "mxfp8 qgeglu H=96": dict(activation="qgeglu", hidden=96),
    "mxfp8 gate/up separate": dict(gate_up=GateUpLayout.SEPARATE),
    "mxfp8 gate/up interleaved": dict(gate_up=GateUpLayout.INTERLEAVED),
    "bf16 geglu bias": dict(recipe=None, activation="geglu", bias=True),
    "bf16 float32 parameters": dict(recipe=None, dtype=torch.float32),
    "bf16 5000 experts": dict(recipe=None, experts=5000),
    "fp8 blockwise swiglu": dict(recipe=gmlp.FP8BlockwiseRecipe()),
}


def _failing_import(module, prefix: str, error: Exception):
    """An ``import_module`` that raises ``error`` for names starting with ``prefix``."""
    real = importlib.import_module

    def import_module(name, *args):
        if name.startswith(prefix):
            raise error
        return real(name, *args)

    return import_module


# name -> (capability or None for the CPU, TRITON_INTERPRET, GMLP_BACKEND, failing imports:
# (module whose importlib is patched, name prefix, error))
SYSTEMS = {
    "cpu": (None, "0", None, ()),
    "cpu, TRITON_INTERPRET=1": (None, "1", None, ()),
    "sm80": ((8, 0), "0", None, ()),
    "sm89": ((8, 9), "0", None, ()),
    "sm90": ((9, 0), "0", None, ()),
    "sm90 without cutlass-dsl": ((9, 0), "0", None,
                                 ((gmlp.cutedsl, "gmlp.cutedsl.quantize", ModuleNotFoundError("No module named 'cutlass'")),
                                  (sm90_support, "gmlp.cutedsl.sm90.", ModuleNotFoundError("No module named 'cutlass'")))),
    "sm90, GMLP_BACKEND=triton": ((9, 0), "0", "triton", ()),
    "sm100": ((10, 0), "0", None, ()),
    "sm100 without cuDNN frontend's kernels": ((10, 0), "0", None,
                                               ((cudnn_kernels, "cudnn.", ModuleNotFoundError("No module named 'cudnn'")),)),
}


def _explain_all(monkeypatch) -> str:
    sections = []
    for system, (capability, interpret, backend, failing) in SYSTEMS.items():
        with monkeypatch.context() as patch:
            for cached in CACHED_ANSWERS:
                cached.cache_clear()
            patch.setattr(paths, "_warned", set())
            patch.setenv("TRITON_INTERPRET", interpret)
            for name in ("GMLP_WARN_FALLBACK", "GMLP_STRICT", "GMLP_BACKEND", "GMLP_SM90_CONFIG", "GMLP_SM90_TUNED"):
                patch.delenv(name, raising=False)
            if backend is not None:
                patch.setenv("GMLP_BACKEND", backend)
            if capability is not None:
                patch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
            for module, prefix, error in failing:
                patch.setattr(module.importlib, "import_module", _failing_import(module, prefix, error))
            device = torch.device("cpu" if capability is None else "cuda")
            for name, args in PROBLEMS.items():
                try:
                    plan = plan_layer(_problem(**args), device, strict=None)
                    references = ", ".join(f"{site}: {path.value if path else None}" for site, path in plan.references.items())
                    said = f"{plan.explain()}\ncross-checked against: {references}"
                except FallbackError as error:  # a forced backend that cannot run the problem
                    said = f"FallbackError: {error}"
                sections.append(f"## {system} | {name}\n{said}\n")
        for cached in CACHED_ANSWERS:
            cached.cache_clear()
    return "\n".join(sections)


def test_explain_matches_the_committed_plans(monkeypatch):
    for what, error in (("cutlass-dsl", gmlp.cutedsl.import_error()), ("cuDNN frontend", cudnn_kernels.import_error()),
                        ("the SM90 kernels", sm90_support.import_error())):
        if error is not None:
            pytest.skip(f"{what} does not import here, so the SM90 / SM100 plans differ from the committed ones: {error}")
    text = _explain_all(monkeypatch)
    if os.environ.get("GMLP_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), (f"explain() changed: rerun with GMLP_UPDATE_GOLDEN=1 and review the diff "
                                        f"of {GOLDEN.relative_to(FilePath.cwd()) if GOLDEN.is_relative_to(FilePath.cwd()) else GOLDEN}")
