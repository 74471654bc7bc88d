"""Tests of gmlp.mxfp8, the format: the spec bit for bit, scale layouts, routing groups, and every quantize kernel against the spec."""
