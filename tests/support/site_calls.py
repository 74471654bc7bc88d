"""Counting the layer's op calls per site: how a test sees which sites a step ran (the weight
cache's "reuse" runs no weight quantize)."""

from __future__ import annotations

import collections

import gmlp.layer.steps

__all__ = ["count_site_calls"]


def count_site_calls(monkeypatch) -> collections.Counter:
    """A Counter, site name -> op calls, of every layer step run while ``monkeypatch`` is in place
    (it wraps the implementation each ``OpRunner`` call looks up; the cross-check's reference
    calls are not counted)."""
    calls = collections.Counter()
    real = gmlp.layer.steps.implementation

    def counting(site, path, capability=None):
        run = real(site, path, capability)

        def call(*args, **kwargs):
            calls[site.name] += 1
            return run(*args, **kwargs)
        return call

    monkeypatch.setattr(gmlp.layer.steps, "implementation", counting)
    return calls
