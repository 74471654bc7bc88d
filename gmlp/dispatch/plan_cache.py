"""What a layer call is, as one string, and its plan, cached.

The layer runs as custom ops (``gmlp.layer.autograd``), whose arguments are tensors and plain values: the
call's settings travel as ``LayerConfig.encode()``, a short string made once per module and
setting, and decoded once per string. The plan (``gmlp.dispatch.plan.plan_layer``) is made inside
the op, on the host, from shapes only, and cached: the key holds everything a plan depends on
(the config, the sizes, the token count's class, the dtypes, the device and its capability,
and the value of every gmlp environment variable, ``gmlp.system.env.raw_values``), so a cached
plan is the plan that would be made again, and a variable's new value is checked (planning checks
them all) at the first call that sees it. Token counts enter the plan only through the quantize
kernels' index limits; the plan is made for the count's class, the next power of two, so that
routing that changes each step does not make a new plan each step (a limit is then checked for
the class's largest count, which only matters within a factor of two of a 2**31 index limit).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import torch

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.gate_up import GateUpLayout
from gmlp.contract.problem import LayerProblem
from gmlp.dispatch.paths import Strict
from gmlp.dispatch.plan import LayerPlan, plan_layer
from gmlp.mxfp8.problem import QuantizeProblem
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.system.env import raw_values

__all__ = ["WEIGHT_CACHE_MODES", "LayerConfig", "decode_config", "layer_problem", "token_class", "cached_plan", "clear_plan_cache"]

WEIGHT_CACHE_MODES = (None, "update", "reuse")


@dataclass(frozen=True, kw_only=True)
class LayerConfig:
    """The settings of one layer call that are not tensors."""

    activation: Activation
    recipe: MXFP8Recipe | FP8BlockwiseRecipe | None
    bias: bool
    strict: Strict  # gmlp.dispatch.paths.strict_floor
    weight_cache: str | None  # None, "update" or "reuse" (GroupedMLP.forward)
    accumulate_main_grad: bool
    gate_up: GateUpLayout = GateUpLayout.HALVES  # how a gated W1's gate and up are stored (gmlp.contract.gate_up)

    def encode(self) -> str:
        """The config as a string (a custom op's argument), each setting keyed by its field's
        name; ``decode_config`` reverses it."""
        act, recipe = self.activation, self.recipe
        return json.dumps({
            "activation": {"kind": act.kind.value, "limit": act.limit, "alpha": act.alpha, "offset": act.offset},
            "recipe": _encode_recipe(recipe),
            "bias": self.bias, "strict": self.strict, "weight_cache": self.weight_cache,
            "accumulate_main_grad": self.accumulate_main_grad, "gate_up": self.gate_up.value,
        })


def _encode_recipe(recipe: MXFP8Recipe | FP8BlockwiseRecipe | None) -> dict | None:
    if recipe is None:
        return None
    if isinstance(recipe, FP8BlockwiseRecipe):
        return {"kind": "fp8_blockwise", "grad_format": recipe.grad_format.value,
                "power_of_two_scales": recipe.power_of_two_scales}
    return {"kind": "mxfp8", "scale_mode": recipe.scale_mode.value, "grad_format": recipe.grad_format.value}


def _decode_recipe(fields: dict | None) -> MXFP8Recipe | FP8BlockwiseRecipe | None:
    if fields is None:
        return None
    if fields["kind"] == "fp8_blockwise":
        return FP8BlockwiseRecipe(ElementFormat(fields["grad_format"]), fields["power_of_two_scales"])
    return MXFP8Recipe(ScaleMode(fields["scale_mode"]), ElementFormat(fields["grad_format"]))


@functools.lru_cache(maxsize=256)
def decode_config(text: str) -> LayerConfig:
    """The ``LayerConfig`` that ``encode`` gave ``text`` (cached: a module sends the same few)."""
    fields = json.loads(text)
    act, recipe = fields.pop("activation"), fields.pop("recipe")
    activation = Activation(ActivationKind(act.pop("kind")), **act)
    recipe = _decode_recipe(recipe)
    if fields["weight_cache"] not in WEIGHT_CACHE_MODES:
        raise ValueError(f"weight_cache must be one of {WEIGHT_CACHE_MODES}, got {fields['weight_cache']!r}")
    return LayerConfig(activation=activation, recipe=recipe, gate_up=GateUpLayout(fields.pop("gate_up")), **fields)


def token_class(tokens: int) -> int:
    """The power of two at or above ``tokens`` (at least 1): the token count a plan is made for."""
    return 1 << max(tokens - 1, 0).bit_length()


def layer_problem(config: LayerConfig, tokens: int, experts: int, hidden: int, ffn: int, param_dtype: torch.dtype,
                  x_dtype: torch.dtype, device: torch.device) -> LayerProblem:
    """What the plan of a call with ``tokens`` rows depends on (``gmlp.contract.problem.LayerProblem``)."""
    recipe = config.recipe
    blockwise = isinstance(recipe, FP8BlockwiseRecipe)
    e5m2_grads = recipe is not None and recipe.grad_format is ElementFormat.E5M2
    floor_scales = isinstance(recipe, MXFP8Recipe) and recipe.scale_mode is ScaleMode.FLOOR
    mxfp8 = isinstance(recipe, MXFP8Recipe)
    fc1_outputs = (2 if config.activation.gated else 1) * ffn
    gate_up = config.gate_up if config.activation.gated else GateUpLayout.HALVES  # srelu: W1 is one matrix
    shapes = (tokens, experts, hidden, ffn, fc1_outputs, param_dtype, x_dtype, device, gate_up)
    mxfp8_recipe = recipe if mxfp8 else None  # the MXFP8 quantize calls (the blockwise ops take the LayerProblem)
    return LayerProblem(param_dtype=param_dtype, mxfp8=mxfp8, bias=config.bias,
                        activation=config.activation.name, e5m2_grads=e5m2_grads,
                        quantize_problems=_quantize_problems(mxfp8_recipe, *shapes, sm100=False), experts=experts,
                        hidden=hidden, ffn=ffn, floor_scales=floor_scales,
                        sm100_quantize_problems=_quantize_problems(mxfp8_recipe, *shapes, sm100=True), tokens=tokens,
                        gate_up=gate_up, blockwise=blockwise)


def _quantize_problems(recipe: MXFP8Recipe | None, tokens: int, experts: int, hidden: int, ffn: int,
                       fc1_outputs: int, param_dtype: torch.dtype, x_dtype: torch.dtype, device: torch.device,
                       gate_up: GateUpLayout, *, sm100: bool) -> dict[str, QuantizeProblem]:
    """The layer's quantize (and quantize-dequantize) calls: as ``gmlp.layer.steps`` makes them, or
    with ``sm100`` as the SM100
    composition does (token rows padded, every expert starting at a multiple of 256 rows,
    grouped by the padded sizes and the slack; weight stacks grouped by expert; swizzled scales).
    W1's gate and up stored apart are quantized apart, each an (E * F, H) call (its size here;
    interleaved, its rows 2H apart)."""
    if recipe is None:
        return {}
    if sm100:
        from gmlp.cutedsl.sm100.layout import M_ALIGNED

        tokens, token_groups = (tokens + (M_ALIGNED - 1) * experts) // M_ALIGNED * M_ALIGNED, experts + 1
    else:
        token_groups = experts

    def problem(rows: int, cols: int, groups: int | None, dtype: torch.dtype, fmt: ElementFormat,
                row_stride: int | None = None, rowwise: bool = True, columnwise: bool = True) -> QuantizeProblem:
        return QuantizeProblem(num_rows=rows, num_cols=cols, num_experts=groups or 1, grouped=groups is not None,
                               dtype=dtype, device=device, rowwise=rowwise, columnwise=columnwise, swizzle=sm100,
                               element_format=fmt, scale_mode=recipe.scale_mode, row_stride=row_stride or cols)

    w1_rows = experts * (fc1_outputs if gate_up is GateUpLayout.HALVES else ffn)
    x_problem = problem(tokens, hidden, token_groups, x_dtype, ElementFormat.E4M3)
    dy = dict(rows=tokens, cols=hidden, groups=token_groups, dtype=x_dtype, fmt=recipe.grad_format)
    if sm100:
        return {
            "quantize x": x_problem,
            "quantize w1": problem(w1_rows, hidden, experts, param_dtype, ElementFormat.E4M3),
            "quantize w2": problem(experts * hidden, ffn, experts, param_dtype, ElementFormat.E4M3),
            "quantize dy": problem(**dy),
        }
    # the step sequence: each weight's values rowwise for the forward, columnwise for the dgrad
    w1_stride = 2 * hidden if gate_up is GateUpLayout.INTERLEAVED else hidden
    weight = dict(groups=None, dtype=param_dtype, fmt=ElementFormat.E4M3)
    return {
        "quantize x": x_problem,
        "qdq w1": problem(w1_rows, hidden, row_stride=w1_stride, columnwise=False, **weight),
        "qdq w2": problem(experts * hidden, ffn, columnwise=False, **weight),
        "qdq dy": problem(**dy, columnwise=False),
        "qdq w2^T": problem(experts * hidden, ffn, rowwise=False, **weight),
        "qdq w1^T": problem(w1_rows, hidden, row_stride=w1_stride, rowwise=False, **weight),
        "qdq dy^T": problem(**dy, rowwise=False),
    }


_plans: dict[tuple, LayerPlan] = {}


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    """The compute capability of CUDA device ``index``, asked once (torch's query costs
    microseconds at every call, and the plan is looked up twice per layer step)."""
    return torch.cuda.get_device_capability(index)


def cached_plan(config: LayerConfig, tokens: int, experts: int, hidden: int, ffn: int, param_dtype: torch.dtype,
                x_dtype: torch.dtype, device: torch.device) -> LayerPlan:
    """The plan of a call (``plan_layer`` of ``layer_problem`` for the token count's class, with
    the config's ``strict``), made once per key. A plan that raises (strict mode, a forced
    backend that cannot run) is not cached: the next call raises again."""
    capability = None
    if device.type == "cuda":
        capability = _capability(device.index if device.index is not None else torch.cuda.current_device())
    environment = raw_values()  # every variable: one the plan does not read is checked when planning
    tokens = token_class(tokens)
    key = (config, tokens, experts, hidden, ffn, param_dtype, x_dtype, device, capability, environment)
    plan = _plans.get(key)
    if plan is None:
        problem = layer_problem(config, tokens, experts, hidden, ffn, param_dtype, x_dtype, device)
        plan = _plans[key] = plan_layer(problem, device, strict=config.strict)
    return plan


def clear_plan_cache() -> None:
    """Forget every cached plan and device capability (after a package was installed or repaired
    in this process)."""
    _plans.clear()
    _capability.cache_clear()
