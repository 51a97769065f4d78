#!/usr/bin/env bash
# The Fortran column model on 4 MPICH ranks, without the link (the baseline) and then coupled to
# `embodyrl learner coupling`, which it trains as it runs. Usage (from the repository root):
#   bash examples/fortran/column_model.sh [OUT_DIR] [STEPS] [STEP_MS]
set -euo pipefail
out="${1:-runs/fortran}"; steps="${2:-3000}"; step_ms="${3:-10}"
mkdir -p "$out"
export OMP_NUM_THREADS=1   # one thread per rank, its BLAS included, as MPI models run
python3 -c "from embodyrl.hal.coupling.clib import build; build('$out/build')"
mpifort.mpich -O2 -I"$out/build" -o "$out/column_model" examples/fortran/column_model.f90 \
  -L"$out/build" -lembodyrl_link -Wl,-rpath,"$(cd "$out/build" && pwd)"
echo "== without the link"
mpiexec.mpich -n 4 "$out/column_model" "$steps" 64 "$out" none | tail -1
embodyrl learner coupling --config examples/fortran/column_model.yaml --run-dir "$out/learner" \
  > "$out/learner.jsonl" 2> "$out/learner.log" &
learner=$!
trap 'kill $learner 2>/dev/null || true' EXIT
until [ -s "$out/learner.jsonl" ]; do sleep 0.5; kill -0 $learner || { cat "$out/learner.log"; exit 1; }; done
read -r endpoint policy < <(python3 -c "import json; d = json.loads(open('$out/learner.jsonl').readline()); print(d['endpoint'], d['policy'])")
echo "== coupled to the learner at $endpoint"
mpiexec.mpich -n 4 "$out/column_model" "$steps" 64 "$out" \
  "policy=$policy learner=$endpoint stream_fraction=0.25 send_every=4" "$step_ms" | awk 'NR % 6 == 0'
kill -INT $learner; wait $learner || true
tail -1 "$out/learner.jsonl"
