"""TransformerEngine's ``GroupedLinear`` with the ``Float8BlockScaling`` recipe as a side of ``bench
mlp``: the FP8 blockwise recipe's reference implementation (gmlp's blockwise layer is bit-compatible
with its quantization), on the same routed rows, weights and router probabilities as the other sides.

The layer is the compiled-activation baseline's with both grouped GEMMs replaced by TE's: two
``GroupedLinear`` modules (FC1 (E, 2F, H), FC2 (E, H, F), no bias) holding copies of the bf16
weights, run under ``fp8_autocast(fp8_recipe=Float8BlockScaling())``, so TE quantizes x, a, dy and the
weights in 1 x 128 and 128 x 128 blocks and runs its FP8 GEMMs forward and backward. TE takes the
rows per expert as a host list (``m_splits``): the side reads ``split_sizes`` once, outside the
timed step, as a user who routes on the host would; gmlp's sides never read it on the host. TE's
block-scaled GEMMs need every expert's rows a multiple of 16 (``ALIGN``, TE's alignment for the
recipe): where the routing is not, the side pads as Megatron's TE experts do, TE's ``Fp8Padding``
before FC1 and ``Fp8Unpadding`` after FC2 (zero rows, zero probabilities), inside the timed step.
TransformerEngine is not a gmlp dependency: the side imports it when asked for (on the GPU machine,
the offline bundle of the maintainer's guide).
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["SIDE", "te_run"]

SIDE = "te-fp8-blockwise"
ALIGN = 16  # rows per expert TE's Float8BlockScaling GEMMs take (transformer_engine's alignment for the recipe)


def _grouped_linear(te, weights: torch.Tensor):
    """A bias-free ``GroupedLinear`` of (E, out, in) bf16 ``weights``, its ``weight{g}`` copies of them."""
    experts, out_features, in_features = weights.shape
    layer = te.GroupedLinear(experts, in_features, out_features, bias=False, params_dtype=torch.bfloat16,
                             device=weights.device)
    with torch.no_grad():
        for g in range(experts):
            getattr(layer, f"weight{g}").copy_(weights[g])
    return layer


def te_run(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor,
           activation):
    """``bench mlp``'s run of TE's FP8 blockwise layer: w1 (E, 2F, H), w2 (E, H, F) bf16 (copied into
    the modules' own weights), x (T, H), probs (T,) fp32, ``split_sizes`` (E,) on the device (read
    once here), ``activation`` the compiled baseline's (h, probs) -> a."""
    te = importlib.import_module("transformer_engine.pytorch")
    recipe = importlib.import_module("transformer_engine.common.recipe").Float8BlockScaling()
    available, why = te.is_fp8_block_scaling_available(return_reason=True)
    if not available:
        raise RuntimeError(f"{SIDE}: TransformerEngine cannot run Float8BlockScaling here: {why}")
    fc1, fc2 = _grouped_linear(te, w1), _grouped_linear(te, w2)
    m_splits = split_sizes.tolist()
    padded_splits = [-(-m // ALIGN) * ALIGN for m in m_splits]
    if padded_splits == m_splits:
        def forward() -> torch.Tensor:
            with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
                return fc2(activation(fc1(x, m_splits), probs), m_splits)

        return forward, [x, probs, *fc1.parameters(), *fc2.parameters()]

    experts = len(m_splits)
    pad, unpad = te.Fp8Padding(experts, align_size=ALIGN), te.Fp8Unpadding(experts, align_size=ALIGN)
    # the padded layout's row of each routed row: expert g's rows start at its padded offset
    starts = [sum(padded_splits[:g]) for g in range(experts)]
    real_rows = torch.cat([torch.arange(m) + start for m, start in zip(m_splits, starts)]).to(probs.device)

    def padded_forward() -> torch.Tensor:
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            x_padded, splits = pad(x, m_splits)
            probs_padded = probs.new_zeros(sum(padded_splits)).index_copy(0, real_rows, probs)
            return unpad(fc2(activation(fc1(x_padded, splits), probs_padded), splits), m_splits)

    return padded_forward, [x, probs, *fc1.parameters(), *fc2.parameters()]

    return forward, [x, probs, *fc1.parameters(), *fc2.parameters()]
