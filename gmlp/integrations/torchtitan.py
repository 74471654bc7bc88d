"""gmlp's experts as torchtitan's routed experts (the ``gmlp[torchtitan]`` extra).

One flag switches a torchtitan MoE model's experts to gmlp::

    --override.imports gmlp.integrations.torchtitan.gmlp_experts                    # MXFP8
    --override.imports 'gmlp.integrations.torchtitan.gmlp_experts={"recipe": "fp8_blockwise"}'
    --override.imports 'gmlp.integrations.torchtitan.gmlp_experts={"recipe": "bf16"}'

``gmlp_experts`` is a torchtitan override (``torchtitan.config.override``) of
``GroupedExperts.Config``: every stock experts node of the config tree becomes a
``GmlpGroupedExperts.Config`` before the model is built. The module keeps the stock parameters,
names, shapes and initializers (``w1_EFD`` gate and ``w3_EFD`` up, both (E, F, D), ``w2_EDF``
(E, D, F)), so torchtitan's sharding plans (EP on dim 0, FSDP2), parameter init and
checkpoints apply unchanged: a stock checkpoint loads as it is. Its forward is gmlp's layer ops
with W1 stored apart (``GateUpLayout.SEPARATE``: gate and up read in place, never
concatenated), SwiGLU, no bias and no probs: torchtitan multiplies the router scores in its
combine, after the experts. Set ``GMLP_CROSSCHECK=raise`` (or ``warn``) to cross-check every op
against the next path down, and ``GMLP_WARN_FALLBACK=1`` to hear about each fallback.

Other experts classes (gpt-oss's biased, clamped SwiGLU, a converter's subclass) keep their own
module, with a ``FallbackWarning`` naming the node and the reason (``strict=True``: an error).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts

from gmlp.contract.activations import activation_from
from gmlp.contract.gate_up import GateUpLayout
from gmlp.dispatch.caller import warn_at_caller
from gmlp.dispatch.paths import FallbackError, FallbackWarning
from gmlp.dispatch.plan_cache import LayerConfig, decode_config, layer_problem, token_class
from gmlp.dispatch.plan import plan_layer
from gmlp.layer import autograd
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.layer.module import MXFP8_PARAM_DTYPES, recipe_name
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.spec import ElementFormat, ScaleMode

__all__ = ["GmlpGroupedExperts", "gmlp_experts", "recipe_from_name"]

RECIPE_NAMES = ("mxfp8", "fp8_blockwise", "bf16")


def recipe_from_name(recipe: str, scale_mode: str = "rceil", grad_format: str = "e4m3"
                     ) -> MXFP8Recipe | FP8BlockwiseRecipe | None:
    """The gmlp recipe a config names: "mxfp8" (with its scale mode and gradient format),
    "fp8_blockwise" (with its gradient format; power-of-two scales) or "bf16" (None)."""
    modes, formats = [m.value for m in ScaleMode], [f.value for f in ElementFormat]
    for name, value, accepted in (("recipe", recipe, RECIPE_NAMES), ("scale_mode", scale_mode, modes),
                                  ("grad_format", grad_format, formats)):
        if value not in accepted:
            raise ValueError(f"gmlp experts: {name} must be one of {accepted}, got {value!r}")
    if recipe == "fp8_blockwise":
        if scale_mode != "rceil":
            raise ValueError(f"gmlp experts: scale_mode={scale_mode!r} is an MXFP8 setting; the fp8_blockwise recipe "
                             "takes fp32 (power-of-two) scales")
        return FP8BlockwiseRecipe(ElementFormat(grad_format))
    return None if recipe == "bf16" else MXFP8Recipe(ScaleMode(scale_mode), ElementFormat(grad_format))


def _check_sizes(recipe: MXFP8Recipe | FP8BlockwiseRecipe | None, dim: int, hidden_dim: int) -> None:
    block = 128 if isinstance(recipe, FP8BlockwiseRecipe) else 32
    if recipe is not None and (dim % block or hidden_dim % block):
        raise ValueError(f"gmlp experts with {'fp8_blockwise' if block == 128 else 'MXFP8'} need dim and hidden_dim "
                         f"multiples of {block} (one scale per {block} elements), got dim={dim}, "
                         f"hidden_dim={hidden_dim}; recipe='bf16' takes any size")


def _local(param: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor of a parameter: under expert parallelism a DTensor sharded on the
    expert dim, whose local experts are the ones the dispatcher's rows belong to."""
    return param.to_local() if isinstance(param, DTensor) else param


class GmlpGroupedExperts(GroupedExperts):
    """torchtitan's routed experts, run by gmlp's layer ops (FC1, SwiGLU, FC2, forward and backward).

    Same parameters and forward signature as the stock ``GroupedExperts``: ``forward(x_RD,
    num_tokens_per_expert_E)`` with the rows grouped by local expert. As the stock module does,
    the rows enter in bf16 and the output takes x's dtype; with ``recipe="bf16"`` the weights are
    cast to bf16 as stock does (nothing to cast under FSDP2's bf16 parameters), with MXFP8 they
    are quantized from their own dtype (bf16 or fp32).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        recipe: str = "mxfp8"  # "mxfp8", "fp8_blockwise" or "bf16"
        scale_mode: str = "rceil"  # MXFP8 scale rounding (gmlp.ScaleMode)
        grad_format: str = "e4m3"  # the gradients' element format (gmlp.ElementFormat)
        strict: bool | None = None  # raise instead of falling back to a slower path (None: GMLP_STRICT)

    def __init__(self, config: Config):
        super().__init__(config)
        if type(self)._grouped_mm is not GroupedExperts._grouped_mm:
            raise TypeError(f"{type(self).__qualname__} replaces GroupedExperts._grouped_mm (a converter's "
                            "quantized GEMM?), which gmlp's experts never call: their GEMMs are gmlp's. Use gmlp's "
                            "recipe instead of the converter")
        self.recipe = recipe_from_name(config.recipe, config.scale_mode, config.grad_format)
        _check_sizes(self.recipe, config.dim, config.hidden_dim)
        self.dim, self.hidden_dim = config.dim, config.hidden_dim
        self._layer_config = LayerConfig(activation=activation_from("swiglu"), recipe=self.recipe, bias=False,
                                         strict=config.strict, weight_cache=None, accumulate_main_grad=False,
                                         gate_up=GateUpLayout.SEPARATE).encode()

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate, up, down): the local weights in the dtype the recipe reads."""
        weights = tuple(_local(p) for p in (self.w1_EFD, self.w3_EFD, self.w2_EDF))
        if self.recipe is None:
            return tuple(w.bfloat16() for w in weights)
        if weights[0].dtype not in MXFP8_PARAM_DTYPES:
            raise TypeError(f"gmlp experts with a quantized recipe quantize the weights from bfloat16 or float32, got "
                            f"{weights[0].dtype}; use recipe='bf16' for other dtypes")
        return weights

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        gate, up, down = self._weights()
        y = autograd.grouped_mlp(x_RD.bfloat16(), num_tokens_per_expert_E, None, gate, None, down, None,
                            self._layer_config, w3=up)[0]
        return y.type_as(x_RD)

    def explain(self, rows: int = 1, device: torch.device | str | None = None) -> str:
        """The plan of a forward with ``rows`` routed rows on ``device`` (default: the weights'):
        each op's path, and why every faster path is skipped."""
        gate = _local(self.w1_EFD)
        device = torch.device(device) if device is not None else gate.device
        dtype = torch.bfloat16 if self.recipe is None else gate.dtype  # what _weights hands the ops
        config = decode_config(self._layer_config)
        problem = layer_problem(config, token_class(rows), gate.shape[0], self.dim, self.hidden_dim, dtype,
                                torch.bfloat16, device)
        return f"{type(self).__name__} ({self.extra_repr()}) on {device}:\n{plan_layer(problem, device, strict=False).explain()}"

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, dim={self.dim}, hidden_dim={self.hidden_dim}, {recipe_name(self.recipe)}"


@override(target=GroupedExperts.Config, description="gmlp experts: fused MXFP8 / FP8 blockwise / bf16 grouped SwiGLU MLP")
def gmlp_experts(cfg: GroupedExperts.Config, *, recipe: str = "mxfp8", scale_mode: str = "rceil",
                 grad_format: str = "e4m3", strict: bool | None = None) -> GroupedExperts.Config:
    """torchtitan's override factory: a stock ``GroupedExperts.Config`` becomes gmlp's (its fields,
    param_init and sharding_config kept), with the recipe the override's kwargs name. The
    settings are checked here, before anything is built; a config of another experts class keeps
    its module, with a ``FallbackWarning`` (an error with ``strict``)."""
    gmlp_recipe = recipe_from_name(recipe, scale_mode, grad_format)
    if isinstance(cfg, GmlpGroupedExperts.Config):
        return cfg
    if type(cfg) is not GroupedExperts.Config:
        reason = (f"{type(cfg).__qualname__} is not torchtitan's stock GroupedExperts.Config (SwiGLU without "
                  "biases); gmlp runs those only")
        if strict:
            raise FallbackError(f"gmlp experts: {reason}")
        warn_at_caller(f"gmlp experts: kept {type(cfg).__qualname__}: {reason}", FallbackWarning)
        return cfg
    _check_sizes(gmlp_recipe, cfg.dim, cfg.hidden_dim)
    return derive(cfg, GmlpGroupedExperts.Config, recipe=recipe, scale_mode=scale_mode, grad_format=grad_format,
                  strict=strict)
