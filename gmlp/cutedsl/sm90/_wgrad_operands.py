"""The SM90 weight gradient's problem: which (T, M, N, E) the kernel runs, and its launcher's
operands checked and unpacked."""

from __future__ import annotations

from typing import NamedTuple

import torch

from gmlp.contract.operands import describe
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl.sm90._launch import check_problem, check_tma_bases
from gmlp.cutedsl.sm90._pipeline import ALIGN, ELEMENT_ALIGN
from gmlp.cutedsl.sm90._tma import BIG

OUT_DTYPES = (torch.float32, torch.bfloat16)  # of a new result (wgrad.py maps them to cutlass dtypes)


class WgradOperands(NamedTuple):
    """A and B as the kernel takes them: bf16 (T, M) and (T, N)."""

    a: torch.Tensor
    b: torch.Tensor
    tokens: int
    m: int
    n: int


def problem_support(num_rows: int, m: int, n: int, num_experts: int) -> Reason | None:
    """None if the kernel runs a (T, M, N, E) problem, else why not (TMA alignment, coordinates)."""
    if num_experts < 1:
        return Reason(ReasonKind.SHAPE, f"E={num_experts}: needs at least one expert")
    if m % ELEMENT_ALIGN or n % ELEMENT_ALIGN:
        return Reason(ReasonKind.SHAPE, f"M={m} and N={n} must be multiples of {ELEMENT_ALIGN} (TMA's 16-byte "
                                        "strides)")
    if num_rows >= BIG or max(m, n) * 2 >= 2**31 or num_experts * (m // 8 + 1) * (n // 8 + 1) >= 2**31:
        return Reason(ReasonKind.SHAPE, f"T={num_rows}, M={m}, N={n}, E={num_experts} too large for 32-bit tile "
                                        "coordinates")
    return None


def tma_rows(t: torch.Tensor) -> bool:
    """A contiguous matrix (its sizes are ``problem_support``'s), or contiguous rows at a stride
    of a multiple of 16 bytes (a column slice of one, ``split_rows``' parts)."""
    return t.is_contiguous() or (t.stride(1) == 1 and t.stride(0) % ELEMENT_ALIGN == 0)


def wgrad_operands(name: str, a, b, experts: int, out: torch.Tensor | None, out_dtype: torch.dtype) -> WgradOperands:
    """``grouped_wgrad``'s arguments checked (raising with what was expected and what was given)
    and unpacked for the kernel."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype == torch.bfloat16
            and a.dim() == b.dim() == 2 and tma_rows(a) and tma_rows(b)):
        raise TypeError(f"a and b must be bf16 (T, M) and (T, N) matrices with contiguous rows and row strides "
                        f"multiples of {ELEMENT_ALIGN}, got a {describe(a)}, b {describe(b)}")
    (tokens, m), (b_tokens, n) = a.shape, b.shape
    if b_tokens != tokens:
        raise ValueError(f"a and b must have the same rows, got {tokens} and {b_tokens}")
    operands = WgradOperands(a, b, tokens, m, n)
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (experts, m, n)
                            or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous fp32 ({experts}, {m}, {n}) tensor, got {describe(out)}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
    check_problem(name, problem_support(tokens, m, n, experts))
    if tokens > 0:
        check_tma_bases(a=operands.a, b=operands.b)
    if out is not None and out.data_ptr() % ALIGN:
        raise ValueError(f"out must be 16-byte aligned, got an address {out.data_ptr() % ALIGN} bytes past a 16-byte "
                         "boundary")
    return operands
