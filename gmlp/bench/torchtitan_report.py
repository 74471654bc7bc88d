"""What ``python -m gmlp.bench torchtitan`` reports from its results JSON: the summary against the
stock run, the loss plots, and the markdown table of ``--table`` (the runs of one model, and the
bf16 spread that their loss gaps are judged against)."""

from __future__ import annotations

import json
import pathlib
from collections import defaultdict

SPREAD_RUN = "torchtitan-fused"  # stock's model rounded differently: its gap to stock is the bf16 noise


def moving_mean(values: list[float], window: int) -> list[float]:
    """The means over ``window`` steps ending at steps window-1, window, ..."""
    return [sum(values[i:i + window]) / window for i in range(len(values) - window + 1)]


def moving_gap(losses: list[float], stock: list[float], window: int) -> list[float]:
    """loss - stock loss, each the mean over ``window`` steps ending at steps window-1, window, ..."""
    return moving_mean([a - b for a, b in zip(losses, stock)], window)


def final_loss(losses: list[float], window: int) -> float:
    """The mean loss over the last ``window`` steps (over the steps there are, when fewer)."""
    tail = losses[-window:]
    return sum(tail) / len(tail)


def max_gap(losses: list[float], stock: list[float], window: int) -> float:
    """The largest distance from stock of the loss's mean over a moving ``window`` (0 for a run
    shorter than the window)."""
    return max((abs(d) for d in moving_gap(losses, stock, window)), default=0.0)


def halfway_step(losses: list[float], stock: list[float], window: int) -> int | None:
    """The first step at which the loss's mean over a moving ``window`` (the window's last step) is
    at or below halfway from stock's first window mean to its last: how soon a run learns, where a
    model's loss sits on a plateau and leaves it at a step of its own (None: never)."""
    level = (final_loss(stock[:window], window) + final_loss(stock, window)) / 2
    return next((step + window - 1 for step, mean in enumerate(moving_mean(losses, window)) if mean <= level), None)


def summary(runs: dict, window: int) -> dict:
    """Each run's mean loss over the last ``window`` steps, its largest distance from stock (the
    mean over a moving ``window``), and tokens/s as a ratio of stock's."""
    stock = runs.get("stock")
    out = {}
    for name, run in runs.items():
        losses = run["loss"]
        entry = {"final_loss": final_loss(losses, window)}
        if stock is not None:
            entry["max_moving_gap_to_stock"] = max_gap(losses, stock["loss"], window)
            entry["final_gap_to_stock_relative"] = entry["final_loss"] / final_loss(stock["loss"], window) - 1
            entry["tokens_per_s_vs_stock"] = run["tokens_per_s"] / stock["tokens_per_s"]
        out[name] = entry
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _kernels(results: dict) -> str:
    """Which gmlp kernels the GPU run had: CuTeDSL where it runs, else Triton only."""
    return "CuTeDSL + Triton" if results["environment"].get("nvidia-cutlass-dsl", "not installed") != "not installed" else "Triton only"


def plot(path: pathlib.Path) -> pathlib.Path:
    """The loss curves of a results JSON, and each run's gap to stock, as a PNG beside it."""
    plt = _pyplot()
    results = json.loads(path.read_text())
    runs, window = results["runs"], results["settings"]["window"]
    figure, (curves, gaps) = plt.subplots(2, 1, figsize=(9, 8), sharex=True, height_ratios=[2, 1])
    for index, (name, run) in enumerate(runs.items()):
        color, tokens_per_s = f"C{index}", run["tokens_per_s"]
        curves.plot(run["loss"], label=f"{name} ({tokens_per_s / 1e3:.0f}k tokens/s)", linewidth=1, color=color)
        if name != "stock" and "stock" in runs:
            gap = moving_gap(run["loss"], runs["stock"]["loss"], window)
            gaps.plot(range(window - 1, window - 1 + len(gap)), gap, label=name, linewidth=1, color=color)
    curves.axhline(results["data_entropy"], color="gray", linestyle=":", label="entropy of the token source")
    curves.set_ylabel("training loss (nats)")
    curves.set_yscale("log")
    curves.legend()
    env = results["environment"]
    settings = results["settings"]
    curves.set_title(f"torchtitan {settings['flavor']}, {env['device']}, torch {env['torch']}, "
                     f"gmlp {env['commit'][:7]} ({_kernels(results)}), seed {settings['seed']}")
    gaps.axhline(0, color="gray", linewidth=0.5)
    gaps.set_ylabel(f"loss - stock loss\n(mean of {window} steps)")
    gaps.set_xlabel("step")
    gaps.legend()
    figure.tight_layout()
    out = path.with_suffix(".png")
    figure.savefig(out, dpi=120)
    return out


def plot_seeds(paths: list[pathlib.Path], out: pathlib.Path) -> pathlib.Path:
    """Each run's gap to stock, one panel per results JSON (seed), on one scale: how far runs that
    differ only in rounding (torchtitan-fused) drift from stock, beside gmlp's."""
    plt = _pyplot()
    figure, axes = plt.subplots(len(paths), 1, figsize=(9, 2.4 * len(paths) + 0.6), sharex=True, sharey=True,
                                squeeze=False)
    every_results = [json.loads(path.read_text()) for path in paths]
    colors = _colors([results["runs"] for results in every_results])
    for axis, path, results in zip(axes[:, 0], paths, every_results):
        runs, window = results["runs"], results["settings"]["window"]
        for name, run in runs.items():
            if name != "stock":
                gap = moving_gap(run["loss"], runs["stock"]["loss"], window)
                axis.plot(range(window - 1, window - 1 + len(gap)), gap, label=name, linewidth=1, color=colors[name])
        axis.axhline(0, color="gray", linewidth=0.5)
        axis.set_title(f"seed {results['settings']['seed']}, gmlp on {_kernels(results)} ({path.name})", fontsize=9)
        axis.set_ylabel(f"loss - stock\n({window}-step mean)")
        axis.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    return out


def _model_key(results: dict) -> tuple:
    """What makes two results files the same experiment but for the seed and the runs in them:
    the model, its blocks, the tokens of a step (batch x length, times the micro-batches where
    gradients accumulate), steps, the device, and gmlp's commit with its kernels."""
    settings, env = results["settings"], results["environment"]
    tokens = f"{settings['batch']} x {settings['seq_len']}"
    micro_batches = settings.get("accumulate", 1)  # files before --accumulate: one batch a step
    if micro_batches > 1:
        tokens += f" x {micro_batches} micro-batches"
    return (settings.get("model", "debug"), settings.get("layers_built"), tokens, settings["steps"], env["device"],
            f"{env['commit'][:7]}, {_kernels(results)}")


def _run_label(name: str, results: dict) -> str:
    """A gmlp run's name with the gmlp settings its process ran under (``GMLP_*`` variables but the
    commit: a forced backend, launch knobs, the cross-check), so that a variant sits beside the
    plain run of its experiment instead of colliding with it; other runs' names as they are."""
    settings = {key: value for key, value in results["environment"].get("gmlp_settings", {}).items()
                if key != "GMLP_COMMIT"}
    if not name.startswith("gmlp-") or not settings:
        return name
    return f"{name} [{', '.join(f'{key}={value}' for key, value in sorted(settings.items()))}]"


def _seed_runs(paths: list[pathlib.Path]) -> dict[tuple, dict[int, dict]]:
    """Each experiment's runs per seed, gathered from files that may each hold some of them (one
    run per process, the same seed, starts from the same weights and sees the same tokens); a run
    in two files of one experiment and seed is an error, not a silent choice."""
    experiments: dict[tuple, dict[int, dict]] = defaultdict(lambda: defaultdict(dict))
    for path in paths:
        results = json.loads(path.read_text())
        runs = experiments[_model_key(results)][results["settings"]["seed"]]
        for run_name, run in results["runs"].items():
            name = _run_label(run_name, results)
            if name in runs:
                raise ValueError(f"--table: run {name!r} of seed {results['settings']['seed']} is in two files "
                                 f"(the second: {path}); expected each once")
            runs[name] = {**run, "window": results["settings"]["window"]}
    return experiments


def _mean(values: list) -> float | None:
    """The mean, or None when a value is missing (a CPU run's memory, a run without a profile)."""
    return sum(values) / len(values) if values and None not in values else None


def _run_names(seeds: list[dict]) -> list[str]:
    """The runs of ``seeds`` (each seed's runs by name), each once, in the order first met."""
    return list(dict.fromkeys(name for runs in seeds for name in runs))


def _colors(seeds: list[dict]) -> dict[str, str]:
    """A color per run of ``seeds``, the same in every panel of a figure."""
    return {name: f"C{index}" for index, name in enumerate(_run_names(seeds))}


def _kernel_ms(run: dict) -> float | None:
    """The profiled steps' GPU kernel ms per step (None: no profile, or a CPU run's, which has no kernels)."""
    profile = run.get("profile") or {}
    return profile["kernels_ms"] / profile["steps"] if profile.get("kernels_ms") and profile.get("steps") else None


def _figures(name: str, seeds: list[dict]) -> dict:
    """Run ``name``'s figures over the seeds that have it (``seeds``: each seed's runs)."""
    with_stock = [runs for runs in seeds if "stock" in runs]
    tokens = _mean([runs[name]["tokens_per_s"] for runs in seeds])
    stock_tokens = _mean([runs["stock"]["tokens_per_s"] for runs in with_stock])
    peak = _mean([runs[name]["peak_memory_gb"] for runs in seeds])
    stock_peak = _mean([runs["stock"]["peak_memory_gb"] for runs in with_stock])
    gaps = [max_gap(runs[name]["loss"], runs["stock"]["loss"], runs[name]["window"])
            for runs in with_stock if name != "stock"]
    kernels = _mean([_kernel_ms(runs[name]) for runs in seeds])
    stock_kernels = _mean([_kernel_ms(runs["stock"]) for runs in with_stock])
    return {"seeds": len(seeds), "tokens_per_s": tokens,
            "kernel_speed": stock_kernels / kernels if kernels and stock_kernels else None,
            "vs_stock": tokens / stock_tokens if tokens and stock_tokens else None,
            "mfu": _mean([runs[name].get("mfu") for runs in seeds]), "peak_gb": peak,
            "peak_vs_stock": peak / stock_peak if peak and stock_peak else None,
            "experts_share": _mean([(runs[name].get("profile") or {}).get("experts_share") for runs in seeds]),
            "final_loss": _mean([final_loss(runs[name]["loss"], runs[name]["window"]) for runs in seeds]),
            "max_gap": max(gaps) if gaps else None}


def _halfway_steps(name: str, by_seed: dict[int, dict]) -> str:
    """Run ``name``'s ``halfway_step`` in each seed that has it and stock, "seed: step" ("-": never)."""
    steps = {seed: halfway_step(runs[name]["loss"], runs["stock"]["loss"], runs[name]["window"])
             for seed, runs in sorted(by_seed.items()) if {name, "stock"} <= set(runs)}
    return ", ".join(f"{seed}: {'-' if step is None else step}" for seed, step in steps.items())


def _cell(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else format(value, pattern)


def table(paths: list[pathlib.Path]) -> str:
    """A markdown table of results files: per experiment (model, blocks, tokens of a step, steps,
    device, gmlp's commit and kernels) and run, over the seeds that have it: the mean tokens/s and its ratio to stock's, MFU,
    peak memory and its ratio to stock's, the experts' share of the profiled kernel time, the
    final loss, the largest moving gap to stock, whether that is within the bf16 spread (the
    largest gap of ``SPREAD_RUN`` over the seeds), each seed's ``halfway_step`` ("seed:
    step"), and stock's GPU kernel time per profiled step over the run's (above 1: the run's
    kernels are faster; steadier than tokens/s, which the host's stalls move from process to
    process); then the spread's row. A gmlp run made under gmlp
    settings is its own row (``_run_label``)."""
    lines = ["| experiment: model (blocks), tokens, steps, device, gmlp | run | seeds | tokens/s | vs stock | MFU | peak GB | vs stock | "
             "experts' share | final loss | max gap to stock | within the bf16 spread | halfway step, per seed | "
             "kernel speed vs stock |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for (model, layers, tokens, steps, device, code), by_seed in _seed_runs(paths).items():
        seeds = list(by_seed.values())
        spread_gaps = [max_gap(runs[SPREAD_RUN]["loss"], runs["stock"]["loss"], runs["stock"]["window"])
                       for runs in seeds if {SPREAD_RUN, "stock"} <= set(runs)]
        spread = max(spread_gaps) if spread_gaps else None
        experiment = f"{model} ({layers}), {tokens}, {steps} steps, {device}, gmlp {code}"
        for name in _run_names(seeds):
            f = _figures(name, [runs for runs in seeds if name in runs])
            within = "" if f["max_gap"] is None or spread is None else ("yes" if f["max_gap"] <= spread else "no")
            lines.append(f"| {experiment} | {name} | {f['seeds']} | {_cell(f['tokens_per_s'], ',.0f')} | "
                         f"{_cell(f['vs_stock'], '.2f')} | {_cell(f['mfu'], '.3f')} | {_cell(f['peak_gb'], '.1f')} | "
                         f"{_cell(f['peak_vs_stock'], '.2f')} | {_cell(f['experts_share'], '.2f')} | "
                         f"{_cell(f['final_loss'], '.4f')} | {_cell(f['max_gap'], '.4f')} | {within} | "
                         f"{_halfway_steps(name, by_seed)} | {_cell(f['kernel_speed'], '.2f')} |")
        lines.append(f"| {experiment} | bf16 spread: {SPREAD_RUN}'s max gap over {len(spread_gaps)} seeds | | | | | | | | | "
                     f"{_cell(spread, '.4f')} | | | |")
    return "\n".join(lines)


def parts_table(paths: list[pathlib.Path]) -> str | None:
    """A markdown table of where each run's profiled step goes (its ``parts_ms``: the experts, the
    optimizer, copies, attention, other GEMMs, the rest), ms per step averaged over the seeds,
    each part's share of the kernel time in brackets; None when no run has them (older files
    recorded the experts' split alone)."""
    lines = []
    for (model, layers, tokens, steps, device, code), by_seed in _seed_runs(paths).items():
        seeds = list(by_seed.values())
        for name in _run_names(seeds):
            profiles = [runs[name]["profile"] for runs in seeds if name in runs and runs[name].get("profile")]
            if not profiles or any("parts_ms" not in profile for profile in profiles):
                continue
            parts = {part: _mean([profile["parts_ms"][part] / profile["steps"] for profile in profiles])
                     for part in profiles[0]["parts_ms"]}
            total = sum(parts.values())
            if not lines:
                lines = [f"| experiment | run | step ms | {' | '.join(parts)} |",
                         "| --- | --- | ---: |" + " ---: |" * len(parts)]
            step_ms = _mean([runs[name]["step_ms"] for runs in seeds if name in runs])
            cells = " | ".join(f"{ms:.1f} ({ms / total:.0%})" if total else f"{ms:.1f}" for ms in parts.values())
            lines.append(f"| {model} ({layers}), {tokens}, {device}, gmlp {code} | {name} | {_cell(step_ms, '.1f')} | "
                         f"{cells} |")
    return "\n".join(lines) if lines else None


def bars(paths: list[pathlib.Path], out: pathlib.Path) -> pathlib.Path:
    """Per experiment (a panel pair), each run's tokens/s and peak memory as ratios of stock's,
    averaged over seeds as ``table`` does: the picture of the table's two ratio columns."""
    plt = _pyplot()
    experiments = _seed_runs(paths)
    colors = _colors([runs for by_seed in experiments.values() for runs in by_seed.values()])
    figure, axes = plt.subplots(len(experiments), 2, figsize=(11, 3.2 * len(experiments) + 0.4), squeeze=False)
    for (speed, memory), ((model, layers, tokens, steps, device, code), by_seed) in zip(axes, experiments.items()):
        seeds = list(by_seed.values())
        names = [name for name in _run_names(seeds) if name != "stock"]
        figures = [_figures(name, [runs for runs in seeds if name in runs]) for name in names]
        for axis, key, label in ((speed, "vs_stock", "tokens/s / stock's"), (memory, "peak_vs_stock", "peak memory / stock's")):
            values = [f[key] or 0.0 for f in figures]
            axis.barh(names, values, color=[colors[name] for name in names])
            for y, value in enumerate(values):
                axis.text(value, y, f" {value:.2f}", va="center", fontsize=8)
            axis.axvline(1.0, color="gray", linewidth=0.8)
            axis.set_xlabel(label)
            axis.invert_yaxis()
        speed.set_title(f"{model}, {layers} blocks, {tokens} tokens, {steps} steps, {device}, gmlp {code}",
                        fontsize=9, loc="left")
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    return out


def curves(paths: list[pathlib.Path], out: pathlib.Path) -> pathlib.Path:
    """Per experiment and seed (a panel pair), the loss of every run gathered from ``paths`` (a
    moving mean over the window, log scale) and its gap to stock's: ``table``'s loss columns as a
    picture, for runs kept one side per file."""
    plt = _pyplot()
    panels = [(key, seed, runs) for key, by_seed in _seed_runs(paths).items() for seed, runs in sorted(by_seed.items())]
    colors = _colors([runs for _, _, runs in panels])
    figure, axes = plt.subplots(2 * len(panels), 1, figsize=(9, 5.2 * len(panels) + 0.4),
                                height_ratios=[2, 1] * len(panels), squeeze=False)
    for index, ((model, layers, tokens, steps, device, code), seed, runs) in enumerate(panels):
        losses, gaps = axes[2 * index, 0], axes[2 * index + 1, 0]
        for name, run in runs.items():
            window = run["window"]
            smoothed = moving_mean(run["loss"], window)
            steps_axis = range(window - 1, window - 1 + len(smoothed))
            losses.plot(steps_axis, smoothed, label=name, linewidth=1, color=colors[name])
            if name != "stock" and "stock" in runs:
                gaps.plot(steps_axis, moving_gap(run["loss"], runs["stock"]["loss"], window), linewidth=1,
                          color=colors[name])
        losses.set_yscale("log")
        losses.set_ylabel("loss (nats), moving mean")
        losses.set_title(f"{model}, {layers} blocks, {tokens} tokens, seed {seed}, {device}, gmlp {code}", fontsize=9,
                         loc="left")
        losses.legend(fontsize=8)
        gaps.axhline(0, color="gray", linewidth=0.5)
        gaps.set_ylabel("loss - stock")
        gaps.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    return out
