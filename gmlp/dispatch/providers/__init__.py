"""Providers: who runs the layer's ops on each path and architecture.

A provider answers the dispatcher's three questions, each with None (yes) or a ``Reason``, and
hands over the op:

- ``system(device_type, capability, interpret)``: can this system run the provider at all
  (packages, drivers; asked once per device and cached by ``gmlp.dispatch.paths``);
- ``supports(op, problem, site)``: can it run this problem of ``op`` (a ``QuantizeProblem`` for
  the quantize, the ``LayerProblem`` for the other ops; ``site`` is the layer's site, None for
  the public quantize);
- ``load(site)``: the function that runs the site's op (the arguments of its Triton launcher).

The table of which providers serve which path is ``gmlp.dispatch.paths.PROVIDERS``. Modules:
``torch_path`` (the spec, any device), ``triton_path`` (the Triton kernels), ``cutedsl_sm90``
(our sm_90a kernels), ``cutedsl_sm100`` (the SM100 composition of cuDNN frontend's kernels),
``common`` (what several of them share). Kernel modules are imported when an op is loaded or a
kernel's own rule is asked, never at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gmlp.contract.reasons import Reason
from gmlp.dispatch.sites import Op, Site

__all__ = ["Provider"]


@dataclass(frozen=True)
class Provider:
    """One path's kernels on one architecture (see the module docstring for the three entry points)."""

    name: str  # in reasons: "sm_90a (Hopper)"
    architectures: tuple[int, ...] | None  # compute capability majors served; None: any device (``system`` decides)
    system: Callable[[str, tuple[int, int] | None, bool], Reason | None]
    supports: Callable[[Op, object, str | None], Reason | None]
    load: Callable[[Site], Callable]

    def serves(self, capability: tuple[int, int] | None) -> bool:
        """Whether this provider is the one for a device of ``capability`` (None: not a GPU)."""
        return self.architectures is None or (capability is not None and capability[0] in self.architectures)
