"""Tests of gmlp.triton_ref: each Triton launcher against the oracle (in Triton's interpreter on a CPU)."""
