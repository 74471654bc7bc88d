"""How two paths' outputs of one op are compared, and the bound each element must keep.

Bit for bit where docs/design.md says the results are defined to the bit: the quantize (the spec) and
the dequantize. Elsewhere the paths differ only in the order of fp32 accumulation (the torch
twins accumulate in fp64 and round once), and each element gets a bound derived from that:

- a K-term fp32 dot product in any order is within ``delta = K * 2**-24 * S`` of the exact one,
  S the same sum of absolute products (the GEMM of |A| and |B|, computed here in fp64);
- an epilogue's elementwise function moves that by at most its slope: ``L = 2 (|g| + 1)(|u| + 1)``
  bounds the partial derivatives of every gated activation here (and of srelu with u = 0),
  times |probs|;
- rounding to bf16 can then land one step (2**-7 of the value) apart; a quantized element (MXFP8
  or FP8 blockwise) one step of its format (2**-m of the value, or one subnormal quantum of its
  block, ``scale * 2**(emin - m)``), or, where the two block scales differ, the value itself;
- an FP8 blockwise GEMM on a GPU adds its tensor cores' own accumulation error inside each
  128-block (``FP8_WGMMA_BLOCK_ERROR`` of the block's sum of |products|).

An element outside its bound is a mismatch; ``tolerance=(rtol, atol)`` replaces the derived
bound with ``atol + rtol * |want|``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gmlp.contract.activations import Activation
from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseQuantized, FP8BlockwiseTensor, FP8BlockwiseWeightPair
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Tensor, MXFP8Values, QuantAxis

__all__ = ["Mismatch", "Comparison", "bitwise", "within_bound", "gemm_delta", "activation_slope",
           "FP8_WGMMA_BLOCK_ERROR"]

FP32_UNIT = 2.0**-24
# Hopper's fp8 wgmma accumulates a k=32 step's 32 products into its fp32 accumulator at about 14
# bits (DeepSeek-V3, section 3.3.2): the 33 addends aligned to the largest one's exponent and cut
# at 13 fraction bits, each losing less than 2**-13 of the largest |addend| <= the block's sum of
# |products| so far. A 128-block's four steps then err by at most 4 * 33 * 2**-13 of its sum of
# |products| (the H200 measured up to about 5.4 * 2**-13, above the 4 * 2**-13 first assumed).
FP8_WGMMA_BLOCK_ERROR = 4 * 33 * 2.0**-13
BF16_STEP = 2.0**-7
REPORTED = 5  # elements listed per mismatching output


@dataclass(frozen=True)
class Mismatch:
    """One element that differs: where, both values, the bound, its block scale (quantized)."""

    index: tuple[int, ...]
    got: float
    want: float
    bound: float | None  # None: compared bit for bit
    scale: float | None = None  # the element's block scale (2**(e - 127)) in the chosen path's output
    want_scale: float | None = None

    def describe(self, name: str, expert: int | None) -> str:
        axes = ("expert", "row", "column") if len(self.index) == 3 else ("row", "column")
        where = ", ".join(f"{axis} {value}" for axis, value in zip(axes, self.index))
        parts = [f"{name}[{where}]" + (f" (expert {expert})" if expert is not None and len(self.index) < 3 else ""),
                 f"got {self.got!r}, want {self.want!r}"]
        if self.bound is not None:
            parts.append(f"|diff| {abs(self.got - self.want):.3g} > bound {self.bound:.3g}")
        if self.scale is not None:
            parts.append(f"block scale {self.scale:g} (want {self.want_scale:g})")
        return "; ".join(parts)


@dataclass
class Comparison:
    """Mismatches of every output of one op call."""

    # name -> (bad elements, shape, first bad element of the first rows, rows with a bad element)
    outputs: dict[str, tuple[int, tuple[int, ...], list[Mismatch], int]] = field(default_factory=dict)
    # an output compared within bounds -> (largest |got - want|, largest |got - want| / bound);
    # the outputs compared bit for bit have none
    errors: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, name: str, bad: torch.Tensor, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor | None,
            scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Record the elements of one output where ``bad`` holds: the count, and the first bad
        element of each of the first few rows that have one (a pattern over rows, such as expert
        boundaries, shows at once)."""
        count = int(bad.sum())
        matrix = bad.reshape(-1, bad.shape[-1]) if bad.dim() > 1 else bad.reshape(-1, 1)  # rows x columns
        bad_rows = matrix.any(dim=1)
        first = []
        for row in bad_rows.nonzero().flatten()[:REPORTED].tolist():
            flat = row * matrix.shape[1] + int(matrix[row].nonzero()[0])
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), bad.shape))
            first.append(Mismatch(index, float(got[index]), float(want[index]),
                                  None if bound is None else float(bound[index]),
                                  None if scales is None else float(scales[0][index]),
                                  None if scales is None else float(scales[1][index])))
        bad_rows = int(bad_rows.sum())
        self.outputs[name] = (count, tuple(bad.shape), first, bad_rows)

    def measure(self, name: str, error: torch.Tensor, bound: torch.Tensor) -> None:
        """Record the largest of one output's elementwise errors ``error`` (|got - want|) and the
        largest fraction of its element's bound an error takes (at most 1 within bounds; a
        nonzero error against a zero bound is infinite; a NaN error stays NaN)."""
        if error.numel() == 0:
            self.errors[name] = (0.0, 0.0)
            return
        used = torch.where(bound > 0, error / bound, torch.where(error == 0, 0.0, torch.inf))
        self.errors[name] = (float(error.max()), float(used.max()))

    @property
    def mismatches(self) -> int:
        return sum(count for count, *_ in self.outputs.values())


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal bit patterns (so NaN equals the same NaN, and -0.0 differs from 0.0)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        raise ValueError(f"outputs of different kinds: {got.dtype} {tuple(got.shape)} vs {want.dtype} {tuple(want.shape)}")
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    return got.contiguous().view(width) == want.contiguous().view(width)


QUANTIZED = (MXFP8Tensor, FP8BlockwiseTensor)  # one quantized orientation: element_scales(), dequantize()


def _source_data(tensor: MXFP8Tensor | FP8BlockwiseTensor) -> torch.Tensor:
    """A quantization's fp8 elements in its source's orientation (a columnwise one's transposed
    back; an FP8 blockwise one's block padding left out)."""
    if isinstance(tensor, FP8BlockwiseTensor):
        return tensor.token_data() if tensor.block_shape is BlockShape.COLUMNWISE else tensor.data
    return tensor.data.t() if tensor.axis is QuantAxis.COLUMNWISE else tensor.data


def _padding(comparison: Comparison, name: str, got: FP8BlockwiseTensor, want: FP8BlockwiseTensor) -> None:
    """The bytes of an FP8 blockwise columnwise tensor outside its tokens (the layout's zeros),
    bit for bit, in the data's own (K, 128 n_blocks) orientation."""
    bad = ~_same_bits(got.data, want.data)
    token_columns = layout.columnwise_token_columns(want.expert_sizes(), want.data.device)
    bad[:, token_columns] = False
    comparison.add(f"{name} (block padding)", bad.cpu(), got.data.float().cpu(), want.data.float().cpu(), None)


def bitwise(comparison: Comparison, name: str, got, want) -> None:
    """Bit-for-bit comparison of a tensor or a quantization (MXFP8 or FP8 blockwise: data and scales;
    a weight's tiles in both orientations: each)."""
    if isinstance(want, FP8BlockwiseWeightPair):
        for orientation in ("tiles", "transposed"):
            bitwise(comparison, f"{name}.{orientation}", getattr(got, orientation), getattr(want, orientation))
        return
    if isinstance(want, (MXFP8Quantized, MXFP8Values, FP8BlockwiseQuantized)):
        for axis in ("rowwise", "columnwise"):
            if getattr(want, axis) is not None:
                bitwise(comparison, f"{name}.{axis}", getattr(got, axis), getattr(want, axis))
        return
    if isinstance(want, QUANTIZED):
        # reported in the source's orientation: an element differs if its byte or its block's scale does
        got_data, want_data = _source_data(got), _source_data(want)
        got_scales, want_scales = got.element_scales(), want.element_scales()
        bad = ~_same_bits(got_data, want_data) | ~_same_bits(got_scales, want_scales)
        comparison.add(name, bad.cpu(), got.dequantize().cpu(), want.dequantize().cpu(), None,
                       (got_scales.cpu(), want_scales.cpu()))
        if isinstance(want, FP8BlockwiseTensor) and want.block_shape is BlockShape.COLUMNWISE:
            _padding(comparison, name, got, want)  # zeros on every path
        return
    comparison.add(name, (~_same_bits(got, want)).cpu(), got.cpu(), want.cpu(), None)


def within_bound(comparison: Comparison, name: str, got, want, delta: torch.Tensor,
                 tolerance: tuple[float, float] | None = None) -> None:
    """Compare one output, bf16 / fp32 or quantized (MXFP8, FP8 blockwise), whose exact value is
    within ``delta`` of the reference's before its final rounding (see the module docstring)."""
    if isinstance(want, QUANTIZED):
        got_values, want_values = got.dequantize(), want.dequantize()
        got_scales, want_scales = got.element_scales(), want.element_scales()
        fmt = want.element_format
        step = 2.0**-fmt.mantissa_bits
        quantum = torch.maximum(got_scales, want_scales) * 2.0 ** (fmt.min_normal_exponent - fmt.mantissa_bits)
        relative = torch.where(got_scales == want_scales, step, 1.0)
        bound = relative * want_values.abs() + quantum + delta
        scales = (got_scales.cpu(), want_scales.cpu())
    else:
        got_values, want_values = got.float(), want.float()
        rounding = BF16_STEP if want.dtype == torch.bfloat16 else FP32_UNIT * 2
        bound = rounding * want_values.abs() + delta
        scales = None
    if tolerance is not None:
        rtol, atol = tolerance
        bound = atol + rtol * want_values.abs()
    # equal values agree even where their difference is NaN (the same infinity), and so do two NaNs
    agree = (got_values == want_values) | (got_values.isnan() & want_values.isnan())
    diff = (got_values - want_values).abs().masked_fill(agree, 0.0)
    bad = ~(diff <= bound) & ~agree
    comparison.add(name, bad.cpu(), got_values.cpu(), want_values.cpu(), bound.cpu(), scales)
    comparison.measure(name, diff, bound)
    if isinstance(want, FP8BlockwiseTensor) and want.block_shape is BlockShape.COLUMNWISE:
        _padding(comparison, name, got, want)  # zeros on every path: bit for bit


def gemm_delta(abs_products: torch.Tensor, terms: int) -> torch.Tensor:
    """Bound on an fp32 dot product's accumulation-order error: terms * 2**-24 * sum |a_k b_k|."""
    return terms * FP32_UNIT * abs_products


def activation_slope(c: torch.Tensor, activation: Activation) -> torch.Tensor:
    """Per element, a bound on the activation's partial derivatives at the saved pre-activation c
    (T, 2F | F): 2 (|gate| + 1)(|up| + 1), up = 0 for srelu (see the module docstring)."""
    c = c.float().abs()
    if activation.gated:
        gate, up = c.chunk(2, dim=1)
        return 2 * (gate + 1) * (up + 1)
    return 2 * (c + 1)
