"""Whole numbers written with ASCII digits: the only ones a file, a flag or a variable means.

``str.isdigit()`` is true of ``"²"`` and of Arabic-Indic ``"١٢"``: ``int()`` then raises on
the first (a capture's ``kernel_details "regs:²"`` ended ``mlprof analyze`` in a
traceback) and reads the second as 12. ``"--5".lstrip("-").isdigit()`` passes and
``int("--5")`` raises; past 4,300 digits ``int()`` refuses the string. This reads
``[0-9]+`` (with ``signed``, an optional leading ``-``) of at most ``MAX_DIGITS`` digits
and answers None for anything else.

>>> parse_ascii_int("42"), parse_ascii_int("²"), parse_ascii_int("-7", signed=True)
(42, None, -7)
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_DIGITS", "parse_ascii_int"]

# Enough for any 64-bit value (20 digits) with room; far below int()'s 4,300.
MAX_DIGITS: Final = 40
_UNSIGNED: Final = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
_SIGNED: Final = re.compile(rf"-?[0-9]{{1,{MAX_DIGITS}}}")


def parse_ascii_int(text: str, *, signed: bool = False) -> int | None:
    """``text`` as an int if it is ASCII digits (``-`` first if ``signed``); else None."""
    return int(text) if (_SIGNED if signed else _UNSIGNED).fullmatch(text) else None
