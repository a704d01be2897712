"""Frame labels as users read them in flame graphs.

Convention: ``Class > method`` where the qualified name is known, the bare name for
functions, ``<interpreter trampoline>`` for interpreter glue, ``0x…`` for native
frames without symbols. File and line travel separately (pprof locations).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "TRAMPOLINE",
    "FrameLabel",
    "label_address",
    "label_native",
    "label_python",
    "parse_python_tracer",
]

TRAMPOLINE = "<interpreter trampoline>"

# CPython's own evaluation and call glue: frames a user cannot act on.
_TRAMPOLINE_RE = re.compile(
    r"^(_?PyEval_\w+|_?PyObject_(Call|Vectorcall|FastCall)\w*|_?PyFunction_\w+|"
    r"_?Py_\w*Call\w*|cfunction_\w+|method_vectorcall\w*|slot_tp_\w+|"
    r"_?PyVectorcall_\w+|vectorcall_\w+|<interpreter trampoline>|"
    r"py_trampoline_evaluator|_PyRun_\w+|PyRun_\w+|run_mod|run_eval_code_obj)$"
)
_IDENT_PATH_RE = re.compile(r"^[A-Za-z_~][\w~<>,]*(::[A-Za-z_~][\w~<>,]*)+$")
# A line number of at most 18 digits: pprof holds it as int64.
_TRACER_RE = re.compile(r"^\$(?P<file>.*?)(?::(?P<line>\d{1,18}))? (?P<func>\S.*)$")


@dataclass(frozen=True, slots=True)
class FrameLabel:
    """A frame's display label plus where it lives (file/line may be unknown)."""

    name: str
    file: str = ""
    line: int = 0


def label_python(qualname: str, file: str = "", line: int = 0) -> FrameLabel:
    """Label a Python frame from its qualified name (``Cls.method`` or ``func``)."""
    parts = [p for p in qualname.split(".") if p and p != "<locals>"]
    if not parts:
        return FrameLabel(qualname or "<unknown>", file, line)
    if len(parts) >= 2 and not parts[-2].startswith("<"):
        # ``Outer.<locals>.inner`` is a function: only a class owns the last part.
        owner_is_class = "<locals>" not in qualname.split(".")[-2:]
        if owner_is_class:
            return FrameLabel(f"{parts[-2]} > {parts[-1]}", file, line)
    return FrameLabel(parts[-1], file, line)


def label_native(symbol: str, file: str = "", line: int = 0, address: int = 0) -> FrameLabel:
    """Label a native (C/C++) frame; unknown symbols show their address."""
    name = symbol.strip()
    if not name:
        return label_address(address, file, line)
    if _TRAMPOLINE_RE.match(name):
        return FrameLabel(TRAMPOLINE, file, line)
    if _IDENT_PATH_RE.match(name):
        parts = name.split("::")
        owner, method = parts[-2], parts[-1]
        # Namespaces are lower case by convention in the code we profile (xla::, tsl::).
        if owner[:1].isupper():
            return FrameLabel(f"{owner} > {method}", file, line)
        return FrameLabel(method, file, line)
    return FrameLabel(name, file, line)


def label_address(address: int, file: str = "", line: int = 0) -> FrameLabel:
    """Label a native frame that has no symbol."""
    return FrameLabel(f"0x{address:x}", file, line)


def parse_python_tracer(name: str) -> FrameLabel | None:
    """Label a JAX Python-tracer event (``$file.py:12 func``); None if it is not one."""
    if not name.startswith("$"):
        return None
    match = _TRACER_RE.match(name)
    if match is None:
        return FrameLabel(name[1:] or "<unknown>")
    file = match["file"]
    if file in ("<unknown>", "builtins"):
        file = "" if file == "<unknown>" else file
    return label_python(match["func"], file, int(match["line"] or 0))
