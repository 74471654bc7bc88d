"""The ragged TMA views of ``gmlp.cutedsl.sm90._tma``, their addressing emulated with Python integers."""

import pytest

from gmlp.cutedsl import import_error

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")


@pytest.mark.parametrize("order", ["ragged_tokens", "ragged_rows"])
def test_ragged_view_addresses_only_the_experts_rows(order):
    """Row r of an expert at [first, first + rows) addresses row first + r (byte offsets mod 2**64,
    as TMA computes them) and is in bounds exactly for 0 <= r < rows; the strides are ones TMA
    takes (multiples of 16 bytes below 2**40) and the coordinates fit its int32s. Both mode orders
    put the token mode's stride and the extra modes' strides at the same values."""
    from gmlp.cutedsl.sm90 import _tma

    assert _tma.BIG * _tma.WRAP == 2**64
    for features in (8, 40, 4096, 28672):
        stride = features * 2  # bytes of a bf16 row
        strides = (stride, (_tma.WRAP * 2 - stride), stride)  # token mode, extra modes, in bytes
        assert all(s % 16 == 0 and 0 < s < 2**40 for s in strides)
        for first, rows in ((0, 0), (0, 1), (5, 64), (1000, 37), (2**29, 2**29 - 1)):
            extra = (_tma.BIG, first + rows)
            assert all(0 <= c < _tma.MAX for c in extra)
            for r in {0, 1, max(rows - 1, 0), rows, rows + 63}:
                token = _tma.BIG - rows + r
                offset = (token * strides[0] + extra[0] * strides[1] + extra[1] * strides[2]) % 2**64
                assert offset == (first + r) * stride
                assert (0 <= token < _tma.BIG) == (0 <= r < rows)

