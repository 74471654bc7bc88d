"""The host side that the SM90 launchers (``grouped_gemm``, ``fc1``, ``fc2_dgrad``, ``wgrad``) share:
the checks of their arguments that recur from launcher to launcher, one helper each, whose error
names the argument, what was expected and what was given; the problem rule of FC1 and FC2 dgrad
(the same (T, H, F, E) limits); and the run of a compiled config over its persistent CTAs. What
only one launcher checks (its operand layouts, its own options) stays in its module.
"""

from __future__ import annotations

from typing import Callable

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.operands import ExpertOperand, describe, expert_operand
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.device_scope import on_device
from gmlp.cutedsl.sm90._pipeline import ALIGN
from gmlp.cutedsl.sm90._schedule import expert_count_reason
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.spec import BLOCK_SIZE

__all__ = ["ffn_problem_support", "check_problem", "check_recipe", "check_activation", "expert_matrices",
           "check_optional", "check_tma_bases", "run"]


def ffn_problem_support(num_rows: int, hidden: int, ffn: int, num_experts: int, gated: bool,
                        tile_rows: int) -> Reason | None:
    """None if the FC1 or the FC2 dgrad kernel runs a (T, H, F, E) problem, else why not: the
    expert search's depth, the Triton twins' rule of H and F multiples of 32 (TMA's 16-byte strides
    follow), and 32-bit coordinates, of the (T, H) and (T, N1 = 2F | F) operands and of
    ``tile_rows`` rows of N1 values per 128-row tile (FC1: 1, its work items; FC2 dgrad: its 8
    db1 warp sums)."""
    reason = expert_count_reason(num_experts)
    if reason is not None:
        return reason
    if hidden <= 0 or ffn <= 0 or hidden % BLOCK_SIZE or ffn % BLOCK_SIZE:
        return Reason(ReasonKind.SHAPE, f"H={hidden} and F={ffn} must be positive multiples of {BLOCK_SIZE}")
    n1 = (2 if gated else 1) * ffn
    tiles = scale_layout.max_row_tiles(num_rows, num_experts)
    if max(num_rows, n1, hidden) * 2 >= 2**31 or tiles * tile_rows * n1 >= 2**31:
        return Reason(ReasonKind.SHAPE, f"T={num_rows}, H={hidden}, F={ffn}, E={num_experts} too large for 32-bit "
                                        "tile coordinates")
    return None


def check_problem(kernel: str, reason: Reason | None) -> None:
    """Raise unless ``reason`` (a kernel module's ``problem_support`` of the sizes) is None."""
    if reason is not None:
        raise ValueError(f"the sm90 {kernel} cannot run this problem: {reason.message}")


def check_recipe(recipe) -> None:
    if recipe is not None and not isinstance(recipe, MXFP8Recipe):
        raise TypeError(f"recipe must be None or a gmlp.MXFP8Recipe, got {recipe!r}")


def check_activation(activation) -> None:
    if not isinstance(activation, Activation):
        raise TypeError(f"activation must be a gmlp.contract.activations.Activation, got {activation!r}")


def expert_matrices(name: str, value, experts: int, **sizes: int | None) -> ExpertOperand:
    """``value`` read as per-expert (N, K) matrices (``expert_operand``: bf16 (E, N, K), any
    strides), checked against ``sizes``: the labels of N and K, in that order, each with the size
    it must have or None for any (``expert_matrices("w1", w1, E, N1=n1, H=h)``)."""
    operand = expert_operand(name, value, experts)
    (n_label, n), (k_label, k) = sizes.items()
    if (n is not None and operand.n != n) or (k is not None and operand.k != k):
        expected = ", ".join(label if size is None else f"{label}={size}" for label, size in sizes.items())
        raise ValueError(f"{name} must hold {experts} experts' ({expected}) matrices, got ({operand.n}, "
                         f"{operand.k}) each")
    return operand


def check_optional(name: str, value: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """An optional operand the kernel reads at dense offsets (a bias, probs): None, or a
    contiguous tensor of ``shape`` (its dtype is the config's check)."""
    if value is not None and (tuple(value.shape) != shape or not value.is_contiguous()):
        raise ValueError(f"{name} must be a contiguous {shape} tensor, got {describe(value)}")


def check_tma_bases(**operands: torch.Tensor) -> None:
    """The operands behind TMA descriptors (``name=tensor``): CUDA tensors at 16-byte aligned
    addresses."""
    for name, value in operands.items():
        if value.is_cuda and value.data_ptr() % ALIGN == 0:
            continue
        names = list(operands)  # the message is built only for a bad operand (host time at every launch)
        together = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        given = (f"{name} on {value.device}" if not value.is_cuda else
                 f"{name} at an address {value.data_ptr() % ALIGN} bytes past a 16-byte boundary")
        raise ValueError(f"{together} must be 16-byte aligned CUDA tensors, got {given}")


def run(compile_config: Callable, config, device: torch.device, num_ctas: int, *arguments) -> None:
    """Launch ``config`` of a kernel module (its cached ``compile_config(config, None)``: built for
    the current GPU on first use) on ``device`` over ``num_ctas`` persistent CTAs, the kernel's
    ``arguments`` before the CTA count; 0 CTAs: nothing to do."""
    if num_ctas > 0:
        with on_device(device):
            compile_config(config, None).function(*arguments, num_ctas)
