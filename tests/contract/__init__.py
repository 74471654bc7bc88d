"""Tests of gmlp.contract: activations and the gate/up layouts."""
