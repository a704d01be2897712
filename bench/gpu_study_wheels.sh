#!/usr/bin/env bash
# Download the wheels the GPU study needs on the lent machine, which has no network.
#
#   bench/gpu_study_wheels.sh [DIR]     # default .gpu-wheels (git-ignored), ~26 wheels, ~14 MB
#
# The lent machine (KINDS.md, nvidia-h200) runs Python 3.12 with jax 0.11.2 + its CUDA 13
# plugin, torch 2.11 (CUDA 13), nvidia-ml-py, numpy, grpcio, httpx, click, rich, ... but
# none of pydantic, pydantic-settings, fastapi, starlette, uvicorn, opentelemetry-*,
# brotli or xprof, and a protobuf older than the 7.35 the committed *_pb2.py need.
#
# What travels: the closure of pyproject's [project] dependencies (the core's runtime
# set; no extras, so no xprof: its wheel alone is 32 MB with heavy dependencies), each
# pinned to the version this checkout's .venv holds (the set the suite passes with),
# less the packages the machine's image already has (DEVICE_HAS below: KINDS.md's
# list), plus setuptools >= 77 (the project's build backend, which the image's older
# one is not). The image's own grpcio and typing-extensions may be older than our
# floors (grpcio >= 1.85.1 for exporter/proto/*_pb2_grpc.py), so they travel too.
# Each is fetched with `pip download --no-deps --only-binary=:all: --python-version 3.12
# --implementation cp --platform manylinux_...`; the script then checks the closure:
# every non-extra requirement of every wheel is a wheel here or in DEVICE_HAS.
#
# How the study installs them there (bench/gpu_study.sh does it; no pip, no venv: the
# image's python3 is itself a venv, and a venv made from it would not see its torch):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mlprof-site DIR/*.whl
#   export PYTHONPATH=/tmp/mlprof-site:$PWD
# and the project from the working tree, its C extensions built in place for cp312:
#   python3 -c 'from setuptools import setup; setup()' build_ext --inplace
# where no compiler exists that build fails and the pure-Python twins stand in
# (exporter/profiles/xspace.py reads through protobuf, highwayhash.py hashes in Python).
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=${1:-.gpu-wheels}
PY=${PYTHON:-.venv/bin/python}
[[ -x $PY ]] || { echo "gpu_study_wheels: no $PY (make the dev venv, or set PYTHON)" >&2; exit 2; }
mkdir -p "$DIR"

# name==version per line: the closure of the core's dependencies, as .venv installed them.
SPECS=$("$PY" - <<'EOF'
import tomllib
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The image's packages (KINDS.md, "Python packages already there"), taken as they are.
DEVICE_HAS = {canonicalize_name(n) for n in """
annotated-doc anyio certifi charset-normalizer click fsspec h11 httpcore httpx idna
markdown-it-py mdurl numpy prometheus-client pygments pyyaml requests rich urllib3 zipp
""".split()}
ALWAYS = ["setuptools"]  # the build backend (pyproject: setuptools>=77)
env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3"}
with open("pyproject.toml", "rb") as handle:
    todo = [Requirement(r) for r in tomllib.load(handle)["project"]["dependencies"]]
todo += [Requirement(n) for n in ALWAYS]
seen: dict[str, str] = {}
while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if name in seen or (name in DEVICE_HAS and name not in ALWAYS):
        continue
    try:
        seen[name] = version(name)
    except PackageNotFoundError:
        raise SystemExit(f"gpu_study_wheels: {name} is not in the venv: install the project first")
    for line in requires(name) or []:
        sub = Requirement(line)
        extras = req.extras or {""}
        if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e}) for e in extras):
            todo.append(sub)
for name, ver in sorted(seen.items()):
    print(f"{name}=={ver}")
EOF
)

PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
# shellcheck disable=SC2086  # one spec a word
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DIR" $SPECS 2> >(grep -v "is ignored: it is neither a file" >&2)

# One version of each (two stop the install there), and nothing missing from the closure.
"$PY" - "$DIR" <<'EOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

DEVICE_HAS = {canonicalize_name(n) for n in """
annotated-doc anyio certifi charset-normalizer click fsspec h11 httpcore httpx idna
markdown-it-py mdurl numpy prometheus-client pygments pyyaml requests rich urllib3 zipp
""".split()}
env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3"}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
names: dict[str, list[str]] = {}
for wheel in wheels:
    names.setdefault(canonicalize_name(parse_wheel_filename(wheel.name)[0]), []).append(wheel.name)
twice = {n: w for n, w in names.items() if len(w) > 1}
missing = set()
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(z.read(meta).decode())
    for line in headers.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in names and name not in DEVICE_HAS:
            missing.add(f"{name} (for {wheel.name})")
size = sum(w.stat().st_size for w in wheels) / 2**20
print(f"gpu_study_wheels: {len(wheels)} wheels, {size:.1f} MiB in {sys.argv[1]}")
if twice:
    raise SystemExit(f"gpu_study_wheels: several versions of {twice}: remove the old ones")
if missing:
    raise SystemExit(f"gpu_study_wheels: not in the closure: {sorted(missing)}")
EOF
