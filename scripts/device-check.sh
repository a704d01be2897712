#!/usr/bin/env bash
# Check the sidecar's GPU metrics and device flame graphs on a machine with an NVIDIA GPU.
#
#   scripts/device-check.sh             # installs into .venv-device, runs, prints PASS/FAIL
#   scripts/device-check.sh --dry-run   # the same without a GPU: CPU JAX, GPU checks SKIP
#   scripts/device-check.sh --no-install --venv .venv
#
# Installs the `gpu` and `jax` extras (and JAX for CUDA when nvidia-smi works), starts
# `mlprof serve` beside the demo JAX workload (sized to load a GPU), then
# tests/device_check.py scrapes /metrics while the GPU idles and while it works, checks
# every GPU metric with its value ranges, captures once and checks the device flame
# graph has GPU kernels. Exit 0 on PASS, 1 on FAIL, 2 on a usage error. Logs and the
# session store stay in the printed work directory.
set -euo pipefail

usage() {
  sed -n '2,13s/^# \{0,1\}//p' "$0"
}

DRY_RUN=0
INSTALL=1
VENV=.venv-device
PORT=${MLPROF_DEVICE_CHECK_PORT:-19464}
PROFILER_PORT=${MLPROF_DEVICE_CHECK_PROFILER_PORT:-19999}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --no-install) INSTALL=0 ;;
    --venv) [[ $# -ge 2 ]] || { echo "device-check: --venv needs a directory" >&2; exit 2; }
            VENV=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "device-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mlprof-device-check.XXXXXX")
SHARED=$WORK/shared
STORE=$WORK/store
mkdir -p "$SHARED" "$STORE"
PIDS=()

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "machine"
if [[ $DRY_RUN -eq 0 ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
    echo "device-check: no NVIDIA GPU here (nvidia-smi failed); use --dry-run to check the rest" >&2
    echo "DEVICE CHECK: FAIL (no GPU)"
    exit 1
  fi
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit --format=csv
else
  echo "dry run: no GPU needed, GPU checks are reported SKIP"
fi
echo "work directory: $WORK"

if [[ $INSTALL -eq 1 ]]; then
  step "install into $VENV"
  [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e '.[gpu,jax]'
  if [[ $DRY_RUN -eq 0 ]]; then
    # JAX for CUDA 12 when the registry has it; without it the workload runs on the CPU
    # and the utilisation and kernel checks fail, saying so.
    "$VENV/bin/pip" install -q -U 'jax[cuda12]' \
      || echo "device-check: could not install jax[cuda12]; JAX may run on the CPU" >&2
  fi
fi
BIN=$VENV/bin
[[ -x $BIN/python ]] || { echo "device-check: no python in $VENV (drop --no-install)" >&2; exit 2; }
"$BIN/python" -c 'import jax; print("JAX", jax.__version__, "devices:", jax.devices())'

step "sidecar and workload"
SOURCES=nvml,jax
[[ $DRY_RUN -eq 1 ]] && SOURCES=auto
MLPROF_LISTEN=127.0.0.1:$PORT MLPROF_SHARED_DIR=$SHARED MLPROF_STORE=$STORE \
  MLPROF_SOURCES=$SOURCES MLPROF_COLLECT_INTERVAL_S=1 MLPROF_DUTY_CYCLE_WINDOW_S=5 \
  "$BIN/mlprof" serve >"$WORK/sidecar.log" 2>&1 &
PIDS+=("$!")
# Big enough to keep a GPU busy; a CPU dry run gets a small model.
SIZE=(--batch 8192 --features 4096 --hidden 8192)
[[ $DRY_RUN -eq 1 ]] && SIZE=(--batch 64 --features 64 --hidden 128)
MLPROF_SHARED_DIR=$SHARED "$BIN/python" -m exporter.demo.workload --shared-dir "$SHARED" \
  --profiler-port "$PROFILER_PORT" "${SIZE[@]}" >"$WORK/workload.log" 2>&1 &
PIDS+=("$!")
echo "sidecar pid ${PIDS[0]} (log $WORK/sidecar.log), workload pid ${PIDS[1]} (log $WORK/workload.log)"

step "checks"
ARGS=(--url "http://127.0.0.1:$PORT" --shared "$SHARED" --store "$STORE")
[[ $DRY_RUN -eq 1 ]] && ARGS+=(--dry-run)
status=0
"$BIN/python" -m tests.device_check "${ARGS[@]}" || status=$?
if [[ $status -ne 0 ]]; then
  echo "device-check: failed; last lines of the logs in $WORK:" >&2
  tail -n 5 "$WORK/sidecar.log" "$WORK/workload.log" >&2 || true
fi
exit "$status"
