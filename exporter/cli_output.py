"""Where a command's result goes: to ``-o FILE`` (said on stderr), else to stdout."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from exporter.errors import MlprofError

__all__ = ["write_output"]


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
