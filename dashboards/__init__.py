"""Grafana dashboards generated from code (``python -m dashboards.generate``)."""
