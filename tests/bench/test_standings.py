"""``python -m gmlp.bench standings``: the picking rule on made-up results, and docs/performance.md
against the committed ones."""

from __future__ import annotations

import json
import pathlib

import pytest

from gmlp.bench import standings
from gmlp.bench.mlp import SHAPES

ROOT = pathlib.Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


def _env(device: str = H100, date: str = "2026-12-06T02:00:00+00:00", commit: str = "b613b72c8eeef7bf",
         dirty: bool | None = False, gpu: bool = True) -> dict:
    env = {"device": device, "python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0",
           "nvidia-cutlass-dsl": "4.8.1", "commit": commit, "dirty": dirty, "date": date}
    return {**env, "compute_capability": "9.0"} if gpu else env


def _mlp_row(impl: str, eager: float, shape: str = "deepseek-v3-rank", routing: str = "balanced",
             peak_mb: float = 3712.0) -> dict:
    return {"shape": shape, "routing": routing, "impl": impl, "step_ms": 10.0, "step_ratio_to_eager": eager,
            "step_ratio_to_compiled_act": eager * 0.9, "peak_step_mb": peak_mb, "peak_ratio_to_eager": peak_mb / 3840}


def _mlp(rows: list[dict], complete: bool | None = True, **env) -> dict:
    data = {"environment": _env(**env), "results": rows}
    return data if complete is None else {**data, "complete": complete}


def _memory(rows: list[tuple[str, float]], date: str, shape: str = "deepseek-v3-rank") -> dict:
    results = [{"shape": shape, "routing": "balanced", "side": side, "peak_mb": mb} for side, mb in rows]
    return {"environment": _env(date=date), "results": results, "complete": True}


def _host(recipe: str, ms: float, shape: tuple[int, ...] = SHAPES["qwen3-30b-a3b"], gpu: bool = True) -> dict:
    entry = {"name": "qwen3", **dict(zip(("experts", "tokens", "hidden", "ffn"), shape)),
             "torch_eager": {"fwd_bwd_host_ms": 1.0},
             "recipes": {recipe: {"default": {"fwd_bwd_host_ms": ms, "fwd_bwd_host_over_torch": ms,
                                              "sleep_ended_early": False}}}}
    return {"bench": "host", **_env(date="2026-12-03T16:54:31+00:00", commit="567fca2", gpu=gpu),
            "shapes": [entry], "complete": True}


def _table(results: dict[str, object]) -> tuple[dict[tuple[str, ...], list[str]], standings.Standings]:
    """The rows of the table made from ``results`` (file name -> JSON) by (card, recipe, shape,
    routing), their cells after those four, links relative to ``docs/``."""
    found = standings.collect((ROOT / "bench_results" / name, data) for name, data in results.items())
    rows = {}
    for line in standings.markdown(found, ROOT / "docs").splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("card", "---"):
            rows[(cells[0], cells[1], cells[2].strip("`"), cells[3])] = cells[4:]
    return rows, found


def test_the_newest_complete_measurement_wins():
    rows, found = _table({
        "mlp-old.json": _mlp([_mlp_row("gmlp-bf16", 0.80)], date="2026-12-04T10:00:00+00:00"),
        "mlp-new.json": _mlp([_mlp_row("gmlp-bf16", 0.95)], date="2026-12-06T10:00:00+00:00", dirty=True),
        "mlp-cut-short.json": _mlp([_mlp_row("gmlp-bf16", 1.50)], complete=False, date="2026-12-07T10:00:00+00:00"),
        "mlp-older-schema.json": _mlp([_mlp_row("gmlp-bf16", 1.60)], complete=None, date="2026-12-08T10:00:00+00:00"),
    })
    eager, compiled, peak, host, date, commit, link = rows[("H100", "bf16", "deepseek-v3-rank", "balanced")]
    assert (eager, compiled, peak, host) == ("0.95", "0.85", "3712 MB (0.97x)", "not measured")
    assert (date, commit, link) == ("2026-12-06", "b613b72 (dirty)", "[mlp-new](../bench_results/mlp-new.json)")
    assert {path.name: reason for path, reason in found.skipped} == {
        "mlp-cut-short.json": "complete: False (a run cut short)",
        "mlp-older-schema.json": "no 'complete' field (written before the benches marked complete runs)"}


def test_a_card_or_recipe_without_measurements_reads_not_measured():
    rows, _ = _table({"mlp.json": _mlp([_mlp_row("gmlp-bf16", 1.0), _mlp_row("torch-grouped-mm-bf16", 1.0)])})
    assert len(rows) == len(standings.CARDS) * len(standings.RECIPES) * len(SHAPES) * len(standings.ROUTINGS)
    unmeasured = [standings.NOT_MEASURED] * 4 + ["-"] * 3
    assert rows[("H200", "bf16", "deepseek-v3-rank", "balanced")] == unmeasured
    assert rows[("H100", "MXFP8", "deepseek-v3-rank", "balanced")] == unmeasured
    assert rows[("H100", "bf16", "deepseek-v3-rank", "skewed")] == unmeasured
    assert rows[("H100", "bf16", "deepseek-v3-rank", "balanced")][0] == "1.00"


def test_a_card_beyond_the_listed_ones_gets_rows_when_measured():
    rows, _ = _table({"mlp.json": _mlp([_mlp_row("gmlp-mxfp8", 1.3)], device="NVIDIA B200")})
    assert rows[("B200", "MXFP8", "deepseek-v3-rank", "balanced")][0] == "1.30"
    assert rows[("H100", "MXFP8", "deepseek-v3-rank", "balanced")][0] == standings.NOT_MEASURED


def test_files_that_are_not_layer_measurements_on_a_gpu_are_skipped_with_the_reason():
    gemm = {"environment": _env(), "results": [{"gemm": "fc1", "ms": 1.0}], "complete": True}
    _, found = _table({"gemm.json": gemm, "list.json": [1, 2], "host-cpu.json": _host("bf16", 1.0, gpu=False)})
    reasons = {path.name: reason for path, reason in found.skipped}
    assert reasons["gemm.json"] == reasons["list.json"] == "not a layer measurement (bench mlp, memory or host)"
    assert reasons["host-cpu.json"].startswith("not a GPU run")
    assert found.figures == {}


def test_a_newer_memory_run_gives_the_peak_with_its_link_and_its_own_torch_side():
    rows, _ = _table({
        "mlp.json": _mlp([_mlp_row("gmlp-bf16", 1.0, peak_mb=3700.0), _mlp_row("gmlp-fp8-blockwise", 1.1)]),
        "memory.json": _memory([("torch-grouped-mm-bf16", 4000.0), ("gmlp-fp8-blockwise", 3000.0)],
                               date="2026-12-07T00:00:00+00:00"),
        "memory-older.json": _memory([("gmlp-bf16", 1.0)], date="2026-12-01T00:00:00+00:00"),
        "memory-no-torch.json": _memory([("gmlp-mxfp8", 2000.0)], date="2026-12-07T00:00:00+00:00"),
    })
    assert rows[("H100", "bf16", "deepseek-v3-rank", "balanced")][2] == "3700 MB (0.96x)"  # the mlp run's: newer
    assert rows[("H100", "FP8 blockwise", "deepseek-v3-rank", "balanced")][2] == \
        "3000 MB (0.75x), [memory](../bench_results/memory.json)"
    assert rows[("H100", "MXFP8", "deepseek-v3-rank", "balanced")][:3] == \
        [standings.NOT_MEASURED, standings.NOT_MEASURED,
         "2000 MB (no torch side), [memory](../bench_results/memory-no-torch.json)"]


def test_host_time_comes_from_the_host_bench_at_a_design_shape_balanced():
    other_shape = _host("bf16", 9.0, shape=(64, 65536, 256, 768))
    rows, _ = _table({"host.json": _host("mxfp8", 3.36), "host-other.json": other_shape})
    assert rows[("H100", "MXFP8", "qwen3-30b-a3b", "balanced")][3] == \
        "3.36 ms (3.36x), [host](../bench_results/host.json)"
    assert rows[("H100", "MXFP8", "qwen3-30b-a3b", "skewed")][3] == standings.NOT_MEASURED
    assert all(cells[3] == standings.NOT_MEASURED for key, cells in rows.items() if key[1] == "bf16")


def test_an_unknown_host_recipe_is_an_error_not_a_gap():
    with pytest.raises(ValueError, match=r"host\.json: bench host recipe 'fp4': expected one of"):
        _table({"host.json": _host("fp4", 1.0)})


def test_replace_block_needs_both_markers_once_in_order():
    text = f"intro\n{standings.BEGIN}\nold\n{standings.END}\nrest\n"
    assert standings.replace_block(text, "new", "doc.md") == f"intro\n{standings.BEGIN}\nnew\n\n{standings.END}\nrest\n"
    begin, end = standings.BEGIN, standings.END
    for broken in ("no markers", f"{end}\n{begin}", f"{begin}{begin}{end}"):
        with pytest.raises(ValueError, match=r"doc\.md: expected one"):
            standings.replace_block(broken, "new", "doc.md")


def test_write_refreshes_a_document_in_one_command(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "mlp-a.json").write_text(json.dumps(_mlp([_mlp_row("gmlp-bf16", 1.25)])))
    (results / "gemm-a.json").write_text(json.dumps({"environment": _env(), "results": [{"gemm": "fc1"}]}))
    doc = tmp_path / "docs" / "performance.md"
    doc.parent.mkdir()
    doc.write_text(f"# Performance\n\n{standings.BEGIN}\n{standings.END}\n\nthe log\n")
    standings.main(["--results", str(results), "--write", str(doc), "--verbose"])
    text = doc.read_text()
    assert "| H100 | bf16 | `deepseek-v3-rank` | balanced | 1.25 |" in text
    assert "[mlp-a](../results/mlp-a.json)" in text and text.endswith(f"{standings.END}\n\nthe log\n")
    assert "gemm-a.json: not a layer measurement" in capsys.readouterr().err
    standings.main(["--results", str(results), "--write", str(doc)])
    assert doc.read_text() == text  # a second refresh changes nothing


def test_results_that_are_not_a_folder_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        standings.main(["--results", str(tmp_path / "missing")])
    assert "--results: expected a folder of JSON results" in capsys.readouterr().err


def test_the_performance_doc_holds_the_standings_of_the_committed_results():
    doc = ROOT / "docs" / "performance.md"
    generated = standings.markdown(standings.collect(standings.read_results(ROOT / "bench_results")), doc.parent)
    text = doc.read_text()
    assert standings.replace_block(text, generated, str(doc)) == text, (
        "docs/performance.md's standings differ from bench_results/: run "
        "`python -m gmlp.bench standings --write docs/performance.md`")


def _standings_rows() -> dict[tuple[str, str, str, str], tuple[str, str, str]]:
    """(card, recipe, shape, routing) -> (vs eager, vs compiled act, date) of docs/performance.md's
    table (equal to the generator's output: the test above)."""
    rows = {}
    for line in (ROOT / "docs" / "performance.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[2].startswith("`"):
            card, recipe, shape, routing, eager, compiled, _, _, date = cells[:9]
            rows[card, recipe, shape.strip("`"), routing] = (eager, compiled, date)
    return rows


def test_the_readme_quotes_the_standings():
    """Each row of README.md's performance table (balanced routing, the three design shapes in
    order) is the standings' figures of its card and recipe, with their date."""
    standings_rows = _standings_rows()
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Performance\n"):readme.index("## Blackwell\n")]
    quoted = [line for line in section.splitlines() if line.startswith("| H")]
    assert quoted, "README.md's performance section has no table rows"
    for line in quoted:
        card_date, recipe, eager, compiled = (cell.strip() for cell in line.strip().strip("|").split("|"))
        card, date = (part.strip() for part in card_date.split(","))
        want = [standings_rows[card, recipe, shape, "balanced"] for shape in SHAPES]
        assert eager.split(" / ") == [row[0] for row in want], line
        assert compiled.split(" / ") == [row[1] for row in want], line
        assert {row[2] for row in want} == {date}, line
