"""In-workload instrumentation: light to import (no server, no OpenTelemetry, no JAX).

>>> from exporter import sdk
>>> with sdk.run(name="demo", shared_dir="/tmp/mlprof-doc") as run:  # doctest: +SKIP
...     with run.step(tokens=4096):
...         pass
...     run.record("loss", 0.5)
"""

from exporter.sdk.host_profile import HostProfiling
from exporter.sdk.run import Run, run

__all__ = ["HostProfiling", "Run", "run"]
