"""Metric sources (step logs, libtpu, NVML, JAX) published through OpenTelemetry."""
