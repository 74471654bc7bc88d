"""Torch twins of cuDNN frontend's SM100 grouped kernels, for running the SM100 composition on the CPU.

Each twin reads a ``KernelCall``'s tensors in the kernel's layouts, as its documentation and code
describe them (AGENTS.md: the contract), and writes its outputs there: fp32 math on dequantized
operands, outputs quantized by the spec (``quantize_mxfp8_ref``). With them, the composition's
plumbing (padding, interleaving, scale views, offsets, which tensor goes where) runs end to end
against the oracle. What they cannot show is that the real kernels behave as documented: only a
Blackwell run can (``tests/cutedsl/sm100/test_gpu.py``).
"""

from __future__ import annotations

import torch

from gmlp.contract.activations import Activation
from gmlp.cutedsl.sm100.layout import interleave_gate_up, padded_group_sizes, split_interleaved
from gmlp.cutedsl.sm100.steps import KernelCall, as_matrix, columnwise_of, rowwise_of, scale_bytes
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.reference import quantize_mxfp8_ref


def _segments(call: KernelCall) -> list[tuple[int, int]]:
    """Each expert's padded rows [start, end)."""
    name = "padded_offsets" if "padded_offsets" in call.tensors else "offsets"
    ends = call[name].tolist()
    return list(zip([0] + ends[:-1], ends))


def _b_values(call: KernelCall) -> torch.Tensor:
    """B per expert as (E, K, N) fp32, from K-major (E, N, K) or N-major (E, K, N) data (the
    srelu kernels' (N, K, E) views first brought back to those)."""
    b, sfb = call["b"], scale_bytes(call["sfb"])
    n_major = call.options.get("b_major", "k") == "n"
    if call.step in ("fc1_srelu", "fc2_dgrad_srelu"):  # (N, K, E) views
        b = b.permute(2, 1, 0) if n_major else b.permute(2, 0, 1)
    experts = b.shape[0]
    n, k = (b.shape[2], b.shape[1]) if n_major else (b.shape[1], b.shape[2])
    per_expert = scale_layout.swizzled_size(n, k // 32)
    values = []
    for e in range(experts):
        rows_nk = b[e].t() if n_major else b[e]  # (N, K), blocks along K
        values.append(rowwise_of(rows_nk.contiguous(), sfb[e * per_expert:(e + 1) * per_expert]).dequantize().t())
    return torch.stack(values)


def _gemm(call: KernelCall) -> tuple[torch.Tensor, list[tuple[int, int]], torch.Tensor]:
    """A @ B_g (fp32) for every expert's padded rows; rows after the last expert stay zero."""
    a = as_matrix(call["a"])
    a_values, b_values = rowwise_of(a, call["sfa"]).dequantize(), _b_values(call)
    out = torch.zeros(a.shape[0], b_values.shape[2])
    segments, sizes = _segments(call), padded_group_sizes(call["padded_offsets"], a.shape[0])
    for e, (start, end) in enumerate(segments):
        out[start:end] = a_values[start:end] @ b_values[e]
    return out, segments, sizes


def _write_quantized(call: KernelCall, values: torch.Tensor, sizes: torch.Tensor, row_name: str) -> None:
    """Q_row and Q_col (grouped by the padded sizes, discrete column scales) of ``values``."""
    values = values.contiguous()
    row = quantize_mxfp8_ref(values, rowwise=True, swizzle=True).rowwise
    col = quantize_mxfp8_ref(values, rowwise=False, columnwise=True, swizzle=True, split_sizes=sizes).columnwise
    as_matrix(call[row_name]).copy_(row.data)
    scale_bytes(call["sfd_row"]).copy_(row.scales[:scale_bytes(call["sfd_row"]).numel()])
    as_matrix(call["d_col"]).copy_(col.data.t())
    scale_bytes(call["sfd_col"]).copy_(col.scales[:scale_bytes(call["sfd_col"]).numel()])


def _interleave_columns(values: torch.Tensor) -> torch.Tensor:
    return interleave_gate_up(values.t().unsqueeze(0))[0].t()


class TorchKernels:
    """A launcher (``gmlp.cutedsl.sm100.layer``'s ``launch``) that runs each call's twin; records the sites."""

    def __init__(self, activation: Activation):
        self.activation, self.sites = activation, []

    def __call__(self, site: str, call: KernelCall) -> None:
        self.sites.append(site)
        getattr(self, f"_{call.step}")(call)

    def _grouped_gemm(self, call: KernelCall) -> None:
        out, _, _ = _gemm(call)
        call["d"].copy_(out.bfloat16())

    def _fc1(self, call: KernelCall) -> None:
        h, _, sizes = _gemm(call)
        as_matrix(call["c"]).copy_(h.bfloat16())
        gmlp_order = split_interleaved(h) if self.activation.gated else h
        a = self.activation.forward(gmlp_order) * call["prob"].reshape(-1, 1)
        _write_quantized(call, a, sizes, "d")

    _fc1_glu = _fc1_srelu = _fc1

    def _fc2_dgrad(self, call: KernelCall) -> None:
        da, _, sizes = _gemm(call)
        c = as_matrix(call["c"]).float()
        c = split_interleaved(c) if self.activation.gated else c
        prob = call["prob"].reshape(-1, 1)
        dh = self.activation.backward(c, da * prob)
        dh = _interleave_columns(dh) if self.activation.gated else dh
        slots = call["dprob_workspace"] if "dprob_workspace" in call.tensors else call["dprob"]
        slots.zero_()
        slots[:, 0, 0] = (da * self.activation.forward(c)).sum(dim=1)
        _write_quantized(call, dh, sizes, "d_row")

    _fc2_dgrad_glu = _fc2_dgrad_srelu = _fc2_dgrad

    def _wgrad(self, call: KernelCall) -> None:
        a, b = call["a"], call["b"]  # (M, T_pad), (T_pad, N)
        segments = _segments(call)
        a_values = columnwise_of(a, call["sfa"], call["offsets"]).dequantize()  # (T_pad, M)
        b_values = columnwise_of(b.t(), call["sfb"], call["offsets"]).dequantize()  # (T_pad, N)
        for e, (start, end) in enumerate(segments):
            call["wgrad"][e] += a_values[start:end].t() @ b_values[start:end]


def as_sm100_plan(plan):
    """``plan`` (the torch path's, made off SM100) as the plan of the SM100 composition: the
    composition's sites only (its quantizes of W1, W2 and dy in place of the step sequence's
    quantize-dequantize sites, on the path of the quantize of x), ``sm100`` set."""
    from gmlp.dispatch.plan import LayerPlan
    from gmlp.dispatch.sites import SITES

    decisions = {s: d for s, d in plan.decisions.items() if SITES[s].sm100 is not False}
    decisions.update({s: plan.decisions["quantize x"] for s in ("quantize w1", "quantize w2", "quantize dy")})
    return LayerPlan(decisions, plan.references, sm100=True)
