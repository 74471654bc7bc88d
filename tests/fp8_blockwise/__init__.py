"""Tests of gmlp.fp8_blockwise, the FP8 blockwise format: the spec bit for bit, its edge cases, layouts and the reference quantize."""
