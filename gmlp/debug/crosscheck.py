"""The cross-check hook: every op of a layer call also runs on the next path down, and the two
outputs are compared (``gmlp.debug.compare``); a mismatch is reported, as a warning or an error,
and every comparison, or the reason there was none, is recorded in the settings' report
(``gmlp.debug.record``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gmlp.contract.gate_up import GateUp
from gmlp.contract.reference import grouped_gemm_ref, grouped_wgrad_ref, segment_sum_ref
from gmlp.debug.compare import (
    FP8_WGMMA_BLOCK_ERROR,
    Comparison,
    activation_slope,
    bitwise,
    gemm_delta,
    within_bound,
)
from gmlp.debug.record import CrossCheckReport
from gmlp.dispatch.caller import warn_at_caller
from gmlp.dispatch.paths import Path
from gmlp.dispatch.plan import LayerPlan, implementation
from gmlp.dispatch.sites import BLOCKWISE_OPS, Op, site_names
from gmlp.fp8_blockwise.gemm import grouped_gemm_blockwise_ref, grouped_wgrad_blockwise_ref
from gmlp.fp8_blockwise.tensor import absolute
from gmlp.mxfp8.routing import device_groups

__all__ = ["CrossCheckSettings", "CrossCheckError", "CrossCheckWarning", "CrossCheck", "report", "say_uncompared",
           "last_path"]


class CrossCheckError(RuntimeError):
    """Raised by the cross-check (action "raise") when two paths disagree beyond the bound."""


class CrossCheckWarning(UserWarning):
    """Emitted by the cross-check (action "warn") when two paths disagree beyond the bound."""


@dataclass(frozen=True)
class CrossCheckSettings:
    """Which sites or ops to check (None: all), what to do on a mismatch, an optional
    ``(rtol, atol)`` that replaces the derived bounds of the non-bitwise comparisons, and the
    report the checks made under these settings are recorded in."""

    ops: frozenset[str] | None = None
    action: str = "warn"
    tolerance: tuple[float, float] | None = None
    report: CrossCheckReport = field(default_factory=CrossCheckReport, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.action not in ("warn", "raise"):
            raise ValueError(f"action must be 'warn' or 'raise', got {self.action!r}")
        known = site_names() | {op.value for op in Op}
        if self.ops is not None and not set(self.ops) <= known:
            unknown = ", ".join(sorted(repr(name) for name in set(self.ops) - known))
            raise ValueError(f"ops: unknown names {unknown}; valid are the site names {sorted(site_names())} and the "
                             f"op names {sorted(op.value for op in Op)}")

    def covers(self, site: str, op: Op) -> bool:
        """Whether a layer site (by its name or its op's, ``op``) is checked."""
        return self.ops is None or site in self.ops or op.value in self.ops

    def covers_op(self, op: str) -> bool:
        """Whether a standalone op (``gmlp.quantize_mxfp8``) is checked."""
        return self.ops is None or op in self.ops


def _compare(op: Op, got, want, args: tuple, kwargs: dict, tolerance) -> Comparison:
    """The comparison rule of the site's op (``gmlp.debug.compare``'s module docstring)."""
    comparison = Comparison()
    if op in BLOCKWISE_OPS:
        _compare_blockwise(comparison, op, got, want, args, kwargs, tolerance)
        return comparison
    if op in (Op.QUANTIZE, Op.DEQUANTIZE, Op.QUANTIZE_DEQUANTIZE):
        bitwise(comparison, "out", got, want)
    elif op is Op.SEGMENT_SUM:
        values, starts = args
        abs_sums = segment_sum_ref(values.abs(), starts)
        within_bound(comparison, "out", got, want, gemm_delta(abs_sums, values.shape[0] + 1), tolerance)
    elif op is Op.GROUPED_GEMM:
        a, b, split_sizes = args[:3]
        abs_products = grouped_gemm_ref(a.abs(), _abs(b), split_sizes, out_dtype=torch.float32)
        within_bound(comparison, "out", got, want, gemm_delta(abs_products, a.shape[1] + 2), tolerance)
    elif op is Op.WGRAD:
        a, b, split_sizes = args[:3]
        split_rows = kwargs.get("split_rows")  # W1's gate and up rows as two gradients
        abs_products = grouped_wgrad_ref(a.abs(), b.abs(), split_sizes, split_rows=split_rows)
        if split_rows is None:
            within_bound(comparison, "out", got, want, gemm_delta(abs_products, a.shape[0] + 2), tolerance)
        else:
            for name, mine, ref, bound in zip(("gate", "up"), got, want, abs_products):
                within_bound(comparison, name, mine, ref, gemm_delta(bound, a.shape[0] + 2), tolerance)
    elif op is Op.FC1:
        _compare_fc1(comparison, got, want, args, kwargs, tolerance)
    else:
        _compare_fc2_dgrad(comparison, got, want, args, kwargs, tolerance)
    return comparison


def _abs(operand):
    """|B| of a GEMM's weight operand: a tensor, W1's gate and up views (a ``GateUp``), or a pair
    of operands side by side along K."""
    if isinstance(operand, GateUp):
        return GateUp(operand.gate.abs(), operand.up.abs())
    if isinstance(operand, tuple):
        return tuple(part.abs() for part in operand)
    return operand.abs()


def _probs_factor(kwargs: dict, rows: int, device) -> torch.Tensor:
    probs = kwargs.get("probs")
    return torch.ones(rows, 1, device=device) if probs is None else probs.float().abs()[:, None]


def _compare_fc1(comparison: Comparison, got, want, args, kwargs, tolerance) -> None:
    x, w1, split_sizes = args[:3]
    delta_h = gemm_delta(grouped_gemm_ref(x.abs(), _abs(w1), split_sizes, out_dtype=torch.float32), x.shape[1] + 2)
    _compare_fc1_outputs(comparison, got, want, delta_h, kwargs, tolerance)


def _compare_fc1_outputs(comparison: Comparison, got, want, delta_h: torch.Tensor, kwargs, tolerance) -> None:
    """FC1's outputs, h being within ``delta_h`` of the reference's: c, then a through the activation."""
    activation = kwargs["activation"]
    within_bound(comparison, "c", got.c, want.c, delta_h, tolerance)
    if activation.gated:
        delta_gate, delta_up = delta_h.chunk(2, dim=1)
        delta_pre = delta_gate + delta_up
    else:
        delta_pre = delta_h
    delta_a = activation_slope(want.c, activation) * delta_pre * _probs_factor(kwargs, want.c.shape[0], want.c.device)
    for name in ("a", "a_rowwise", "a_columnwise"):
        if getattr(want, name) is not None:
            within_bound(comparison, name, getattr(got, name), getattr(want, name), delta_a, tolerance)


def _compare_fc2_dgrad(comparison: Comparison, got, want, args, kwargs, tolerance) -> None:
    dy, w2t, c, split_sizes = args[:4]
    abs_da = grouped_gemm_ref(dy.abs(), w2t.abs(), split_sizes, out_dtype=torch.float32)
    _compare_fc2_dgrad_outputs(comparison, got, want, abs_da, gemm_delta(abs_da, dy.shape[1] + 2), c, split_sizes,
                               kwargs, tolerance)


def _compare_fc2_dgrad_outputs(comparison: Comparison, got, want, abs_da: torch.Tensor, delta_da: torch.Tensor,
                               c: torch.Tensor, split_sizes: torch.Tensor, kwargs, tolerance) -> None:
    """FC2 dgrad's outputs, da being within ``delta_da`` of the reference's (|da| <= ``abs_da``):
    dh through the activation's derivative, dprobs and db1 as sums of them."""
    activation = kwargs["activation"]
    tokens, ffn = abs_da.shape
    probs = _probs_factor(kwargs, tokens, abs_da.device)
    slope = activation_slope(c, activation)
    delta_half = slope * delta_da * probs  # each half of dh: its partial derivative times da's error
    delta_dh = torch.cat([delta_half, delta_half], dim=1) if activation.gated else delta_half
    for name in ("dh", "dh_rowwise", "dh_columnwise"):
        if getattr(want, name) is not None:
            within_bound(comparison, name, getattr(got, name), getattr(want, name), delta_dh, tolerance)
    if want.dprobs is not None:
        act = activation.forward(c.float()).abs()
        delta = ((delta_da + gemm_delta(abs_da, ffn)) * act).sum(dim=1)
        within_bound(comparison, "dprobs", got.dprobs, want.dprobs, delta, tolerance)
    if want.db1 is not None:
        abs_dh = slope * abs_da * probs
        per_row = delta_dh + gemm_delta(torch.cat([abs_dh, abs_dh], dim=1) if activation.gated else abs_dh, tokens)
        delta = segment_sum_ref(per_row, device_groups(split_sizes, tokens).row_start)
        within_bound(comparison, "db1", got.db1, want.db1, delta, tolerance)


def _blockwise_delta(abs_products: torch.Tensor, terms: int, on_gpu: bool) -> torch.Tensor:
    """Bound on an FP8 blockwise GEMM's summation error against the fp64 oracle: fp32 sums over
    ``terms`` (``gemm_delta``), plus on a GPU each 128-block's fp8 ``wgmma`` chain at the tensor
    cores' reduced accumulation precision (``compare.FP8_WGMMA_BLOCK_ERROR``)."""
    return gemm_delta(abs_products, terms) + (FP8_WGMMA_BLOCK_ERROR * abs_products if on_gpu else 0.0)


def _compare_blockwise(comparison: Comparison, op: Op, got, want, args, kwargs, tolerance) -> None:
    """The FP8 blockwise ops: the quantizes bit for bit (the spec); the GEMMs within the bound of
    their summation order, from the GEMMs of |elements| and |scales|."""
    if op in (Op.BLOCKWISE_QUANTIZE, Op.BLOCKWISE_WEIGHTS):
        bitwise(comparison, "out", got, want)
        return
    a, b, split_sizes = args[:3]
    on_gpu = a.data.is_cuda
    if op is Op.BLOCKWISE_WGRAD:
        abs_products = grouped_wgrad_blockwise_ref(absolute(a), absolute(b), split_sizes)
        within_bound(comparison, "out", got, want, _blockwise_delta(abs_products, a.source_shape[0] + 2, on_gpu),
                     tolerance)
        return
    if op is Op.BLOCKWISE_FC2_DGRAD:
        b, c, split_sizes = args[1:4]
    terms = a.source_shape[1] + 2
    abs_products = grouped_gemm_blockwise_ref(absolute(a), absolute(b), split_sizes, out_dtype=torch.float32)
    delta = _blockwise_delta(abs_products, terms, on_gpu)
    if op is Op.BLOCKWISE_GEMM:
        within_bound(comparison, "out", got, want, delta, tolerance)
    elif op is Op.BLOCKWISE_FC1:
        _compare_fc1_outputs(comparison, got, want, delta, kwargs, tolerance)
    else:
        _compare_fc2_dgrad_outputs(comparison, got, want, abs_products, delta, c, split_sizes, kwargs, tolerance)


_said_uncompared: set[str] = set()


def report(title: str, comparison: Comparison, action: str, expert_of=None) -> None:
    """Warn or raise with the mismatches of one op call; ``expert_of(index, shape)`` names the
    expert of an element where the output's rows are tokens (or experts)."""
    lines = [f"cross-check: {title}:"]
    for name, (count, shape, first, rows) in comparison.outputs.items():
        if not count:
            continue
        in_rows = f", in {rows} of {math.prod(shape[:-1])} rows (the first of each below)" if len(shape) > 1 else ""
        lines.append(f"  {name} {shape}: {count} of {math.prod(shape)} elements differ{in_rows}:")
        for mismatch in first:
            lines.append("    " + mismatch.describe(name, expert_of(mismatch.index, shape) if expert_of else None))
    message = "\n".join(lines)
    if action == "raise":
        raise CrossCheckError(message)
    warn_at_caller(message, CrossCheckWarning)


def last_path(path: Path) -> str:
    """Why an op on ``path`` is not compared: no path below it runs the op here."""
    return f"{path.value} is the last path here"


def say_uncompared(what: str, path: Path) -> None:
    """Once per process for each ``what``: ops the cross-check covers run on ``path``, the last path
    that runs them here, so nothing checks them."""
    if what not in _said_uncompared:
        _said_uncompared.add(what)
        warn_at_caller(f"cross-check: nothing to compare {what} with ({last_path(path)})", CrossCheckWarning)


class CrossCheck:
    """The ``OpRunner`` hook of one layer call: runs each covered site on its reference path too."""

    def __init__(self, plan: LayerPlan, settings: CrossCheckSettings, split_sizes: torch.Tensor):
        self.plan, self.settings = plan, settings
        self.row_start = torch.cat([split_sizes.new_zeros(1), split_sizes.cumsum(0)]).cpu()
        # the covered sites with no path below theirs, said in one warning (once per process)
        last = {}
        for site, reference in plan.references.items():
            if reference is None and settings.covers(site, plan.site(site).op):
                last.setdefault(plan.path(site), []).append(f"{site} ({plan.site(site).op.value})")
        for path, sites in last.items():
            say_uncompared(f"the layer's {', '.join(sites)}", path)

    def __call__(self, site: str, got, args: tuple, kwargs: dict, before: torch.Tensor | None) -> None:
        op = self.plan.site(site).op
        if not self.settings.covers(site, op):
            return
        chosen, reference = self.plan.path(site), self.plan.references[site]
        if reference is None:  # said when the call started
            self.settings.report.add_uncompared(site, op.value, chosen.value, last_path(chosen))
            return
        if before is not None:  # an accumulating output: the reference starts from the same values
            kwargs = {**kwargs, "out": before}
        want = implementation(self.plan.site(site), reference, self.plan.capability)(*args, **kwargs)
        comparison = _compare(op, got, want, args, kwargs, self.settings.tolerance)
        self.settings.report.add(site, op.value, chosen.value, reference.value, comparison)
        if comparison.mismatches:
            report(f"{site} ({op.value}) on {chosen.value} differs from {reference.value}", comparison,
                   self.settings.action, self._expert)

    def _expert(self, index: tuple[int, ...], shape: tuple[int, ...]) -> int | None:
        if len(index) == 3:
            return index[0]
        if shape[0] != int(self.row_start[-1]):
            return None  # not a tensor of token rows (a weight)
        return int(torch.searchsorted(self.row_start[1:], torch.tensor(index[0]), right=True))
