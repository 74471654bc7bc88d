"""A forward's saved state as a flat list of tensors and back, for a custom op to return.

A PyTorch custom op returns tensors only, and none of them may alias one of its inputs or
another output. The layer's saved state is a tree of dataclasses (``gmlp.layer.LayerSaved``,
``gmlp.cutedsl.sm100_layer.Sm100Saved``, ``MXFP8Tensor`` ...), dicts, tuples, tensors and
constants. ``flatten`` walks it and returns the tensors the op must output plus a ``Spec``:
the same tree with every tensor replaced by where it comes from: output ``i``, input ``i``
itself, or a view (size, stride, storage offset) of an input or of an earlier output. So a
saved input, a tensor saved twice and a slice of another saved tensor are each returned once,
or not at all. ``unflatten`` rebuilds the tree from the op's outputs and inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Spec", "flatten", "unflatten"]


@dataclass(frozen=True)
class _Slot:
    """A tensor of the tree: ``source`` "output" or "input", index ``index`` there; ``view``
    (size, stride, storage offset) when it is a view of that tensor rather than the tensor."""

    source: str
    index: int
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None = None


@dataclass(frozen=True)
class _Node:
    """A dataclass instance of the tree: its class and its fields' specs."""

    cls: type
    fields: dict[str, Any]


Spec = Any  # the tree, with a _Slot in place of every tensor and a _Node in place of every dataclass


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.device == b.device


def _view_of(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    return tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()


def flatten(tree: Any, inputs: list[torch.Tensor | None], traced: bool = False) -> tuple[list[torch.Tensor], Spec]:
    """(the tensors to output, the spec) of ``tree``; ``inputs`` are the op's tensor inputs.
    ``traced``: the tensors are a tracer's (fake, no storage); shared tensors are then found
    by identity only, which is what a fake implementation builds (no views)."""
    outputs: list[torch.Tensor] = []

    def slot(tensor: torch.Tensor) -> _Slot:
        for source, pool in (("input", inputs), ("output", outputs)):
            for index, other in enumerate(pool):
                if other is tensor:
                    return _Slot(source, index)
            for index, other in enumerate(pool if not traced else ()):
                # an empty tensor has no storage to share; a view of one is rebuilt as a view
                if other is not None and other.numel() > 0 and tensor.numel() > 0 and _same_storage(other, tensor):
                    return _Slot(source, index, _view_of(tensor))
        outputs.append(tensor)
        return _Slot("output", len(outputs) - 1)

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            return slot(node)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            return _Node(type(node), {f.name: walk(getattr(node, f.name)) for f in dataclasses.fields(node)})
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, (tuple, list)):
            return type(node)(walk(value) for value in node)
        return node

    return outputs, walk(tree)


def unflatten(spec: Spec, outputs: list[torch.Tensor], inputs: list[torch.Tensor | None]) -> Any:
    """The tree ``flatten`` described, from the op's ``outputs`` and ``inputs``."""
    def walk(node: Any) -> Any:
        if isinstance(node, _Slot):
            base = (outputs if node.source == "output" else inputs)[node.index]
            return base if node.view is None else base.as_strided(*node.view)
        if isinstance(node, _Node):
            return node.cls(**{name: walk(value) for name, value in node.fields.items()})
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, (tuple, list)):
            return type(node)(walk(value) for value in node)
        return node

    return walk(spec)
