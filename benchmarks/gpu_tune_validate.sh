#!/usr/bin/env bash
# `ncclbench tune` on a GPU host, end to end: NCCL's example tuner plugin built from NCCL's
# source (not part of this repository: point TUNER_SRC at a copy of NCCL's
# plugins/tuner/example from NCCL 2.30 or later, and OLD_TUNER_SRC, optionally, at
# ext-tuner/example from 2.27-2.29 to see that build refused), the route probe (NCCL reads
# NCCL_ALGO/NCCL_PROTO and the channel limit again per communicator), the GPU tests, a
# tune sweep and a --verify run. Text results land in $OUT.
#   TUNER_SRC=path/to/plugins/tuner/example OUT=/tmp/tune-out bash benchmarks/gpu_tune_validate.sh
# STAGES picks stages (default: all, in this order): route pytest tune verify precision.
# precision: `tune allreduce -g NP -b 8 -e $PREC_E -f 4` (CUDA-graph replay, a confirming
# second launch) and `--verify` of its own file (needs the plugin), each timed, then the
# per-size noise of both (benchmarks/tune_noise.py, target 3 %). PREC_E (1G) and
# PREC_REPEAT (5) shorten it where it must fit a time limit.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ncclbench-tune-out}; mkdir -p "$OUT"
NP=${NP:-$(nvidia-smi -L | wc -l)}
PY=${PY:-python3}
BUILD=$(mktemp -d)
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=${STAGES:-route pytest tune verify precision}
want() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }

$PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 1; }
{ nvidia-smi -L; $PY -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'; command -v gcc && gcc --version | head -1; } >"$OUT/env.txt" 2>&1

stamp "build NCCL's example tuner plugin"
PLUGIN=
if [ -n "${TUNER_SRC:-}" ] && command -v gcc >/dev/null; then
  (cd "$TUNER_SRC" && gcc -Inccl -fPIC -shared -o "$BUILD/libnccl-tuner-example.so" plugin.c) >"$OUT/build.txt" 2>&1 \
    && PLUGIN=$BUILD/libnccl-tuner-example.so
  nm -D "$BUILD/libnccl-tuner-example.so" 2>/dev/null | grep ncclTunerPlugin >>"$OUT/build.txt"
fi
echo "plugin: ${PLUGIN:-none}" >>"$OUT/build.txt"

want route && {
stamp "route probe"
$PY benchmarks/tune_route_probe.py >"$OUT/route_1rank.txt" 2>&1; echo "exit $?" >>"$OUT/route_1rank.txt"
if [ "$NP" -ge 2 ]; then
  torchrun --standalone --nproc-per-node 2 benchmarks/tune_route_probe.py >"$OUT/route_2ranks.txt" 2>&1
  echo "exit $?" >>"$OUT/route_2ranks.txt"
fi
}

want pytest && {
stamp "pytest"
NCCLBENCH_TUNER_PLUGIN=$PLUGIN $PY -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu_tune.py >"$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
}

want tune && {
stamp "tune on $NP GPU(s)"
ncclbench tune allreduce allgather -g "$NP" -b 1K -e 256M -f 4 -O "$BUILD/tuned" \
  >"$OUT/tune.txt" 2>"$OUT/tune.err"; echo "exit $?" >>"$OUT/tune.txt"
cp "$BUILD/tuned/tune.json" "$BUILD/tuned/performance.csv" "$BUILD/tuned/nccl_tuner.conf" "$BUILD/tuned"/*.png "$OUT/" 2>/dev/null
grep -h "NCCL INFO" "$BUILD"/tuned/probe/nccl.*.log 2>/dev/null | grep -E "Bytes -> Algo|Init COMPLETE|set by environment|coll channels" \
  | head -400 >"$OUT/probe_log_excerpt.txt"
}

want verify && {
printf 'allreduce,0,70000,ring,simple,2,1,%s,1,0\n' "$NP" >"$BUILD/one_row.conf"
if [ -n "$PLUGIN" ]; then
  stamp "verify with the plugin"
  ncclbench tune allreduce -g "$NP" -b 1K -e 1M -f 8 --repeat 3 --verify "$BUILD/one_row.conf" --plugin "$PLUGIN" \
    -O "$BUILD/verified" >"$OUT/verify.txt" 2>"$OUT/verify.err"; echo "exit $?" >>"$OUT/verify.txt"
  if grep -qv '^#' "$BUILD/tuned/nccl_tuner.conf" 2>/dev/null; then
    ncclbench tune allreduce allgather -g "$NP" -b 1K -e 256M -f 4 --verify "$BUILD/tuned/nccl_tuner.conf" \
      --plugin "$PLUGIN" -O "$BUILD/verified2" >"$OUT/verify_tuned.txt" 2>"$OUT/verify_tuned.err"
    echo "exit $?" >>"$OUT/verify_tuned.txt"
  fi
fi
if [ -n "${OLD_TUNER_SRC:-}" ] && command -v gcc >/dev/null; then
  (cd "$OLD_TUNER_SRC" && gcc -Inccl -fPIC -shared -o "$BUILD/old.so" plugin.c) \
    && ncclbench tune allreduce -g "$NP" --verify "$BUILD/one_row.conf" --plugin "$BUILD/old.so" \
      >"$OUT/old_plugin.txt" 2>&1; echo "exit $?" >>"$OUT/old_plugin.txt"
fi
}

want precision && {
PREC_E=${PREC_E:-1G}; PREC_REPEAT=${PREC_REPEAT:-5}
SWEEP="allreduce -g $NP -b 8 -e $PREC_E -f 4 --repeat $PREC_REPEAT --no-plot"
stamp "precision: tune $SWEEP"
t1=$(date +%s)
ncclbench tune $SWEEP -O "$BUILD/precise" >"$OUT/precision_tune.txt" 2>"$OUT/precision_tune.err"
echo "exit $? after $(( $(date +%s) - t1 )) s" >>"$OUT/precision_tune.txt"
cp "$BUILD/precise/tune.json" "$OUT/precision_tune.json" 2>/dev/null
cp "$BUILD/precise/nccl_tuner.conf" "$OUT/precision_tuner.conf" 2>/dev/null
NOISE=("$BUILD/precise/tune.json")
if [ -n "$PLUGIN" ] && [ -f "$BUILD/precise/nccl_tuner.conf" ]; then
  stamp "precision: tune $SWEEP --verify its own file"
  t1=$(date +%s)
  ncclbench tune $SWEEP --verify "$BUILD/precise/nccl_tuner.conf" --plugin "$PLUGIN" -O "$BUILD/precise_verify" \
    >"$OUT/precision_verify.txt" 2>"$OUT/precision_verify.err"
  echo "exit $? after $(( $(date +%s) - t1 )) s" >>"$OUT/precision_verify.txt"
  cp "$BUILD/precise_verify/verify.json" "$OUT/precision_verify.json" 2>/dev/null
  NOISE+=("$BUILD/precise_verify/verify.json")
else
  echo "no plugin (TUNER_SRC) or no tuner config: --verify not run" >"$OUT/precision_verify.txt"
fi
$PY benchmarks/tune_noise.py "${NOISE[@]}" --target 3 >"$OUT/precision_noise.txt" 2>&1
echo "exit $?" >>"$OUT/precision_noise.txt"
grep -h "^exit" "$OUT/precision_tune.txt" "$OUT/precision_verify.txt"
grep -E "noise at most|no win|sizes over|verify:" "$OUT/precision_noise.txt"
}
stamp "done"
