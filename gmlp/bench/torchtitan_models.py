"""The models ``python -m gmlp.bench torchtitan`` trains (torchtitan registry flavors), their
parameter counts on the meta device, how many of their layers fit one GPU, their FLOPs per token
and MFU, and the experts' share of a profiled step's device time."""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass

import torch

# --model -> (torchtitan model package, registry flavor)
MODELS = {
    "debug": ("qwen3", "debugmodel_moe"),  # 8 layers, dim 256, 64 experts of 768, top 8
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"),  # 48 layers, dim 2048, 128 experts of 768, top 8
    "deepseek-v3-16b": ("deepseek_v3", "16B"),  # 27 layers (the first dense), dim 2048, 64 of 1408, top 6, 2 shared
    "mixtral-like": ("qwen3", "235B-A22B"),  # reshaped by mixtral_like: dim 4096, 8 experts of 14336, top 2
}


@dataclass(frozen=True)
class ExpertShape:
    """What ``with_experts`` gives every MoE block of a config: routed experts, their hidden size,
    the experts a token is sent to, and the vocabulary."""

    num_experts: int
    hidden: int
    top_k: int
    vocab: int


# Mixtral 8x7B's experts and vocabulary (dim 4096 comes with the qwen3 flavor reshaped).
MIXTRAL_EXPERTS = ExpertShape(num_experts=8, hidden=14336, top_k=2, vocab=32000)


def with_experts(config, shape: ExpertShape):
    """``config`` (a torchtitan decoder config, changed in place and returned) with ``shape``'s
    routed experts in every MoE block and its vocabulary. Every other setting is the config's own
    (attention, norms, the router's score function, each parameter's init, the dispatcher's
    backend): each changed config is a ``dataclasses.replace`` of torchtitan's, so a field that
    torchtitan renames fails here loudly instead of being dropped."""
    replace = dataclasses.replace
    config.vocab_size = shape.vocab
    config.tok_embeddings = replace(config.tok_embeddings, num_embeddings=shape.vocab)
    config.lm_head = replace(config.lm_head, out_features=shape.vocab)
    for block in config.layers:
        moe = block.moe
        if moe is None:
            continue
        routed = moe.routed_experts
        block.moe = replace(
            moe, num_experts=shape.num_experts,
            router=replace(moe.router, num_experts=shape.num_experts, top_k=shape.top_k,
                           gate=replace(moe.router.gate, out_features=shape.num_experts)),
            routed_experts=replace(
                routed,
                inner_experts=replace(routed.inner_experts, hidden_dim=shape.hidden, num_experts=shape.num_experts),
                token_dispatcher=replace(routed.token_dispatcher, num_experts=shape.num_experts, top_k=shape.top_k)))
    return config


def mixtral_like(config):
    """qwen3's 235B-A22B flavor (dim 4096; its attention: 64 query and 4 key-value heads of 128,
    QK norm; its inits) with Mixtral 8x7B's experts (8 of 14336, top 2) and 32000-token vocabulary:
    torchtitan has no Mixtral flavor."""
    return with_experts(config, MIXTRAL_EXPERTS)


# --model -> how its registry flavor's config is reshaped, for the models that are not a flavor as is
RESHAPED = {"mixtral-like": mixtral_like}


def describe(model: str) -> str:
    """``--model``'s torchtitan flavor, as the help and the results name it."""
    package, flavor = MODELS[model]
    reshaped = RESHAPED.get(model)
    return f"{package} {flavor}" + (f" reshaped by {reshaped.__module__}.{reshaped.__name__}" if reshaped else "")

# Dense bf16 tensor-core peak (FLOP/s, without sparsity), keyed by torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {
    "NVIDIA H100 80GB HBM3": 989.4e12,  # H100 SXM
    "NVIDIA H200": 989.4e12,
}

STATE_BYTES_PER_PARAM = 18  # fp32 param 4 + fp32 grad 4 + AdamW's two fp32 states 8 + bf16 all-gathered copy 2
LOGIT_BYTES = 16  # per logit: bf16 logits 2 + fp32 copy 4 + saved log-softmax 4 + fp32 grad 4 + bf16 grad 2
ACTIVATION_SAFETY = 2.0  # multiplies the counted bf16 activations (backward transients, fp32 intermediates)
MEMORY_MARGIN = 0.15  # share of the GPU's memory left unplanned (CUDA context, workspaces, fragmentation)


def registry_spec(model: str, layers: int | None = None, converters: list | None = None):
    """torchtitan's model spec of ``--model`` ``model`` (its registry's default attention, reshaped
    by ``RESHAPED[model]`` if any, then ``converters``, torchtitan model converter configs, applied
    as its registry applies them), with only its first ``layers`` blocks if given (each keeps its
    own init)."""
    from torchtitan.models.utils import validate_converter_order

    package, flavor = MODELS[model]
    spec = importlib.import_module(f"torchtitan.models.{package}").model_registry(flavor)
    config = RESHAPED.get(model, lambda config: config)(spec.model)
    if converters:
        validate_converter_order(converters)
        for converter in converters:
            config = converter.build().convert(config)
    spec = dataclasses.replace(spec, model=config)
    if layers is not None:
        available = len(spec.model.layers)
        if not 1 <= layers <= available:
            raise ValueError(f"layers: expected 1 to {available} for {model}, got {layers}")
        spec.model.layers = spec.model.layers[:layers]
    return spec


@dataclass(frozen=True)
class LayerCounts:
    """One block's parameters: all, the routed experts' (0 in a dense block), the routing
    (experts, top k, expert hidden size), and the hidden size of its dense MLP or shared experts."""

    params: int
    routed_params: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_hidden: int = 0
    dense_hidden: int = 0


@dataclass(frozen=True)
class ModelCounts:
    """A model's parameters: outside the blocks (embedding, head, final norm) and per block."""

    dim: int
    vocab: int
    other_params: int
    layers: tuple[LayerCounts, ...]

    @property
    def total(self) -> int:
        return self.other_params + sum(layer.params for layer in self.layers)

    @property
    def active(self) -> int:
        """Parameters a token uses: all but the routed experts it is not sent to."""
        unused = sum(layer.routed_params * (layer.num_experts - layer.top_k) // layer.num_experts
                     for layer in self.layers if layer.num_experts)
        return self.total - unused


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def layer_counts(block, dim: int) -> LayerCounts:
    """The counts of one built torchtitan block (meta tensors will do)."""
    moe = getattr(block, "moe", None)
    dense = getattr(block, "feed_forward", None) or getattr(moe, "shared_experts", None)
    dense_hidden = _numel(dense) // (3 * dim)  # a SwiGLU MLP: w1, w3 (dim x h) and w2 (h x dim)
    if moe is None:
        return LayerCounts(_numel(block), dense_hidden=dense_hidden)
    experts = moe.routed_experts.inner_experts
    return LayerCounts(_numel(block), _numel(moe.routed_experts), experts.num_experts, moe.router.top_k,
                       experts.w1_EFD.shape[1], dense_hidden)  # w1: (experts, hidden, dim)


def count(model) -> ModelCounts:
    """The counts of a built torchtitan decoder (build it under ``torch.device("meta")``)."""
    dim = model.tok_embeddings.embedding_dim
    layers = tuple(layer_counts(block, dim) for block in model.layers.values())
    return ModelCounts(dim, model.tok_embeddings.num_embeddings, _numel(model) - sum(l.params for l in layers), layers)


def activation_bytes(layer: LayerCounts, dim: int, tokens: int) -> int:
    """Activations one block keeps for its backward, estimated: bf16 tensors per token of 12 x dim
    (norms, q/k/v, attention output, projections, residual), per routed copy of a token 2 x dim +
    3 x expert hidden (its input and output; gate, up and their product), 3 x the dense or shared
    MLP's hidden; all x ``ACTIVATION_SAFETY``."""
    elements = 12 * dim + layer.top_k * (2 * dim + 3 * layer.expert_hidden) + 3 * layer.dense_hidden
    return int(ACTIVATION_SAFETY * 2 * elements * tokens)


def layers_that_fit(counts: ModelCounts, tokens: int, gpu_memory_gb: float) -> int:
    """The most leading blocks of ``counts`` that one GPU of ``gpu_memory_gb`` (1e9 bytes) trains
    with AdamW under the bench's FSDP2 mixed precision, at ``tokens`` tokens per step (batch x
    sequence length):

        (1 - MEMORY_MARGIN) x memory >= 18 x (other params + sum of the blocks' params)
                                        + 16 x tokens x vocab + sum of the blocks' activations

    18 bytes per parameter: fp32 parameter, fp32 gradient, AdamW's two fp32 states, and a bf16
    all-gathered copy of every parameter (FSDP2 holds one or two blocks' at a time: an
    overestimate, which leaves room for the bf16 gradients of the block in its backward). 16 bytes
    per logit (``LOGIT_BYTES``), activations by ``activation_bytes``. 0 when not even one fits."""
    budget = (1 - MEMORY_MARGIN) * gpu_memory_gb * 1e9
    used = STATE_BYTES_PER_PARAM * counts.other_params + LOGIT_BYTES * tokens * counts.vocab
    fitting = 0
    for layer in counts.layers:
        used += STATE_BYTES_PER_PARAM * layer.params + activation_bytes(layer, counts.dim, tokens)
        if used > budget:
            break
        fitting += 1
    return fitting


def meta_counts(model: str, layers: int | None, seq_len: int) -> tuple[ModelCounts, int]:
    """``model``'s parameter counts (its first ``layers`` blocks if given) and torchtitan's model
    FLOPs per token at ``seq_len`` (its config's ``get_nparams_and_flops``: 6 x the active
    parameters but the embedding, plus 6 x layers x heads x head dims x seq_len for attention),
    from a build on the meta device: no weights are made."""
    spec = registry_spec(model, layers)
    with torch.device("meta"):
        built = spec.model.build()
    return count(built), spec.model.get_nparams_and_flops(built, seq_len)[1]


def resolve_layers(value: str | None, model: str, tokens: int, gpu_memory_gb: float) -> int | None:
    """``--layers``: None (all), a count within the model's, or "auto" (``layers_that_fit`` at
    ``tokens`` per step); ValueError naming the argument otherwise."""
    if value is None:
        return None
    available = len(registry_spec(model).model.layers)
    if value == "auto":
        fitting = layers_that_fit(meta_counts(model, None, 1)[0], tokens, gpu_memory_gb)
        if fitting == 0:
            raise ValueError(f"--layers auto: not one block of {model} fits {gpu_memory_gb} GB at {tokens} tokens per "
                             "step; expected a smaller --batch or --seq-len, or a larger --gpu-memory-gb")
        return fitting
    if not value.isdigit() or not 1 <= int(value) <= available:
        raise ValueError(f"--layers: expected 'auto' or a count from 1 to {available} ({model}), got {value!r}")
    return int(value)


def peak_flops(device_name: str) -> tuple[float | None, str | None]:
    """The device's dense bf16 peak in FLOP/s, or None and why."""
    peak = PEAK_BF16_FLOPS.get(device_name)
    return (peak, None) if peak is not None else (None, f"no dense bf16 peak known for {device_name!r}")


def mfu(flops_per_token: float, tokens_per_s: float, device_name: str) -> dict:
    """Model FLOP utilization: ``flops_per_token`` x ``tokens_per_s`` over the device's peak."""
    peak, reason = peak_flops(device_name)
    if peak is None:
        return {"mfu": None, "mfu_unknown_because": reason}
    return {"mfu": flops_per_token * tokens_per_s / peak, "peak_bf16_flops": peak}


# Regular expressions (re.search) for the names of each run's expert kernels; the rest of the
# step's kernels (attention, dense GEMMs, router, permutation, optimizer, ...) are "other".
TORCH_GROUPED_MM = r"GroupProblemShape|grouped_mm|GroupedGemm"  # torch._grouped_mm's CUTLASS kernels
# gmlp's CuTeDSL kernels carry its module path ("...gmlpcutedslsm90fc2_dgrad..."); its Triton
# kernels are named by their functions.
KERNELS_OF_GMLP = r"gmlp|^(fc1_|fc2_dgrad|wgrad|grouped_gemm|expert_groups|segment_sum|quantize|dequantize)"
EXPERT_KERNELS = {
    "stock": TORCH_GROUPED_MM,
    "torchtitan-fused": rf"{TORCH_GROUPED_MM}|silu_and_mul",
    "gmlp-bf16": KERNELS_OF_GMLP,
    "gmlp-mxfp8": KERNELS_OF_GMLP,
    "gmlp-fp8-blockwise": KERNELS_OF_GMLP,
    "torchao-fp8-rowwise": rf"{TORCH_GROUPED_MM}|fp8|float8",  # torch._scaled_grouped_mm, torchao's quantize kernels
}


# The rest of a step's kernels by what they do (re.search, the first that matches; the experts'
# own pattern goes first): what bounds the step where the experts do not.
STEP_PARTS = {
    "optimizer": r"multi_tensor_apply|lpnorm",  # AdamW (fused or foreach) and the gradient-norm clip
    # FSDP2 on one GPU: the bf16 casts of the parameters, the all-gather's and reduce-scatter's copies
    "copies": r"Memcpy|copy_kernel|chunk_cat|split_with_sizes",
    "attention": r"flash|fmha|sdpa|attention",
    "other GEMMs": r"nvjet|gemm|Gemm|cutlass|xmma",
}


def expert_share(kernels: list[tuple[str, float]], pattern: str, top: int = 15) -> dict:
    """Split kernels' (name, device ms) into the experts' (name matching ``pattern``) and the
    rest: the experts' share of their sum, each part's ms (the experts, then ``STEP_PARTS``, then
    "other"), and the ``top`` kernels by time with their class, so that a reader can check the
    split by name.

    Limits: a split by kernel name, so the experts' kernels that a pattern does not name (stock's
    SiLU and multiply, torch copies inside gmlp's torch code, torchtitan's permutation and
    combine around either) count as the rest, and the share is of kernel time, not of the step's
    wall time (idle GPU time, where the host sets the pace, is in neither)."""
    expression = re.compile(pattern)
    parts = {"experts": expression, **{part: re.compile(rule) for part, rule in STEP_PARTS.items()}}
    parts_ms = dict.fromkeys([*parts, "other"], 0.0)
    for name, ms in kernels:
        parts_ms[next((part for part, rule in parts.items() if rule.search(name)), "other")] += ms
    experts, total = parts_ms["experts"], sum(parts_ms.values())
    ranked = sorted(kernels, key=lambda kernel: kernel[1], reverse=True)[:top]
    return {"pattern": pattern, "experts_ms": experts, "kernels_ms": total,
            "experts_share": experts / total if total else None, "parts_ms": parts_ms,
            "top_kernels": [{"name": name[:120], "ms": ms, "experts": bool(expression.search(name))}
                            for name, ms in ranked]}
