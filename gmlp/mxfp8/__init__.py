"""The MXFP8 format, on the ground floor of gmlp (only ``gmlp.system`` is below it).

- ``spec``: the bit-exact specification (E8M0 scales, element casts, RCEIL and FLOOR);
- ``scale_layout``: where each scale byte lives (compact, swizzled, grouped by expert);
- ``tensor``: the quantized containers (``MXFP8Tensor``, ``MXFP8Quantized``);
- ``routing``: rows grouped by expert: device-side offsets of rows, 128-row tiles and 32-row
  blocks, and the split-size checks;
- ``problem``: the validated description of a quantize call (every argument checked once);
- ``buffers``: the output buffers a quantize kernel writes;
- ``reference``: the spec's quantize in plain PyTorch, the oracle of every kernel;
- ``recipe``: ``MXFP8Recipe``, the layer's quantization settings.

Every kernel (``gmlp.triton_ref``, ``gmlp.cutedsl``) sits above this package and matches it bit
for bit.
"""
