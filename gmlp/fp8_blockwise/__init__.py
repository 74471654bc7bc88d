"""The FP8 blockwise format (the DeepSeek-V3 recipe: 1 x 128 / 128 x 1 token blocks, 128 x 128
weight tiles, fp32 scales), beside ``gmlp.mxfp8`` on the format floor.

- ``spec``: the bit-exact specification (TransformerEngine's ``Float8BlockScaling`` scales);
- ``layout``: which values form a block and where each scale lives;
- ``tensor``: the quantized containers (``FP8BlockwiseTensor``, ``FP8BlockwiseQuantized``);
- ``problem``: the validated quantize arguments;
- ``buffers``: the output buffers of a quantization both ways;
- ``reference``: the spec's quantize in plain PyTorch, the oracle of every kernel;
- ``gemm``: what the blockwise GEMMs compute (scales promoted every 128), in fp64;
- ``recipe``: ``FP8BlockwiseRecipe``, the layer's settings.
"""
