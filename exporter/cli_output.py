"""Where a command's result goes: to ``-o FILE`` (said on stderr), else to stdout."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from exporter.errors import ConfigError, MlprofError

__all__ = ["check_output", "write_output"]


# Formats that are no use on a terminal, and what to say instead.
_NOT_FOR_A_TERMINAL = {
    "html": "--format html writes a page: give -o FILE.html or redirect stdout",
    "pprof": "--format pprof is binary: give -o FILE or redirect stdout",
}


def check_output(fmt: str, output: Path | None) -> None:
    """A usage error, before any work, for a page or binary bound for a terminal."""
    if output is None and fmt in _NOT_FOR_A_TERMINAL and sys.stdout.isatty():
        raise ConfigError(_NOT_FOR_A_TERMINAL[fmt])


def write_output(data: bytes, output: Path | None, what: str) -> None:
    """Write ``data`` to ``output`` and say so with ``what``, or to stdout when None."""
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise MlprofError(f"-o {output}: cannot write ({exc.strerror})") from None
    click.echo(f"wrote {output} ({what})", err=True)
