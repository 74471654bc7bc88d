"""SonicMoE (``sonic-moe``, QuACK's CuTeDSL kernels) as a side of ``bench mlp``: its MoE experts on
the same routed rows, weights and router probabilities as the other sides.

SonicMoE's layer takes tokens and their (token, expert, score) routing and fuses the gather of
token rows into FC1's loads and the weighted scatter into FC2's epilogue. Here each routed row
of the benchmark is a token routed to one expert (top-1), in expert order, with its router score
``probs``: the same products and the same activation (SwiGLU of W1's [gate | up] halves,
``concat_layout``) times probs, with dprobs in the backward. It pins its own cutlass-dsl
(``sonic-moe 0.1.2`` needs 4.4.2), so it runs in a process of its own with its own site
directory, beside the torch baselines (``--sides``), never beside gmlp's CuTeDSL kernels.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["SIDE", "sonicmoe_run"]

SIDE = "sonicmoe-bf16"


def sonicmoe_run(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor):
    """``bench mlp``'s run of SonicMoE: w1 (E, 2F, H), w2 (E, H, F) bf16 (copied into new leaves),
    x (T, H), probs (T,) fp32, split_sizes (E,) rows per expert."""
    sonic = importlib.import_module("sonicmoe")
    activation = importlib.import_module("sonicmoe.enums").ActivationType.SWIGLU
    w1, w2 = (w.detach().clone().requires_grad_() for w in (w1, w2))
    experts, tokens = w1.shape[0], x.shape[0]
    token_indices = torch.arange(tokens, device=x.device, dtype=torch.int32)
    expert_indices = torch.repeat_interleave(torch.arange(experts, device=x.device, dtype=torch.int32),
                                             split_sizes.long(), output_size=tokens)
    stream = torch.cuda.current_stream().cuda_stream

    def forward() -> torch.Tensor:
        # SonicMoE's weights are (2F, H, E) and (H, F, E): the (E, ., .) stacks permuted, as its MoE module does
        out, _ = sonic.moe_general_routing_inputs(x, probs, token_indices, expert_indices, w1.permute(1, 2, 0), None,
                                                  w2.permute(1, 2, 0), None, experts, stream, activation,
                                                  concat_layout=True)
        return out

    return forward, [x, probs, w1, w2]
