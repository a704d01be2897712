"""Shipped alerting content: Prometheus rules rendered from one thresholds table."""
