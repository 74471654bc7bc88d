"""Tests of gmlp.system: environment settings and versions."""
