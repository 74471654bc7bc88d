"""The quick run (``python -m pytest -m "not slow"``) covers every test module: each keeps at
least one test that is not ``slow`` (AGENTS.md, "Testing on a CPU"), but for the modules named
here with their reason."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
WHOLLY_SLOW = {
    # gloo processes running torchtitan's trainer pieces: 90 s and more on two cores
    "tests/integrations/test_torchtitan_distributed.py",
    # this module: its one test collects the whole suite again
    "tests/test_quick_run.py",
}


@pytest.mark.slow  # a second pytest collects the whole suite (about 10 s)
def test_every_test_module_keeps_a_quick_test():
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:xdist",
         "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    quick = {line.split("::")[0] for line in collected.splitlines() if "::" in line}
    modules = {path.relative_to(ROOT).as_posix() for path in TESTS.rglob("test_*.py")}
    assert quick <= modules  # the node ids read as the modules' paths
    assert modules - quick == WHOLLY_SLOW, "modules whose every test is slow: mark fewer slow, or name them here"
