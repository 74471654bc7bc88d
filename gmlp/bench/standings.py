"""``python -m gmlp.bench standings``: where gmlp stands, one markdown table from the benches' JSON.

Reads every ``*.json`` in ``--results`` (default ``bench_results/``) and keeps the layer
measurements on a GPU: ``bench mlp`` (a forward + backward step's time as ratios of torch's
eager layer and of torch's with the compiled activation, and its peak memory, in one run),
``bench memory`` (a step's peak memory) and ``bench host`` (the host's time to issue a step,
the default path; that bench routes balanced). A file that is another bench's, is not complete
(``"complete": false``: a run cut short; no such field: written before the benches marked
complete runs) or ran on the CPU is skipped (``--verbose`` says why).

Per card, recipe, design shape (``gmlp.bench.mlp.SHAPES``), routing and figure (step times,
peak, host time) the newest measurement wins, by the date its run recorded; a figure without
one reads "not measured", on every card in ``CARDS`` and any other that has a measurement.
``--write FILE`` puts the table between ``BEGIN`` and ``END`` in FILE (docs/performance.md),
its links to the JSON relative to FILE's folder; without it the table is printed, its links
relative to ``docs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import sys
import textwrap
from collections.abc import Iterable

from gmlp.bench.common import gpu_model
from gmlp.bench.host_report import SHAPE_KEYS
from gmlp.bench.mlp import BLOCKWISE, EAGER_ACT, SHAPES

__all__ = ["BEGIN", "CARDS", "END", "NOT_MEASURED", "RECIPES", "ROUTINGS", "Figure", "Skipped", "Source", "Standings",
           "collect", "main", "markdown", "read_results", "replace_block"]

BEGIN, END = "<!-- standings:begin -->", "<!-- standings:end -->"
CARDS = ("H100", "H200")  # rows for these whether measured or not
ROUTINGS = ("balanced", "skewed")
# recipe label -> its side in bench mlp and bench memory, and its key in bench host
RECIPES = {"bf16": ("gmlp-bf16", "bf16"), "MXFP8": ("gmlp-mxfp8", "mxfp8"),
           "FP8 blockwise": (BLOCKWISE, "fp8-blockwise")}
HOST_ROUTING = "balanced"  # bench host's only routing
VERSIONS = ("torch", "triton", "nvidia-cutlass-dsl")  # named per source: the last says cutedsl or core install
NOT_MEASURED = "not measured"

Key = tuple[str, str, str, str]  # card, recipe label, shape, routing


class Skipped(Exception):
    """A results file that holds no layer measurement to use; the message says why."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One results file: its path, bench, card, and its run's date, commit and versions."""

    path: pathlib.Path
    bench: str
    device: str
    card: str
    date: datetime.datetime
    commit: str
    dirty: bool | None
    versions: str

    @property
    def short_commit(self) -> str:
        """The commit's first 7 characters (all of a non-hash such as "8c64155+bench"), "(dirty)"
        where the run's working tree had changes."""
        commit = self.commit[:7] if all(c in "0123456789abcdef" for c in self.commit) else self.commit
        return f"{commit} (dirty)" if self.dirty else commit


@dataclasses.dataclass(frozen=True)
class Figure:
    """A measured figure and its source. ``values``: step ``eager`` / ``compiled_act`` (torch's
    time over gmlp's); peak ``mb`` / ``over_torch`` (gmlp's over torch eager's in the same run,
    None where that run had no torch side); host ``ms`` / ``over_torch`` / ``waited`` (the host
    waited on the device in a sample: not pure host time)."""

    source: Source
    values: dict


@dataclasses.dataclass
class Standings:
    """The newest figure per (figure kind, key) (``"step"``, ``"peak"``, ``"host"``) and the
    files skipped with the reason."""

    figures: dict[tuple[str, Key], Figure]
    skipped: list[tuple[pathlib.Path, str]]


def _bench_of(data: object) -> str:
    """``"mlp"``, ``"memory"`` or ``"host"`` by the file's content, else ``Skipped``."""
    if isinstance(data, dict) and data.get("bench") == "host":
        return "host"
    rows = data.get("results") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("environment"), dict) and isinstance(rows, list) and rows \
            and all(isinstance(row, dict) for row in rows):
        if all({"impl", "step_ms"} <= row.keys() for row in rows):
            return "mlp"
        if all({"side", "peak_mb"} <= row.keys() for row in rows):
            return "memory"
    raise Skipped("not a layer measurement (bench mlp, memory or host)")


def _source(path: pathlib.Path, data: dict) -> Source:
    """The file's source record, or ``Skipped`` when it is not complete or ran on no GPU."""
    bench = _bench_of(data)
    if "complete" not in data:
        raise Skipped("no 'complete' field (written before the benches marked complete runs)")
    if data["complete"] is not True:
        raise Skipped(f"complete: {data['complete']} (a run cut short)")
    env = data if bench == "host" else data["environment"]
    if "compute_capability" not in env:
        raise Skipped(f"not a GPU run ({env.get('device')})")
    versions = ", ".join(f"{name} {env.get(name, 'unrecorded')}" for name in VERSIONS)
    return Source(path, bench, env["device"], gpu_model(env["device"]).upper(),
                  datetime.datetime.fromisoformat(env["date"]), env["commit"], env.get("dirty"), versions)


def _recipe(side: str) -> str | None:
    """The recipe label of a bench mlp / memory side (None: a baseline, a peer or a variant)."""
    return next((label for label, (name, _) in RECIPES.items() if name == side), None)


def _mlp(data: dict, source: Source) -> Iterable[tuple[str, Key, Figure]]:
    for row in data["results"]:  # every complete file has both ratios: the older schemas predate "complete"
        recipe = _recipe(row["impl"])
        if recipe is None or row["shape"] not in SHAPES:
            continue
        key = (source.card, recipe, row["shape"], row["routing"])
        yield "step", key, Figure(source, {"eager": row["step_ratio_to_eager"],
                                           "compiled_act": row["step_ratio_to_compiled_act"]})
        if "peak_step_mb" in row:
            yield "peak", key, Figure(source, {"mb": row["peak_step_mb"], "over_torch": row["peak_ratio_to_eager"]})


def _memory(data: dict, source: Source) -> Iterable[tuple[str, Key, Figure]]:
    torch_peaks = {(row["shape"], row["routing"]): row["peak_mb"] for row in data["results"]
                   if row["side"] == EAGER_ACT}
    for row in data["results"]:
        recipe = _recipe(row["side"])
        if recipe is None or row["shape"] not in SHAPES:
            continue
        torch_peak = torch_peaks.get((row["shape"], row["routing"]))
        yield "peak", (source.card, recipe, row["shape"], row["routing"]), Figure(
            source, {"mb": row["peak_mb"], "over_torch": row["peak_mb"] / torch_peak if torch_peak else None})


def _host(data: dict, source: Source) -> Iterable[tuple[str, Key, Figure]]:
    design = {sizes: name for name, sizes in SHAPES.items()}
    recipes = {host_key: label for label, (_, host_key) in RECIPES.items()}
    for entry in data["shapes"]:
        shape = design.get(tuple(entry[key] for key in SHAPE_KEYS))
        if shape is None:  # not a design shape
            continue
        for host_key, paths in entry["recipes"].items():
            if host_key not in recipes:
                raise ValueError(f"{source.path}: bench host recipe {host_key!r}: expected one of {list(recipes)} "
                                 "(add it to gmlp.bench.standings.RECIPES)")
            row = paths.get("default")
            if row is None or "reason" in row:
                continue
            yield "host", (source.card, recipes[host_key], shape, HOST_ROUTING), Figure(
                source, {"ms": row["fwd_bwd_host_ms"], "over_torch": row.get("fwd_bwd_host_over_torch"),
                         "waited": bool(row.get("sleep_ended_early"))})


READERS = {"mlp": _mlp, "memory": _memory, "host": _host}


def collect(results: Iterable[tuple[pathlib.Path, object]]) -> Standings:
    """The newest figure per kind and key among ``results`` (a path and its parsed JSON each);
    ties on the date go to the later file name."""
    figures: dict[tuple[str, Key], Figure] = {}
    skipped = []
    for path, data in results:
        try:
            source = _source(path, data)
            found = list(READERS[source.bench](data, source))
        except Skipped as reason:
            skipped.append((path, str(reason)))
            continue
        for kind, key, figure in found:
            held = figures.get((kind, key))
            if held is None or (figure.source.date, path.name) > (held.source.date, held.source.path.name):
                figures[(kind, key)] = figure
    return Standings(figures, skipped)


def read_results(folder: pathlib.Path) -> list[tuple[pathlib.Path, object]]:
    """Every ``*.json`` in ``folder``, parsed, by name."""
    return [(path, json.loads(path.read_text())) for path in sorted(folder.glob("*.json"))]


def _link(source: Source, base: pathlib.Path, text: str | None = None) -> str:
    target = pathlib.PurePath(os.path.relpath(source.path.resolve(), base.resolve())).as_posix()
    return f"[{text or source.path.stem}]({target})"


def _step_cells(figure: Figure | None, base: pathlib.Path) -> list[str]:
    if figure is None:
        return [NOT_MEASURED, NOT_MEASURED, "-", "-", "-"]
    source = figure.source
    return [f"{figure.values['eager']:.2f}", f"{figure.values['compiled_act']:.2f}", source.date.date().isoformat(),
            source.short_commit, _link(source, base)]


def _peak_cell(figure: Figure | None, step: Figure | None, base: pathlib.Path) -> str:
    if figure is None:
        return NOT_MEASURED
    over = figure.values["over_torch"]
    cell = f"{figure.values['mb']:.0f} MB" + (f" ({over:.2f}x)" if over is not None else " (no torch side)")
    if step is None or step.source != figure.source:
        cell += f", {_link(figure.source, base, figure.source.bench)}"
    return cell


def _host_cell(figure: Figure | None, base: pathlib.Path) -> str:
    if figure is None:
        return NOT_MEASURED
    over = figure.values["over_torch"]
    cell = f"{figure.values['ms']:.2f} ms" + (f" ({over:.2f}x)" if over is not None else " (no torch side)")
    if figure.values["waited"]:
        cell += " (includes waits on the device)"
    return f"{cell}, {_link(figure.source, base, figure.source.bench)}"


LEGEND = (
    "One layer step (forward + backward) per card, recipe (bf16 is `recipe=None`), design shape and routing. "
    "**vs torch eager** and **vs torch + compiled act**: torch's step time over gmlp's in the same run (above 1: "
    "gmlp is faster), torch being its bf16 `torch._grouped_mm` layer with the SwiGLU eager or through "
    "`torch.compile`. **Peak**: the MB a step allocates above what was resident, and over torch eager's in the "
    "same run (below 1: less memory). **Host**: the ms the host takes to issue a step (`bench host`, the default "
    "path, balanced routing) and over torch eager's (above 1: gmlp's host is slower). Each figure is the newest "
    "complete measurement; date, commit and JSON are the step times'; a peak or host figure from another run "
    "links its own file. Sources' devices and versions are listed under the table.")


def markdown(standings: Standings, base: pathlib.Path) -> str:
    """The legend, the table (every card in ``CARDS`` and any other measured, each recipe, shape
    and routing) and the sources it cites, links relative to ``base``."""
    cards = [*CARDS, *sorted({key[0] for _, key in standings.figures} - set(CARDS))]
    lines = [f"<!-- generated by `python -m gmlp.bench standings --write docs/performance.md` from "
             f"bench_results/*.json: change the generator or the results, not this text -->", "",
             textwrap.fill(LEGEND, width=100, break_long_words=False, break_on_hyphens=False), "",
             "| card | recipe | shape | routing | vs torch eager | vs torch + compiled act | peak (x torch eager) | "
             "host (x torch eager) | date | commit | JSON |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    cited: set[Source] = set()
    for card in cards:
        for recipe in RECIPES:
            for shape in SHAPES:
                for routing in ROUTINGS:
                    key = (card, recipe, shape, routing)
                    step, peak, host = (standings.figures.get((kind, key)) for kind in ("step", "peak", "host"))
                    cited |= {figure.source for figure in (step, peak, host) if figure is not None}
                    eager, compiled, date, commit, link = _step_cells(step, base)
                    lines.append(f"| {card} | {recipe} | `{shape}` | {routing} | {eager} | {compiled} | "
                                 f"{_peak_cell(peak, step, base)} | {_host_cell(host, base)} | {date} | {commit} | "
                                 f"{link} |")
    lines += ["", "Sources:", ""]
    for source in sorted(cited, key=lambda source: source.path.name):
        lines.append(f"- {_link(source, base)}: bench {source.bench}, {source.device}, "
                     f"{source.date.isoformat()}, commit {source.short_commit}, {source.versions}")
    return "\n".join(lines)


def replace_block(text: str, block: str, name: str) -> str:
    """``text`` with what lies between ``BEGIN`` and ``END`` replaced by ``block``; ``ValueError``
    (naming the file ``name``) when the markers are not there once each, in that order."""
    start, end = text.find(BEGIN), text.find(END)
    if text.count(BEGIN) != 1 or text.count(END) != 1 or end < start:
        raise ValueError(f"{name}: expected one {BEGIN!r} line and after it one {END!r} line around the "
                         f"standings, found {text.count(BEGIN)} and {text.count(END)}")
    return f"{text[:start + len(BEGIN)]}\n{block}\n\n{text[end:]}"


def main(argv: list[str] | None = None) -> None:
    """Print the table (or ``--write`` it into a file) and, with ``--verbose``, the files skipped."""
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench standings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="bench_results", help="the folder of the JSON (default bench_results)")
    parser.add_argument("--write", default=None, metavar="FILE",
                        help=f"replace the text between {BEGIN} and {END} in FILE (docs/performance.md)")
    parser.add_argument("--verbose", action="store_true", help="list the files skipped and why (to stderr)")
    args = parser.parse_args(argv)
    folder = pathlib.Path(args.results)
    if not folder.is_dir():
        parser.error(f"--results: expected a folder of JSON results, got {args.results!r}")
    standings = collect(read_results(folder))
    if args.verbose:
        for path, reason in standings.skipped:
            print(f"skipped {path}: {reason}", file=sys.stderr)
    if args.write is None:
        print(markdown(standings, pathlib.Path("docs")))
        return
    target = pathlib.Path(args.write)
    try:
        text = replace_block(target.read_text(), markdown(standings, target.parent), args.write)
    except ValueError as error:
        sys.exit(str(error))
    target.write_text(text)
    print(f"wrote the standings into {target}")
