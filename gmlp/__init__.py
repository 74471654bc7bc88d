"""gmlp: the expert MLP of Mixture-of-Experts layers with MXFP8 block-scaled quantization.

The packages, from the ground up (each imports only those below it):

- ``gmlp.system``: the environment variables and package versions gmlp reads;
- ``gmlp.mxfp8``: the format (the bit-exact spec, scale layouts, rows grouped by expert,
  quantized tensors, the reference quantize, the recipe);
- ``gmlp.fp8_blockwise``: the second format, FP8 with 128-element blocks and fp32 scales (its
  spec, layouts, containers and reference quantize), beside MXFP8;
- ``gmlp.contract``: what every backend shares (the oracle of each op, activations, gate/up
  layouts, reasons);
- ``gmlp.triton_ref`` and ``gmlp.cutedsl``: the kernels and their launchers;
- ``gmlp.dispatch``: which path runs each op and why (sites, plans, the dispatched quantize);
- ``gmlp.debug``: the cross-check;
- ``gmlp.layer``: ``GroupedMLP``, its autograd and custom ops, the dataflow's steps;
- ``gmlp.integrations``, ``gmlp.bench`` and ``python -m gmlp`` on top.
"""

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.dispatch.paths import FallbackError, FallbackWarning
from gmlp.dispatch.quantize import plan_quantize, quantize_mxfp8
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.layer.module import GroupedMLP
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Tensor, QuantAxis

__all__ = [
    "GroupedMLP",
    "MXFP8Recipe",
    "FP8BlockwiseRecipe",
    "Activation",
    "ActivationKind",
    "ElementFormat",
    "ScaleMode",
    "QuantAxis",
    "MXFP8Tensor",
    "MXFP8Quantized",
    "quantize_mxfp8",
    "plan_quantize",
    "quantize_mxfp8_ref",
    "FallbackError",
    "FallbackWarning",
]
__version__ = "0.1.0"
