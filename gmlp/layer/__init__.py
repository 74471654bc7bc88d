"""The layer, on top of the dispatcher: ``GroupedMLP`` and what runs inside it.

- ``module``: ``GroupedMLP``, the ``nn.Module`` users build;
- ``autograd``: the two custom ops (forward, backward) and the autograd function joining them;
- ``steps``: the dataflow as a sequence of op sites, each run on its planned path;
- ``state``: what the forward saves, flattened to tensors for the custom ops.

Its oracle, the same dataflow in plain PyTorch, is ``gmlp.contract.reference``.
"""
