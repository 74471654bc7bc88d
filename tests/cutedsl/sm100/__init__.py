"""Tests of gmlp.cutedsl.sm100: the composition of cuDNN frontend's kernels (contracts, layouts, twins; compiled for sm_100a on the CPU)."""
