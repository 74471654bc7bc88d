"""The SM90 kernels' epilogue store choice (``gmlp.cutedsl.sm90.launch_options``): defaults, where
the TMA store applies, ``GMLP_SM90_STORE``, and the same choice in ``explain()``'s words. Pure
Python: no cutlass-dsl needed."""

import pytest

from gmlp.cutedsl.sm90 import launch_options
from gmlp.cutedsl.sm90.launch_options import ENV, describe, forced_stores, store_for, tma_reason


def test_defaults_where_the_tma_store_applies(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert store_for("grouped_gemm") == "tma" and store_for("grouped_wgrad") == "tma"
    assert store_for("fc1_forward") == "tma" and store_for("fc2_dgrad") == "tma"
    assert describe("grouped_gemm") == "store=tma"


def test_variants_the_tma_store_does_not_take_get_the_register_store(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert tma_reason("grouped_gemm") is None and tma_reason("fc1_forward", bias=True) is None  # FC1 adds b1 itself
    assert tma_reason("grouped_gemm", bias=True) == "grouped_gemm's TMA store does not take a bias yet"
    assert tma_reason("grouped_wgrad", pingpong=True, decoded=True) == (
        "grouped_wgrad's TMA store does not take ping-pong or a decoded MXFP8 operand yet")
    assert store_for("grouped_gemm", bias=True) == "regs"
    assert describe("fc2_dgrad", quantized=True) == "store=regs (fc2_dgrad's TMA store does not take MXFP8 outputs yet)"
    with pytest.raises(ValueError, match=r"op must be one of \('grouped_gemm', .*\), got 'fc3'"):
        tma_reason("fc3")


def test_a_forced_store(monkeypatch):
    monkeypatch.setenv(ENV, "fc1_forward=tma, grouped_gemm=regs")
    assert forced_stores() == {"fc1_forward": "tma", "grouped_gemm": "regs"}
    assert store_for("fc1_forward") == "tma" and store_for("grouped_gemm") == "regs"
    assert store_for("grouped_wgrad") == "tma"  # not named: its default
    assert describe("grouped_gemm") == "store=regs (forced by GMLP_SM90_STORE)"
    # a forced TMA store where it does not apply is an error that says why, not a silent change
    with pytest.raises(ValueError, match=r"GMLP_SM90_STORE forces the TMA store for fc1_forward, but fc1_forward's "
                                         r"TMA store does not take MXFP8 outputs yet"):
        store_for("fc1_forward", quantized=True)
    assert describe("fc1_forward", quantized=True).startswith("store=tma forced by GMLP_SM90_STORE, which fails: ")
    monkeypatch.setenv(ENV, "regs")  # every op
    assert forced_stores() == dict.fromkeys(launch_options.DEFAULT_STORES, "regs")


@pytest.mark.parametrize("value,match", [
    ("fc3=tma", r"GMLP_SM90_STORE: 'fc3=tma' names op 'fc3'; the ops are \('grouped_gemm'"),
    ("grouped_gemm=smem", r"'grouped_gemm=smem' asks for store 'smem'; the stores are \('regs', 'tma'\)"),
])
def test_a_bad_forced_store_is_named(value, match):
    with pytest.raises(ValueError, match=match):
        forced_stores(value)
