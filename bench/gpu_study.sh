#!/usr/bin/env bash
# The GPU study in one call of the device tool: NVML against nvidia-smi, the project's
# device check, JAX GPU captures -> the detection curve and device-plane floors, a
# torch.profiler CUDA trace and an allocator snapshot against torch's own readings, and
# MFU against a hand count. At most 5 minutes on the lent machine (one H200, no network).
#
#   bench/gpu_study_wheels.sh                  # here, once: .gpu-wheels/ (git-ignored, ~14 MB)
#   device tool: run(command="bash bench/gpu_study.sh", carry=[".gpu-wheels"], timeout_s=420)
#   bench/gpu_study.sh --dry-run               # here: every part on the CPU, reduced sizes
#   bench/gpu_study.sh --parts mfu,torch       # some parts (names: bench/gpu_study.py)
#   MLPROF_GPU_STUDY_BUDGET_S=900 bench/gpu_study.sh --dry-run   # a loaded machine: more time,
#                                              # shared out in proportion (default 280 s)
#
# Results go to $OUT (the device tool returns what is written there; without $OUT,
# bench/out/gpu-study): summary.json, mfu.json, torch.json, nvml.json, detection.json,
# device_check.json, study.log, samples.tar.gz. docs/gpu-study.md says how to read them.
#
# Install on the lent machine (its python3, /opt/torch/.venv, holds torch, jax, numpy,
# nvidia-ml-py, grpcio, httpx, click, rich, ...; a venv made from it would not see them):
#   1. the carried wheels (pydantic, fastapi, starlette, uvicorn, opentelemetry-*, brotli,
#      protobuf 7.36, grpcio, setuptools: bench/gpu_study_wheels.sh says which and why)
#        python3 -m pip install --no-index --no-deps --no-compile --target /tmp/mlprof-site .gpu-wheels/*.whl
#        export PYTHONPATH=/tmp/mlprof-site:$PWD
#   2. the project is the working tree itself (on PYTHONPATH, nothing installed); its C
#      extensions (the decode core, HighwayHash) are built in place for cp312:
#        python3 -c 'from setuptools import setup; setup()' build_ext --inplace
#      Where gcc is missing or the build fails, the study goes on: the pure-Python twins
#      stand in (protobuf decoding, highwayhash.py), and study.log says which.
# The dry run uses the dev venv (.venv) as it is: it checks that the wheels install for
# cp312 (pip --target --python-version 3.12, not imported: this Python is 3.11) and
# that the extensions build (into a temporary directory: the tree's own .so files are
# in use by others), then runs every part on the CPU.
set -uo pipefail

# All in one function, read whole before it runs: an edit of this file during a run
# cannot change what the run does.
main() {
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET=${MLPROF_GPU_STUDY_BUDGET_S:-280}
WHEELS=${MLPROF_GPU_WHEELS:-.gpu-wheels}
SITE=${MLPROF_GPU_SITE:-/tmp/mlprof-site}
DRY_RUN=0
for arg in "$@"; do
  [[ $arg == --dry-run ]] && DRY_RUN=1
  [[ $arg == -h || $arg == --help ]] && { sed -n '2,34s/^# \{0,1\}//p' "$0"; exit 0; }
done
if [[ $DRY_RUN -eq 0 ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_study: no NVIDIA GPU here: a dry run (CPU, reduced sizes)"
  DRY_RUN=1
fi
if [[ $DRY_RUN -eq 1 && -z ${PYTHON:-} && -x .venv/bin/python ]]; then
  PY=.venv/bin/python
else
  PY=${PYTHON:-python3}
fi
BUILD_LOG=$(mktemp "${TMPDIR:-/tmp}/gpu-study-build.XXXXXX")

echo "== setup: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [[ ${#wheels[@]} -eq 0 ]]; then
  echo "setup: no wheels in $WHEELS (run bench/gpu_study_wheels.sh here and carry it);" \
    "the parts that need the sidecar's dependencies will fail"
elif [[ $DRY_RUN -eq 1 ]]; then
  rm -rf "$BUILD_LOG.site"
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: \
      --python-version 3.12 --implementation cp --target "$BUILD_LOG.site" "${wheels[@]}" \
      >>"$BUILD_LOG" 2>&1; then
    echo "setup: ${#wheels[@]} wheels install for cp312 (dry run: not used; the dev venv is)"
  else
    echo "setup: the wheels do not install for cp312:"; tail -n 5 "$BUILD_LOG"
  fi
  rm -rf "$BUILD_LOG.site"
else
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "${wheels[@]}" \
      >>"$BUILD_LOG" 2>&1; then
    echo "setup: ${#wheels[@]} wheels installed into $SITE"
  else
    echo "setup: wheel install failed:"; tail -n 5 "$BUILD_LOG"
  fi
fi
# The carried wheels come before the image's own packages (its protobuf is older).
if [[ $DRY_RUN -eq 1 ]]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

if [[ $DRY_RUN -eq 1 ]]; then
  BUILD=(build_ext -b "$BUILD_LOG.lib" -t "$BUILD_LOG.tmp")
else
  BUILD=(build_ext --inplace)
fi
if "$PY" -c 'from setuptools import setup; setup()' -q "${BUILD[@]}" >>"$BUILD_LOG" 2>&1; then
  echo "setup: C extensions built (${BUILD[*]})"
else
  echo "setup: C extensions not built (no compiler?): the pure-Python twins stand in;" \
    "last lines:"; tail -n 3 "$BUILD_LOG"
fi
rm -rf "$BUILD_LOG.lib" "$BUILD_LOG.tmp"
"$PY" - <<'EOF'
import importlib, importlib.util
for name in ("exporter.profiles._xwire", "exporter.profiles._highwayhash"):
    print(f"setup: {name}: {'compiled' if importlib.util.find_spec(name) else 'pure-Python twin'}")
for name in ("jax", "torch", "pynvml", "pydantic", "fastapi", "google.protobuf", "xprof"):
    try:
        module = importlib.import_module(name)
        print(f"setup: {name} {getattr(module, '__version__', 'importable')}")
    except ImportError as exc:
        print(f"setup: {name}: not importable ({exc})")
EOF
echo "setup: $((SECONDS - START)) s"

exec "$PY" bench/gpu_study.py --budget $((BUDGET - (SECONDS - START))) "$@"
}
main "$@"
