"""The SM100 composition on a Blackwell GPU: the real cuDNN frontend kernels, every step
cross-checked against the Triton path on the same operands (``GMLP_CROSSCHECK=raise``), and the
layer's outputs against the oracle (the bounds of ``tests/layer/test_mlp_triton_path.py``).

Skipped on any other machine, with the reason: no Blackwell GPU has run it yet (README).
"""

from __future__ import annotations

import pytest
import torch

import gmlp
from gmlp.cutedsl.sm100 import cudnn_kernels
from tests.support.layer_checks import check_against_oracle


def _why_not_here() -> str | None:
    if not torch.cuda.is_available():
        return "needs an SM100 (Blackwell) GPU; there is no CUDA GPU here"
    major, minor = torch.cuda.get_device_capability()
    if major != 10:
        return f"needs an SM100 (Blackwell) GPU; this one is sm_{major}{minor}"
    error = cudnn_kernels.import_error()
    return None if error is None else error.message


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why_not_here() is not None, reason=str(_why_not_here()))]


@pytest.mark.parametrize("activation", ["swiglu", "qgeglu", "srelu"])
@pytest.mark.parametrize("splits", [[0, 37, 64, 1, 90], [1500, 0, 611, 37, 1024, 300, 129, 999]],
                         ids=["small", "skewed"])
def test_sm100_composition_matches_triton_and_the_oracle(activation, splits, monkeypatch):
    monkeypatch.setenv("GMLP_CROSSCHECK", "raise")
    hidden, ffn = (128, 128) if len(splits) == 5 else (1024, 768)
    check_against_oracle(splits, hidden, ffn, activation, gmlp.MXFP8Recipe(), bias=False, sm100=True)
