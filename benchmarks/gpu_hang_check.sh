#!/usr/bin/env bash
# Hangs across hosts on one GPU (docs/reliability.md, "Hangs across hosts"): installs this
# checkout, then
#   1. the GPU tests of tests/test_hang_hosts.py: 2 simulated hosts sharing the GPU under CUDA
#      MPS (tests/netsim.py; needs root and pyroute2), NCCL over sockets between them, -T 10:
#      a GPU held before its 6th timed op (eager, -G, CuPy), a GPU held before the op that
#      connects the ranks, rank 1 stopped by SIGSTOP (ncclbench's launcher, torchrun), host 1's
#      link down; each must be named within -T + 5 s and leave no process within -T + 15 s;
#   2. their time-to-name and time-to-gone as a table (hang_table.md);
#   3. what reading the timed loop's marks costs the timing: benchmarks/progress_cost.py
#      against BASE (a commit, default 2b35542, unpacked with git archive; or BASE_DIR, a
#      checkout), one rank on GPU 0, eager, -G and CuPy (progress_cost.md).
# Everything goes to OUTDIR. Usage:
#   NCCL_NVLS_ENABLE=0 bash benchmarks/gpu_hang_check.sh OUTDIR
set -u
OUT=${1:?usage: gpu_hang_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 1  # the repository root
# A rule of the validation hosts, not a default of ncclbench: NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PY=${PY:-python3}
BASE=${BASE:-2b35542}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/steps.txt"; }

stamp "install"
$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 1; }
{ echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"; nvidia-smi -L
  $PY -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
  $PY -c 'import cupy; print("CuPy", cupy.__version__)' 2>&1 | tail -1
  $PY -c 'import pyroute2; print("pyroute2", pyroute2.__version__)' 2>&1 | tail -1
  command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control: hosts time-slice the GPU"
  id -u; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

stamp "GPU tests (tests/test_hang_hosts.py -m gpu)"
timeout -k 10 330 $PY -m pytest -q -s -m gpu tests/test_hang_hosts.py -p no:cacheprovider -rA \
  >"$OUT/pytest_hang_hosts.txt" 2>&1
echo "pytest exit $?" >>"$OUT/pytest_hang_hosts.txt"
tail -25 "$OUT/pytest_hang_hosts.txt"

stamp "table"
{ echo "| fault on host 1 | launcher | backend, mode | named after | all gone after | host 0's verdict (first clause) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  grep -o 'HANG-TABLE | .*' "$OUT/pytest_hang_hosts.txt" | sed -e 's/^HANG-TABLE | /| /' -e 's/$/ |/'
} >"$OUT/hang_table.md"
cat "$OUT/hang_table.md"

stamp "timing cost"
base_dir=${BASE_DIR:-}
if [ -z "$base_dir" ] && git rev-parse --verify -q "$BASE^{commit}" >/dev/null 2>&1; then
  base_dir="$OUT/base"; rm -rf "$base_dir"; mkdir -p "$base_dir"
  git archive "$BASE" | tar -x -C "$base_dir"
fi
if [ -n "$base_dir" ] && [ -d "$base_dir" ]; then
  timeout -k 10 150 $PY benchmarks/progress_cost.py --base "$base_dir" --new . --out "$OUT/cost" --repeat 5 \
    --budget 100 >"$OUT/progress_cost.txt" 2>&1
  echo "progress_cost exit $?" >>"$OUT/progress_cost.txt"
  cat "$OUT/progress_cost.txt"
else
  echo "no baseline: give BASE_DIR (a checkout of $BASE) or run from a git checkout" | tee "$OUT/progress_cost.txt"
fi
stamp "done"
