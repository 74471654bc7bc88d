"""``GroupedMLP``: the experts of an MoE layer (FC1, gated activation, FC2), forward and backward.

Rows of ``x`` arrive grouped by expert (``split_sizes`` rows each, zeros allowed). Weights are
``w1`` (E, 2F, H) as [gate; up] halves for gated activations, (E, F, H) for srelu, and ``w2``
(E, H, F). The computation is the dataflow of docs/design.md (``gmlp.layer.steps``, a sequence of ops); the
dispatcher chooses each op's path separately (``gmlp.dispatch.sites``): CuTeDSL (the quantize, where
cutlass-dsl runs; on SM100 the GEMM steps too, as cuDNN frontend's fused kernels composed by
``gmlp.cutedsl.sm100.layer``), Triton, or the torch twins of the oracle (``gmlp.contract.reference``).
``explain`` shows the plan; ``gmlp.debug.cross_check`` runs every op on two paths and compares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NoReturn

import torch
from torch import nn

from gmlp.contract.activations import Activation, activation_from
from gmlp.contract.problem import LayerProblem
from gmlp.dispatch.plan_cache import (
    WEIGHT_CACHE_MODES,
    LayerConfig,
    cached_plan,
    decode_config,
    layer_problem,
    token_class,
)
from gmlp.dispatch.paths import Strict, strict_floor
from gmlp.dispatch.plan import LayerPlan, plan_layer
from gmlp.layer import autograd
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.mxfp8.recipe import MXFP8Recipe

__all__ = ["GroupedMLP", "recipe_name"]

_DEFAULT_RECIPE = MXFP8Recipe()


# the settings in the forward op's config string (GroupedMLP._encoded_config), b1 for "bias"
_CONFIG_ATTRIBUTES = ("activation", "recipe", "strict", "accumulate_main_grad", "b1")
MXFP8_PARAM_DTYPES = (torch.bfloat16, torch.float32)  # what the quantize kernels read


def _check_mxfp8_dtype(dtype: torch.dtype) -> None:
    if dtype not in MXFP8_PARAM_DTYPES:
        raise TypeError(f"a quantized recipe (MXFP8, FP8 blockwise) takes bfloat16 or float32 parameters (the quantize "
                        f"reads them), got {dtype}; recipe=None runs unquantized in any floating dtype")


def recipe_name(recipe: MXFP8Recipe | FP8BlockwiseRecipe | None) -> str:
    """A recipe as the layers' reprs name it."""
    if recipe is None:
        return "bf16"
    if isinstance(recipe, FP8BlockwiseRecipe):
        scales = "power-of-two" if recipe.power_of_two_scales else "fp32"
        return f"fp8 blockwise {scales} scales, grads {recipe.grad_format.value}"
    return f"mxfp8 {recipe.scale_mode.value}, grads {recipe.grad_format.value}"


def _refuse_under_compile(message: str) -> NoReturn:
    """Refuse a setting that torch.compile cannot trace, so that the user reads gmlp's sentence
    first. Raised in traced code, an exception reaches a ``fullgraph=True`` user as Dynamo's
    "Observed exception" with the sentence buried in its debug context; a graph break with a
    message puts it in the error's first lines instead. Without fullgraph Dynamo runs this
    function eagerly after the break, which raises the sentence as it is."""
    torch._dynamo.graph_break(msg=message)
    raise NotImplementedError(message)


@dataclass(frozen=True)
class _KeptWeights:
    """The quantized weights a forward with ``weight_cache="update"`` kept, and what they were made from."""

    key: tuple  # GroupedMLP._weight_cache_key: the plan and the weights' storage, shape, dtype, device
    tensors: list[torch.Tensor]  # the flattened quantized weights (gmlp.layer.autograd.kept_weights)
    versions: dict[str, int]  # the weights' version counters when they were quantized


class GroupedMLP(nn.Module):
    """The expert MLPs of a Mixture-of-Experts layer, MXFP8, FP8 blockwise (or bf16) forward and backward.

    Args:
        num_experts: E.
        hidden_size: H, the model dimension (a multiple of 32 with MXFP8).
        ffn_hidden_size: F, each expert's intermediate size (a multiple of 32 with MXFP8).
        activation: "swiglu", "geglu", "qgeglu", "srelu", or an ``Activation`` (qgeglu's
            limit / alpha / offset).
        bias: add per-expert biases b1 (E, 2F | F) and b2 (E, H).
        recipe: ``MXFP8Recipe`` (scale mode, gradient element format) or ``FP8BlockwiseRecipe``
            (128-element blocks: H and F multiples of 128), with bfloat16 or float32
            parameters; None runs unquantized in the parameters' dtype (bf16 on the Triton
            kernels; other dtypes on the torch path, float64 included, e.g. for gradcheck).
        strict: raise ``FallbackError`` where an op would run below a path, the floor: True or
            "cutedsl" below CuTeDSL (any fallback; on a CPU every op), "triton" below Triton (an
            op on torch), False never; None (the default): GMLP_STRICT, which takes the same
            words and boolean spellings.
        accumulate_main_grad: add weight gradients into each parameter's fp32 ``main_grad``
            (which must exist) instead of returning them to autograd (eager mode only).
        device, dtype: of the parameters; ``device="meta"`` defers their storage
            (``to_empty(device=...)``, then ``reset_parameters()``).

    ``forward`` runs as two custom ops (``gmlp.layer.autograd``), so ``torch.compile(mlp, fullgraph=True)``
    traces the layer, forward and backward, without graph breaks; outputs and gradients have
    the dtypes of the tensors they belong to.
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        ffn_hidden_size: int,
        activation: str | Activation = "swiglu",
        bias: bool = False,
        recipe: MXFP8Recipe | FP8BlockwiseRecipe | None = _DEFAULT_RECIPE,
        strict: Strict = None,
        accumulate_main_grad: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__()
        for name, value in (("num_experts", num_experts), ("hidden_size", hidden_size), ("ffn_hidden_size", ffn_hidden_size)):
            if isinstance(value, bool) or not isinstance(value, int):  # True is an int to Python, not a size
                raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
            if value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if recipe is not None and not isinstance(recipe, (MXFP8Recipe, FP8BlockwiseRecipe)):
            raise TypeError(f"recipe must be a gmlp.MXFP8Recipe, a gmlp.FP8BlockwiseRecipe or None, got {recipe!r}")
        if recipe is not None:
            _check_mxfp8_dtype(dtype)
        if isinstance(recipe, MXFP8Recipe) and (hidden_size % 32 or ffn_hidden_size % 32):
            raise ValueError(f"MXFP8 needs hidden_size and ffn_hidden_size multiples of 32, got {hidden_size=}, {ffn_hidden_size=}")
        if isinstance(recipe, FP8BlockwiseRecipe) and (hidden_size % 128 or ffn_hidden_size % 128):
            raise ValueError(f"the FP8 blockwise recipe (128-element blocks) needs hidden_size and ffn_hidden_size "
                             f"multiples of 128, got {hidden_size=}, {ffn_hidden_size=}")
        if strict is not None:
            strict_floor(strict)  # a bad value raises here, naming the argument
        self.activation = activation_from(activation)
        self.num_experts, self.hidden_size, self.ffn_hidden_size = num_experts, hidden_size, ffn_hidden_size
        self.recipe, self.strict, self.accumulate_main_grad = recipe, strict, accumulate_main_grad
        fc1_outputs = (2 if self.activation.gated else 1) * ffn_hidden_size
        factory = dict(device=device, dtype=dtype)
        self.w1 = nn.Parameter(torch.empty(num_experts, fc1_outputs, hidden_size, **factory))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_hidden_size, **factory))
        self.b1 = nn.Parameter(torch.zeros(num_experts, fc1_outputs, **factory)) if bias else None
        self.b2 = nn.Parameter(torch.zeros(num_experts, hidden_size, **factory)) if bias else None
        self._kept_weights: _KeptWeights | None = None  # weight_cache="update"'s quantized weights
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) weights, as nn.Linear; zero biases."""
        with torch.no_grad():
            self.w1.uniform_(-1 / math.sqrt(self.hidden_size), 1 / math.sqrt(self.hidden_size))
            self.w2.uniform_(-1 / math.sqrt(self.ffn_hidden_size), 1 / math.sqrt(self.ffn_hidden_size))
            for bias in (self.b1, self.b2):
                if bias is not None:
                    bias.zero_()

    def extra_repr(self) -> str:
        recipe = recipe_name(self.recipe)
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"activation={self.activation.name}, bias={self.b1 is not None}, {recipe}")

    def _check_inputs(self, x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None,
                      w1: torch.Tensor) -> None:
        """Raise for inputs the layer cannot take; ``w1`` is ``self.w1`` (read once by the caller: a
        parameter's attribute lookup goes through ``nn.Module.__getattr__``, microseconds each)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f"x must be a (T, hidden_size={self.hidden_size}) tensor, got {getattr(x, 'shape', type(x))}")
        if self.recipe is not None:
            _check_mxfp8_dtype(w1.dtype)  # the parameters may have been cast since
        if x.dtype != w1.dtype:
            raise TypeError(f"x must have the parameters' dtype {w1.dtype}, got {x.dtype=}")
        if x.device != w1.device:
            raise ValueError(f"x must be on the parameters' device {w1.device}, got {x.device=}")
        if not isinstance(split_sizes, torch.Tensor) or split_sizes.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"split_sizes must be an int32/int64 tensor of shape (num_experts,), got {split_sizes!r}")
        if split_sizes.shape != (self.num_experts,):
            raise ValueError(f"split_sizes must have shape ({self.num_experts},), got {tuple(split_sizes.shape)}")
        if split_sizes.device != x.device:
            raise ValueError(f"split_sizes must be on x's device {x.device}, got {split_sizes.device=}")
        if probs is not None:
            if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
                raise TypeError(f"probs must be None or a floating-point tensor of shape ({x.shape[0]},), got "
                                f"{probs.dtype if isinstance(probs, torch.Tensor) else type(probs).__name__}")
            if probs.shape != (x.shape[0],):
                raise ValueError(f"probs must have shape ({x.shape[0]},) (one per row of x), got {tuple(probs.shape)}")
            if probs.device != x.device:
                raise ValueError(f"probs must be on x's device {x.device}, got {probs.device=}")
        if self.accumulate_main_grad:
            for name, param in self.named_parameters():
                main_grad = getattr(param, "main_grad", None)
                if main_grad is None or main_grad.shape != param.shape or main_grad.dtype != torch.float32:
                    raise ValueError(f"accumulate_main_grad=True needs {name}.main_grad, an fp32 tensor of shape {tuple(param.shape)}")

    def plan(self, x: torch.Tensor, split_sizes: torch.Tensor | None = None, strict: Strict = False) -> LayerPlan:
        """The path of every op of a call with inputs like ``x`` (T, H), and why each faster path
        is skipped. ``strict`` as in the constructor (default here: report, never raise). The
        plan depends on ``split_sizes`` through its length only (``num_experts``), so it may be
        left out; on T through its class, the next power of two (``gmlp.dispatch.plan_cache``): the
        plan a forward takes, made anew here."""
        return plan_layer(self._layer_problem(x), x.device, strict=strict)

    def _layer_problem(self, x: torch.Tensor) -> LayerProblem:
        """What the plan of a call with inputs like ``x`` depends on."""
        return layer_problem(self._config(None, None), token_class(x.shape[0]), self.num_experts, self.hidden_size,
                             self.ffn_hidden_size, self.w1.dtype, x.dtype, x.device)

    def explain(self, x: torch.Tensor, split_sizes: torch.Tensor | None = None) -> str:
        """The plan as text: each op (where it runs in the layer), its path, and why not faster ones."""
        return f"{self!r} on {x.device}, x {tuple(x.shape)} {x.dtype}:\n{self.plan(x, split_sizes).explain()}"

    def _config(self, weight_cache: str | None, strict: Strict) -> LayerConfig:
        return LayerConfig(activation=self.activation, recipe=self.recipe, bias=self.b1 is not None, strict=strict,
                           weight_cache=weight_cache, accumulate_main_grad=self.accumulate_main_grad)

    def forward(self, x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None = None, *,
                weight_cache: str | None = None) -> torch.Tensor:
        """y (T, H) for x (T, H) grouped by expert; probs (T,) scales each row's activation.

        ``weight_cache`` (the quantized recipes), for micro-batches that share their weights: None quantizes
        the weights in this forward; "update" does too and keeps the quantized weights (MXFP8 on
        Hopper: the bf16 values of W and W^T; FP8 blockwise: the fp8 tiles of W and W^T, both
        from one pass over W; on the SM100 path W1 gate/up interleaved as well) for later
        forwards, for example the first micro-batch of a gradient-accumulation step; "reuse"
        takes the ones the last "update" forward kept, instead of quantizing again. With "reuse"
        the caller promises that the weights have not changed since: gmlp checks their storage,
        shape, dtype, the plan and their version counters (an in-place change, an optimizer step
        for example, raises ``ValueError``; a change through ``.data`` is not seen).

        Meta tensors in (model tracing, deferred init) give meta outputs of the right shapes and
        dtypes, forward and backward, with nothing read on the host."""
        if self.accumulate_main_grad and torch.compiler.is_compiling():
            _refuse_under_compile("gmlp: accumulate_main_grad under torch.compile: the backward adds into main_grad "
                                  "tensors outside the graph; run the layer eagerly with it")
        w1, w2 = self.w1, self.w2
        self._check_inputs(x, split_sizes, probs, w1)
        if weight_cache not in WEIGHT_CACHE_MODES:
            raise ValueError(f"weight_cache must be None, 'update' or 'reuse', got {weight_cache!r}")
        if weight_cache is not None and torch.compiler.is_compiling():
            _refuse_under_compile("gmlp: weight_cache under torch.compile: the kept quantized weights live on the "
                                  "module, outside the graph; call the layer eagerly with weight_cache")
        if weight_cache is not None and x.is_meta:
            raise ValueError(f"weight_cache={weight_cache!r} with meta tensors: they hold no weights to quantize and keep")
        config = self._encoded_config(weight_cache)
        # the kernels read row-major x and contiguous probs (router outputs are often strided
        # views, (T, k) score columns); no copy when they already are
        x = x.contiguous()
        probs = probs.contiguous() if probs is not None else None
        if weight_cache is None:
            return autograd.grouped_mlp(x, split_sizes, probs, w1, self.b1, w2, self.b2, config)[0]
        plan = cached_plan(decode_config(config), x.shape[0], self.num_experts, self.hidden_size,
                           self.ffn_hidden_size, w1.dtype, x.dtype, x.device)
        key = self._weight_cache_key(weight_cache, plan)
        reused = self._kept_weights.tensors if weight_cache == "reuse" else None
        outputs = autograd.grouped_mlp(x, split_sizes, probs, w1, self.b1, w2, self.b2, config, reused)
        if weight_cache == "update":
            tensors, _ = autograd.kept_weights(outputs, config, x, split_sizes, probs, w1, self.b1, w2, self.b2)
            self._kept_weights = _KeptWeights(key, tensors, self._weight_versions())
        return outputs[0]

    def layer_config(self, weight_cache: str | None = None) -> LayerConfig:
        """The settings a call with ``weight_cache`` hands the forward op (its config string, decoded
        as the op decodes it)."""
        return decode_config(self._encoded_config(weight_cache))

    def _encoded_config(self, weight_cache: str | None) -> str:
        """The forward op's config string for this call: a lookup of strings made eagerly
        (``__setattr__``), which torch.compile traces as a constant, where making one (json)
        would break the graph."""
        return self._config_strings[weight_cache]

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name in _CONFIG_ATTRIBUTES and all(hasattr(self, a) for a in _CONFIG_ATTRIBUTES):
            self._config_strings = {mode: self._config(mode, self.strict).encode() for mode in WEIGHT_CACHE_MODES}

    def release_quantized_weights(self) -> None:
        """Free the quantized weights kept by a forward with ``weight_cache="update"``."""
        self._kept_weights = None

    def _weight_cache_key(self, weight_cache: str, plan: LayerPlan) -> tuple:
        """What quantized weights kept by one forward depend on; checks a "reuse" against it."""
        if self.recipe is None:
            raise ValueError(f"weight_cache={weight_cache!r} needs a quantized recipe (gmlp.MXFP8Recipe or "
                             "gmlp.FP8BlockwiseRecipe), got recipe=None: no weight is quantized")
        key = (plan.sm100, self.recipe, *((w.data_ptr(), tuple(w.shape), w.dtype, w.device) for w in (self.w1, self.w2)))
        if weight_cache != "reuse":
            return key
        kept = self._kept_weights
        if kept is None or kept.key != key:
            raise ValueError("weight_cache='reuse': no quantized weights were kept by an earlier forward with "
                             "weight_cache='update' for these parameters (storage, shape, dtype) and this plan "
                             f"({'the SM100 composition' if plan.sm100 else 'one op per GEMM site'})")
        for name, version in self._weight_versions().items():
            if version != kept.versions[name]:
                raise ValueError(f"weight_cache='reuse': {name} was changed in place since the forward with "
                                 f"weight_cache='update' quantized it (its version counter went from "
                                 f"{kept.versions[name]} to {version}: an optimizer step, a load_state_dict, ...); "
                                 "the kept quantized weights are stale: quantize again with weight_cache='update'")
        return key

    def _weight_versions(self) -> dict[str, int]:
        """The weights' version counters: every in-place change through autograd-visible ops
        (optimizer steps, copy_, load_state_dict) increments them; changes through ``.data`` do not."""
        return {"w1": self.w1._version, "w2": self.w2._version}
