"""Tests of gmlp.layer: GroupedMLP against the oracle on each path, autograd, torch.compile, weight cache, temporaries."""
