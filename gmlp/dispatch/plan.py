"""The plan of one layer call: the path of every site, why each faster path is skipped, and the
function each site runs.

``plan_layer`` asks, site by site, each path's provider for the device (``gmlp.dispatch.paths``:
the table, and how a path is chosen) whether it can run the site's problem: the site's quantize
call (a ``QuantizeProblem``) for the quantizes, the ``LayerProblem`` for the other ops.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import torch

from gmlp.contract.problem import LayerProblem
from gmlp.contract.reasons import Reason
from gmlp.cutedsl.sm90 import launch_options
from gmlp.cutedsl.sm90 import support as sm90_support
from gmlp.dispatch.paths import (
    Decision,
    Path,
    Strict,
    choose_path,
    forced_path,
    next_path_down,
    provider,
    system_reason,
)
from gmlp.dispatch.sites import BLOCKWISE_SITES, GEMM_OPS, SITES, Op, Site
from gmlp.system.env import check_environment

__all__ = ["LayerPlan", "plan_layer", "implementation"]


@functools.lru_cache(maxsize=None)  # looked up for every op call: built once per (site, path, architecture)
def implementation(site: Site, path: Path, capability: tuple[int, int] | None = None) -> Callable:
    """The function that runs ``site``'s op on ``path`` for a device of ``capability`` (None: not a
    GPU), with the arguments of the op's Triton launcher (launch settings such as the quantize
    config excepted: each path has its own)."""
    chosen = provider(path, capability)
    if chosen is None:
        raise ValueError(f"no {path.value} provider serves compute capability {capability}")
    return chosen.load(site)


@dataclass(frozen=True)
class LayerPlan:
    """The path of every site of one layer call, and why each faster path is skipped."""

    decisions: dict[str, Decision]  # site name -> decision, in the order the sites run
    references: dict[str, Path | None]  # site name -> the next path down that runs it (cross-check), if any
    sm100: bool = False  # the GEMM sites run as the SM100 composition (gmlp.cutedsl.sm100.layer)
    capability: tuple[int, int] | None = None  # the device's (None: not a GPU), which picks each path's provider
    # site -> how its SM90 kernel launches (its knobs and where they come from), for the sites on the SM90 kernels
    launch_notes: dict[str, str] = dataclasses.field(default_factory=dict)
    blockwise: bool = False  # the FP8 blockwise recipe's step sequence (``BLOCKWISE_SITES``)
    # (site name, lookup) -> the function ``function`` returned: the layer asks at every op call
    _functions: dict[tuple[str, Callable], Callable] = dataclasses.field(default_factory=dict, init=False, repr=False,
                                                                         compare=False)

    def path(self, site: str) -> Path:
        return self.decisions[site].path

    def function(self, site: str, lookup: Callable = implementation) -> Callable:
        """The function that runs site ``site`` on its path: ``lookup(Site, path, capability)``
        (``implementation``, or a stand-in with its signature), asked once per site and lookup."""
        key = (site, lookup)
        found = self._functions.get(key)
        if found is None:
            found = self._functions[key] = lookup(self.site(site), self.path(site), self.capability)
        return found

    def site(self, name: str) -> Site:
        """The site ``name`` of this plan's step sequence (its op differs between recipes)."""
        return (BLOCKWISE_SITES if self.blockwise else SITES)[name]

    def explain(self) -> str:
        """Each op (where it runs in the layer, which op, which path), then why faster paths were
        skipped: each reason once, with the ops it applies to."""
        width = max(len(name) for name in self.decisions)
        op_width = max(len(decision.op) for decision in self.decisions.values())
        lines = ["the layer's GEMMs run as one Blackwell (SM100) composition of cuDNN frontend's fused kernels, "
                 "MXFP8 operands as they are; each op and its path:" if self.sm100 else
                 "each op of the layer (the FP8 blockwise recipe) and the path it runs on (the fastest that can: "
                 "cutedsl, triton, torch):" if self.blockwise else
                 "each op of the layer and the path it runs on (the fastest that can: cutedsl, triton, torch):"]
        skipped: dict[tuple[Path, str], list[str]] = {}  # (path, reason) -> the ops that skipped it for it
        for name, decision in self.decisions.items():
            launch = f", {self.launch_notes[name]}" if name in self.launch_notes else ""
            lines.append(f"  {name:<{width}}  {decision.op:<{op_width}} -> {decision.path.value}{launch}")
            for path, reason in decision.skipped:
                skipped.setdefault((path, str(reason)), []).append(name)
        if skipped:
            lines.append("why not a faster path:")
        for (path, reason), names in skipped.items():
            ops = "every op" if len(names) == len(self.decisions) else ", ".join(names)
            lines.append(f"  not {path.value} ({ops}): {reason}")
        return "\n".join(lines)


def plan_layer(problem: LayerProblem, device: torch.device, *, strict: Strict) -> LayerPlan:
    """Choose the path of every site (``gmlp.dispatch.paths.choose_path``: strict mode and forced
    backends apply per site; a fallback warning comes once per op, activation, path and reason,
    naming the first site where it happened). On SM100 the GEMM sites get the same CuTeDSL answer
    (the SM100 composition, all or none); when they take it, nothing is dequantized and the
    quantizes are judged as the composition calls them. On SM90 each GEMM site takes its SM90
    kernel where that runs the site's problem. Every gmlp environment variable is checked first
    (``gmlp.system.env.check_environment``), whichever of them this device's paths read."""
    check_environment()
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    sm100 = _sm100_runs(problem, device, capability)
    quantize_problems = problem.sm100_quantize_problems if sm100 else problem.quantize_problems
    decisions, references = {}, {}
    for name, site in (BLOCKWISE_SITES if problem.blockwise else SITES).items():
        if (site.mxfp8_only and not problem.mxfp8) or (site.bias_only and not problem.bias):
            continue
        if site.sm100 is not None and site.sm100 != sm100:
            continue
        op_problem = quantize_problems[name] if site.quantizes else problem

        def problem_reason(path: Path, site: Site = site, op_problem=op_problem) -> Reason | None:
            return provider(path, capability).supports(site.op, op_problem, site.name)  # asked after its system check

        decision = choose_path(site.op.value, device, problem_reason, strict=strict, detail=problem.activation, where=name)
        decisions[name] = decision
        references[name] = next_path_down(decision.path, device, problem_reason)
    if sm100 and any(decisions[name].path is not Path.CUTEDSL for name in decisions if SITES[name].op in GEMM_OPS):
        raise AssertionError(f"the GEMM sites must all take the SM100 composition or none: {decisions}")
    launch_notes = {}
    if capability is not None and capability[0] == 9:
        sites = BLOCKWISE_SITES if problem.blockwise else SITES
        launch_notes = {name: _sm90_launch(name, problem)
                        for name, decision in decisions.items()
                        if decision.path is Path.CUTEDSL and sites[name].op.value in launch_options.DEFAULTS}
    return LayerPlan(decisions, references, sm100=sm100, capability=capability,
                     launch_notes=launch_notes, blockwise=problem.blockwise)


def _sm90_launch(name: str, problem: LayerProblem) -> str:
    """The knobs of the SM90 kernel of site ``name`` and where they come from
    (``launch_options.describe``), as the layer launches it: FC2 adds b2, FC1 and FC2 dgrad
    quantize their outputs in an MXFP8 layer (the FP8 blockwise kernels: their recipe's entries)."""
    op = (BLOCKWISE_SITES if problem.blockwise else SITES)[name].op
    variant = {}
    if op in (Op.FC1, Op.FC2_DGRAD):
        variant["quantized"] = problem.mxfp8
    gated = problem.activation != "srelu"
    if name == "fc2":
        variant["bias"] = problem.bias
    gemm = sm90_support.site_gemm(name, problem.tokens, problem.hidden, problem.ffn, problem.experts, gated=gated)
    return launch_options.describe(op.value, *gemm, site=name, **variant)


def _sm100_runs(problem: LayerProblem, device: torch.device, capability: tuple[int, int] | None) -> bool:
    """Whether the GEMM sites will take the SM100 composition (their CuTeDSL answer on an SM100
    GPU, unforced or forced to CuTeDSL). On SM90 each GEMM site decides on its own."""
    return (forced_path() in (None, Path.CUTEDSL) and system_reason(Path.CUTEDSL, device) is None
            and capability[0] == 10 and provider(Path.CUTEDSL, capability).supports(Op.FC1, problem, "fc1") is None)
