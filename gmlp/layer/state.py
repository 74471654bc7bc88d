"""A forward's saved state as a flat list of tensors and back, for a custom op to return.

A PyTorch custom op returns tensors only, and none of them may alias one of its inputs or
another output. The layer's saved state is a tree of dataclasses (``gmlp.layer.steps.LayerSaved``,
``gmlp.cutedsl.sm100.layer.Sm100Saved``, ``MXFP8Tensor`` ...), dicts, tuples, tensors and
constants. ``flatten`` walks it and returns the tensors the op must output plus a ``Spec``:
the same tree with every tensor replaced by where it comes from: output ``i``, input ``i``
itself, or a view (size, stride, storage offset) of an input or of an earlier output. So a
saved input, a tensor saved twice and a slice of another saved tensor are each returned once,
or not at all. ``unflatten`` rebuilds the tree from the op's outputs and inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

__all__ = ["Spec", "flatten", "unflatten"]


class _Slot(NamedTuple):
    """A tensor of the tree: ``source`` "output" or "input", index ``index`` there; ``view``
    (size, stride, storage offset) when it is a view of that tensor rather than the tensor.
    (Named tuples: a few are made at every layer step, and a frozen dataclass costs more.)"""

    source: str
    index: int
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None = None


class _Node(NamedTuple):
    """A dataclass instance of the tree: its class and its fields' specs."""

    cls: type
    fields: dict[str, Any]


Spec = Any  # the tree, with a _Slot in place of every tensor and a _Node in place of every dataclass


def _storage_key(tensor: torch.Tensor) -> tuple | None:
    """Which memory a tensor's elements live in (None for an empty tensor, which shares none): its
    device and its storage's base address (read from the tensor's own pointer and offset, without
    making the storage object, which costs more host time)."""
    if tensor.numel() == 0:
        return None
    return tensor.get_device(), tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


# How the tree walks treat an instance of a class: a tensor, a dataclass (its field names), a dict, a
# tuple or list, or a constant. Worked out once per class (``dataclasses.fields`` builds a tuple on
# every call, ``is_dataclass`` looks the class up: the walks meet the same few classes each step).
_TENSOR, _DICT, _SEQUENCE, _CONSTANT = "tensor", "dict", "sequence", "constant"
_KINDS: dict[type, str | tuple[str, ...]] = {}


def _kind(cls: type) -> str | tuple[str, ...]:
    """How the walks treat an instance of ``cls``: ``_TENSOR``, a dataclass's field names,
    ``_DICT``, ``_SEQUENCE`` or ``_CONSTANT``."""
    kind = _KINDS.get(cls)
    if kind is None:
        if issubclass(cls, torch.Tensor):
            kind = _TENSOR
        elif dataclasses.is_dataclass(cls):
            kind = tuple(f.name for f in dataclasses.fields(cls))
        elif issubclass(cls, dict):
            kind = _DICT
        elif issubclass(cls, (tuple, list)):
            kind = _SEQUENCE
        else:
            kind = _CONSTANT
        _KINDS[cls] = kind
    return kind


def _view_of(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    return tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()


def flatten(tree: Any, inputs: list[torch.Tensor | None], traced: bool = False) -> tuple[list[torch.Tensor], Spec]:
    """(the tensors to output, the spec) of ``tree``; ``inputs`` are the op's tensor inputs.
    ``traced``: the tensors are a tracer's (fake, no storage); shared tensors are then found
    by identity only, which is what a fake implementation builds (no views)."""
    outputs: list[torch.Tensor] = []
    # one dict lookup per tensor: by identity, then (untraced) by the memory it lives in
    by_id = {id(t): _Slot("input", i) for i, t in enumerate(inputs) if t is not None}
    by_storage: dict[tuple, _Slot] = {}
    if not traced:
        for i, t in reversed(list(enumerate(inputs))):  # the first input with a storage wins
            if t is not None and (key := _storage_key(t)) is not None:
                by_storage[key] = _Slot("input", i)

    def slot(tensor: torch.Tensor) -> _Slot:
        found = by_id.get(id(tensor))
        if found is not None:
            return found
        key = None if traced else _storage_key(tensor)
        base = by_storage.get(key) if key is not None else None
        if base is not None:  # a view of an input or of an earlier output
            return _Slot(base.source, base.index, _view_of(tensor))
        outputs.append(tensor)
        found = by_id[id(tensor)] = _Slot("output", len(outputs) - 1)
        if key is not None:
            by_storage[key] = found
        return found

    return outputs, _spec_of(tree, slot)


# The tree walks are module functions, not nested ones: a recursive closure refers to itself, and
# that reference cycle would keep the state's tensors alive until the cyclic garbage collector ran.
def _spec_of(node: Any, slot) -> Any:
    """``node`` with each tensor replaced by ``slot(tensor)`` and each dataclass by a ``_Node``."""
    kind = _KINDS.get(type(node)) or _kind(type(node))  # the lookup inline: once per node of every step
    if kind is _TENSOR:
        return slot(node)
    if kind is _CONSTANT:
        return node
    if kind is _DICT:
        return {key: _spec_of(value, slot) for key, value in node.items()}
    if kind is _SEQUENCE:
        return type(node)(_spec_of(value, slot) for value in node)
    return _Node(type(node), {name: _spec_of(getattr(node, name), slot) for name in kind})  # a dataclass


def unflatten(spec: Spec, outputs: list[torch.Tensor], inputs: list[torch.Tensor | None]) -> Any:
    """The tree ``flatten`` described, from the op's ``outputs`` and ``inputs``."""
    cls = type(spec)
    if cls is _Slot:
        base = (outputs if spec.source == "output" else inputs)[spec.index]
        return base if spec.view is None else base.as_strided(*spec.view)
    if cls is _Node:
        return spec.cls(**{name: unflatten(value, outputs, inputs) for name, value in spec.fields.items()})
    kind = _KINDS.get(cls) or _kind(cls)
    if kind is _DICT:
        return {key: unflatten(value, outputs, inputs) for key, value in spec.items()}
    if kind is _SEQUENCE:
        return type(spec)(unflatten(value, outputs, inputs) for value in spec)
    return spec
