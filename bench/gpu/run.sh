#!/usr/bin/env bash
# bench/gpu/run.sh [OUTDIR [OPTIONS]] -- on the bare, offline CUDA machine: install the carried wheels, then run the GPU suite.
#
# Needs the wheel folder that bench/gpu/wheels.sh made (default .whl at the repo root, or $WHEEL_DIR) next to the
# checkout. Installs it with no index and no dependency resolution into /tmp/site (nothing in the machine's own
# Python changes), puts the repo root and /tmp/site first on PYTHONPATH, and runs `python3 -m bench gpu --out OUTDIR`.
# OUTDIR defaults to $OUT (the folder the device tool brings back) or ./gpu-out. The exit status is the suite's:
# 2, with one line, where CUDA is absent.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUTDIR=${1:-${OUT:-$ROOT/gpu-out}}
WHEEL_DIR=${WHEEL_DIR:-$ROOT/.whl}
SITE=${SITE:-/tmp/site}
PY=${PYTHON:-python3}
cd "$ROOT"

shopt -s nullglob
wheels=("$WHEEL_DIR"/*.whl)
[[ ${#wheels[@]} -gt 0 ]] || { echo "run.sh: no wheels in $WHEEL_DIR: run bench/gpu/wheels.sh where there is a network, and carry the folder" >&2; exit 1; }
echo "run.sh: $("$PY" -c 'import sys, torch; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")')"
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
echo "run.sh: installed into $SITE:"
for w in "${wheels[@]}"; do echo "  $(basename "$w")"; done
export PYTHONPATH=$ROOT:$SITE
"$PY" -c 'import fastprofile.all, fastai, fastprogress; print(f"run.sh: fastprofile.all imports (fastai {fastai.__version__}, fastprogress {fastprogress.__version__})")'
mkdir -p "$OUTDIR"
exec "$PY" -m bench gpu --out "$OUTDIR" "${@:2}"  # OPTIONS (--parts, --total) go to the suite
