"""The grouped MLP's ops: their call sites in the layer, their implementations on each path, and
what each path can run (the per-op half of the dispatch rules; ``gmlp.dispatch.paths`` has the rest).

Every implementation of an op takes the arguments of its Triton launcher; the torch ones are
the oracle's twins (``gmlp.contract.reference``, ``gmlp.mxfp8.reference``), which ignore the launch-only
arguments (``groups``, ``config``). A *site* is one place in the layer where an op runs, with
its own decision, since the operands (and so the answers) differ: the quantize of x is not the
quantize of W1.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Callable

import torch

from gmlp.contract.gate_up import GateUpLayout
from gmlp.contract.problem import LayerProblem
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.dispatch.paths import Decision, Path, choose_path, forced_path, next_path_down, system_reason
from gmlp.mxfp8.tensor import MXFP8Tensor

__all__ = ["Op", "Site", "SITES", "GEMM_OPS", "LayerProblem", "LayerPlan", "plan_layer", "sm100_reason", "implementation"]


class Op(enum.Enum):
    QUANTIZE = "quantize_mxfp8"
    DEQUANTIZE = "dequantize_mxfp8"
    FC1 = "fc1_forward"  # FC1 GEMM + bias + activation + probs, a in bf16 or quantized both ways
    GROUPED_GEMM = "grouped_gemm"  # A @ B_g^T per expert: FC2 forward, FC1 dgrad
    FC2_DGRAD = "fc2_dgrad"  # FC2 dgrad + activation backward + dprobs, dh in bf16 or quantized
    WGRAD = "grouped_wgrad"  # weight gradients, a ragged contraction over each expert's tokens
    SEGMENT_SUM = "segment_sum"  # per-expert row sums (b2's gradient)


@dataclass(frozen=True)
class Site:
    """One place in the layer where an op runs."""

    name: str
    op: Op
    mxfp8_only: bool = False  # runs only with an MXFP8 recipe
    weight_stack: bool = False  # quantizes an (E * N, K) weight stack (a launch config of its own)
    bias_only: bool = False  # runs only when the layer has biases


SITES = {site.name: site for site in (
    Site("quantize x", Op.QUANTIZE, True),
    Site("quantize w1", Op.QUANTIZE, True, weight_stack=True),
    Site("quantize w2", Op.QUANTIZE, True, weight_stack=True),
    Site("dequantize", Op.DEQUANTIZE, True),
    Site("fc1", Op.FC1),
    Site("fc2", Op.GROUPED_GEMM),
    Site("quantize dy", Op.QUANTIZE, True),
    Site("fc2 dgrad", Op.FC2_DGRAD),
    Site("fc1 dgrad", Op.GROUPED_GEMM),
    Site("fc2 wgrad", Op.WGRAD),
    Site("fc1 wgrad", Op.WGRAD),
    Site("bias grad", Op.SEGMENT_SUM, bias_only=True),
)}


# --- implementations -------------------------------------------------------------------------


def _without(*launch_only: str) -> Callable[[Callable], Callable]:
    """Wrap an implementation so that it accepts, and ignores, the Triton launcher's launch-only
    arguments."""
    def wrap(function: Callable) -> Callable:
        def twin(*args, **kwargs):
            for name in launch_only:
                kwargs.pop(name, None)
            return function(*args, **kwargs)
        twin.__name__ = twin.__qualname__ = function.__name__
        return twin
    return wrap


def _dequantize_ref(tensor, groups=None) -> torch.Tensor:
    """The spec's dequantize, rounded to bf16 (what the Triton kernel writes, bit for bit)."""
    del groups
    return tensor.dequantize().to(torch.bfloat16)


def operand_values(a: torch.Tensor | MXFP8Tensor) -> torch.Tensor:
    """A GEMM operand's values: an MXFP8Tensor's (the spec's dequantize in bf16), or the tensor."""
    return _dequantize_ref(a) if isinstance(a, MXFP8Tensor) else a


def _dequantizing_a(function: Callable, dequantize: Callable, operands: int = 1) -> Callable:
    """Wrap a GEMM that reads bf16 operands (the token-row GEMMs' A: x, a, dy, dh; the weight
    gradients' two, ``operands=2``) so that it also takes the MXFP8 operands of a site whose chosen
    kernel decodes them (``LayerPlan.decoding_sites``): the cross-check's reference then runs on the
    dequantized values, which the decoding kernel multiplies bit for bit. ``dequantize`` gets the
    call's ``groups`` (a columnwise quantization's experts)."""
    def twin(*args, **kwargs):
        values = [dequantize(v, kwargs.get("groups")) if isinstance(v, MXFP8Tensor) else v for v in args[:operands]]
        return function(*values, *args[operands:], **kwargs)
    twin.__name__ = twin.__qualname__ = function.__name__
    return twin


def _segment_sum_ref(values: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """(G, N) fp32 (fp64 for fp64 values) sums of the rows [starts[g], starts[g+1]) of values,
    accumulated in fp64."""
    bounds = starts.tolist()
    sums = torch.stack([values[bounds[g]:bounds[g + 1]].double().sum(0) for g in range(len(bounds) - 1)])
    return sums if values.dtype == torch.float64 else sums.float()


def _torch_implementation(op: Op) -> Callable:
    from gmlp.contract import reference
    from gmlp.mxfp8.reference import quantize_mxfp8_ref

    return {
        Op.QUANTIZE: quantize_mxfp8_ref,
        Op.DEQUANTIZE: _dequantize_ref,
        Op.FC1: _dequantizing_a(_without("groups", "tiling")(reference.fc1_forward_ref), _dequantize_ref),
        Op.GROUPED_GEMM: _dequantizing_a(_without("groups", "tiling")(reference.grouped_gemm_ref), _dequantize_ref),
        Op.FC2_DGRAD: _dequantizing_a(_without("groups", "tiling")(reference.fc2_dgrad_ref), _dequantize_ref),
        Op.WGRAD: _dequantizing_a(_without("groups", "tiling")(reference.grouped_wgrad_ref), _dequantize_ref, 2),
        Op.SEGMENT_SUM: _segment_sum_ref,
    }[op]


def _triton_implementation(site: Site) -> Callable:
    op = site.op
    if op is Op.QUANTIZE:
        from gmlp.triton_ref.quantize import DEFAULT_QUANTIZE_CONFIG, WEIGHT_QUANTIZE_CONFIG, quantize_mxfp8

        config = WEIGHT_QUANTIZE_CONFIG if site.weight_stack else DEFAULT_QUANTIZE_CONFIG
        return functools.partial(quantize_mxfp8, config=config)
    from gmlp.triton_ref.dequantize import dequantize_mxfp8

    if op is Op.DEQUANTIZE:
        run = dequantize_mxfp8
    elif op is Op.FC1:
        from gmlp.triton_ref.fc1 import fc1_forward

        run = _dequantizing_a(fc1_forward, dequantize_mxfp8)
    elif op is Op.GROUPED_GEMM:
        from gmlp.triton_ref.grouped_gemm import grouped_gemm

        run = _dequantizing_a(grouped_gemm, dequantize_mxfp8)
    elif op is Op.FC2_DGRAD:
        from gmlp.triton_ref.fc2_dgrad import fc2_dgrad

        run = _dequantizing_a(fc2_dgrad, dequantize_mxfp8)
    elif op is Op.WGRAD:
        from gmlp.triton_ref.wgrad import grouped_wgrad

        run = _dequantizing_a(grouped_wgrad, dequantize_mxfp8, 2)
    else:
        from gmlp.triton_ref.segment_sum import segment_sum as run
    return run


@functools.lru_cache(maxsize=None)  # looked up for every op call: built once per (site, path)
def implementation(site: Site, path: Path) -> Callable:
    """The function that runs ``site``'s op on ``path`` (the arguments of the op's Triton launcher,
    launch settings such as the quantize config excepted: each path has its own)."""
    if path is Path.TORCH:
        return _torch_implementation(site.op)
    if path is Path.TRITON:
        return _triton_implementation(site)
    if site.op in GEMM_OPS:  # the SM90 kernels (the SM100 composition runs its steps itself)
        from gmlp.cutedsl.sm90.support import launcher

        return launcher(site.op.value)
    if site.op is not Op.QUANTIZE:
        raise ValueError(f"{site.op.value} has no {path.value} implementation")
    from gmlp.cutedsl.quantize import quantize_mxfp8

    return quantize_mxfp8


# --- what each path can run ------------------------------------------------------------------


GEMM_OPS = (Op.FC1, Op.GROUPED_GEMM, Op.FC2_DGRAD, Op.WGRAD)
SM100_MAX_EXPERTS = 1024  # cuDNN frontend's grouped kernels


def sm100_reason(problem: LayerProblem) -> Reason | None:
    """Why the layer's GEMMs cannot run as the SM100 composition (``gmlp.cutedsl.sm100.layer``) on
    an SM100 GPU whose packages import, or None. Its steps share padded layouts, so the GEMM
    sites take it together or not at all: every reason here applies to all of them."""
    if not problem.mxfp8:
        return Reason(ReasonKind.RECIPE, "bf16 (recipe=None): gmlp's SM100 path maps the MXFP8 recipe onto cuDNN "
                                         "frontend's block-scaled kernels; a bf16 layer runs on Triton")
    if problem.param_dtype not in (torch.bfloat16, torch.float32):
        return Reason(ReasonKind.RECIPE, f"{problem.param_dtype} parameters: the quantize takes bf16 or float32")
    if problem.floor_scales:
        return Reason(ReasonKind.RECIPE, "FLOOR scales: the kernels' epilogues quantize their outputs with RCEIL "
                                         "scales (cvt.rp.ue8m0)")
    if problem.e5m2_grads:
        return Reason(ReasonKind.RECIPE, "E5M2 gradients: cuDNN frontend's grouped kernels take one fp8 format for "
                                         "both operands, and the backward GEMMs' other operand is E4M3")
    if problem.bias:
        return Reason(ReasonKind.RECIPE, "biases: the dGLU kernel's bias gradient is bf16 and not deterministic with "
                                         "deterministic dprobs, where gmlp's bias gradients are fp32 sums")
    if problem.gate_up is not GateUpLayout.HALVES:
        return Reason(ReasonKind.SHAPE, f"W1's gate and up stored {problem.gate_up.storage}: the SM100 "
                                        "composition interleaves W1's (E, 2F, H) halves in its quantize")
    if problem.activation == "geglu":
        return Reason(ReasonKind.ACTIVATION, "cuDNN frontend's GLU kernels have no tanh-GELU GeGLU (their 'geglu' is "
                                             "the clamped GPT-OSS form, gmlp's qgeglu)")
    ffn_multiple = 128 if problem.activation == "srelu" else 64  # FC1's N (F or 2F) in 128-row scale tiles
    if problem.experts > SM100_MAX_EXPERTS or problem.hidden % 128 or problem.ffn % ffn_multiple:
        return Reason(ReasonKind.SHAPE, f"the SM100 kernels need at most {SM100_MAX_EXPERTS} experts, H a multiple of "
                                        f"128 and F of {ffn_multiple} ({problem.activation}), got E={problem.experts}, "
                                        f"H={problem.hidden}, F={problem.ffn}")
    return None


def _bf16_operands_reason(problem: LayerProblem, kernels: str) -> Reason | None:
    """Why GEMM kernels on bf16 operands (Triton's, SM90's) cannot take the layer's parameters, or None."""
    dtype = problem.param_dtype
    if dtype != torch.bfloat16 and not (problem.mxfp8 and dtype == torch.float32):
        mode = "MXFP8" if problem.mxfp8 else "bf16 (recipe=None)"
        return Reason(ReasonKind.RECIPE, f"{mode} with {dtype} parameters: the {kernels} GEMMs take bf16 operands, "
                                         "which are the parameters themselves without a recipe, or their "
                                         "dequantized MXFP8 values (bf16 or float32 parameters)")
    return None


def _cutedsl_gemm_reason(op: Op, site: str, problem: LayerProblem, device: torch.device) -> Reason | None:
    """Why an op other than the quantize does not take CuTeDSL at ``site``, or None (the system
    check has passed: an SM90 or SM100 GPU with cutlass-dsl)."""
    if op is Op.DEQUANTIZE:
        return Reason(ReasonKind.SYSTEM, "no CuTeDSL dequantize in gmlp: the SM100 steps read MXFP8 operands as "
                                         "they are, and on SM90 the operands are dequantized before the GEMMs")
    if op is Op.SEGMENT_SUM:
        return Reason(ReasonKind.SYSTEM, "no CuTeDSL per-expert sum in gmlp (bias gradients; the SM100 path takes "
                                         "no biases)")
    if torch.cuda.get_device_capability(device)[0] == 9:
        from gmlp.cutedsl.sm90.support import site_reason

        return _bf16_operands_reason(problem, "SM90 CuTeDSL") or site_reason(site, op.value, problem)
    from gmlp.cutedsl.sm100.cudnn_kernels import import_error

    error = import_error()
    if error is not None:
        return Reason(ReasonKind.SYSTEM, error)
    return sm100_reason(problem)


def _triton_shape_reason(op: Op, problem: LayerProblem) -> Reason | None:
    """The shape rule of the op's Triton launcher at the layer's sizes (``gmlp.triton_ref.shapes``,
    which the launchers raise with), or None: the ops without one take any sizes."""
    from gmlp.triton_ref.shapes import fc1_shape_reason, fc2_dgrad_shape_reason

    if op is Op.FC1:
        return fc1_shape_reason(problem.hidden, problem.ffn)
    if op is Op.FC2_DGRAD:
        return fc2_dgrad_shape_reason(problem.ffn)
    return None


def _reason(op: Op, site: str, path: Path, problem: LayerProblem, device: torch.device, sm100: bool) -> Reason | None:
    """Why ``path`` cannot run ``op`` at ``site`` for ``problem``, or None (the system check has
    passed; ``sm100``: the GEMM sites run as the SM100 composition)."""
    if path is Path.TORCH:
        return None
    if op is Op.QUANTIZE:
        if path is Path.CUTEDSL:
            from gmlp.cutedsl.quantize import problem_support
        else:
            from gmlp.triton_ref.quantize import problem_support
        return problem_support((problem.sm100_quantize_problems if sm100 else problem.quantize_problems)[site])
    if path is Path.CUTEDSL:
        return _cutedsl_gemm_reason(op, site, problem, device)
    return (_bf16_operands_reason(problem, "Triton") if op in GEMM_OPS else None) or _triton_shape_reason(op, problem)


@dataclass(frozen=True)
class LayerPlan:
    """The path of every site of one layer call, and why each faster path is skipped."""

    decisions: dict[str, Decision]  # site name -> decision, in the order the sites run
    references: dict[str, Path | None]  # site name -> the next path down that runs it (cross-check), if any
    sm100: bool = False  # the GEMM sites run as the SM100 composition (gmlp.cutedsl.sm100.layer)
    # sites whose chosen kernel reads its MXFP8 operands as they are, decoding them (no dequantize
    # pass for them; the weight gradients' only where decodable: ``layer._wgrad_operands``)
    decoding_sites: frozenset[str] = frozenset()

    def path(self, site: str) -> Path:
        return self.decisions[site].path

    def explain(self) -> str:
        """Each op (where it runs in the layer, which op, which path), then why faster paths were
        skipped: each reason once, with the ops it applies to."""
        width = max(len(name) for name in self.decisions)
        lines = ["the layer's GEMMs run as one Blackwell (SM100) composition of cuDNN frontend's fused kernels, "
                 "MXFP8 operands as they are; each op and its path:" if self.sm100 else
                 "each op of the layer and the path it runs on (the fastest that can: cutedsl, triton, torch):"]
        skipped: dict[tuple[Path, str], list[str]] = {}  # (path, reason) -> the ops that skipped it for it
        for name, decision in self.decisions.items():
            decoded = ", MXFP8 operands decoded in the kernel" if name in self.decoding_sites else ""
            lines.append(f"  {name:<{width}}  {decision.op:<16} -> {decision.path.value}{decoded}")
            for path, reason in decision.skipped:
                skipped.setdefault((path, str(reason)), []).append(name)
        if skipped:
            lines.append("why not a faster path:")
        for (path, reason), names in skipped.items():
            ops = "every op" if len(names) == len(self.decisions) else ", ".join(names)
            lines.append(f"  not {path.value} ({ops}): {reason}")
        return "\n".join(lines)


def plan_layer(problem: LayerProblem, device: torch.device, *, strict: bool | None) -> LayerPlan:
    """Choose the path of every site (``gmlp.dispatch.paths.choose_path``: strict mode and forced
    backends apply per site; a fallback warning comes once per op, activation, path and reason,
    naming the first site where it happened). On SM100 the GEMM sites get the same CuTeDSL answer
    (the SM100 composition, all or none); when they take it, nothing is dequantized. On SM90 each
    GEMM site takes its SM90 kernel where that runs the site's problem."""
    decisions, references = {}, {}
    sm100 = _sm100_runs(problem, device)
    for name, site in SITES.items():
        if (site.mxfp8_only and not problem.mxfp8) or (site.bias_only and not problem.bias):
            continue
        if site.op is Op.DEQUANTIZE and sm100:
            continue
        def problem_reason(path: Path, site: Site = site) -> Reason | None:
            return _reason(site.op, site.name, path, problem, device, sm100)
        decision = choose_path(site.op.value, device, problem_reason, strict=strict, detail=problem.activation, where=name)
        decisions[name] = decision
        references[name] = next_path_down(decision.path, device, problem_reason)
    if sm100 and any(decisions[name].path is not Path.CUTEDSL for name in decisions if SITES[name].op in GEMM_OPS):
        raise AssertionError(f"the GEMM sites must all take the SM100 composition or none: {decisions}")
    decoding_sites = frozenset()
    if problem.mxfp8 and not sm100:
        from gmlp.cutedsl.sm90.support import DECODING_SITES

        decoding_sites = frozenset(name for name in DECODING_SITES if decisions[name].path is Path.CUTEDSL)
    return LayerPlan(decisions, references, sm100=sm100, decoding_sites=decoding_sites)


def _sm100_runs(problem: LayerProblem, device: torch.device) -> bool:
    """Whether the GEMM sites will take the SM100 composition (their CuTeDSL answer on an SM100
    GPU, unforced or forced to CuTeDSL). On SM90 each GEMM site decides on its own."""
    return (forced_path() in (None, Path.CUTEDSL) and system_reason(Path.CUTEDSL, device) is None
            and torch.cuda.get_device_capability(device)[0] == 10
            and _cutedsl_gemm_reason(Op.FC1, "fc1", problem, device) is None)
