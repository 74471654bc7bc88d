"""Tests of gmlp.debug: the cross-check."""
