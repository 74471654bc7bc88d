"""The parser of gmlp's boolean environment variables (``gmlp.system.env``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gmlp.system.env import env_flag, env_setting
from tests.support.cases import parametrize_quick

NAME = "GMLP_TEST_FLAG"


@pytest.mark.parametrize("value,expected", [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("Yes", True), ("on", True), ("ON", True),
    ("0", False), ("false", False), ("False", False), ("no", False), ("NO", False), ("off", False), (" off ", False),
])
def test_boolean_spellings(monkeypatch, value, expected):
    monkeypatch.setenv(NAME, value)
    assert env_flag(NAME) is expected
    assert env_flag(NAME, default=True) is expected


@pytest.mark.parametrize("default", [False, True])
def test_unset_or_empty_is_the_default(monkeypatch, default):
    monkeypatch.delenv(NAME, raising=False)
    assert env_flag(NAME, default) is default
    monkeypatch.setenv(NAME, "")
    assert env_flag(NAME, default) is default


@pytest.mark.parametrize("value", ["maybe", "2", "y", "enable"])
def test_other_values_raise_naming_variable_value_and_spellings(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ValueError, match=rf"{NAME}='{value}': expected one of 1/0, true/false, yes/no, on/off"):
        env_flag(NAME)


def test_setting_words_and_booleans(monkeypatch):
    monkeypatch.setenv(NAME, "Raise")
    assert env_setting(NAME, ("warn", "raise")) == "raise"
    monkeypatch.setenv(NAME, "on")
    assert env_setting(NAME, ("warn", "raise")) is True
    monkeypatch.setenv(NAME, "loud")
    with pytest.raises(ValueError, match=rf"{NAME}='loud': expected one of warn, raise, 1/0"):
        env_setting(NAME, ("warn", "raise"))


@parametrize_quick("value,installed", [("1", True), ("0", False), ("yes", True), ("off", False)], keep=2)
def test_triton_ref_installs_the_interpreter_fixes_when_interpreting(value, installed):
    """gmlp.triton_ref decides at import (in a fresh interpreter, so this session's is untouched)."""
    code = "import sys, gmlp.triton_ref; print('gmlp.triton_ref._interpreter_fixes' in sys.modules)"
    env = {**os.environ, "TRITON_INTERPRET": value}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(installed)
