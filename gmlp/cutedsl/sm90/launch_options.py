"""The SM90 kernels' epilogue store, chosen in one place: each kernel's default (what ``bench
gemm`` measured faster on the H200), where the TMA store applies, and a forced choice.

``store="tma"`` stages a tile's outputs in shared memory and stores them by TMA (``_store``);
``"regs"`` stores them from the registers. The TMA store does not yet cover every variant of a
kernel (``tma_reason``); where it does not, the register store runs. A launcher given
``store=None`` takes ``store_for``: the store forced for its op by ``GMLP_SM90_STORE``, else its
default where the TMA store applies, else "regs". A forced "tma" where it does not apply is an
error that says why, never a silent change. ``describe`` is the same choice in words, for
``LayerPlan.explain``.

``GMLP_SM90_STORE``: ``op=store`` items separated by commas, the ops those of ``DEFAULT_STORES``
(``grouped_gemm=regs,fc1_forward=tma``), or one store for every op (``tma``).
"""

from __future__ import annotations

import functools
import os

__all__ = ["ENV", "STORES", "DEFAULT_STORES", "check_store", "tma_reason", "forced_stores", "store_for", "describe"]

ENV = "GMLP_SM90_STORE"
STORES = ("regs", "tma")
# op -> its launcher's store where the TMA store applies: the TMA store at every op, the faster
# on the H200 (bench gemm, docs/performance.md; FC1 0.94 / 0.85 of torch against 0.86 / 0.75 at
# the DeepSeek-V3 / Qwen3 shapes, FC2 dgrad 0.86 / 0.62 against 0.82 / 0.62). The register store
# stays for the variants the TMA store does not take (tma_reason) and as GMLP_SM90_STORE's "regs".
DEFAULT_STORES = {"grouped_gemm": "tma", "grouped_wgrad": "tma", "fc1_forward": "tma", "fc2_dgrad": "tma"}


def check_store(store: str) -> None:
    """Raises for a kernel config's ``store`` that is not one of ``STORES``."""
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}, got {store!r}")


def tma_reason(op: str, *, bias: bool = False, pingpong: bool = False, quantized: bool = False,
               decoded: bool = False, fused_b: bool = False) -> str | None:
    """None if ``op``'s TMA-store epilogue covers this variant, else why not."""
    if op not in DEFAULT_STORES:
        raise ValueError(f"op must be one of {tuple(DEFAULT_STORES)}, got {op!r}")
    if not (bias or pingpong or quantized or decoded or fused_b):  # the common case, at every launch
        return None
    blocked = {"a bias": bias and op == "grouped_gemm", "ping-pong": pingpong, "MXFP8 outputs": quantized,
               "a decoded MXFP8 operand": decoded, "fused_b": fused_b}
    reasons = [reason for reason, present in blocked.items() if present]
    return None if not reasons else f"{op}'s TMA store does not take {' or '.join(reasons)} yet"


def forced_stores(value: str | None = None) -> dict[str, str]:
    """op -> store forced by ``GMLP_SM90_STORE`` (or ``value``); empty when unset. Raises naming
    the item for an unknown op or store."""
    return dict(_parsed(os.environ.get(ENV, "") if value is None else value))


@functools.lru_cache(maxsize=8)  # read at every launch: parsed once per value of the variable
def _parsed(value: str) -> tuple[tuple[str, str], ...]:
    forced: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        op, _, store = item.rpartition("=")
        ops = [op] if op else list(DEFAULT_STORES)
        if op and op not in DEFAULT_STORES:
            raise ValueError(f"{ENV}: {item!r} names op {op!r}; the ops are {tuple(DEFAULT_STORES)}")
        if store not in STORES:
            raise ValueError(f"{ENV}: {item!r} asks for store {store!r}; the stores are {STORES}")
        forced.update(dict.fromkeys(ops, store))
    return tuple(forced.items())


def store_for(op: str, **variant: bool) -> str:
    """The store of a launch of ``op`` given ``store=None`` (``variant``: ``tma_reason``'s flags)."""
    reason = tma_reason(op, **variant)
    store = forced_stores().get(op) if ENV in os.environ else None  # the check first: no dict at every launch
    if store == "tma" and reason is not None:
        raise ValueError(f"{ENV} forces the TMA store for {op}, but {reason}")
    if store is None:
        store = DEFAULT_STORES[op] if reason is None else "regs"
    return store


def describe(op: str, **variant: bool) -> str:
    """``store_for``'s choice and where it comes from, e.g. "store=tma" or "store=regs (forced by
    GMLP_SM90_STORE)"."""
    reason = tma_reason(op, **variant)
    store = forced_stores().get(op)
    if store == "tma" and reason is not None:
        return f"store=tma forced by {ENV}, which fails: {reason}"
    if store is not None:
        return f"store={store} (forced by {ENV})"
    if reason is not None:
        return f"store=regs ({reason})"
    return f"store={DEFAULT_STORES[op]}"
