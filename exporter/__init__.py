"""mlprof-exporter: ML workload observability for the Grafana stack."""

__version__ = "0.1.0"
__all__ = ["__version__"]
