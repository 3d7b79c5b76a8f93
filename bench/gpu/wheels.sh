#!/usr/bin/env bash
# bench/gpu/wheels.sh [DIR] -- download the wheels that the bare, offline CUDA machine lacks (default DIR: .whl at the repo root).
#
# That machine (see bench/README.md) has Python 3.12 (x86-64, manylinux), torch 2.11+cu130 and a long list of packages
# (numpy, pandas, matplotlib, pillow, rich, scipy, scikit-learn, pyyaml, requests, cloudpickle, pytest, ...), but no
# fastai and no network. PINS is what `import fastprofile.all` (and the suite) still needs there, found by importing in a
# venv that holds only what that machine holds (tests/test_gpu_wheels.py repeats that check), not by reading metadata.
# Everything here is pure Python (py3-none-any). Never add torch, torchvision, triton or nvidia-*/cuda packages:
# the machine has its own, built for its CUDA.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-$ROOT/.whl}
PY=${PYTHON:-python3}
# Pure Python: downloaded as py3-none-any only (pip fails if there is none). plum-dispatch also ships mypyc-compiled
# cp3XX wheels that pip would prefer for a manylinux platform; its pure wheel is the one this machine can check.
PINS=(
  fastai==2.8.12
  fastcore==2.2.39
  fasttransform==0.0.5
  fastprogress==1.0.3      # >=1.1 imports python-fasthtml and its many dependencies
  fastdownload==0.0.8
  plum-dispatch==2.9.0
  beartype==0.23.1
)
# Compiled (cp312 manylinux x86-64), for anything needed at import time that has no pure wheel and that the
# GPU machine lacks. None so far.
COMPILED=()
MAX_MIB=40

ALL=("${PINS[@]}" ${COMPILED[@]+"${COMPILED[@]}"})
for p in "${ALL[@]}"; do
  case "${p%%==*}" in torch*|triton*|nvidia-*|cuda-*|cupy*|jax-cuda*) echo "wheels.sh: refusing to carry ${p}: the GPU machine has its own" >&2; exit 1;; esac
done
mkdir -p "$DIR"
# pip warns about every file:// index of this machine's pip.conf that lacks the package: noise, dropped.
quiet_pip() { "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  -d "$DIR" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
quiet_pip --implementation py --abi none --platform any "${PINS[@]}"
if [[ ${#COMPILED[@]} -gt 0 ]]; then
  quiet_pip --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${COMPILED[@]}"
fi

# Keep exactly one wheel per pin: drop wheels of older pins, or of the other kind (pip install --target would see both).
norm() { tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/_/g'; }
prefix() { printf '%s-%s-' "$(printf %s "${1%%==*}" | norm)" "${1#*==}"; }
kind_of() {  # pure | compiled | '' for a wheel's file name
  local lb w; lb=$(printf %s "$1" | tr 'A-Z' 'a-z')
  for p in "${PINS[@]}"; do w=$(prefix "$p"); [[ $lb == "$w"*-none-any.whl ]] && { echo pure; return; }; done
  for p in ${COMPILED[@]+"${COMPILED[@]}"}; do
    w=$(prefix "$p"); [[ $lb == "$w"*-cp312-cp312-*manylinux*x86_64*.whl ]] && { echo compiled; return; }
  done
}
shopt -s nullglob
n=0
for f in "$DIR"/*.whl; do
  b=$(basename "$f")
  if [[ -z $(kind_of "$b") ]]; then echo "wheels.sh: removing $b (not pinned, or not the pinned kind)"; rm -f "$f"; else n=$((n+1)); fi
done
[[ $n -eq ${#ALL[@]} ]] || { echo "wheels.sh: expected ${#ALL[@]} wheels in $DIR, found $n" >&2; exit 1; }
total=0
for f in "$DIR"/*.whl; do
  size=$(wc -c < "$f"); total=$((total+size))
  awk -v s="$size" -v n="$(basename "$f")" 'BEGIN { printf "%8.1f KiB  %s\n", s/1024, n }'
done
awk -v t="$total" -v n="$n" -v d="$DIR" 'BEGIN { printf "wheels.sh: %d wheels, %.1f MiB in %s\n", n, t/1048576, d }'
[[ $total -le $((MAX_MIB*1048576)) ]] || { echo "wheels.sh: over ${MAX_MIB} MiB: the device tool carries at most 64 MiB of working tree" >&2; exit 1; }
