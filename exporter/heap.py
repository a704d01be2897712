"""The C heap of a short-lived converting process: large blocks kept for reuse.

glibc serves every allocation above its mmap threshold (which grows to at most 32 MiB)
from a fresh ``mmap`` and unmaps it on ``free``. Decoding a large capture and building
its graphs makes numpy temporaries of tens of MiB one after another (a line is read
through windows of 16 MiB, about 0.9 M events), so each is a new mapping whose pages
fault in again, one fault per 4 KiB page. :func:`keep_freed_memory` makes glibc serve
them from its heap instead and keep up to 1 GiB of freed heap resident, so the next
temporary reuses pages already faulted in. Measured by ``bench/huge_capture.py --gb 0.37
--glibc-defaults`` (373 MB, 20.8 M events, same run): ``mlprof analyze --no-xprof``
4.55 s CPU against 5.24 s with glibc's defaults (0.87x; system time 0.43 s against
0.82 s), peak RSS 285 against 278 MiB; ``mlprof flamegraph`` 0.91x CPU, peak RSS 0.98x.

Only for processes that convert or analyse captures and then exit: the CLI commands that
read captures (``mlprof flamegraph``, ``analyze``, ``compare``) and the bounded children
(``exporter.pipeline.job``, the XProf converters' child). Never in the sidecar's own
process or any other long-running one: with a 1 GiB trim threshold, memory it freed
would stay resident for the rest of its life. ``MLPROF_MALLOC=default`` keeps glibc's
defaults (to measure against, or if a process's memory bound is tight); any other value
is refused in one line (:func:`malloc_choice`), by every command that reads settings
(``mlprof serve`` before it starts a child) and by the converting commands themselves.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from exporter.errors import ConfigError

__all__ = ["MALLOC_CHOICES", "MALLOC_ENV", "keep_freed_memory", "malloc_choice"]

MALLOC_ENV = "MLPROF_MALLOC"  # "default": leave glibc's allocator settings alone
# What MLPROF_MALLOC may say (case and spaces aside): unset or empty keeps freed blocks.
MALLOC_CHOICES = {"": "keep", "default": "default"}
# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Freed heap kept before glibc returns it to the kernel: above the largest temporary of a
# large capture's conversion (a few hundred MiB), below the 4 GiB analysis bound.
_TRIM_THRESHOLD_BYTES = 1 << 30

_applied: bool | None = None  # once per process: the answer of the first call


def malloc_choice(environ: Mapping[str, str] | None = None) -> str:
    """``keep`` or ``default``, from ``MLPROF_MALLOC``; ConfigError naming the accepted values.

    A misspelt value (``defualt``, ``glibc``) had silently meant "keep freed blocks".
    """
    raw = (os.environ if environ is None else environ).get(MALLOC_ENV, "")
    choice = MALLOC_CHOICES.get(raw.strip().lower())
    if choice is None:
        raise ConfigError(
            f"{MALLOC_ENV}={raw!r}: expected 'default' (glibc's own allocator settings) "
            "or unset (converting processes keep freed blocks for reuse)"
        )
    return choice


def keep_freed_memory() -> bool:
    """Keep large blocks on glibc's heap for reuse in this process; True if applied.

    False (and nothing changed) where the C library is not glibc, where it refuses,
    or with ``MLPROF_MALLOC=default``. Call it at the start of a short-lived converting
    process, never in a long-running one (module docstring). Raises ConfigError only
    for an ``MLPROF_MALLOC`` :func:`malloc_choice` refuses (the first call's answer holds).
    """
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if malloc_choice() == "default":
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # musl, macOS: no such mallopt
            return False
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        # Trim threshold first: setting it also stops glibc's dynamic mmap threshold.
        # mallopt answers 1 on success, 0 on error.
        trimmed = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1
        return bool(trimmed and mallopt(_M_MMAP_MAX, 0) == 1)
    except (OSError, ValueError, AttributeError):  # no confstr name, no libc.so.6, no symbol
        return False
