#!/usr/bin/env bash
# Check the sidecar's GPU metrics and device flame graphs on a machine with an NVIDIA GPU.
#
#   scripts/device-check.sh             # installs into .venv-device, runs, prints PASS/FAIL
#   scripts/device-check.sh --dry-run   # the same without a GPU: CPU JAX, GPU checks SKIP
#   scripts/device-check.sh --no-install --venv .venv
#
# Installs the `gpu` and `jax` extras and JAX for the driver's CUDA (jax[cuda13] or
# jax[cuda12]); where a JAX on a GPU is already importable it is used as it is. Starts
# `mlprof serve` beside the demo JAX workload (sized to load a GPU), then
# tests/device_check.py scrapes /metrics while the GPU idles and while it works, checks
# every GPU metric with its value ranges, captures once (remotely, or in the workload
# with run.profile where xprof is absent) and checks the device flame graph has GPU
# kernels. Exit 0 on PASS, 1 on FAIL, 2 on a usage error; killed (TERM, INT, HUP), it
# ends the sidecar and workload first. Logs and the store stay in the work directory.
set -euo pipefail

usage() {
  sed -n '2,15s/^# \{0,1\}//p' "$0"
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

# Each child runs in its own process group (started under `set -m`): its whole tree
# (the sidecar's session children, the checker's mlprof commands) ends with it.
# shellcheck disable=SC2317  # run by the traps
cleanup() {
  local pid alive _
  for pid in "${PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for _ in $(seq 30); do  # 3 s to end cleanly (a parent stopping us waits about 5 s)
    alive=0
    for pid in "${PIDS[@]}"; do
      kill -0 -- "-$pid" 2>/dev/null && alive=1
    done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
# Stopped by a signal: end every child's group (the EXIT trap alone reached the pids,
# not their trees nor the foreground checker), then die of that signal.
# shellcheck disable=SC2317
stopped() {
  trap - EXIT
  cleanup
  echo "device-check: stopped by SIG$1; sidecar and workload ended" >&2
  trap - "$1"
  kill -s "$1" "$$"
}
trap cleanup EXIT
for sig in TERM INT HUP; do
  # shellcheck disable=SC2064  # the signal's name, fixed now
  trap "stopped $sig" "$sig"
done
# In the background in its own process group: $! is the group's id, and `wait` on it is
# interrupted by a signal (a foreground child would hold the trap until it ended).
background() {
  set -m
  "$@" &
  PIDS+=("$!")
  set +m
}

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

# Whether this python imports a JAX that has a GPU backend.
gpu_jax() {
  "$1" -c 'import jax, sys; sys.exit(0 if jax.devices("gpu") else 1)' >/dev/null 2>&1
}

if [[ $INSTALL -eq 1 ]]; then
  step "install into $VENV"
  if [[ $DRY_RUN -eq 0 ]] && gpu_jax "$PY"; then
    # A machine with its JAX and CUDA plugin installed (and perhaps no network): the venv
    # sees them, and only the exporter's own extras are added.
    echo "using the installed JAX: $("$PY" -c 'import jax; print(jax.__version__)')"
    [[ -x $VENV/bin/python ]] || "$PY" -m venv --system-site-packages "$VENV"
    # Offline, the install fails: what that python has is used (run from this tree).
    "$VENV/bin/pip" install -q -e '.[gpu]' \
      || echo "device-check: could not install the exporter (offline?); using what $PY has" >&2
  else
    [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -e '.[gpu,jax]'
  fi
  if [[ $DRY_RUN -eq 0 ]] && ! gpu_jax "$VENV/bin/python"; then
    # The driver says the newest CUDA it runs; JAX's wheels come per CUDA major. Without
    # them the workload runs on the CPU and the utilisation and kernel checks fail.
    cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
    extra=cuda12
    [[ ${cuda:-0} -ge 13 ]] && extra=cuda13
    "$VENV/bin/pip" install -q -U "jax[$extra]" \
      || echo "device-check: could not install jax[$extra]; JAX may run on the CPU" >&2
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
  background "$BIN/python" -m exporter.cli serve >"$WORK/sidecar.log" 2>&1
# Big enough to keep a GPU busy; a CPU dry run gets a small model.
SIZE=(--batch 8192 --features 4096 --hidden 8192)
[[ $DRY_RUN -eq 1 ]] && SIZE=(--batch 64 --features 64 --hidden 128)
MLPROF_SHARED_DIR=$SHARED background "$BIN/python" -m exporter.demo.workload \
  --shared-dir "$SHARED" --profiler-port "$PROFILER_PORT" "${SIZE[@]}" >"$WORK/workload.log" 2>&1
echo "sidecar pid ${PIDS[0]} (log $WORK/sidecar.log), workload pid ${PIDS[1]} (log $WORK/workload.log)"

step "checks"
ARGS=(--url "http://127.0.0.1:$PORT" --shared "$SHARED" --store "$STORE")
[[ $DRY_RUN -eq 1 ]] && ARGS+=(--dry-run)
if ! "$BIN/python" -c 'import xprof' >/dev/null 2>&1; then
  # Remote capture needs XProf's profiler client; the workload can trace itself.
  echo "no xprof here: the capture is taken in the workload (run.profile)"
  ARGS+=(--in-process-capture)
fi
status=0
background "$BIN/python" -m tests.device_check "${ARGS[@]}"
wait "${PIDS[2]}" || status=$?
if [[ $status -ne 0 ]]; then
  echo "device-check: failed; last lines of the logs in $WORK:" >&2
  tail -n 5 "$WORK/sidecar.log" "$WORK/workload.log" >&2 || true
fi
exit "$status"
