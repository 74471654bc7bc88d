"""Debugging the fused paths: the cross-check between two implementations of every op.

``GMLP_CROSSCHECK=warn`` (or ``1``, ``yes``, ``on``) or ``GMLP_CROSSCHECK=raise``, or, in code::

    with gmlp.debug.cross_check(ops=["fc1", "quantize_mxfp8"], action="raise"):
        y = mlp(x, split_sizes, probs)
        y.backward(dy)

Every op of the layer then also runs on the next path down (CuTeDSL -> Triton -> torch) on the
same inputs; the outputs are compared bit for bit where the spec defines them to the bit, else
within bounds derived from the formats (``gmlp.debug.compare``). A mismatch names the site, the
op, each differing output and how many of its elements differ, and the first elements: index,
expert, both values, the bound, the block scale. The settings in force when the forward runs
apply to its backward too, and a block is also seen by the threads autograd runs a backward in
(on a GPU, its own device threads), which a context variable does not reach.

Modules: ``settings`` (the blocks and the environment setting in force), ``crosscheck`` (the
layer's sites checked, and the reports), ``compare`` (the comparison rules and bounds),
``quantize_check`` (the public quantize's check).
"""

from __future__ import annotations

from gmlp.debug.crosscheck import CrossCheckError, CrossCheckSettings, CrossCheckWarning
from gmlp.debug.quantize_check import check_quantize
from gmlp.debug.settings import active_settings, cross_check
from gmlp.dispatch.quantize import add_quantize_check

__all__ = ["cross_check", "active_settings", "CrossCheckSettings", "CrossCheckError", "CrossCheckWarning"]

# the public quantize's cross-check: the dispatcher runs the checks registered with it
add_quantize_check(check_quantize)
