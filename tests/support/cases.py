"""Test inputs: random distributions and adversarial blocks for quantization, split sizes; the
parametrization that keeps the quick run (``-m "not slow"``) to a representative subset, and the
ids of compile tests parametrized by kernel config."""

from __future__ import annotations

import dataclasses
import enum

import pytest
import torch

from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode, e8m0_from_amax, quantize_multiplier

INF, NAN = float("inf"), float("nan")


def _bits_to_float(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


def fp8_values(element_format: ElementFormat) -> torch.Tensor:
    """Every finite non-negative value of the format, ascending."""
    codes = torch.arange(0, 128, dtype=torch.uint8).view(element_format.torch_dtype).float()
    return codes[torch.isfinite(codes)].unique()


def tie_block(element_format: ElementFormat, scale_mode: ScaleMode, sign: float = 1.0) -> torch.Tensor:
    """A block holding max_normal and midpoints between adjacent fp8 codes (after scaling)."""
    top = element_format.max_normal
    multiplier = quantize_multiplier(e8m0_from_amax(torch.tensor([top]), element_format, scale_mode)).item()
    values = fp8_values(element_format)
    midpoints = ((values[1:] + values[:-1]) / 2) / multiplier
    picks = midpoints[torch.linspace(0, midpoints.numel() - 1, BLOCK_SIZE - 1).long()]
    return sign * torch.cat([torch.tensor([top]), picks])


def adversarial_blocks(element_format: ElementFormat, scale_mode: ScaleMode) -> list[torch.Tensor]:
    """32-value fp32 blocks that exercise every special case of the spec."""
    ramp = torch.linspace(-1, 1, BLOCK_SIZE)
    blocks = {
        "zeros": torch.zeros(BLOCK_SIZE),
        "negative_zeros": torch.full((BLOCK_SIZE,), -0.0),
        "nan_among_finite": torch.where(torch.arange(BLOCK_SIZE) == 5, NAN, ramp * 3),
        "all_nan": torch.full((BLOCK_SIZE,), NAN),
        "pos_inf": torch.where(torch.arange(BLOCK_SIZE) == 7, INF, ramp),
        "neg_inf": torch.where(torch.arange(BLOCK_SIZE) == 0, -INF, ramp * 1e30),
        "fp32_subnormals": ramp * _bits_to_float(0x00000400),
        "smallest_subnormal": torch.full((BLOCK_SIZE,), _bits_to_float(1)),
        "at_max": torch.where(ramp > 0, element_format.max_normal, -element_format.max_normal),
        "beyond_max": ramp * element_format.max_normal * 1.07,
        "e5m2_max": ramp * 57344.0,
        "near_fp32_max": ramp * 3.0e38,
        "fp32_max": torch.full((BLOCK_SIZE,), _bits_to_float(0x7F7FFFFF)),
        "scale_2_pow_minus_127": ramp * 448.0 * 2.0**-127,
        "tiny_normals": ramp * 2.0**-120,
        "ties": tie_block(element_format, scale_mode),
        "negative_ties": tie_block(element_format, scale_mode, sign=-1.0),
    }
    for exponent in (-100, -3, 0, 8, 9, 15, 16, 100):
        power = 2.0**exponent
        for name, amax in (("pow2", power), ("pow2_up", power * (1 + 2**-23)), ("pow2_down", power * (1 - 2**-24))):
            blocks[f"{name}_{exponent}"] = torch.where(torch.arange(BLOCK_SIZE) == 3, amax, ramp * power / 2)
    for scaled_max in (448.0, 57344.0):  # amax mapping exactly onto a power-of-two multiple of max_normal
        for exponent in (-130, -10, 0, 10):
            amax = scaled_max * 2.0**exponent
            blocks[f"max_times_2^{exponent}_{scaled_max:g}"] = torch.where(torch.arange(BLOCK_SIZE) == 9, amax, ramp)
    return [b.float() for b in blocks.values()]


def adversarial_matrix(element_format: ElementFormat, scale_mode: ScaleMode, rows: int = 64) -> torch.Tensor:
    """(rows, 32 * n_blocks): every adversarial block along K, and along M in the transposed use.

    Row r holds the blocks rotated by r, so that each column also sees every kind of block.
    """
    blocks = adversarial_blocks(element_format, scale_mode)
    row = torch.cat(blocks)
    return torch.stack([torch.roll(row, shifts=BLOCK_SIZE * r + r) for r in range(rows)])


def random_matrix(kind: str, rows: int, cols: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """Random (rows, cols) data of a named distribution."""
    if kind == "normal":
        x = torch.randn(rows, cols)
    elif kind == "uniform_wide":  # magnitudes over many binades
        x = torch.randn(rows, cols) * torch.exp2(torch.randint(-40, 40, (rows, cols)).float())
    elif kind == "outliers":  # activations with a few large channels
        x = torch.randn(rows, cols)
        x[:, :: max(1, cols // 7)] *= 300.0
    elif kind == "lognormal":
        x = torch.exp(torch.randn(rows, cols) * 3) * torch.sign(torch.randn(rows, cols))
    else:
        raise ValueError(f"unknown distribution {kind=}")
    return x.to(dtype=dtype, device=device)


SPLIT_CASES = {
    "ungrouped": None,
    "one_expert": [300],
    "zeros_and_odd": [0, 37, 200, 63, 0],
    "all_in_last": [0, 0, 0, 300],
    "tiny_experts": [1, 31, 33, 1, 0, 105, 129],
}

# 20 m-tiles of 128 rows with an empty expert: past one band (8 m-tiles) of the SM90 kernels' tile
# schedule (gmlp.cutedsl.sm90._schedule.GROUP_M), with a partial last band
BANDED_SPLITS = [700, 0, 129, 1, 300, 64, 256, 600]


def stored_gate_up(layout, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """W1's (E, F, H) gate and up stored as ``layout`` (a ``gmlp.contract.gate_up.GateUpLayout``) says: the
    tensors ``gate_up_views`` takes (one, or gate and up for SEPARATE), new copies of the values."""
    from gmlp.contract.gate_up import GateUpLayout

    if layout is GateUpLayout.HALVES:
        return (torch.cat([gate, up], 1),)
    if layout is GateUpLayout.INTERLEAVED:
        return (torch.stack([gate, up], 2),)
    return gate.clone(), up.clone()


def parametrize_quick(argnames: str, argvalues, keep: int = 1, **kwargs):
    """``pytest.mark.parametrize`` whose first ``keep`` values run in the quick run and the rest are
    marked ``slow`` (the quick run, ``-m "not slow"``, leaves them out; the full run keeps them).
    A test with several such axes is quick only at the combination of their kept values."""
    argvalues = list(argvalues)
    several = len(argnames.split(",") if isinstance(argnames, str) else argnames) > 1

    def slow(value):
        return pytest.param(*(value if several else (value,)), marks=pytest.mark.slow)

    return pytest.mark.parametrize(argnames, [*argvalues[:keep], *map(slow, argvalues[keep:])], **kwargs)


_DTYPE_WORDS = {torch.float32: "fp32", torch.bfloat16: "bf16"}
# (False, True) of a flag; the others are "no-name", "name"
_FLAG_WORDS = {"b_k_major": ("n-major-b", "k-major-b"), "ragged_tma": ("smem-mask", "ragged-tma")}
_LABELS = {"tile_n": "tile"}


def _knob_word(name: str, value) -> str:
    """One knob of a kernel config as an id word: ``probs_dtype=torch.float32`` is ``probs-fp32``."""
    if dataclasses.is_dataclass(value):  # an Activation: its kind, then the parameters it changes
        changed = [f"{f.name}{getattr(value, f.name)}" for f in dataclasses.fields(value)
                   if f.default is not dataclasses.MISSING and getattr(value, f.name) != f.default]
        return "-".join([value.kind.value, *changed])
    label = _LABELS.get(name, name.removesuffix("_dtype").removesuffix("_format")).replace("_", "-")
    if isinstance(value, bool):
        return _FLAG_WORDS.get(name, (f"no-{label}", label))[value]
    if value is None:
        return f"no-{label}"
    if isinstance(value, torch.dtype):
        return f"{label}-{_DTYPE_WORDS[value]}"
    if isinstance(value, enum.Enum):
        return f"{label}-{value.value}"
    if isinstance(value, str):  # an activation's name
        return value
    return f"{label}{value}"


def config_id(knobs: dict) -> str:
    """The id of a compile test from the knobs of the kernel config it compiles (the others keep
    the config's defaults), in order: ``dict(activation="swiglu", b_k_major=False, probs_dtype=
    torch.float32, bias_grad=True, tile_n=256)`` is ``swiglu-n-major-b-probs-fp32-bias-grad-tile256``."""
    return "-".join(_knob_word(name, value) for name, value in knobs.items())
