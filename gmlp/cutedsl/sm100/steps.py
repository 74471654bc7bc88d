"""The SM100 path's fused steps on cuDNN frontend's grouped kernels, from gmlp's MXFP8 tensors.

Each builder checks gmlp's operands against its kernel's contract and returns a ``KernelCall``:
the tensors in the kernel's terms (outputs allocated here) and its options. The same call builds
the kernel object (``kernel()``: construct, then ``check_support``, ``compile``) and launches it
(``launch(kernel)``), so that what compiles in the tests is what runs.

- ``fc1_glu_call``: FC1 with a gated activation and probs, ``a`` quantized both ways
  (``GroupedGemmGluSm100``); ``fc1_srelu_call``: the same for srelu (``GroupedGemmSreluSm100``);
- ``grouped_gemm_call``: ``D = A @ B_g^T`` in bf16 (``GroupedGemmQuantSm100``): FC2 forward (B =
  Q_row of W2) and FC1 dgrad (``fc1_dgrad_call``: A = dh as the backward step wrote it, B = W1 as
  the kernel's N-major B);
- ``fc2_dgrad_call``: FC2 dgrad with the activation's backward and deterministic dprobs, dh
  quantized both ways (``GroupedGemmDgluSm100`` / ``GroupedGemmDsreluSm100``); its B is W2 in
  its own (E, H, F) order with scale blocks along H (the kernel's N-major B);
- ``fc2_wgrad_call`` / ``fc1_wgrad_call``: dW2 = Q_col(dy)^T Q_col(a), dW1 = Q_col(dh)^T Q_col(x)
  per expert, added into an fp32 (E, M, N) tensor (``GroupedGemmWgradSm100``).

What gmlp hands over, and why it fits the contracts (cuDNN frontend 1.32):
- A: Q_row of the token rows in the padded layout (``layout``: every expert starts at a
  multiple of 256 rows), swizzled; its flat scale buffer is the kernel's SFA, (32, 4, M_pad/128,
  4, ceil(K/128), 1) tiles (the srelu kernels take the same bytes as that 6-D view).
- B: Q_row of the (E * N, K) weight stack: data (E, N, K), K-major; with N a multiple of 128 no
  128-row scale tile crosses experts, so gmlp's swizzled scales are the kernel's flat SFB. An
  N-major B (W (E, K, N) as stored, scale blocks along K) is gmlp's Q_col of the (E * K, N)
  stack grouped by [K] * E: the scales as they are, the data permuted back from (N, E * K) by
  one fp8 copy (a quantize that keeps the source orientation would avoid it, AGENTS.md).
- Scales are E8M0 bytes, viewed as ``float8_e8m0fnu``; ``sf_vec_size`` 32 (MXFP8).
- Quantized outputs: D (Q_row, swizzled, padded rows) and D_col ((M_pad, N) row-major, 32-row
  blocks per column, each expert's scales on their own: ``discrete_col_sfd``), which is gmlp's
  grouped columnwise swizzle for the padded group sizes and the weight-gradient kernel's layout.
- Gated steps interleave gate and up in 32-column blocks (``layout.interleave_gate_up``):
  FC1's B, its C, and dh. Padding rows read zero probs, so their activations and amax stay zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.cutedsl.sm100.cudnn_kernels import kernel_class
from gmlp.cutedsl.sm100.layout import M_ALIGNED, padded_group_sizes
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.scale_layout import SCALE_TILE_ROWS
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Tensor, QuantAxis

__all__ = ["SF_VEC_SIZE", "KernelCall", "ungrouped_rowwise", "grouped_gemm_call", "fc1_glu_call", "fc1_srelu_call",
           "fc1_call", "as_matrix", "scale_bytes", "rowwise_of", "d_row_of", "d_col_of", "columnwise_of", "fc2_dgrad_call", "dprobs_of", "fc1_dgrad_call",
           "fc2_wgrad_call", "fc1_wgrad_call"]

SF_VEC_SIZE = 32
MMA_TILER_MN = (256, 256)  # the kernels' default tile, which their dprob slot count assumes


@dataclass
class KernelCall:
    """One launch of a cuDNN frontend kernel: its tensors by the kernel's own names (the
    constructor takes ``sample_<name>``, ``execute`` takes ``<name>_tensor``), its compile-time
    options and its run-time scalars. ``host_samples`` replace tensors the constructor reads on
    the host (the weight-gradient kernel validates its offsets there)."""

    step: str  # a key of cudnn_kernels.KERNELS
    tensors: dict[str, torch.Tensor]
    options: dict = field(default_factory=dict)
    runtime: dict = field(default_factory=dict)
    host_samples: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def keeping(self, names: tuple[str, ...]) -> KernelCall:
        """This call with only the tensors ``names`` (what a later step reads of it), so that
        a saved call does not keep its operands alive."""
        return KernelCall(self.step, {name: self.tensors[name] for name in names}, self.options, self.runtime)

    def signature(self) -> tuple:
        """What a compiled kernel depends on: the step, options, tensor shapes, strides, dtypes."""
        tensors = tuple((name, tuple(t.shape), t.stride(), t.dtype) for name, t in self.tensors.items())
        return self.step, tuple(sorted(self.options.items())), tensors

    def kernel(self):
        """The kernel object for calls like this one (its tensors are the samples)."""
        samples = {**self.tensors, **self.host_samples}
        return kernel_class(self.step)(**{f"sample_{name}": t for name, t in samples.items()},
                                       sf_vec_size=SF_VEC_SIZE, **self.options)

    def execute_kwargs(self) -> dict:
        """The keyword arguments of the kernel object's ``execute`` for this call."""
        names = {name: (name if name == "padded_offsets" else f"{name}_tensor") for name in self.tensors}
        return {**{names[name]: t for name, t in self.tensors.items()}, **self.runtime}

    def launch(self, kernel) -> None:
        """Run the compiled ``kernel`` on this call's tensors."""
        kernel.execute(**self.execute_kwargs())


def _e8m0(scales: torch.Tensor) -> torch.Tensor:
    return scales.view(torch.float8_e8m0fnu)


def _check_rowwise(name: str, value) -> MXFP8Tensor:
    if not (isinstance(value, MXFP8Tensor) and value.axis is QuantAxis.ROWWISE and value.swizzled):
        raise TypeError(f"{name} must be a rowwise MXFP8Tensor with swizzled scales, got {value!r}")
    return value


def ungrouped_rowwise(value: MXFP8Tensor) -> MXFP8Tensor:
    """A rowwise quantization as the kernels read it: ungrouped. Grouped in multiples of 128 rows
    (the padded layout's ``layout.padded_group_sizes``, a weight stack's [N] * E), its
    per-group 128-row scale tiles are the ungrouped tiles, in order; the buffer is cut to them."""
    value = _check_rowwise("value", value)
    if value.split_sizes is None:
        return value
    rows, cols = value.source_shape
    used = scale_layout.ceil_div(rows, SCALE_TILE_ROWS) * scale_layout.swizzled_size(SCALE_TILE_ROWS, cols // 32)
    return MXFP8Tensor(value.data, value.scales[:used], QuantAxis.ROWWISE, True, value.element_format,
                       value.scale_mode, None)


def _operands(a: MXFP8Tensor, b: MXFP8Tensor, padded_offsets: torch.Tensor) -> tuple[int, int, int, int]:
    """(M_pad, N, K, E) of A (padded token rows) times B (an (E * N, K) stack), both Q_row
    swizzled, once they satisfy the kernels' contract."""
    a, b = ungrouped_rowwise(a), ungrouped_rowwise(b)
    rows, k = a.source_shape
    stack_rows, b_k = b.source_shape
    experts = padded_offsets.numel()
    if rows % M_ALIGNED:
        raise ValueError(f"a must hold the padded layout: rows a multiple of {M_ALIGNED}, got {rows}")
    if b_k != k or stack_rows % experts:
        raise ValueError(f"b must stack {experts} experts' (N, K={k}) matrices, got a ({stack_rows}, {b_k}) source")
    n = stack_rows // experts
    if n % SCALE_TILE_ROWS:
        raise ValueError(f"N must be a multiple of {SCALE_TILE_ROWS} (a scale tile may not cross experts), got {n}")
    if a.data.dtype != b.data.dtype:
        raise TypeError(f"a and b must have the same fp8 format, got {a.data.dtype} and {b.data.dtype}")
    if padded_offsets.dtype != torch.int32 or padded_offsets.dim() != 1:
        raise TypeError(f"padded_offsets must be an (E,) int32 tensor, got {padded_offsets.dtype} {tuple(padded_offsets.shape)}")
    return rows, n, k, experts


def _bf16_out(out: torch.Tensor | None, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)
    if tuple(out.shape) != shape or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 {shape}, got {out.dtype} {tuple(out.shape)}")
    return out


def _ones(count: int, device: torch.device) -> torch.Tensor:
    return torch.ones(count, dtype=torch.float32, device=device)


def grouped_gemm_call(a: MXFP8Tensor, b: MXFP8Tensor, padded_offsets: torch.Tensor,
                      out: torch.Tensor | None = None) -> KernelCall:
    """``a``: Q_row of the padded token rows (M_pad, K); ``b``: Q_row of the (E * N, K) weight
    stack; ``padded_offsets``: ``layout.padded_rows(...).offsets``; ``out``: (M_pad, N) bf16."""
    rows, n, k, experts = _operands(a, b, padded_offsets)
    a, device = ungrouped_rowwise(a), a.data.device
    b = ungrouped_rowwise(b)
    return KernelCall("grouped_gemm", dict(
        a=a.data, sfa=_e8m0(a.scales), b=b.data.view(experts, n, k), sfb=_e8m0(b.scales),
        padded_offsets=padded_offsets, alpha=_ones(experts, device), d=_bf16_out(out, (rows, n), device)),
        options=dict(b_major="k"))


# --- FC1 -------------------------------------------------------------------------------------

GLU_FUNCTIONS = {ActivationKind.SWIGLU: ("swiglu", "dswiglu"), ActivationKind.QGEGLU: ("geglu", "dgeglu")}


def _glu_parameters(activation: Activation) -> dict:
    """The GLU kernels' parameters of gmlp's qgeglu (their "geglu": ``(clamp(up, min, max) +
    linear_offset) * g * sigmoid(geglu_alpha * g)``, ``g = min(gate, max)``); none for swiglu."""
    if activation.kind is not ActivationKind.QGEGLU:
        return {}
    return dict(linear_offset=activation.offset, geglu_alpha=activation.alpha, glu_clamp_max=activation.limit,
                glu_clamp_min=-activation.limit)


def _quantized_outputs(rows: int, cols: int, fp8: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """D (Q_row) and D_col (Q_col, (rows, cols) row-major) with their scale buffers: the same
    number of bytes, (rows / 128) swizzled tiles of (128, cols / 32) either way."""
    scale_bytes = (rows // SCALE_TILE_ROWS) * scale_layout.swizzled_size(SCALE_TILE_ROWS, cols // 32)
    def scales() -> torch.Tensor:
        return _e8m0(torch.empty(scale_bytes, dtype=torch.uint8, device=device))
    return dict(d=torch.empty(rows, cols, dtype=fp8, device=device), sfd_row=scales(),
                d_col=torch.empty(rows, cols, dtype=fp8, device=device), sfd_col=scales())


def _check_prob(prob: torch.Tensor, rows: int) -> None:
    if prob.dtype != torch.float32 or tuple(prob.shape) != (rows,):
        raise ValueError(f"prob must be fp32 ({rows},) with zeros on padding rows, got {prob.dtype} {tuple(prob.shape)}")


def fc1_glu_call(x: MXFP8Tensor, w1: MXFP8Tensor, padded_offsets: torch.Tensor, prob: torch.Tensor,
                 activation: Activation) -> KernelCall:
    """FC1 with a gated activation: ``x`` Q_row of the padded token rows (M_pad, H); ``w1`` Q_row
    of the gate/up-interleaved (E * 2F, H) stack; ``prob`` (M_pad,) fp32, zeros on padding rows."""
    if activation.kind not in GLU_FUNCTIONS:
        raise ValueError(f"the SM100 GLU step runs {[k.value for k in GLU_FUNCTIONS]}, got {activation.name!r}")
    rows, n, _, experts = _operands(x, w1, padded_offsets)
    ffn = n // 2
    if ffn % 64:  # N = 2F: a multiple of 128 (scale tiles), F of 64 (the kernel)
        raise ValueError(f"F must be a multiple of 64, got {ffn}")
    _check_prob(prob, rows)
    x, w1, device, fp8 = ungrouped_rowwise(x), ungrouped_rowwise(w1), x.data.device, x.data.dtype
    tensors = dict(
        a=x.data, sfa=_e8m0(x.scales), b=w1.data.view(experts, n, -1), sfb=_e8m0(w1.scales),
        padded_offsets=padded_offsets, alpha=_ones(experts, device), prob=prob,
        c=torch.empty(rows, n, dtype=torch.bfloat16, device=device), **_quantized_outputs(rows, ffn, fp8, device),
        amax=torch.zeros(experts, 1, dtype=torch.float32, device=device), norm_const=_ones(1, device))
    return KernelCall("fc1_glu", tensors, options=dict(discrete_col_sfd=True, act_func=GLU_FUNCTIONS[activation.kind][0]),
                      runtime=_glu_parameters(activation))


def _six_d(scales: torch.Tensor, mn: int, k_blocks: int, groups: int = 1) -> torch.Tensor:
    """The srelu kernels' view of a flat swizzled scale buffer: the (32, 4, MN/128, 4, K'/4, L)
    permutation of its C-contiguous (L, MN/128, K'/4, 32, 4, 4) tiles (the same bytes)."""
    tiles = scales[:groups * scale_layout.swizzled_size(mn, k_blocks)]
    shape = (groups, scale_layout.ceil_div(mn, SCALE_TILE_ROWS), scale_layout.ceil_div(k_blocks, 4), 32, 4, 4)
    return tiles.view(shape).permute(3, 4, 1, 5, 2, 0)


def fc1_srelu_call(x: MXFP8Tensor, w1: MXFP8Tensor, padded_offsets: torch.Tensor, prob: torch.Tensor) -> KernelCall:
    """FC1 with srelu (not gated): ``w1`` Q_row of the (E * F, H) stack; else as ``fc1_glu_call``.
    The srelu kernel takes (M, N, 1) tensors, B as (N, K, E) and 6-D scale views."""
    rows, ffn, hidden, experts = _operands(x, w1, padded_offsets)
    _check_prob(prob, rows)
    x, w1, device, fp8 = ungrouped_rowwise(x), ungrouped_rowwise(w1), x.data.device, x.data.dtype
    out = _quantized_outputs(rows, ffn, fp8, device)
    tensors = dict(
        a=x.data.unsqueeze(-1), sfa=_six_d(_e8m0(x.scales), rows, hidden // 32),
        b=w1.data.view(experts, ffn, hidden).permute(1, 2, 0),
        sfb=_six_d(_e8m0(w1.scales), ffn, hidden // 32, experts), padded_offsets=padded_offsets,
        alpha=_ones(experts, device), prob=prob.view(rows, 1, 1),
        c=torch.empty(rows, ffn, 1, dtype=torch.bfloat16, device=device),
        d=out["d"].unsqueeze(-1), sfd_row=_six_d(out["sfd_row"], rows, ffn // 32),
        d_col=out["d_col"].unsqueeze(-1), sfd_col=_six_d(out["sfd_col"], ffn, rows // 32),
        amax=torch.zeros(experts, 1, dtype=torch.float32, device=device), norm_const=_ones(1, device))
    return KernelCall("fc1_srelu", tensors, options=dict(discrete_col_sfd=True))


def fc1_call(x: MXFP8Tensor, w1: MXFP8Tensor, padded_offsets: torch.Tensor, prob: torch.Tensor,
             activation: Activation) -> KernelCall:
    """FC1's call for ``activation``: the GLU kernel when gated, the srelu kernel otherwise."""
    if activation.gated:
        return fc1_glu_call(x, w1, padded_offsets, prob, activation)
    return fc1_srelu_call(x, w1, padded_offsets, prob)


def as_matrix(t: torch.Tensor) -> torch.Tensor:
    """An (M, N) or (M, N, 1) tensor of a call (the srelu kernels take the latter) as (M, N)."""
    return t.squeeze(-1) if t.dim() == 3 else t


def scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    """A scale buffer of a call as flat uint8 bytes (a 6-D view's bytes are C-contiguous tiles)."""
    flat = scales.permute(5, 2, 4, 0, 1, 3).reshape(-1) if scales.dim() == 6 else scales
    return flat.view(torch.uint8)


def _format_of(data: torch.Tensor) -> ElementFormat:
    return ElementFormat.E4M3 if data.dtype == torch.float8_e4m3fn else ElementFormat.E5M2


def rowwise_of(data: torch.Tensor, scales: torch.Tensor) -> MXFP8Tensor:
    """(M, K) fp8 data with blocks of 32 along K and a call's swizzled scales, as gmlp's Q_row."""
    data = as_matrix(data)
    return MXFP8Tensor(data, scale_bytes(scales), QuantAxis.ROWWISE, True, _format_of(data), ScaleMode.RCEIL, None)


def d_row_of(call: KernelCall, name: str = "d") -> MXFP8Tensor:
    """A step's rowwise quantized output (``d`` or ``d_row``) as gmlp's Q_row (padded rows)."""
    return rowwise_of(call[name], call["sfd_row"])


def columnwise_of(data: torch.Tensor, scales: torch.Tensor, padded_offsets: torch.Tensor) -> MXFP8Tensor:
    """An (N, M_pad) fp8 matrix quantized along its padded token rows (M_pad) with a kernel's
    per-expert column scales, as gmlp's Q_col grouped by the padded group sizes."""
    sizes = padded_group_sizes(padded_offsets, data.shape[1])
    return MXFP8Tensor(data, scale_bytes(scales), QuantAxis.COLUMNWISE, True, _format_of(data),
                       ScaleMode.RCEIL, sizes)


def d_col_of(call: KernelCall) -> MXFP8Tensor:
    """A step's columnwise quantized output (``d_col``, (M_pad, N) row-major) as gmlp's Q_col."""
    return columnwise_of(as_matrix(call["d_col"]).t(), call["sfd_col"], call["padded_offsets"])


# --- backward --------------------------------------------------------------------------------


def _n_major_weight(name: str, w_col: MXFP8Tensor, experts: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, sfb) of a weight W (E, K, N) as the kernels' N-major B, from ``w_col``, gmlp's Q_col of
    its (E * K, N) stack grouped by [K] * E: the scales (blocks of 32 along K, each expert's
    swizzled on its own) are the kernels' SFB as they are; the data, stored transposed (N, E * K),
    is permuted back to (E, K, N) by one fp8 copy."""
    if not (isinstance(w_col, MXFP8Tensor) and w_col.axis is QuantAxis.COLUMNWISE and w_col.swizzled):
        raise TypeError(f"{name} must be a columnwise MXFP8Tensor with swizzled scales, got {w_col!r}")
    n, stack_rows = w_col.data.shape
    if stack_rows != experts * k or k % SCALE_TILE_ROWS:
        raise ValueError(f"{name} must quantize an ({experts} * {k}, N) stack, K a multiple of {SCALE_TILE_ROWS}, "
                         f"got data {tuple(w_col.data.shape)}")
    b = w_col.data.view(n, experts, k).permute(1, 2, 0).contiguous()
    return b, _e8m0(w_col.scales[:experts * scale_layout.swizzled_size(n, k // 32)])


def fc2_dgrad_call(dy: MXFP8Tensor, w2_col: MXFP8Tensor, fc1: KernelCall, activation: Activation) -> KernelCall:
    """FC2 dgrad with the activation's backward and deterministic dprobs: ``dy`` Q_row of the
    padded dy rows (M_pad, H), E4M3 like the weights (the kernels take one fp8 format for A and
    B); ``w2_col`` Q_col of the (E * H, F) W2 stack grouped by [H] * E; ``fc1`` the forward's
    FC1 call (its C, probs and offsets). dprobs come in per-tile slots (``dprobs_of``)."""
    from cudnn.gemm.cutedsl.grouped.dsrelu.api import _dprob_n_slots  # the kernels' slot count (pinned version)

    dy = ungrouped_rowwise(dy)
    rows, hidden = dy.source_shape
    padded_offsets = fc1["padded_offsets"]
    experts = padded_offsets.numel()
    b, sfb = _n_major_weight("w2_col", w2_col, experts, hidden)
    ffn = b.shape[2]
    c = as_matrix(fc1["c"])
    n_out = 2 * ffn if activation.gated else ffn
    if tuple(c.shape) != (rows, n_out):
        raise ValueError(f"w2_col's F = {ffn} does not match FC1's C {tuple(c.shape)} for {activation.name}")
    if dy.data.dtype != w2_col.data.dtype:
        raise TypeError(f"dy and W2 must have the same fp8 format, got {dy.data.dtype} and {w2_col.data.dtype}")
    device, fp8 = dy.data.device, dy.data.dtype
    out = _quantized_outputs(rows, n_out, fp8, device)
    slots = torch.zeros(rows, _dprob_n_slots(ffn, MMA_TILER_MN, None, True), 1, dtype=torch.float32, device=device)
    prob = fc1["prob"].reshape(rows)
    amax_shape = (experts, 2, 1) if activation.gated else (experts, 1)
    common = dict(a=dy.data, sfa=_e8m0(dy.scales), b=b, sfb=sfb, padded_offsets=padded_offsets,
                  alpha=_ones(experts, device), amax=torch.zeros(amax_shape, dtype=torch.float32, device=device),
                  norm_const=fc1["norm_const"])
    if activation.gated:
        if activation.kind not in GLU_FUNCTIONS:
            raise ValueError(f"the SM100 dGLU step runs {[k.value for k in GLU_FUNCTIONS]}, got {activation.name!r}")
        tensors = dict(common, c=c, prob=prob, dprob=slots, beta=_ones(experts, device), d_row=out["d"],
                       sfd_row=out["sfd_row"], d_col=out["d_col"], sfd_col=out["sfd_col"])
        options = dict(act_func=GLU_FUNCTIONS[activation.kind][1], b_major="n", discrete_col_sfd=True,
                       _deterministic=True, **_glu_parameters(activation))
        return KernelCall("fc2_dgrad_glu", tensors, options=options)
    tensors = dict(
        common, a=dy.data.unsqueeze(-1), sfa=_six_d(common["sfa"], rows, hidden // 32),
        b=b.permute(2, 1, 0), sfb=_six_d(sfb, ffn, hidden // 32, experts), c=c.unsqueeze(-1),
        prob=prob.view(rows, 1, 1), dprob=torch.zeros(rows, 1, 1, dtype=torch.float32, device=device),
        dprob_workspace=slots, d_row=out["d"].unsqueeze(-1), sfd_row=_six_d(out["sfd_row"], rows, ffn // 32),
        d_col=out["d_col"].unsqueeze(-1), sfd_col=_six_d(out["sfd_col"], ffn, rows // 32))
    return KernelCall("fc2_dgrad_srelu", tensors, options=dict(b_major="n", discrete_col_sfd=True, deterministic=True))


def dprobs_of(dgrad: KernelCall) -> torch.Tensor:
    """(M_pad,) fp32 dprobs of a finished FC2 dgrad: its per-tile slots summed in a fixed order."""
    slots = dgrad["dprob_workspace"] if "dprob_workspace" in dgrad.tensors else dgrad["dprob"]
    return slots.sum(dim=1).reshape(-1)


def fc1_dgrad_call(dgrad: KernelCall, w1_col: MXFP8Tensor, out: torch.Tensor | None = None) -> KernelCall:
    """FC1 dgrad, dx = dh @ W1_g: A is dh quantized rowwise as FC2 dgrad wrote it (interleaved
    columns when gated, like ``w1_col``'s rows); ``w1_col`` Q_col of the (E * N1, H) W1 stack as
    FC1 read it, grouped by [N1] * E; ``out`` (M_pad, H) bf16 or None."""
    dh = d_row_of(dgrad, "d_row")
    rows, n1 = dh.source_shape
    experts = dgrad["padded_offsets"].numel()
    b, sfb = _n_major_weight("w1_col", w1_col, experts, n1)
    hidden = b.shape[2]
    if dh.data.dtype != w1_col.data.dtype:
        raise TypeError(f"dh and W1 must have the same fp8 format, got {dh.data.dtype} and {w1_col.data.dtype}")
    return KernelCall("grouped_gemm", dict(
        a=dh.data, sfa=_e8m0(dh.scales), b=b, sfb=sfb, padded_offsets=dgrad["padded_offsets"],
        alpha=_ones(experts, b.device), d=_bf16_out(out, (rows, hidden), b.device)), options=dict(b_major="n"))


def _wgrad_call(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, padded_offsets: torch.Tensor,
                out: torch.Tensor) -> KernelCall:
    experts, m, n = out.shape
    if tuple(a.shape[:1]) != (m,) or tuple(b.shape[1:]) != (n,) or a.shape[1] != b.shape[0]:
        raise ValueError(f"wgrad operands A {tuple(a.shape)} and B {tuple(b.shape)} do not give ({m}, {n}) per expert")
    if out.dtype != torch.float32:
        raise ValueError(f"the weight gradient is accumulated in fp32, got {out.dtype}")
    # the kernel object checks its offsets on the host when built; they are run-time values, so
    # it is built from a host sample (any valid offsets) and launched with the device ones
    host = torch.zeros(experts, dtype=torch.int32)
    return KernelCall("wgrad", dict(a=a, b=b, sfa=sfa, sfb=sfb, offsets=padded_offsets, wgrad=out),
                      options=dict(accumulate_on_output=True), host_samples=dict(offsets=host))


def _columnwise_padded(name: str, value, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(data (cols, rows), scales of the rows / 128 tiles the kernel reads) of gmlp's Q_col of a
    padded (rows, cols) tensor grouped by the padded group sizes (``padded_group_sizes``): each
    expert's 32-row blocks are whole, so its swizzled scales are the kernel's layout."""
    if not (isinstance(value, MXFP8Tensor) and value.axis is QuantAxis.COLUMNWISE and value.swizzled):
        raise TypeError(f"{name} must be a columnwise MXFP8Tensor with swizzled scales, got {value!r}")
    if tuple(value.data.shape) != (cols, rows) or cols % SCALE_TILE_ROWS:
        raise ValueError(f"{name} must quantize ({rows}, {cols}) padded rows, {cols} a multiple of "
                         f"{SCALE_TILE_ROWS}, got data {tuple(value.data.shape)}")
    used = (rows // SCALE_TILE_ROWS) * scale_layout.swizzled_size(cols, 4)
    return value.data, _e8m0(value.scales[:used])


def fc2_wgrad_call(dy_col: MXFP8Tensor, fc1: KernelCall, out: torch.Tensor) -> KernelCall:
    """dW2 += Q_col(dy)^T Q_col(a): ``dy_col`` Q_col of the padded dy rows (data (H, M_pad), tokens
    contiguous); B is FC1's D_col as written (features contiguous); ``out`` (E, H, F) fp32."""
    d_col = as_matrix(fc1["d_col"])
    rows, ffn = d_col.shape
    a, sfa = _columnwise_padded("dy_col", dy_col, rows, out.shape[1])
    return _wgrad_call(a, sfa, d_col, _e8m0(scale_bytes(fc1["sfd_col"])), fc1["padded_offsets"], out)


def fc1_wgrad_call(dgrad: KernelCall, x_col: MXFP8Tensor, out: torch.Tensor) -> KernelCall:
    """dW1 += Q_col(dh)^T Q_col(x): A is FC2 dgrad's D_col transposed (features contiguous), its
    scales as written; ``x_col`` Q_col of the padded x rows (data (H, M_pad)), read as (M_pad, H);
    ``out`` (E, N1, H) fp32 in dh's column order (interleaved when gated)."""
    d_col = as_matrix(dgrad["d_col"])
    rows = d_col.shape[0]
    b, sfb = _columnwise_padded("x_col", x_col, rows, out.shape[2])
    return _wgrad_call(d_col.t(), _e8m0(scale_bytes(dgrad["sfd_col"])), b.t(), sfb, dgrad["padded_offsets"], out)
