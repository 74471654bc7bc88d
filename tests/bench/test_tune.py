"""The SM90 tuner's choice and table (``gmlp.bench.tune``), on made-up timings: no GPU needed."""

import json
import pathlib

import pytest

from gmlp.bench import tune
from gmlp.cutedsl.sm90 import tuned
from gmlp.cutedsl.sm90.launch_options import DEFAULTS, candidates

ENV = {"device": "NVIDIA H200", "commit": "abc1234", "nvidia-cutlass-dsl": "4.8.1"}


def _row(site, options, routing, ratio, shape="qwen3-30b-a3b"):
    return dict(shape=shape, routing=routing, site=site, options=options, ratio=ratio)


def test_the_best_geometric_mean_over_both_routings_wins():
    wide, narrow, broken = dict(tile_n=256), dict(tile_n=128), dict(tile_n=128, store="tma")
    rows = [_row("fc2", wide, "balanced", 1.10), _row("fc2", wide, "skewed", 0.80),  # geomean 0.938
            _row("fc2", narrow, "balanced", 0.95), _row("fc2", narrow, "skewed", 0.95),  # 0.95
            _row("fc2", broken, "balanced", 2.0), _row("fc2", broken, "skewed", None)]  # failed once: out
    best = tune.choose(rows)
    assert best[("qwen3-30b-a3b", "fc2", "bf16")]["options"] == narrow
    assert best[("qwen3-30b-a3b", "fc2", "bf16")]["geomean"] == pytest.approx(0.95)
    with pytest.raises(RuntimeError, match=r"no candidate ran at every routing for \('qwen3-30b-a3b', 'fc1', 'bf16'\)"):
        tune.choose([_row("fc1", dict(store="tma"), "balanced", 1.0)])


def test_entries_carry_each_sites_launch_shape():
    best = {("deepseek-v3-rank", site, "bf16"): dict(options=dict(DEFAULTS[op]), ratios=dict(balanced=1.0, skewed=0.9))
            for site, op in (("fc1", "fc1_forward"), ("fc1 dgrad", "grouped_gemm"), ("fc1 wgrad", "grouped_wgrad"))}
    entries = {entry["site"]: entry for entry in tune.table_entries(best, "NVIDIA H200")}
    # DeepSeek-V3 rank: E=32, T=32768, H=7168, F=2048
    assert (entries["fc1"]["op"], entries["fc1"]["n"], entries["fc1"]["k"]) == ("fc1_forward", 4096, 7168)
    assert (entries["fc1 dgrad"]["n"], entries["fc1 dgrad"]["k"]) == (7168, 4096)
    assert (entries["fc1 wgrad"]["n"], entries["fc1 wgrad"]["k"]) == (4096, 7168)
    assert entries["fc1"]["rows_per_expert"] == 1024 and entries["fc1"]["device"] == "NVIDIA H200"


def test_the_table_merges_and_reads_back(tmp_path):
    path = tmp_path / "table.json"
    narrow = dict(tile_n=128, store="regs")
    first = tune.table_entries({("qwen3-30b-a3b", "fc2", "bf16"): dict(options=narrow,
                                                                       ratios=dict(balanced=1.0, skewed=1.0))},
                               ENV["device"])
    path.write_text(json.dumps(tune.merged_table(path, first, ENV, "bench_results/tune-1.json")))
    second = tune.table_entries({("deepseek-v3-rank", "fc2", "bf16"): dict(options=dict(DEFAULTS["grouped_gemm"]),
                                                                   ratios=dict(balanced=1.0, skewed=0.98))},
                                ENV["device"])
    path.write_text(json.dumps(tune.merged_table(path, second, ENV, "bench_results/tune-2.json")))
    table = tuned.read_table(path)
    assert [entry.shape for entry in table.entries] == ["deepseek-v3-rank", "qwen3-30b-a3b"]  # both kept
    assert table.measurements == "bench_results/tune-2.json"
    assert {entry.device for entry in table.entries} == {"NVIDIA H200"}
    assert table.entries[1].options == dict(tile_n=128, store="regs")
    retuned = tune.table_entries({("qwen3-30b-a3b", "fc2", "bf16"): dict(options=dict(DEFAULTS["grouped_gemm"]),
                                                                 ratios=dict(balanced=1.1, skewed=1.0))},
                                 ENV["device"])
    path.write_text(json.dumps(tune.merged_table(path, retuned, ENV, "bench_results/tune-3.json")))
    assert [entry.options for entry in tuned.read_table(path).entries] == [DEFAULTS["grouped_gemm"]] * 2  # replaced


def test_each_card_keeps_its_entries_and_launches_read_their_own(tmp_path, monkeypatch):
    """Tuning on an H100 adds its entries beside the H200's (same site and shape, other knobs); a
    launch reads its own card's, and another card's only where its own has none for the op."""
    path = tmp_path / "table.json"
    h100 = dict(ENV, device="NVIDIA H100 80GB HBM3")
    narrow = dict(tile_n=128, store="regs")
    for env, options in ((ENV, DEFAULTS["grouped_gemm"]), (h100, narrow)):
        entries = tune.table_entries({("qwen3-30b-a3b", "fc2", "bf16"): dict(options=dict(options),
                                                                     ratios=dict(balanced=1.0, skewed=1.0))},
                                     env["device"])
        path.write_text(json.dumps(tune.merged_table(path, entries, env, "bench_results/tune-x.json")))
    table = tuned.read_table(path)
    assert [(e.device, e.options) for e in table.entries] == [
        ("NVIDIA H100 80GB HBM3", narrow), ("NVIDIA H200", DEFAULTS["grouped_gemm"])]
    assert table.devices == ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    monkeypatch.setenv(tuned.ENV, str(path))
    qwen3_fc2 = (65536, 2048, 768, 128)
    assert tuned.lookup("grouped_gemm", *qwen3_fc2, card="NVIDIA H100 80GB HBM3").options == narrow
    assert tuned.lookup("grouped_gemm", *qwen3_fc2, card="NVIDIA H200").options == DEFAULTS["grouped_gemm"]
    other = tuned.lookup("grouped_gemm", *qwen3_fc2, card="NVIDIA GH200 480GB")  # no entry: another card's
    assert other is not None and "tuned on the NVIDIA H" in other.words()
    assert tuned.lookup("fc2_dgrad", *qwen3_fc2, card="NVIDIA H200") is None


def test_an_older_table_names_its_card_once():
    """The format before per-card entries (one table-level device) reads as entries of that card."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "old.json"
        entry = tune.table_entries({("qwen3-30b-a3b", "fc2", "bf16"): dict(options=dict(DEFAULTS["grouped_gemm"]),
                                                                   ratios=dict(balanced=1.0, skewed=1.0))}, "x")[0]
        del entry["device"]
        path.write_text(json.dumps(dict(device="NVIDIA H200", commit="abc", date="2026-12-04", measurements="m",
                                        entries=[entry])))
        assert tuned.read_table(path).entries[0].device == "NVIDIA H200"


@pytest.mark.parametrize("op,count", [("grouped_gemm", 8), ("fc1_forward", 4), ("fc2_dgrad", 8),
                                      ("grouped_wgrad", 16)])
def test_candidates_are_the_consistent_knob_combinations(op, count):
    found = candidates(op)
    assert found[0] == DEFAULTS[op] and len(found) == count
    assert len({json.dumps(c, sort_keys=True) for c in found}) == count


def test_measurements_of_a_removed_knob_count_as_the_kernel_runs_now():
    """A committed run timed FC1's fused_b (removed): its rows with the knob off are the kernel as
    it runs now (the knob dropped), those with it on a variant that no longer exists (left out)."""
    fused, apart = dict(fused_b=True, store="regs"), dict(fused_b=False, store="tma")
    rows = [_row("fc1", fused, "balanced", 2.0), _row("fc1", fused, "skewed", 2.0),
            _row("fc1", apart, "balanced", 0.9), _row("fc1", apart, "skewed", 0.9)]
    assert tune.choose(rows)[("qwen3-30b-a3b", "fc1", "bf16")]["options"] == dict(store="tma")
    assert tune.current_options("fc1", fused) is None
    # the ping-pong schedule (removed) likewise: a ping-pong row that tied is out, the cooperative kept
    pingpong = dict(tile_n=128, ragged_tma=True, pingpong=True, store="tma", cluster=1)
    cooperative = dict(tile_n=256, ragged_tma=True, pingpong=False, store="tma", cluster=1)
    rows = [_row("fc2 wgrad", options, routing, ratio) for options, ratio in ((pingpong, 1.0), (cooperative, 0.99))
            for routing in tune.ROUTINGS]
    assert tune.choose(rows)[("qwen3-30b-a3b", "fc2 wgrad", "bf16")]["options"] == dict(
        tile_n=256, ragged_tma=True, store="tma", cluster=1)


def test_the_committed_table_is_what_the_committed_measurements_choose():
    """Each entry of the package's table is the fastest candidate of the latest committed tuner run
    on its card that timed its site and shape (bench_results/tune-*.json), with that run's ratios
    and with the (N, K, rows per expert) of its shape: no entry edited by hand, none left from an
    older run."""
    runs = sorted(pathlib.Path(__file__).parents[2].glob("bench_results/tune-*.json"))
    assert runs, "no committed tuner measurements (bench_results/tune-*.json)"
    latest: dict[str, dict[tuple[str, str, str], dict]] = {}  # card -> (shape, site, recipe) -> choice
    for run in runs:  # names sort by date: a later run's choice replaces an earlier one's
        measured = json.loads(run.read_text())
        latest.setdefault(measured["environment"]["device"], {}).update(tune.choose(measured["results"]))
    table = json.loads(tuned.TABLE_FILE.read_text())["entries"]
    key = lambda entry: (entry["device"], entry["shape"], entry["site"], entry["recipe"])  # noqa: E731
    expected = {key(entry): entry for card, best in latest.items() for entry in tune.table_entries(best, card)}
    assert set(map(key, table)) == set(expected)
    for entry in table:
        assert entry == expected[key(entry)], entry


def test_each_recipe_keeps_its_choice_and_entry(tmp_path):
    """The MXFP8 variant of FC2 dgrad is chosen from its own rows and gets its own entry beside the
    bf16 one; a row without a recipe (a run from before recipes) counts as bf16."""
    wide, paired = dict(tile_n=256, store="tma", cluster=1), dict(tile_n=128, store="regs", cluster=2)
    rows = [_row("fc2 dgrad", wide, routing, 1.0) for routing in tune.ROUTINGS]
    rows += [dict(_row("fc2 dgrad", paired, routing, 0.5), recipe="mxfp8") for routing in tune.ROUTINGS]
    best = tune.choose(rows)
    assert set(best) == {("qwen3-30b-a3b", "fc2 dgrad", "bf16"), ("qwen3-30b-a3b", "fc2 dgrad", "mxfp8")}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(tune.merged_table(path, tune.table_entries(best, ENV["device"]), ENV, "m")))
    mxfp8_only = {key: chosen for key, chosen in best.items() if key[2] == "mxfp8"}
    path.write_text(json.dumps(tune.merged_table(path, tune.table_entries(mxfp8_only, ENV["device"]), ENV, "m2")))
    entries = tuned.read_table(path).entries
    assert [(entry.recipe, entry.options) for entry in entries] == [("bf16", wide), ("mxfp8", paired)]


def test_the_blockwise_recipe_tunes_its_own_kernels(tmp_path):
    """FP8 blockwise rows choose among the blockwise kernel's knobs (wide, cluster) and make
    entries of its op, beside the bf16 entry of the same site, and a launch of that op reads them."""
    rows = [dict(_row("fc2 wgrad", dict(wide=wide, cluster=cluster), routing, ratio), recipe="fp8-blockwise")
            for (wide, cluster, ratio) in ((True, 1, 1.0), (False, 2, 1.2)) for routing in tune.ROUTINGS]
    rows += [_row("fc2 wgrad", dict(DEFAULTS["grouped_wgrad"]), routing, 1.0) for routing in tune.ROUTINGS]
    best = tune.choose(rows)
    assert best[("qwen3-30b-a3b", "fc2 wgrad", "fp8-blockwise")]["options"] == dict(wide=False, cluster=2)
    entries = {entry["recipe"]: entry for entry in tune.table_entries(best, ENV["device"])}
    assert entries["fp8-blockwise"]["op"] == "grouped_wgrad_fp8_blockwise" and entries["bf16"]["op"] == "grouped_wgrad"
    assert tune.site_op("fc1", "fp8-blockwise") == "fc1_forward_blockwise" and tune.site_op("fc1", "mxfp8") == "fc1_forward"
    path = tmp_path / "table.json"
    path.write_text(json.dumps(tune.merged_table(path, list(entries.values()), ENV, "bench_results/tune-b.json")))
    read = tuned.read_table(path)
    assert {(entry.op, entry.recipe) for entry in read.entries} == {("grouped_wgrad", "bf16"),
                                                                   ("grouped_wgrad_fp8_blockwise", "fp8-blockwise")}
    # every candidate of each blockwise op is a combination of its knobs
    assert all(set(options) == set(DEFAULTS[op]) for op in ("grouped_gemm_fp8_blockwise", "fc1_forward_blockwise")
               for options in candidates(op))
