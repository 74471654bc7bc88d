"""Debugging the fused paths: the cross-check between two implementations of every op.

``GMLP_CROSSCHECK=warn`` (or ``1``, ``yes``, ``on``) or ``GMLP_CROSSCHECK=raise``, or, in code::

    with gmlp.debug.cross_check(ops=["fc1", "quantize_mxfp8"], action="raise") as report:
        y = mlp(x, split_sizes, probs)
        y.backward(dy)
    print(report)  # each op compared: paths, calls, each output's largest error against its bound

Every op of the layer then also runs on the next path down (CuTeDSL -> Triton -> torch) on the
same inputs; the outputs are compared bit for bit where the spec defines them to the bit, else
within bounds derived from the formats (``gmlp.debug.compare``). A mismatch names the site, the
op, each differing output and how many of its elements differ, and the first elements: index,
expert, both values, the bound, the block scale. The settings in force when the forward runs
apply to its backward too, and a block is also seen by the threads autograd runs a backward in
(on a GPU, its own device threads), which a context variable does not reach. Nothing is printed
while the ops agree: the block's report (``CrossCheckReport``) records what was compared, and
``environment_report()`` what ``GMLP_CROSSCHECK``'s checks compared in the process.

Modules: ``settings`` (the blocks and the environment setting in force), ``crosscheck`` (the
layer's sites checked, and the mismatch warnings and errors), ``compare`` (the comparison rules
and bounds), ``record`` (the report of what was compared), ``quantize_check`` (the public
quantize's check).
"""

from __future__ import annotations

from gmlp.debug.crosscheck import CrossCheckError, CrossCheckSettings, CrossCheckWarning
from gmlp.debug.quantize_check import check_quantize
from gmlp.debug.record import CrossCheckReport, OpRecord, OutputRecord, UncomparedRecord
from gmlp.debug.settings import active_settings, cross_check, environment_report
from gmlp.dispatch.quantize import add_quantize_check

__all__ = ["cross_check", "active_settings", "environment_report", "CrossCheckSettings", "CrossCheckReport",
           "OpRecord", "OutputRecord", "UncomparedRecord", "CrossCheckError", "CrossCheckWarning"]

# the public quantize's cross-check: the dispatcher runs the checks registered with it
add_quantize_check(check_quantize)
