"""The environment variables gmlp reads, and the one parser of their boolean values.

Every variable is read when it is used (not at import), except ``TRITON_INTERPRET`` in
``gmlp.triton_ref``, which decides at import whether the interpreter fixes are installed.

- ``GMLP_STRICT`` (boolean, ``gmlp.dispatch.paths``): raise ``FallbackError`` instead of falling back
  to a slower path.
- ``GMLP_WARN_FALLBACK`` (boolean, ``gmlp.dispatch.paths``): warn once per (op, path, reason) when an
  op skips a faster path.
- ``GMLP_BACKEND`` (``cutedsl`` | ``triton`` | ``torch``, ``gmlp.dispatch.paths``): run that path or
  raise ``FallbackError``.
- ``GMLP_CROSSCHECK`` (``warn`` | ``raise`` or boolean, true = ``warn``, ``gmlp.debug``):
  cross-check every op against the next path down.
- ``GMLP_VALIDATE`` (boolean, ``gmlp.mxfp8.routing``, ``gmlp.layer.autograd``): check split sizes on the host,
  at the cost of a sync, where tensors are on a GPU, and raise ``ValueError`` with them (the
  layer checks them on the device without it; CPU tensors are always checked on the host).
- ``TRITON_INTERPRET`` (boolean, Triton's own; read by ``gmlp.dispatch.paths`` and
  ``gmlp.triton_ref``): the Triton kernels run in Triton's interpreter.
- ``GMLP_CACHE_DIR`` (path, ``gmlp.cutedsl.compile_cache``): where compiled CuTeDSL kernels are kept
  (default ``$XDG_CACHE_HOME/gmlp`` or ``~/.cache/gmlp``).
- ``GMLP_COMPILE_CACHE`` (boolean, ``gmlp.cutedsl.compile_cache``): keep and load compiled CuTeDSL
  kernels (default on).
- ``GMLP_SM90_CONFIG`` (``op.knob=value,...``, ``gmlp.cutedsl.sm90.launch_options``): force the SM90
  kernels' launch knobs (tile width, ping-pong, epilogue store, ...) over the tuned table's.
- ``GMLP_SM90_TUNED`` (path, ``gmlp.cutedsl.sm90.tuned``): a tuned table of the SM90 launch knobs to
  read instead of the package's (``python -m gmlp.bench tune`` writes one).
- ``GMLP_COMMIT`` (string, ``gmlp.bench``): the commit recorded in benchmark results.

Boolean values: ``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``, in any case;
unset or empty means the default; anything else is a ``ValueError`` (a typo must not silently
flip a mode: ``GMLP_STRICT=no`` is not strict).
"""

from __future__ import annotations

import os

__all__ = ["TRUE_WORDS", "FALSE_WORDS", "env_flag", "env_setting"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_setting(name: str, words: tuple[str, ...] = ()) -> bool | str | None:
    """The value of the environment variable ``name``: None when unset or empty, one of ``words``
    (lower-case; the value is compared lower-cased), else the value of a boolean spelling.

    Raises ValueError naming the variable, its value and the accepted spellings for anything else.
    """
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return None
    if value in words:
        return value
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    accepted = ", ".join((*words, *(f"{yes}/{no}" for yes, no in zip(TRUE_WORDS, FALSE_WORDS))))
    raise ValueError(f"environment variable {name}={raw!r}: expected one of {accepted} (any case), "
                     "or unset / empty for the default")


def env_flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable ``name`` (``default`` when unset or empty); ValueError for a
    value that is not a boolean spelling (see the module docstring)."""
    value = env_setting(name)
    return default if value is None else value
