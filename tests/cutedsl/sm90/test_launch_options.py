"""The SM90 kernels' launch knobs (``gmlp.cutedsl.sm90.launch_options``, ``gmlp.cutedsl.sm90.tuned``):
defaults, the tuned table's nearest entry, ``GMLP_SM90_CONFIG``, what a variant fixes, and the same
choice in ``explain()``'s words. Pure Python: no cutlass-dsl needed."""

import itertools
import json

import pytest

from gmlp.cutedsl.sm90 import launch_options, tuned
from gmlp.cutedsl.sm90.launch_options import DEFAULTS, ENV, choose, describe, forced_options

DEEPSEEK_FC2 = (32768, 7168, 2048, 32)  # (T, N, K, E)
QWEN3_FC2 = (65536, 2048, 768, 128)


def _table(tmp_path, entries) -> str:
    path = tmp_path / "table.json"
    path.write_text(json.dumps(dict(device="NVIDIA H200", commit="abc1234", date="2026-12-04",
                                    measurements="bench_results/tune-test.json", entries=entries)))
    return str(path)


def _entry(op, shape, n, k, rows, **options):
    return dict(op=op, site="fc2", shape=shape, n=n, k=k, rows_per_expert=rows, options=options,
                ratios=dict(balanced=1.0, skewed=1.0))


@pytest.fixture
def no_table(monkeypatch, tmp_path):
    """No forced knobs and an empty tuned table: the kernels' defaults."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv(tuned.ENV, _table(tmp_path, []))


@pytest.fixture
def two_shapes(monkeypatch, tmp_path):
    """A table tuned at two grouped-GEMM shapes, with different knobs."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv(tuned.ENV, _table(tmp_path, [
        _entry("grouped_gemm", "deepseek-v3-rank", 7168, 2048, 1024, tile_n=256, store="tma"),
        _entry("grouped_gemm", "qwen3-30b-a3b", 2048, 768, 512, tile_n=128, store="regs"),
    ]))


def test_defaults_without_a_table_entry(no_table):
    for op, knobs in DEFAULTS.items():
        choice = choose(op, *DEEPSEEK_FC2)
        assert choice.options == knobs and choice.source == "defaults" and not choice.notes
    assert describe("grouped_gemm", *DEEPSEEK_FC2) == "tile_n=256, store=tma, cluster=1 (defaults)"


def test_the_nearest_tuned_shape_gives_the_knobs(two_shapes):
    assert choose("grouped_gemm", *DEEPSEEK_FC2).options == dict(tile_n=256, store="tma", cluster=1)
    qwen = choose("grouped_gemm", *QWEN3_FC2)
    assert qwen.options == dict(tile_n=128, store="regs", cluster=1)
    assert qwen.source == "tuned on the NVIDIA H200 at qwen3-30b-a3b's fc2: N=2048, K=768, 512 rows/expert"
    # a shape between the two takes the nearer in log2 (N, K, rows per expert)
    assert choose("grouped_gemm", 16384, 4096, 1024, 32).options["tile_n"] == 128  # distances 3 / 2
    assert choose("grouped_gemm", 32768, 4096, 2048, 32).options["tile_n"] == 256  # distances 1 / 4
    assert choose("fc2_dgrad", *QWEN3_FC2).source == "defaults"  # no entry of that op


def test_a_variant_replaces_a_tuned_knob_and_says_so(two_shapes):
    assert choose("grouped_gemm", *DEEPSEEK_FC2, bias=True).options["store"] == "regs"
    assert describe("fc2_dgrad", *DEEPSEEK_FC2, quantized=True) == (
        "tile_n=128, store=regs, cluster=1 (defaults; store=regs, not the default tma: fc2_dgrad's "
        "TMA store does not take MXFP8 outputs yet; tile_n=128, not the default 256: the quantizing epilogue's tile is 128 columns wide)")
    assert "store=regs, not the table's tma: grouped_gemm's TMA store does not take a bias yet" in describe(
        "grouped_gemm", *DEEPSEEK_FC2, bias=True)


@pytest.mark.parametrize("op,variant,fixed", [
    ("fc2_dgrad", dict(quantized=True), dict(tile_n=128, store="regs")),
    ("fc1_forward", dict(quantized=True), dict(store="regs")),
    ("grouped_gemm", dict(bias=True), dict(store="regs")),
])
def test_what_each_variant_fixes(no_table, monkeypatch, op, variant, fixed):
    # every knob forced to the other value where it has one: the variant's value still wins
    # over the table and the defaults, and a forced conflicting knob is an error naming both
    options = choose(op, *DEEPSEEK_FC2, **variant).options
    assert {knob: options[knob] for knob in fixed} == fixed
    knob, value = next(iter(fixed.items()))
    other = {"store": "tma", "tile_n": 256}[knob]
    monkeypatch.setenv(ENV, f"{op}.{knob}={str(other).lower()}")
    with pytest.raises(ValueError, match=rf"{ENV} forces {op}.{knob}={other}, but .* \({knob}={value}\)"):
        choose(op, *DEEPSEEK_FC2, **variant)
    assert describe(op, *DEEPSEEK_FC2, **variant).startswith(f"{ENV} fails: ")


def test_forced_knobs_beat_the_table(two_shapes, monkeypatch):
    monkeypatch.setenv(ENV, "grouped_gemm.tile_n=256, store=regs")
    assert forced_options() == {"grouped_gemm": dict(tile_n=256, store="regs"),
                                **{op: dict(store="regs") for op, knobs in DEFAULTS.items()
                                   if op != "grouped_gemm" and "store" in knobs}}
    choice = choose("grouped_gemm", *QWEN3_FC2)
    assert choice.options == dict(tile_n=256, store="regs", cluster=1)
    assert choice.forced == ("tile_n", "store")
    assert describe("grouped_gemm", *QWEN3_FC2).endswith(
        "512 rows/expert; tile_n forced by GMLP_SM90_CONFIG; store forced by GMLP_SM90_CONFIG)")


def test_a_launcher_keeps_the_knobs_it_is_given(two_shapes, monkeypatch):
    given = dict(tile_n=256, store=None, cluster=None)
    assert launch_options.launch_options("grouped_gemm", *QWEN3_FC2, given) == dict(tile_n=256, store="regs",
                                                                                      cluster=1)
    every = dict(tile_n=128, store="tma", cluster=1)
    assert launch_options.launch_options("grouped_gemm", *QWEN3_FC2, every) is every  # nothing to choose
    monkeypatch.setenv(ENV, "grouped_gemm.tile_n=256")  # a new value of the variable: chosen again, not cached
    assert launch_options.launch_options("grouped_gemm", *DEEPSEEK_FC2, dict(tile_n=None))["tile_n"] == 256


@pytest.mark.parametrize("value,match", [
    ("fc3.store=tma", r"GMLP_SM90_CONFIG='fc3.store=tma': 'fc3.store=tma' names op 'fc3'; the ops are \('grouped_gemm'"),
    ("grouped_gemm.ragged_tma=1",
     r"names knob 'ragged_tma'; the knobs of grouped_gemm are \('tile_n', 'store', 'cluster'\)"),
    ("tiles=2",
     r"names knob 'tiles'; the knobs are \('tile_n', 'store', 'cluster', 'ragged_tma', 'wide', 'pipelined'\)"),
    ("grouped_wgrad.pingpong=1",  # a removed knob (docs/design.md, what was tried)
     r"names knob 'pingpong'; the knobs of grouped_wgrad are \('tile_n', 'ragged_tma', 'store', 'cluster'\)"),
    ("store=smem", r"'store=smem' asks for store 'smem'; the stores are \('regs', 'tma'\)"),
    ("tile_n=64", r"'tile_n=64' asks for tile_n '64'; the widths are \(128, 256\)"),
    ("ragged_tma=maybe", r"'ragged_tma=maybe': ragged_tma takes one of \('1', 'true'"),
    ("store", r"'store' is not knob=value or op.knob=value"),
])
def test_a_bad_forced_knob_is_named(value, match):
    with pytest.raises(ValueError, match=match):
        forced_options(value)


def test_a_malformed_table_is_named(monkeypatch, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(dict(device="H200", entries=[])))
    monkeypatch.setenv(tuned.ENV, str(path))
    with pytest.raises(ValueError, match=r"the SM90 tuned table .*bad.json cannot be read: KeyError: 'commit'"):
        choose("grouped_gemm", *DEEPSEEK_FC2)
    monkeypatch.setenv(tuned.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"missing.json cannot be read: FileNotFoundError"):
        choose("grouped_gemm", *DEEPSEEK_FC2)


def test_the_package_table_is_valid():
    """The committed table reads and names known ops and knobs with legal values (that each entry is
    its measurements' fastest candidate: tests/bench/test_tune.py). An entry may lack a knob added
    after its tuner run (``cluster`` in the H200's of 2026-12-04): that knob takes its default."""
    assert tuned.TABLE_FILE.exists(), f"the package's tuned table {tuned.TABLE_FILE} is missing"
    current = tuned.read_table(tuned.TABLE_FILE)
    assert current.entries, "an empty table: the tuner writes at least one entry per op it tuned"
    for entry in current.entries:
        assert entry.options and set(entry.options) <= set(DEFAULTS[entry.op]), entry
        items = ",".join(f"{entry.op}.{knob}={str(value).lower()}" for knob, value in entry.options.items())
        assert forced_options(items)[entry.op] == entry.options  # every value parses as a forced one would
        assert set(entry.ratios) == {"balanced", "skewed"} and all(r > 0 for r in entry.ratios.values())


def test_fc2_dgrads_quantized_tile_width_is_its_epilogues():
    pytest.importorskip("cutlass")
    from gmlp.cutedsl.sm90 import _quantize_epilogue, fc2_dgrad

    assert launch_options.QUANTIZED_TILE_N == fc2_dgrad.QUANTIZED_TILE_N == _quantize_epilogue.TILE_COLS


def test_a_site_takes_its_own_entry_before_a_nearer_one_of_another_site(monkeypatch, tmp_path):
    """The grouped GEMM runs FC2 and FC1 dgrad: a launch at FC1 dgrad's site reads FC1 dgrad's entry
    even where FC2's is nearer in shape; without a site (a direct launcher call), the nearest."""
    monkeypatch.delenv(ENV, raising=False)
    fc1_dgrad = dict(_entry("grouped_gemm", "deepseek-v3-rank", 7168, 4096, 1024, tile_n=128, store="regs"),
                     site="fc1 dgrad")
    monkeypatch.setenv(tuned.ENV, _table(tmp_path, [
        _entry("grouped_gemm", "deepseek-v3-rank", 7168, 2048, 1024, tile_n=256, store="tma"),
        fc1_dgrad]))
    launch = (32768, 7168, 2048, 32)  # FC2's shape exactly
    assert choose("grouped_gemm", *launch).options["tile_n"] == 256
    chosen = choose("grouped_gemm", *launch, site="fc1 dgrad")
    assert chosen.options == dict(tile_n=128, store="regs", cluster=1) and "fc1 dgrad" in chosen.source
    assert choose("grouped_gemm", *launch, site="fc1 wgrad").options["tile_n"] == 256  # no entry: the nearest
    assert "fc1 dgrad" in describe("grouped_gemm", *launch, site="fc1 dgrad")


def test_the_layer_launches_each_sm90_gemm_with_its_site():
    """The SM90 provider binds the site to the launchers that choose launch knobs (the blockwise
    ones choose none and take no site)."""
    pytest.importorskip("cutlass")
    from gmlp.dispatch.providers.cutedsl_sm90 import PROVIDER
    from gmlp.dispatch.sites import SITES

    fc1_dgrad = PROVIDER.load(SITES["fc1 dgrad"])
    assert fc1_dgrad.func.__name__ == "grouped_gemm" and fc1_dgrad.keywords == dict(site="fc1 dgrad")
    assert PROVIDER.load(SITES["fc2 wgrad"]).keywords == dict(site="fc2 wgrad")


def test_a_launch_reads_its_recipes_entries_first(monkeypatch, tmp_path):
    """FC2 dgrad writing MXFP8 outputs reads the entry tuned for that variant (recipe mxfp8); the
    bf16 launch reads the bf16 one; an unknown recipe in a table is an error naming it."""
    monkeypatch.delenv(ENV, raising=False)
    bf16 = dict(_entry("fc2_dgrad", "deepseek-v3-rank", 2048, 7168, 1024, tile_n=256, store="tma", cluster=1),
                site="fc2 dgrad")
    mxfp8 = dict(bf16, recipe="mxfp8", options=dict(tile_n=128, store="regs", cluster=2))
    monkeypatch.setenv(tuned.ENV, _table(tmp_path, [bf16, mxfp8]))
    launch = (32768, 2048, 7168, 32)
    assert choose("fc2_dgrad", *launch, site="fc2 dgrad").options == dict(tile_n=256, store="tma", cluster=1)
    quantized = choose("fc2_dgrad", *launch, site="fc2 dgrad", quantized=True)
    assert quantized.options == dict(tile_n=128, store="regs", cluster=2) and not quantized.notes
    assert "fc2 dgrad (mxfp8)" in quantized.source
    # an MXFP8 launch without an entry of its recipe reads the bf16 one, its variant's fixes applied
    (tmp_path / "bf16-only").mkdir()  # another file: a table is read once per value of the variable
    monkeypatch.setenv(tuned.ENV, _table(tmp_path / "bf16-only", [bf16]))
    fallback = choose("fc2_dgrad", *launch, site="fc2 dgrad", quantized=True)
    assert fallback.options == dict(tile_n=128, store="regs", cluster=1) and len(fallback.notes) == 2
    (tmp_path / "unknown").mkdir()
    monkeypatch.setenv(tuned.ENV, _table(tmp_path / "unknown", [dict(bf16, recipe="fp4")]))
    with pytest.raises(ValueError, match=r"recipe 'fp4' is not one of \('bf16', 'mxfp8', 'fp8-blockwise'\)"):
        choose("fc2_dgrad", *launch)


@pytest.mark.parametrize("op,count", [("fc1_forward", 2), ("fc2_dgrad", 2)])
def test_the_quantizing_variants_candidates(op, count):
    """What the MXFP8 epilogues leave free to tune: the cluster (their store and tile are fixed)."""
    found = launch_options.candidates(op, quantized=True)
    assert len(found) == count and {c["cluster"] for c in found} == {1, 2}
    assert all(c["store"] == "regs" and c.get("tile_n", 128) == 128 for c in found)


def test_the_blockwise_kernels_knobs(no_table, monkeypatch, tmp_path):
    """The FP8 blockwise kernels: wide items where the columns allow (a note says why not), their
    own recipe's entries (never a bf16 entry of another op), and every combination of wide and
    cluster as candidates."""
    assert launch_options.recipe_of("grouped_gemm_fp8_blockwise") == "fp8-blockwise"
    assert launch_options.recipe_of("fc2_dgrad", quantized=True) == "mxfp8"
    assert choose("grouped_gemm_fp8_blockwise", *DEEPSEEK_FC2).options == dict(wide=True, cluster=1, pipelined=False,
                                                                                store="tma")
    narrow = choose("grouped_gemm_fp8_blockwise", 65536, 640, 768, 128)  # N = 640: not two halves
    assert narrow.options == dict(wide=False, cluster=1, pipelined=False, store="tma")
    assert narrow.notes == ("wide=False, not the default True: 640 columns are not a multiple of 256 (two "
                            "128-column halves an item)",)
    # the weight gradient's items split dW's N: the launch's k (its (n, k) are dW's (M, N))
    assert choose("grouped_wgrad_fp8_blockwise", 65536, 2048, 640, 128).options["wide"] is False
    assert choose("grouped_wgrad_fp8_blockwise", 65536, 640, 2048, 128).options["wide"] is True
    # given wide=True where N does not allow it: kept, for the launcher to refuse
    assert launch_options.launch_options("grouped_gemm_fp8_blockwise", 65536, 640, 768, 128,
                                         dict(wide=True, cluster=None, pipelined=None))["wide"] is True
    wgrad = launch_options.candidates("grouped_wgrad_fp8_blockwise")
    assert wgrad[0] == dict(wide=True, cluster=1, store="tma") and len(wgrad) == 8
    assert {tuple(c.values()) for c in wgrad} == set(itertools.product((False, True), (1, 2), ("regs", "tma")))
    assert launch_options.candidates("fc1_forward_blockwise") == [dict(cluster=1), dict(cluster=2)]
    bf16 = dict(_entry("grouped_gemm", "deepseek-v3-rank", 7168, 2048, 1024, tile_n=128, store="tma", cluster=2))
    blockwise = dict(_entry("grouped_gemm_fp8_blockwise", "deepseek-v3-rank", 7168, 2048, 1024, wide=False, cluster=2),
                     recipe="fp8-blockwise")
    (tmp_path / "blockwise").mkdir()  # another file: a table is read once per value of the variable
    monkeypatch.setenv(tuned.ENV, _table(tmp_path / "blockwise", [bf16, blockwise]))
    chosen = choose("grouped_gemm_fp8_blockwise", *DEEPSEEK_FC2, site="fc2")
    assert chosen.options == dict(wide=False, cluster=2, pipelined=False, store="tma")
    assert "fc2 (fp8-blockwise)" in chosen.source
    assert choose("fc2_dgrad_blockwise", *DEEPSEEK_FC2).source == "defaults"  # no entry of its op


def test_the_pipelined_promotion_takes_one_half(no_table, monkeypatch):
    """The blockwise token-row kernels' pipelined promotion: off by default, fixed off beside wide
    items (two halves: a note, or an error where GMLP_SM90_CONFIG forces it), a candidate with
    narrow ones and with FC2 dgrad's one half; FC1 (gate and up halves) has no such knob."""
    assert DEFAULTS["grouped_gemm_fp8_blockwise"]["pipelined"] is False
    assert DEFAULTS["fc2_dgrad_blockwise"]["pipelined"] is False and "pipelined" not in DEFAULTS["fc1_forward_blockwise"]
    gemm = launch_options.candidates("grouped_gemm_fp8_blockwise")
    assert gemm[0] == dict(wide=True, cluster=1, pipelined=False, store="tma") and len(gemm) == 12
    # pipelined only with narrow items, each of the six with either store
    assert {tuple(c.values()) for c in gemm} == {
        (wide, cluster, pipelined, store) for wide, cluster, pipelined, store
        in itertools.product((False, True), (1, 2), (False, True), ("regs", "tma")) if not (wide and pipelined)}
    assert len(launch_options.candidates("fc2_dgrad_blockwise")) == 4
    monkeypatch.setenv(ENV, "pipelined=true")
    with pytest.raises(ValueError, match=r"GMLP_SM90_CONFIG forces grouped_gemm_fp8_blockwise.pipelined=True, but wide "
                                         r"items have two halves: its second fp32 partial fragment fits a consumer "
                                         r"thread's 232 registers beside one 128-column half's accumulators, not two "
                                         r"\(pipelined=False\)"):
        choose("grouped_gemm_fp8_blockwise", *DEEPSEEK_FC2)
    assert choose("grouped_gemm_fp8_blockwise", 65536, 640, 768, 128).options == dict(wide=False, cluster=1,
                                                                                     pipelined=True, store="tma")
    assert choose("fc2_dgrad_blockwise", *DEEPSEEK_FC2).options == dict(cluster=1, pipelined=True)
    monkeypatch.setenv(ENV, "pipelined=true,grouped_gemm_fp8_blockwise.wide=false")
    assert choose("grouped_gemm_fp8_blockwise", *DEEPSEEK_FC2).options == dict(wide=False, cluster=1, pipelined=True,
                                                                                store="tma")
    monkeypatch.setenv(ENV, "grouped_gemm_fp8_blockwise.wide=false")
    assert choose("grouped_gemm_fp8_blockwise", *DEEPSEEK_FC2).options["pipelined"] is False
    # given pipelined=True beside the default wide items: kept, for the config to refuse
    assert launch_options.launch_options("grouped_gemm_fp8_blockwise", *DEEPSEEK_FC2,
                                         dict(wide=None, cluster=None, pipelined=True))["pipelined"] is True

