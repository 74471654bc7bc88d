"""Tests of gmlp.bench: each benchmark's smoke run and its JSON."""
