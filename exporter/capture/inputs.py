"""What a name given to a command refers to: a path, else a session of the store.

Light on purpose (no settings, no pydantic until a remote store is read):
``mlprof flamegraph FILE`` resolves its input here and loads nothing else of the
capture engine.
"""

from __future__ import annotations

from pathlib import Path

from exporter.capture.names import check_session_id
from exporter.errors import InputError, MlprofError

__all__ = ["existing_input", "resolve_input"]


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


def existing_input(text: str, store: str | None) -> Path:
    """:func:`resolve_input`, or InputError naming what was looked for and where."""
    path = resolve_input(text, store)
    if path.exists():
        return path
    where = f"the store {store}" if store else "no store (--store or MLPROF_STORE)"
    raise InputError(f"{text}: no such file or directory, and no such session in {where}")
