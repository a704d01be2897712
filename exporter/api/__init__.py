"""HTTP API of the sidecar: /metrics, health, webhook and REST endpoints."""
