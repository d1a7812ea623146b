#!/usr/bin/env bash
# Validation run on a lent multi-GPU machine (the device tool). One call does everything;
# logs land in $OUT (packed into $OUT/logs.tgz). Stages are chosen with STAGES, e.g.
#   STAGES="env probe full_nccl full_cupy latency topo pytest" bash scripts/gpu_validate.sh
# Other stages: hyper (hypercube sweeps), quick (quick suite twice + compare + plot),
# reliab (killed and stalled rank, wall times), hostcost (plain torch and CuPy loops),
# register (-R 0/1/2), full_nccl_graph / full_cupy_graph (-G 1 sweeps from 32 MiB),
# a2av (alltoallv: spread 1, spread 0, a matrix file; both backends), split (--split on GPUs),
# hostprof (host time of one small all_reduce, broken down), cycles (-N 3 small sweeps, twice),
# agg (-m 1 vs -m 4: grouped ops, eager and -G, both backends), tstall (torch eager's host stalls),
# single (the options on one GPU, both backends),
# pin (ranks pinned to their own CPUs or not: small all_reduce, both backends),
# targets (scripts/speed_targets.py on this folder: the Speed issue's verdicts, printed; put it last).
# Knobs: NP (ranks, default all GPUs), MINBYTES (full_* stages), MAXBYTES (default 4G), OUT (log folder),
# COLLS (collectives of the full_* stages), TAG (suffix of the latency logs).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ncclbench-out}
LOG=$OUT/logs; mkdir -p "$LOG"
STAGES=${STAGES:-"env probe full_nccl full_cupy latency topo pytest"}
NP=${NP:-$(nvidia-smi -L | wc -l)}
MAXBYTES=${MAXBYTES:-4G}
PY=${PY:-python3}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

$PY -m pip install -q --no-deps --no-build-isolation -e . >"$LOG/install.txt" 2>&1 || { cat "$LOG/install.txt"; exit 1; }

for stage in $STAGES; do
  stamp "stage $stage"
  case $stage in
    env)
      { nvidia-smi; nvidia-smi topo -m; $PY -c 'import torch,cupy; print(torch.__version__, torch.cuda.nccl.version(), cupy.__version__)'; } >"$LOG/env.txt" 2>&1 ;;
    probe)
      pnp=$(( NP < 2 ? NP : 2 ))
      torchrun --nproc-per-node $pnp scripts/probe_dtypes.py torch >"$LOG/probe_torch.txt" 2>&1
      torchrun --nproc-per-node $pnp scripts/probe_dtypes.py cupy >"$LOG/probe_cupy.txt" 2>&1 ;;
    full_nccl|full_cupy|full_nccl_graph|full_cupy_graph)
      b=${stage#full_}; b=${b%_graph}; name=${stage#full_}
      cp configs/full.yaml "$LOG/$name.yaml"
      sets=(--set "maxbytes=$MAXBYTES")
      if [ "$name" != "$b" ]; then  # CUDA graphs: one replay of the 20 captured ops, from 32 MiB (the reference rows 32M 128M 512M 2G)
        sets+=(--set cudagraph=1 --set minbytes=32M)
      fi
      if [ -n "${MINBYTES:-}" ]; then  # e.g. MINBYTES=128M MAXBYTES=2G: the reference rows >= 64 MiB only
        sets+=(--set "minbytes=$MINBYTES")
      fi
      if [ -n "${COLLS:-}" ]; then  # only these collectives, e.g. COLLS="gather scatter"
        { sed '/^runs:/,$d' "$LOG/$name.yaml"; echo "runs:"; for c in $COLLS; do echo "  - $c"; done; } >"$LOG/full.tmp"
        mv "$LOG/full.tmp" "$LOG/$name.yaml"
      fi
      timeout ${FULL_TIMEOUT:-240} ncclbench suite "$LOG/$name.yaml" "${sets[@]}" -g "$NP" --backend "$b" --no-save \
        --csv "$LOG/full_${name}_np$NP.csv" >"$LOG/full_${name}_np$NP.txt" 2>"$LOG/full_${name}_np$NP.err"
      echo "exit $?" >>"$LOG/full_${name}_np$NP.err" ;;
    latency)
      for b in nccl cupy; do
        timeout 120 ncclbench allreduce -g "$NP" --backend $b -b 8 -e 1M -f 8 -n 200 --no-save \
          -J "$LOG/small_${b}_eager_np$NP${TAG:-}.json" >"$LOG/small_${b}_eager_np$NP${TAG:-}.txt" 2>&1
        timeout 120 ncclbench allreduce -g "$NP" --backend $b -b 8 -e 1M -f 8 -G 100 --no-save \
          -J "$LOG/small_${b}_graph_np$NP${TAG:-}.json" >"$LOG/small_${b}_graph_np$NP${TAG:-}.txt" 2>&1
      done ;;
    topo)
      timeout 60 ncclbench topo >"$LOG/topo.txt" 2>&1
      timeout 60 ncclbench topo --json >"$LOG/topo.json" 2>"$LOG/topo_json.err"
      timeout 120 ncclbench p2p --json "$LOG/p2p.json" --csv "$LOG/p2p.csv" >"$LOG/p2p.txt" 2>&1 ;;
    hyper)
      for b in nccl cupy; do
        timeout 120 ncclbench hypercube -g "$NP" --backend $b -b 8 -e "$MAXBYTES" -f 4 --no-save \
          --csv "$LOG/hyper_${b}_np$NP.csv" >"$LOG/hyper_${b}_np$NP.txt" 2>&1
      done ;;
    quick)
      for k in 1 2; do
        timeout 120 ncclbench suite configs/quick.yaml -g "$NP" --results-dir "$LOG/store$k" \
          --csv "$LOG/quick$k.csv" >"$LOG/quick$k.txt" 2>&1
      done
      ncclbench compare "$LOG/quick1.csv" "$LOG/quick2.csv" --threshold 5% --min-size 64K --json "$LOG/compare.json" \
        >"$LOG/compare.txt" 2>&1; echo "compare exit $?" >>"$LOG/compare.txt"
      ncclbench plot "$LOG/quick1.csv" -o "$LOG/quick1.png" >"$LOG/plot.txt" 2>&1 ;;
    reliab)
      for f in "kill:rank=1,size=1048576" "stall:rank=1,size=1048576,seconds=300"; do
        k=${f%%:*}; s0=$(date +%s.%N)
        NCCLBENCH_FAULT=$f timeout 200 ncclbench allreduce -g 2 -b 8 -e 64M -f 4 -T 10 --no-save \
          --csv "$LOG/rel_$k.csv" -J "$LOG/rel_$k.json" >"$LOG/rel_$k.out" 2>"$LOG/rel_$k.err"
        rc=$?; s1=$(date +%s.%N)
        $PY -c "print('$f exit $rc wall %.1f s' % ($s1 - $s0))" >>"$LOG/reliab.txt"
        sleep 3; ps -eo pid,args | grep "[N]CCLBENCH\|-m ncclbench" >>"$LOG/reliab.txt" || echo "no ncclbench process left" >>"$LOG/reliab.txt"
      done ;;
    hostcost)
      { torchrun --nproc-per-node "$NP" scripts/host_cost.py; torchrun --nproc-per-node "$NP" scripts/host_cost.py --own-stream
        torchrun --nproc-per-node "$NP" scripts/host_cost.py --cupy; } >"$LOG/hostcost.txt" 2>&1 ;;
    hostprof)  # where a small all_reduce's host time goes (scripts/host_profile.py)
      { torchrun --nproc-per-node "$NP" scripts/host_profile.py cupy
        NCCL_GRAPH_MIXING_SUPPORT=0 torchrun --nproc-per-node "$NP" scripts/host_profile.py cupy
        torchrun --nproc-per-node "$NP" scripts/host_profile.py torch; } >"$LOG/hostprof.txt" 2>&1 ;;
    tstall)  # torch eager's long host stalls: period and what their length follows (scripts/torch_stall_probe.py)
      for k in 1 2; do timeout 120 torchrun --nproc-per-node "$NP" scripts/torch_stall_probe.py; done >"$LOG/tstall.txt" 2>&1 ;;
    pin)  # does pinning each rank to its own CPUs change small-message times? (scripts/pinned_rank.py)
      for k in 1 2 3 4; do
        for pin in none 4 1; do
          PIN=$pin timeout 60 torchrun --standalone --nproc-per-node "$NP" scripts/pinned_rank.py allreduce --backend cupy \
            -b 8 -e 4K -f 8 -n 200 -N 2 -I 1 --no-save >"$LOG/pin_cupy_${pin}_$k.txt" 2>&1
        done
      done
      for k in 1 2; do
        for pin in none 4; do
          PIN=$pin timeout 60 torchrun --standalone --nproc-per-node "$NP" scripts/pinned_rank.py allreduce --backend nccl \
            -b 8 -e 4K -f 8 -n 200 -N 2 -C 1 --no-save >"$LOG/pin_nccl_${pin}_$k.txt" 2>&1
        done
      done ;;
    cycles)  # is the slow first size a first-in-process effect? three cycles per process, twice
      for k in 1 2; do
        for b in cupy nccl; do
          timeout 120 ncclbench allreduce -g "$NP" --backend $b -b 8 -e 4K -f 8 -n 200 -N 3 --no-save \
            >"$LOG/cycles_${b}_$k.txt" 2>&1
        done
        timeout 120 ncclbench allreduce -g "$NP" --backend nccl -b 8 -e 4K -f 8 -G 100 -N 3 --no-save \
          >"$LOG/cycles_graph_$k.txt" 2>&1
        # per-iteration times: is an eager first-size outlier one stall (i_max) or a slow start (i_p50)?
        timeout 120 ncclbench allreduce -g "$NP" --backend cupy -b 8 -e 4K -f 8 -n 200 -N 2 -I 1 --no-save \
          -J "$LOG/cycles_cupyI_$k.json" >"$LOG/cycles_cupyI_$k.txt" 2>&1
      done ;;
    agg)  # -m: each iteration's ops in one NCCL group, eager and in a graph, vs -m 1
      for b in cupy nccl; do
        for m in 1 4; do
          timeout 120 ncclbench allreduce -g "$NP" --backend $b -b 8 -e 64K -f 8 -n 50 -m $m --no-save \
            >"$LOG/agg_${b}_m${m}_eager.txt" 2>&1
          timeout 120 ncclbench allreduce -g "$NP" --backend $b -b 8 -e 64K -f 8 -n 20 -m $m -G 20 --no-save \
            >"$LOG/agg_${b}_m${m}_graph.txt" 2>&1
        done
        timeout 120 ncclbench alltoall -g "$NP" --backend $b -b 8 -e 64K -f 8 -n 50 -m 4 --no-save \
          >"$LOG/agg_${b}_alltoall_m4.txt" 2>&1
      done ;;
    a2av)
      # an uneven NP x NP byte matrix (zeros included), every row and column total < 2 GiB
      $PY -c "n=$NP; print('\n'.join(' '.join(str((i * n + j) * 7 % 5 * (96 << 20) // max(n - 1, 1)) for j in range(n)) for i in range(n)))" \
        >"$LOG/a2av_matrix.txt"
      for b in nccl cupy; do
        for s in 1 0; do
          timeout 120 ncclbench alltoallv -g "$NP" --backend $b -b 8 -e "$MAXBYTES" -f 4 --alltoallv-spread $s --no-save \
            --csv "$LOG/a2av_${b}_s${s}_np$NP.csv" >"$LOG/a2av_${b}_s${s}_np$NP.txt" 2>&1
        done
        timeout 120 ncclbench alltoallv -g "$NP" --backend $b -b 2G -e 2G --alltoallv-matrix "$LOG/a2av_matrix.txt" \
          --alltoallv-summary --no-save >"$LOG/a2av_${b}_matrix_np$NP.txt" 2>&1
      done ;;
    split)
      for b in nccl cupy; do
        timeout 120 ncclbench allreduce -g "$NP" --backend $b -b 8 -e 64M -f 8 --split "MOD 2" --no-save \
          >"$LOG/split_${b}_np$NP.txt" 2>&1; echo "exit $?" >>"$LOG/split_${b}_np$NP.txt"
      done ;;
    register)
      for r in 0 1 2; do
        timeout 120 ncclbench allreduce -g "$NP" -b 8 -e 1M -f 8 -n 200 -R $r --no-save -M 1 \
          -J "$LOG/register_R$r.json" >"$LOG/register_R$r.txt" 2>&1
      done ;;
    pytest)
      timeout 300 $PY -m pytest -q -m gpu tests >"$LOG/pytest_gpu.txt" 2>&1 ;;
    single)  # the CLI's options on one GPU, both backends (for a machine with one GPU); exit codes in single.txt
      for b in nccl cupy; do
        run1() { local name=$1; shift; timeout 120 ncclbench "$@" --backend $b --no-save >"$LOG/single_${b}_$name.txt" 2>&1
                 echo "$b $name exit $?" >>"$LOG/single.txt"; }
        run1 suite suite configs/quick.yaml -g 1
        run1 opall allreduce -g 1 -b 8 -e 64M -f 8 -o all -d all -c 3 -C 1 -S 1 -z 1
        run1 graph allreduce -g 1 -b 8 -e 64M -f 8 -G 10 -I 1 -K 2 -J "$LOG/single_${b}_graph.json"
        run1 t0 reducescatter -g 1 -b 8 -e 1M -f 8 -T 0
        run1 a2av alltoallv -g 1 -b 8 -e 1M -f 8
        s0=$(date +%s); timeout -s TERM 12 ncclbench allreduce -g 1 --backend $b -b 1K -e 1G -f 2 -n 4000 --no-save \
          -J "$LOG/single_${b}_term.json" >"$LOG/single_${b}_term.txt" 2>&1
        echo "$b sigterm exit $? after $(( $(date +%s) - s0 )) s" >>"$LOG/single.txt"
      done
      NCCLBENCH_FAULT="corrupt:rank=0,size=1024" timeout 60 ncclbench allreduce -g 1 -b 8 -e 4K -f 2 --no-save \
        >"$LOG/single_fault.txt" 2>&1; echo "fault exit $?" >>"$LOG/single.txt" ;;
    targets)  # the Speed issue's verdicts from this folder's full_* and latency logs, also on stdout
      $PY scripts/speed_targets.py "$LOG" --reference-dir "tests/fixtures/nccl-tests/h200-${NP}gpu-nvswitch" \
        --np "$NP" --tag "${TAG:-}" 2>&1 | tee "$LOG/targets${TAG:-}.md" ;;
    *)
      # any other word runs as a shell command line from the EXTRA_<word> variable
      var="EXTRA_$stage"; eval "${!var:-true}" >"$LOG/extra_$stage.txt" 2>&1 ;;
  esac
done
stamp "done"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$LOG"
