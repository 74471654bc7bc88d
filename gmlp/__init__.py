"""gmlp: the expert MLP of Mixture-of-Experts layers with MXFP8 block-scaled quantization.

Layer map:
- ``gmlp.mxfp8``: the bit-exact MXFP8 spec (scales, element casts); ``gmlp.scale_layout``:
  where each scale byte lives (swizzled, grouped); ``gmlp.quantized``: result containers.
- ``gmlp.mlp``: ``GroupedMLP`` (the module), its oracle ``gmlp.mlp_ref`` (the dataflow in
  PyTorch), ``gmlp.activations`` and ``gmlp.recipe``.
- ``gmlp.quantize``: the public ``quantize_mxfp8``, dispatched over ``gmlp.dispatch``'s paths:
  ``gmlp.cutedsl`` (CuTeDSL kernels), ``gmlp.triton_ref`` (Triton kernels), and the torch
  reference ``gmlp.quantize_ref``.
"""

from gmlp.activations import Activation, ActivationKind
from gmlp.mlp import GroupedMLP
from gmlp.mxfp8 import ElementFormat, ScaleMode
from gmlp.quantized import MXFP8Quantized, MXFP8Tensor, QuantAxis
from gmlp.quantize import plan_quantize, quantize_mxfp8
from gmlp.quantize_ref import quantize_mxfp8_ref
from gmlp.recipe import MXFP8Recipe

__all__ = [
    "GroupedMLP",
    "MXFP8Recipe",
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
]
__version__ = "0.1.0"
