"""Tune the SM90 kernels' launch knobs: time every candidate configuration of each GEMM site at
each shape, over balanced and skewed routing, and write the fastest into the tuned table.

For each shape of ``--shapes`` and each routing (balanced, and Zipf-like skewed with empty
experts: the layer's plan cannot know the routing, so one choice must serve both), each site's
SM90 kernel runs every candidate of ``launch_options.candidates`` on the bf16 operands of
``bench gemm``, timed as there: the ratio to torch's ``_grouped_mm`` on the same product, the
baseline timed again after each candidate. With the recipe ``mxfp8`` of ``--recipes``, FC1 and FC2
dgrad also run as the MXFP8 layer runs them (``bench gemm``'s ``cutedsl-dequant``: the token
operand dequantized, then the kernel quantizing its output in the epilogue), over the candidates
that variant takes; the layer's other GEMMs run the bf16 kernels there, so their bf16 entries
serve it. With ``fp8-blockwise``, every site runs the FP8 blockwise recipe's own kernel on its
quantized operands (``bench gemm``'s ``cutedsl-fp8-blockwise``: wide items and clusters). A
site's choice, per recipe, is the candidate with the best geometric mean of its ratios over the
routings (a candidate that fails at one routing is out).

Writes the measurements (``tune-<date>.json`` in ``--out``, every candidate's time and ratio) and
merges the choices into ``--table`` (default: the package's ``gmlp/cutedsl/sm90/tuned_sm90.json``),
replacing this card's entries of the sites and shapes tuned now and keeping the others (other
cards' entries included: a launch reads its own card's, ``gmlp.cutedsl.sm90.tuned``). Commit both:
the table is what every later launch reads (``GMLP_SM90_TUNED`` points a process at another table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib

import torch

from gmlp.bench.common import PartialResults, add_out_argument, environment
from gmlp.bench.gemm import _gemms, _operands, _time
from gmlp.bench.mlp import SHAPES, add_shapes_argument
from gmlp.cutedsl.sm90 import launch_options, tuned
from gmlp.cutedsl.sm90.support import site_gemm
from gmlp.dispatch.sites import BLOCKWISE_SITES, SITES

ROUTINGS = ("balanced", "skewed")
# bench gemm's name of each layer site
GEMM_NAMES = {"fc1": "fc1", "fc2": "fc2", "fc2 dgrad": "fc2_dgrad", "fc1 dgrad": "fc1_dgrad", "fc2 wgrad": "fc2_wgrad",
              "fc1 wgrad": "fc1_wgrad"}
# recipe -> bench gemm's variant of the SM90 kernel as that recipe's layer runs it, and the sites
# whose kernel differs from the bf16 one there (the MXFP8 epilogues)
RECIPE_VARIANTS = {"bf16": "cutedsl", "mxfp8": "cutedsl-dequant", "fp8-blockwise": "cutedsl-fp8-blockwise"}
RECIPE_SITES = {"bf16": tuple(GEMM_NAMES), "mxfp8": ("fc1", "fc2 dgrad"), "fp8-blockwise": tuple(GEMM_NAMES)}


def site_op(site: str, recipe: str) -> str:
    """The op (``launch_options.DEFAULTS``' key) that runs ``site`` in ``recipe``'s layer."""
    return (BLOCKWISE_SITES if recipe == "fp8-blockwise" else SITES)[site].op.value


def current_options(site: str, options: dict, recipe: str = "bf16") -> dict | None:
    """A measured candidate's ``options`` as the site's op takes them now: a knob the op no longer
    has (a removed variant, such as FC1's fused_b) is dropped where it was off (False: the kernel
    as it runs now); None where it was on (a variant that no longer exists)."""
    knobs = launch_options.DEFAULTS[site_op(site, recipe)]
    if any(value is not False for knob, value in options.items() if knob not in knobs):
        return None
    return {knob: value for knob, value in options.items() if knob in knobs}


def choose(rows: list[dict]) -> dict[tuple[str, str, str], dict]:
    """(shape, site, recipe) -> its best candidate's row (``options``, ``ratios`` per routing,
    their geometric mean): the candidate with the best geometric mean over ``ROUTINGS`` among
    those that ran at every routing, its options as the op takes them now (``current_options``;
    rows of removed variants are left out). A row without a recipe (a run from before recipes)
    timed bf16 operands. Raises naming the site if none did."""
    by_site: dict[tuple[str, str, str], dict[str, dict[str, float]]] = {}
    for row in rows:
        recipe = row.get("recipe", "bf16")
        options = current_options(row["site"], row["options"], recipe)
        if options is None:
            continue
        key = json.dumps(options, sort_keys=True)
        site_key = (row["shape"], row["site"], recipe)
        by_site.setdefault(site_key, {}).setdefault(key, {})
        if row["ratio"]:
            by_site[site_key][key][row["routing"]] = row["ratio"]
    best = {}
    for site_key, by_options in by_site.items():
        complete = {key: ratios for key, ratios in by_options.items() if set(ratios) == set(ROUTINGS)}
        if not complete:
            raise RuntimeError(f"no candidate ran at every routing for {site_key}: {by_options}")
        mean = {key: math.exp(sum(map(math.log, ratios.values())) / len(ratios)) for key, ratios in complete.items()}
        key = max(mean, key=mean.get)
        best[site_key] = dict(options=json.loads(key), ratios=complete[key], geomean=mean[key])
    return best


def table_entries(best: dict[tuple[str, str, str], dict], device: str) -> list[dict]:
    """The tuned table's entries for ``choose``'s result on the card ``device``: the card, op, site,
    recipe, shape, the launch's (N, K) and rows per expert (what ``tuned.lookup`` measures distance
    in), the knobs and their ratios."""
    entries = []
    for (shape, site, recipe), chosen in best.items():
        experts, tokens, hidden, ffn = SHAPES[shape]
        _, n, k, _ = site_gemm(site, tokens, hidden, ffn, experts)
        entries.append(dict(device=device, op=site_op(site, recipe), site=site, recipe=recipe, shape=shape, n=n, k=k,
                            rows_per_expert=tokens / experts, options=chosen["options"],
                            ratios={routing: round(ratio, 4) for routing, ratio in chosen["ratios"].items()}))
    return entries


def merged_table(path: pathlib.Path, entries: list[dict], env: dict, measurements: str) -> dict:
    """The table at ``path`` (if any) with ``entries`` replacing those of the same card, site,
    recipe and shape (another card's entries are kept: the table holds every card's)."""
    old = json.loads(path.read_text()) if path.exists() else dict(entries=[])
    old_entries = [dict(entry, device=entry.get("device") or old["device"], recipe=entry.get("recipe", "bf16"))
                   for entry in old["entries"]]
    key = lambda e: (e["device"], e["site"], e["recipe"], e["shape"])  # noqa: E731
    tuned_now = set(map(key, entries))
    kept = [entry for entry in old_entries if key(entry) not in tuned_now]
    order = {site: i for i, site in enumerate(GEMM_NAMES)}
    all_entries = sorted(kept + entries, key=lambda e: (e["device"], e["shape"], order[e["site"]], e["recipe"]))
    return dict(commit=env["commit"], cutlass_dsl=env.get("nvidia-cutlass-dsl"),
                date=datetime.date.today().isoformat(), measurements=measurements, entries=all_entries)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shapes_argument(parser, ",".join(SHAPES))
    parser.add_argument("--sites", default=",".join(GEMM_NAMES), help=f"comma-separated, of {list(GEMM_NAMES)}")
    parser.add_argument("--recipes", default=",".join(RECIPE_VARIANTS),
                        help=f"comma-separated, of {list(RECIPE_VARIANTS)} (mxfp8 tunes {RECIPE_SITES['mxfp8']}; "
                             "the others every site)")
    parser.add_argument("--table", default=str(tuned.TABLE_FILE), help="the tuned table to merge the choices into")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    sites = [site.strip() for site in args.sites.split(",")]
    unknown = [site for site in sites if site not in GEMM_NAMES]
    if unknown:
        parser.error(f"--sites: unknown {unknown}; the sites are {list(GEMM_NAMES)}")
    recipes = [recipe.strip() for recipe in args.recipes.split(",")]
    unknown = [recipe for recipe in recipes if recipe not in RECIPE_VARIANTS]
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; the recipes are {list(RECIPE_VARIANTS)}")
    runs = [(site, recipe) for recipe in recipes for site in sites if site in RECIPE_SITES[recipe]]
    device, env = torch.device("cuda"), environment()
    rows, results = [], PartialResults("tune", args.out)
    for shape in args.shapes.split(","):
        experts, tokens, hidden, ffn = SHAPES[shape]
        for routing in ROUTINGS:
            gemms = _gemms(_operands(experts, tokens, hidden, ffn, device, routing), hidden, ffn)
            for site, recipe in runs:
                gemm, op = gemms[GEMM_NAMES[site]], site_op(site, recipe)
                base_ms, _ = _time(gemm["baseline"])
                for options in launch_options.candidates(op, quantized=recipe == "mxfp8"):
                    print(f"{shape} {routing} {site:>9} {recipe} {options}: ", end="", flush=True)  # a hang shows where
                    ms, error = _time(gemm[RECIPE_VARIANTS[recipe]](options))
                    base_after, _ = _time(gemm["baseline"])
                    bracket = [t for t in (base_ms, base_after) if t]
                    baseline = sum(bracket) / len(bracket) if bracket else None
                    ratio = baseline / ms if ms and baseline else None
                    rows.append(dict(shape=shape, routing=routing, site=site, recipe=recipe, op=op, options=options,
                                     ms=ms,
                                     tflops=gemm["flops"] / ms / 1e9 if ms else None, baseline_ms=baseline,
                                     ratio=ratio, error=error))
                    base_ms = base_after or base_ms
                    results.write(dict(environment=env, results=rows), complete=False)  # kept if cut short
                    print(f"{ms:.3f} ms, {ratio:.3f} of torch" if ratio else str(error), flush=True)
            del gemms
            torch.cuda.empty_cache()
    best = choose(rows)
    measurements = results.write(dict(environment=env, results=rows, chosen=[
        dict(shape=shape, site=site, recipe=recipe, **chosen) for (shape, site, recipe), chosen in best.items()]),
        complete=True)
    table_path = pathlib.Path(args.table)
    # where the measurements are committed beside the table (the tuner writes them to --out)
    table = merged_table(table_path, table_entries(best, env["device"]), env, f"bench_results/{measurements.name}")
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    for (shape, site, recipe), chosen in best.items():
        ratios = ", ".join(f"{routing} {ratio:.3f}" for routing, ratio in chosen["ratios"].items())
        print(f"{shape} {site:>9} {recipe}: {chosen['options']} ({ratios} of torch)")
    print(f"wrote {measurements} and {table_path}")
