"""What a session may be named, and what a name given to a command refers to.

Light on purpose (no settings, no pydantic): ``mlprof flamegraph FILE`` resolves its
input here and loads nothing else of the capture engine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from exporter.errors import InputError, MlprofError

__all__ = ["SESSION_ID_RE", "check_session_id", "resolve_input"]

# Session ids become directory names in the store (and in XProf's UI): one path
# component, no leading dot (so never "." or ".."), bounded length.
SESSION_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_session_id(value: str) -> str:
    """Return ``value`` if it is a safe session id; raise ValueError saying what is expected."""
    if not SESSION_ID_RE.fullmatch(value) or ".." in value:
        raise ValueError(
            f"session name {value!r}: expected 1-128 characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit, without '..' or path separators"
        )
    return value


def resolve_input(text: str, store: str | None = None) -> Path:
    """A file or directory path, else a session id in the session store.

    Session ids cannot leave the store (:func:`check_session_id`). A session of a remote
    store (``gs://``, ``s3://``, any fsspec URL) is copied once into a temporary
    directory (:meth:`SessionStore.local_copy`: the files a command reads) and read
    from there.
    """
    path = Path(text)
    if path.exists() or store is None:
        return path
    try:
        check_session_id(text)
    except ValueError:
        return path
    if "://" in store and not store.startswith("file://"):
        from exporter.capture.store import SessionStore

        try:
            copy = SessionStore(store).local_copy(text)
        except MlprofError:
            raise
        except ValueError:
            return path
        except OSError as exc:  # the bucket's own errors (HTTP, connection, auth)
            raise InputError(f"{text}: cannot read this session from {store} ({exc})") from None
        return copy if copy is not None else path
    candidate = Path(store.removeprefix("file://")) / "plugins" / "profile" / text
    return candidate if candidate.is_dir() else path
