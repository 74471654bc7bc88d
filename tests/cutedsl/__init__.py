"""Tests of gmlp.cutedsl: the CuTeDSL quantize (a CPU model, ahead-of-time compiles); sm90/ and sm100/ below."""
