"""Tests of gmlp.cutedsl.sm90: each kernel compiled for sm_90a on the CPU (per config) with its support rules over shapes, and on an H100/H200 against the reference and the Triton twin."""
