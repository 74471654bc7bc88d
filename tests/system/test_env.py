"""gmlp's environment variables (``gmlp.system.env``): the parser of their words and boolean
spellings, every variable checked wherever a plan is made (a typo raises on a CPU too, naming
the variable, the value and what is accepted), and the report the doctor prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import gmlp
from gmlp.system import env
from gmlp.system.env import parse_setting
from tests.support.cases import parametrize_quick

NAME = "GMLP_TEST_FLAG"


@pytest.mark.parametrize("value,expected", [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("Yes", True), ("on", True), ("ON", True),
    ("0", False), ("false", False), ("False", False), ("no", False), ("NO", False), ("off", False), (" off ", False),
])
def test_boolean_spellings(value, expected):
    assert parse_setting(NAME, value) is expected


@pytest.mark.parametrize("name,default", [("GMLP_VALIDATE", False), ("GMLP_COMPILE_CACHE", True)])
def test_unset_empty_or_blank_is_the_default(monkeypatch, name, default):
    monkeypatch.delenv(name, raising=False)
    assert env.setting(name) is default
    for blank in ("", "  "):
        monkeypatch.setenv(name, blank)
        assert env.setting(name) is default
    assert parse_setting(NAME, "") is None


@pytest.mark.parametrize("value", ["maybe", "2", "y", "enable"])
def test_other_values_raise_naming_variable_value_and_spellings(value):
    with pytest.raises(ValueError, match=rf"{NAME}='{value}': expected one of 1/0, true/false, yes/no, on/off"):
        parse_setting(NAME, value)


def test_setting_words_and_booleans():
    assert parse_setting(NAME, "Raise", ("warn", "raise")) == "raise"
    assert parse_setting(NAME, "on", ("warn", "raise")) is True
    with pytest.raises(ValueError, match=rf"{NAME}='loud': expected one of warn, raise, 1/0"):
        parse_setting(NAME, "loud", ("warn", "raise"))


@parametrize_quick("value,installed", [("1", True), ("0", False), ("yes", True), ("off", False)], keep=2)
def test_triton_ref_installs_the_interpreter_fixes_when_interpreting(value, installed):
    """gmlp.triton_ref decides at import (in a fresh interpreter, so this session's is untouched)."""
    code = "import sys, gmlp.triton_ref; print('gmlp.triton_ref._interpreter_fixes' in sys.modules)"
    env = {**os.environ, "TRITON_INTERPRET": value}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(installed)


def test_every_variable_named_in_gmlp_is_declared():
    """A variable that gmlp's code names (a read, a message, a docstring) is declared, so that a
    plan checks it and the doctor knows it."""
    package = os.path.dirname(gmlp.__file__)
    named = set()
    for folder, _, files in os.walk(package):
        for file in (f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, file)) as source:
                named |= set(re.findall(r"\bGMLP_[A-Z][A-Z0-9_]*", source.read()))
    declared = {variable.name for variable in env.variables()}
    assert named and named <= declared, named - declared
    assert "TRITON_INTERPRET" in declared


# (variable, a typo, what the error says); "{tmp}" is the test's temporary folder, which holds a
# file "a-file" that is not a tuned table (GMLP_CACHE_DIR and GMLP_COMMIT take any value)
TYPOS = [
    ("GMLP_STRICT", "ture", r"GMLP_STRICT='ture': expected one of cutedsl, triton, 1/0, true/false, yes/no, on/off"),
    ("GMLP_WARN_FALLBACK", "maybe", r"GMLP_WARN_FALLBACK='maybe': expected one of 1/0, true/false"),
    ("GMLP_BACKEND", "fastest", r"GMLP_BACKEND='fastest': expected one of cutedsl, triton, torch \(any case\)"),
    ("GMLP_CROSSCHECK", "loud", r"GMLP_CROSSCHECK='loud': expected one of warn, raise, 1/0"),
    ("GMLP_VALIDATE", "ture", r"GMLP_VALIDATE='ture': expected one of 1/0, true/false"),
    ("TRITON_INTERPRET", "maybe", r"TRITON_INTERPRET='maybe': expected one of 1/0, true/false"),
    ("GMLP_COMPILE_CACHE", "of", r"GMLP_COMPILE_CACHE='of': expected one of 1/0, true/false"),
    ("GMLP_SM90_CONFIG", "fc3.store=tma",
     r"GMLP_SM90_CONFIG='fc3.store=tma': 'fc3.store=tma' names op 'fc3'; the ops are \('grouped_gemm'"),
    ("GMLP_SM90_CONFIG", "store=regs,grouped_gemm.tiles=2",
     r"GMLP_SM90_CONFIG='store=regs,grouped_gemm.tiles=2': 'grouped_gemm.tiles=2' names knob 'tiles'; the knobs of "
     r"grouped_gemm are \('tile_n', 'store', 'cluster'\)"),
    ("GMLP_SM90_CONFIG", "store:tma", r"GMLP_SM90_CONFIG='store:tma': 'store:tma' is not knob=value or op.knob=value"),
    ("GMLP_SM90_CONFIG", "tile_n=64", r"GMLP_SM90_CONFIG='tile_n=64': 'tile_n=64' asks for tile_n '64'"),
    ("GMLP_SM90_TUNED", "{tmp}/missing.json",
     r"GMLP_SM90_TUNED='.*missing.json': the SM90 tuned table .* cannot be read: FileNotFoundError"),
    ("GMLP_SM90_TUNED", "{tmp}/a-file",
     r"GMLP_SM90_TUNED='.*a-file': the SM90 tuned table .* cannot be read: JSONDecodeError.* expected the path of a "
     r"tuned table file"),
]


@pytest.mark.parametrize("name,value,match", TYPOS, ids=[f"{name}={value}" for name, value, _ in TYPOS])
def test_a_typo_raises_wherever_a_plan_is_made_on_a_cpu(monkeypatch, tmp_path, name, value, match):
    """On a CPU, where the paths that read most of these at their use (a GPU's, a fallback's,
    CuTeDSL's) never run: a layer's plan (``explain``) and the quantize's raise, naming the
    variable, its value and what it accepts."""
    (tmp_path / "a-file").write_text("not a table")
    monkeypatch.setenv(name, value.format(tmp=tmp_path))
    with pytest.raises(ValueError, match=match):
        gmlp.GroupedMLP(2, 64, 64).explain(torch.zeros(8, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=match):
        gmlp.plan_quantize(torch.zeros(64, 64))


def test_a_typo_set_after_a_cached_plan_raises_at_the_next_call(monkeypatch):
    """The plan cache keys on every variable's value: the first call that sees a new value plans,
    and so checks, again."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")  # the layer on the torch twins: quick
    mlp = gmlp.GroupedMLP(2, 64, 64, recipe=None)
    x, split_sizes = torch.randn(8, 64, dtype=torch.bfloat16), torch.tensor([3, 5])
    mlp(x, split_sizes)
    monkeypatch.setenv("GMLP_VALIDATE", "ture")  # read at the call only for GPU tensors
    with pytest.raises(ValueError, match=r"GMLP_VALIDATE='ture'"):
        mlp(x, split_sizes)
    monkeypatch.setenv("GMLP_VALIDATE", "true")
    mlp(x, split_sizes)


def test_a_valid_tuned_table_and_forced_knobs_pass_the_check(monkeypatch, tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps(dict(device="NVIDIA H200", commit="abc1234", date="2026-12-04",
                                     measurements="bench_results/tune-test.json", entries=[])))
    monkeypatch.setenv("GMLP_SM90_TUNED", str(table))
    monkeypatch.setenv("GMLP_SM90_CONFIG", "store=regs, grouped_gemm.tile_n=128")
    monkeypatch.setenv("GMLP_CACHE_DIR", str(tmp_path / "not-yet-made"))
    env.check_environment()
    assert env.setting("GMLP_SM90_TUNED").entries == ()


def test_the_report_says_each_set_variable_its_meaning_or_its_error(monkeypatch):
    for name in [name for name in os.environ if name.startswith(env.PREFIX)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("GMLP_STRICT", "triton")
    monkeypatch.setenv("GMLP_BACKEND", "fast")
    monkeypatch.setenv("GMLP_VALIDAT", "1")
    found = {variable.name: variable for variable in env.report()}  # never raises
    assert list(found) == ["GMLP_BACKEND", "GMLP_STRICT", "GMLP_VALIDAT", "TRITON_INTERPRET"]
    assert found["GMLP_STRICT"].error is None and "below the path named" in found["GMLP_STRICT"].meaning
    assert found["GMLP_BACKEND"].error.startswith("environment variable GMLP_BACKEND='fast': expected one of cutedsl")
    assert found["GMLP_VALIDAT"].meaning.endswith("(misspelt GMLP_VALIDATE?)") and found["GMLP_VALIDAT"].error is None
    assert found["TRITON_INTERPRET"].value == "1" and "interpreter" in found["TRITON_INTERPRET"].meaning
