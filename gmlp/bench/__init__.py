"""Benchmarks (``python -m gmlp.bench NAME``): scripts that write JSON results, never tests.

Every figure is a ratio against a baseline measured in the same process on the same device:
the device copy bandwidth for memory-bound kernels, torch's bf16 grouped GEMM for the MLP.
"""
