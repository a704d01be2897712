"""Whether the demo's workload has written its first step: where ``mlprof demo
--duration`` starts counting.

Before its first step the workload imports JAX and compiles its update: seconds on an
idle machine, more than 12 on a busy 2-core one, where a duration counted from the
start ended the demo before any step was written (the step log held only its
``mfu_basis`` and ``end`` records). Counted from the first step, ``--duration N`` is N
seconds of training however long the start took.
"""

from __future__ import annotations

from pathlib import Path

from exporter import schema

__all__ = ["FirstStep"]

# A step record, as the SDK writes it (exporter.sdk.run): '{"kind":"step",...'.
STEP_RECORD = b'"kind":"step"'
# The records before the first step (run and MFU identity) are far shorter than this.
READ_LIMIT_BYTES = 1 << 20


class FirstStep:
    """Watch one workload process's step log (``steps/<host>-<pid>.jsonl``) for a step.

    >>> first = FirstStep(Path("mlprof-data/shared"), workload.pid)
    >>> first.seen()  # poll; True from the first step record on
    """

    def __init__(self, shared_dir: Path, pid: int) -> None:
        self._steps = shared_dir / schema.STEPS_DIR
        self._pattern = f"*-{pid}{schema.STEP_LOG_SUFFIX}"
        # A log of an earlier run whose process had the same pid is appended to: only
        # what is written from now on is this run's.
        self._offsets = {p: p.stat().st_size for p in self._logs()}
        self._seen = False

    def _logs(self) -> list[Path]:
        return sorted(self._steps.glob(self._pattern)) if self._steps.is_dir() else []

    def seen(self) -> bool:
        """Whether a step record has been written since this watch began."""
        if not self._seen:
            for log in self._logs():
                try:
                    with log.open("rb") as f:
                        f.seek(self._offsets.get(log, 0))
                        written = f.read(READ_LIMIT_BYTES)
                except OSError:
                    continue
                if STEP_RECORD in written:
                    self._seen = True
                    break
        return self._seen
