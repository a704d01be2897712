"""Errors a user can act on: the CLI prints them as one line, never a traceback."""

from __future__ import annotations

__all__ = ["ConfigError", "InputError", "MlprofError", "UnavailableError"]


class MlprofError(Exception):
    """Base class; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class ConfigError(MlprofError):
    """A setting or command-line value is wrong (usage error, exit 2)."""

    exit_code = 2


class InputError(MlprofError):
    """An input file or service answer cannot be used (failure, exit 1)."""


class UnavailableError(InputError):
    """A service the answer needs (a bucket) does not answer: a failure (exit 1), and an
    HTTP 503 where a request asked, never "not found"."""
