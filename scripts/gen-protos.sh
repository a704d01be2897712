#!/usr/bin/env bash
# Regenerate the committed *_pb2.py from exporter/proto/*.proto; run from the repo root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. exporter/proto/xplane.proto
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. exporter/proto/profile.proto
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. exporter/proto/pyroscope_types.proto
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. exporter/proto/pyroscope_push.proto
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. exporter/proto/tpu_metrics.proto
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. exporter/proto/pyroscope_querier.proto
