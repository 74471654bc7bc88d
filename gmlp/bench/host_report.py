"""``python -m gmlp.bench host``'s results as text, and the ratios of two runs (``--before``)."""

from __future__ import annotations

from collections import Counter

from gmlp.bench.host_profile import markdown

__all__ = ["COMPARED", "SHAPE_KEYS", "compare", "shape_entries", "sides", "table"]

SHAPE_KEYS = ("experts", "tokens", "hidden", "ffn")
COMPARED = ("fwd_bwd_host_ms", "fwd_host_ms", "plan_per_step_ms")  # compared by --before, per side


def sides(entry: dict) -> list[tuple[str, dict]]:
    """A shape entry's rows by side name: "torch eager", then "<recipe> <path>" for gmlp's."""
    named = [("torch eager", entry["torch_eager"])] if entry.get("torch_eager") else []
    return named + [(f"{recipe} {path}", row) for recipe, paths in entry["recipes"].items()
                    for path, row in paths.items()]


def shape_entries(results: dict) -> list[dict]:
    """The shape entries of a results JSON; a JSON of the bench before ``--shapes`` (one shape,
    one row per recipe, no baseline) read as that shape with its rows on the default path."""
    if "shapes" in results:
        return results["shapes"]
    return [{**results["shape"], "recipes": {name: {"default": row} for name, row in results["recipes"].items()}}]


def _shape_key(entry: dict) -> str:
    return ",".join(str(entry[key]) for key in SHAPE_KEYS)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _paths(plan_paths: dict[str, str]) -> str:
    """The sites' paths counted: "cutedsl 6, triton 4"."""
    return ", ".join(f"{path} {count}" for path, count in sorted(Counter(plan_paths.values()).items())) or "-"


_HEADER = (f"{'side':<16} {'mode':<15} {'fwd+bwd host':>12} {'fwd host':>9} {'/torch':>6} {'fwd/torch':>9} "
           f"{'device':>8} {'dev wall':>8} {'plan':>7} {'plan uncached':>13} {'plan/step':>9} {'plans made':>10} "
           f"{'syncs':>5} {'launches':>8}  paths")


def _line(side: str, mode: str, row: dict) -> str:
    """A row as a table line: its figures, or the reason it has none."""
    if "reason" in row:
        reason = row["reason"].splitlines()[0] if row["reason"] else ""
        return f"{side:<16} {mode:<15} {reason[:140]}"
    host = _ms(row["fwd_bwd_host_ms"]) + ("*" if row.get("sleep_ended_early") else "")
    syncs = row.get("host_syncs_per_step")
    plan = [_ms(row.get(key)) for key in ("plan_ms", "plan_uncached_ms", "plan_per_step_ms")]
    return (f"{side:<16} {mode:<15} {host:>12} {_ms(row.get('fwd_host_ms')):>9} "
            f"{_ratio(row.get('fwd_bwd_host_over_torch')):>6} {_ratio(row.get('fwd_host_over_torch')):>9} "
            f"{_ms(row['device_ms']):>8} {_ms(row['device_wall_ms']):>8} {plan[0]:>7} {plan[1]:>13} {plan[2]:>9} "
            f"{row.get('plans_made_per_step', '-'):>10} {'-' if syncs is None else syncs:>5} "
            f"{'-' if row.get('launches_per_step') is None else row['launches_per_step']:>8}  "
            f"{_paths(row.get('plan_paths', {}))}")


def table(results: dict) -> str:
    """The run's checkout and device, then per shape a line per side and mode (and the profiles)."""
    checkout = f"gmlp {results['commit'][:12]}{' (dirty)' if results['dirty'] else ''} ({results['gmlp_path']})"
    lines = [f"{checkout}, {results['device']}, torch {results['torch']}, triton {results['triton']}", results["note"],
             "ms per call; /torch: gmlp's host ms over torch eager's in the same mode (above 1: gmlp's host is slower)"]
    early = False
    for entry in results["shapes"]:
        sizes = ", ".join(f"{key[0].upper()}={entry[key]}" for key in SHAPE_KEYS)
        lines += ["", f"shape {entry['name']} ({sizes})", _HEADER]
        profiles = {}
        for side, row in sides(entry):
            lines.append(_line(side, "eager", row))
            if "reduce_overhead" in row:
                lines.append(_line(side, "reduce-overhead", row["reduce_overhead"]))
            early = early or any(part.get("sleep_ended_early") for part in (row, row.get("reduce_overhead", {})))
            if "profile" in row:
                profiles[side] = row["profile"]
        if profiles:
            lines += ["", f"host profile, shape {entry['name']}", "", markdown(profiles)]
    if early:
        lines.append("* the sleep ended before the loop was issued: that host time includes waiting on the device")
    return "\n".join(lines)


def compare(results: dict, before: dict) -> dict:
    """Per shape and side, this run's figures over the earlier run's (after / before; ``COMPARED``,
    the reduce-overhead step's host ms) and the ms a step's host time saved."""
    earlier = {_shape_key(entry): dict(sides(entry)) for entry in shape_entries(before)}
    ratios = {}
    for entry in results["shapes"]:
        then = earlier.get(_shape_key(entry), {})
        for side, row in sides(entry):
            old = then.get(side)
            if old is None:
                continue
            figures = {key: row[key] / old[key] for key in COMPARED if row.get(key) and old.get(key)}
            graphed, graphed_before = row.get("reduce_overhead", {}), old.get("reduce_overhead", {})
            if graphed.get("fwd_bwd_host_ms") and graphed_before.get("fwd_bwd_host_ms"):
                figures["reduce_overhead_fwd_bwd_host_ms"] = (graphed["fwd_bwd_host_ms"]
                                                              / graphed_before["fwd_bwd_host_ms"])
            if row.get("fwd_bwd_host_ms") and old.get("fwd_bwd_host_ms"):
                figures["fwd_bwd_host_saved_ms"] = old["fwd_bwd_host_ms"] - row["fwd_bwd_host_ms"]
            if figures:
                ratios[f"{_shape_key(entry)} {side}"] = figures
    return {"commit": before.get("commit"), "device": before.get("device"), "after_over_before": ratios}
