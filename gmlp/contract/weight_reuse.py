"""A weight site's quantization, kept by one forward and reused by the next ones: what the layer's
step sequence (``gmlp.layer.steps``) and the SM100 composition (``gmlp.cutedsl.sm100.layer``)
share. ``run`` is the layer's op runner, read by duck typing: ``reused_weights`` (site -> an
earlier forward's result) and ``kept_weights`` (a dict to keep results in, or None); a plain
quantize function has neither."""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["quantized_weight"]


def quantized_weight(run: Callable, site: str, stack: Callable[[], torch.Tensor | tuple], cache: bool = True,
                     combine: Callable[[tuple], Any] | None = None, **quantize_args):
    """A weight site's quantization: the one an earlier forward kept (``run.reused_weights``,
    GroupedMLP's ``weight_cache``), or ``run(site, stack(), **quantize_args)``, kept in
    ``run.kept_weights`` when the runner keeps weights; with ``cache`` False neither (a
    backward's). ``stack`` builds the (E * N, K) weight stack only when it is quantized (the SM100
    path interleaves W1 there); a pair of stacks (W1's gate and up stored apart) is quantized one
    by one, and the pair of results is the site's, or what ``combine`` makes of it (kept as such,
    so that a reusing forward does not combine them again)."""
    reused = getattr(run, "reused_weights", {}).get(site) if cache else None  # a plain function keeps none
    if reused is not None:
        return reused
    stacks = stack()
    if isinstance(stacks, tuple):
        result = tuple(run(site, part, **quantize_args) for part in stacks)
        result = combine(result) if combine is not None else result
    else:
        result = run(site, stacks, **quantize_args)
    kept = getattr(run, "kept_weights", None) if cache else None
    if kept is not None:
        kept[site] = result
    return result
