#!/usr/bin/env bash
# Validation run on a GPU host: installs this checkout, runs the chosen stages, and packs
# their logs into $OUT/logs.tgz; benchmarks/report.py turns such a folder into the tables of
# docs/BENCHMARKS.md. Stages are chosen with STAGES, e.g.
#   STAGES="env full_nccl full_cupy latency topo pytest report" bash benchmarks/gpu_validate.sh
# Stages: env (GPUs, driver, versions, commit), probe (dtype x op support, benchmarks/probe_dtypes.py),
# premul (torch's premul-sum per float type, benchmarks/torch_premul_probe.py),
# full_nccl / full_cupy (every collective, configs/full.yaml), full_nccl_graph / full_cupy_graph
# (-G 1 sweeps from 32 MiB), latency (small all_reduce, eager and -G 100, both backends),
# topo (topo, p2p, pairs), hyper (hypercube sweeps), quick (quick suite twice + compare + plot),
# reliab (killed and stalled rank, wall times), preflight (false alarms and planted slow ranks,
# benchmarks/preflight_verdicts.py, then the command), tune (tune's own file and a one-row file
# deployed with NCCL's example tuner plugin built from TUNER_SRC, --verify at every size), fleet (one
# host's GPUs as simulated nodes), deadrank (a rank SIGKILLed mid-sweep: who is named, how fast
# everything is gone; benchmarks/dead_rank.py), register (-R 0/1/2), a2av (alltoallv: spread 1,
# spread 0, a matrix file; both backends), split (--split on GPUs), cycles (-N 3 small sweeps,
# twice), agg (-m 1 vs -m 4: grouped ops, eager and -G, both backends), single (the options on one
# GPU, both backends), pytest (the GPU tests), startup (benchmarks/startup.py: start-up against bare
# torch/CuPy/gloo scripts, and nccl-tests when NCCL_TESTS names its all_reduce_perf; REPEAT runs
# each, default 5), targets (benchmarks/speed_targets.py on this
# folder), report (benchmarks/report.py on this folder, into report.md), multihost (the GPUs as 2 hosts and
# as 4 one-GPU hosts, NCCL across a network: sweeps under each launcher, a capped NIC, preflight;
# benchmarks/multihost.py, needs root and pyroute2), pytest_multihost (tests/test_multihost.py's GPU
# tests). Put targets and report last.
# Knobs: NP (ranks, default all GPUs), MINBYTES (full_* stages), MAXBYTES (default 4G), OUT (log folder),
# COLLS (collectives of the full_* stages), TAG (suffix of the latency logs), COMMIT (the code's
# commit when this copy has no .git), REFDIR (nccl-tests files for this host type).
set -u
# A rule of the validation hosts, not a default of ncclbench: NVLink multicast (NVLS) stays off
# there, for this script and every rank it starts.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ncclbench-out}
LOG=$OUT/logs; mkdir -p "$LOG"
STAGES=${STAGES:-"env probe full_nccl full_cupy latency topo pytest"}
NP=${NP:-$(nvidia-smi -L | wc -l)}
MAXBYTES=${MAXBYTES:-4G}
PY=${PY:-python3}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
REFDIR=${REFDIR:-tests/fixtures/nccl-tests/h200-${NP}gpu-nvswitch}
[ -d "$REFDIR" ] || REFDIR=tests/fixtures/nccl-tests/h200-4gpu-nvswitch
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

$PY -m pip install -q --no-deps --no-build-isolation -e . >"$LOG/install.txt" 2>&1 || { cat "$LOG/install.txt"; exit 1; }

for stage in $STAGES; do
  stamp "stage $stage"
  case $stage in
    env)
      { echo "commit $COMMIT"; nvidia-smi -L; nvidia-smi; nvidia-smi topo -m
        $PY -c 'import torch, cupy; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())), "CuPy", cupy.__version__)'
      } >"$LOG/env.txt" 2>&1 ;;
    probe)
      pnp=$(( NP < 2 ? NP : 2 ))
      torchrun --nproc-per-node $pnp benchmarks/probe_dtypes.py torch >"$LOG/probe_torch.txt" 2>&1
      torchrun --nproc-per-node $pnp benchmarks/probe_dtypes.py cupy >"$LOG/probe_cupy.txt" 2>&1 ;;
    premul)
      torchrun --nproc-per-node 1 benchmarks/torch_premul_probe.py >"$LOG/premul.txt" 2>&1 ;;
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
      timeout 120 ncclbench p2p --json "$LOG/p2p.json" --csv "$LOG/p2p.csv" >"$LOG/p2p.txt" 2>&1
      if [ "$NP" -ge 2 ]; then
        timeout 120 ncclbench pairs -g "$NP" -b 256M --json "$LOG/pairs.json" >"$LOG/pairs.txt" 2>&1
      fi ;;
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
      ncclbench plot "$LOG/quick1.csv" -O "$LOG/quick1.png" >"$LOG/plot.txt" 2>&1 ;;
    reliab)
      for f in "kill:rank=1,size=1048576" "stall:rank=1,size=1048576,seconds=300"; do
        k=${f%%:*}; s0=$(date +%s.%N)
        NCCLBENCH_FAULT=$f timeout 200 ncclbench allreduce -g 2 -b 8 -e 64M -f 4 -T 10 --no-save \
          --csv "$LOG/rel_$k.csv" -J "$LOG/rel_$k.json" >"$LOG/rel_$k.out" 2>"$LOG/rel_$k.err"
        rc=$?; s1=$(date +%s.%N)
        $PY -c "print('$f exit $rc wall %.1f s' % ($s1 - $s0))" >>"$LOG/reliab.txt"
        sleep 3; ps -eo pid,args | grep "[N]CCLBENCH\|-m ncclbench" >>"$LOG/reliab.txt" || echo "no ncclbench process left" >>"$LOG/reliab.txt"
      done ;;
    preflight)  # preflight's verdicts: false alarms and planted slow ranks in one job, then the command itself
      timeout 400 $PY -m torch.distributed.run --standalone --nproc-per-node "$NP" benchmarks/preflight_verdicts.py \
        --out "$LOG" --healthy "${HEALTHY:-10}" >"$LOG/preflight_verdicts.txt" 2>&1
      for case in healthy slow mesh; do
        [ "$case" = mesh ] && [ "$NP" != 4 ] && continue
        fault=; [ "$case" != healthy ] && fault="slow:rank=1,us=2000"
        mesh=; [ "$case" = mesh ] && mesh="--mesh dp=2,tp=2"
        s0=$(date +%s.%N)
        NCCLBENCH_FAULT=$fault timeout 200 ncclbench preflight -g "$NP" $mesh --json "$LOG/preflight_$case.json" \
          >"$LOG/preflight_$case.txt" 2>&1
        rc=$?; s1=$(date +%s.%N)
        $PY -c "print('preflight -g $NP $mesh ${fault:+(NCCLBENCH_FAULT=$fault)}: exit $rc, %.1f s' % ($s1 - $s0))" \
          >>"$LOG/preflight_cli.txt"
      done ;;
    tune)  # tune's file deployed with NCCL's example tuner plugin (built from TUNER_SRC): its own file, and a one-row file
      plugin=$LOG/../libnccl-tuner-example.so
      (cd "${TUNER_SRC:?set TUNER_SRC to the plugins/tuner/example folder of NCCL}" && gcc -Inccl -fPIC -shared -o "$plugin" plugin.c) \
        >"$LOG/tune_build.txt" 2>&1 || { echo "plugin build failed" >>"$LOG/tune_cli.txt"; continue; }
      tdir=$OUT/tuned; vdir=$OUT/verified
      for step in tune verify control; do
        s0=$(date +%s.%N)
        case $step in
          tune) ncclbench tune allreduce -g "$NP" -b 1K -e 256M -f 4 -O "$tdir" >"$LOG/tune.txt" 2>"$LOG/tune.err" ;;
          verify) ncclbench tune allreduce -g "$NP" -b 1K -e 256M -f 4 --verify "$tdir/nccl_tuner.conf" --plugin "$plugin" \
                    -O "$vdir" >"$LOG/tune_verify.txt" 2>"$LOG/tune_verify.err" ;;
          control) printf 'allreduce,4097,16384,tree,ll,-1,1,%s,1,0\n' "$NP" >"$OUT/one_row.conf"
                   ncclbench tune allreduce -g "$NP" -b 1K -e 256M -f 4 --verify "$OUT/one_row.conf" --plugin "$plugin" \
                    -O "$OUT/verified_one_row" >"$LOG/tune_control.txt" 2>"$LOG/tune_control.err" ;;
        esac
        rc=$?; s1=$(date +%s.%N)
        $PY -c "print('tune $step: exit $rc, %.1f s' % ($s1 - $s0))" >>"$LOG/tune_cli.txt"
      done
      cp "$tdir/nccl_tuner.conf" "$tdir/tune.json" "$vdir/verify.json" "$LOG/" 2>/dev/null ;;
    fleet)  # ncclbench fleet on one host: its GPUs as nodes of 2 and of 1 (--sim-node-size), exit codes and times
      for k in 2 1; do
        [ "$k" = 2 ] && [ "$NP" -lt 4 ] && continue
        s0=$(date +%s.%N)
        timeout 200 ncclbench fleet -g "$NP" --sim-node-size $k -T 60 --json "$LOG/fleet_$k.json" --csv "$LOG/fleet_$k.csv" \
          --drain-file "$LOG/fleet_drain_$k.txt" >"$LOG/fleet_$k.txt" 2>"$LOG/fleet_$k.err"
        rc=$?; s1=$(date +%s.%N)
        $PY -c "print('fleet -g $NP --sim-node-size $k: exit $rc, %.1f s' % ($s1 - $s0))" >>"$LOG/fleet_cli.txt"
      done ;;
    deadrank)  # a rank SIGKILLed mid-sweep (benchmarks/dead_rank.py): -g on both backends, and under torchrun
      for run in "nccl g" "cupy g" "nccl torchrun"; do
        set -- $run
        timeout 120 $PY benchmarks/dead_rank.py --backend $1 --launcher $2 --np "$NP" --kill-rank $(( NP - 1 )) \
          --out "$LOG" >>"$LOG/dead_rank.txt" 2>&1
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
      timeout ${PYTEST_TIMEOUT:-300} $PY -m pytest -q -m gpu tests >"$LOG/pytest_gpu.txt" 2>&1 ;;
    multihost)  # the GPUs as 2 hosts (and 4 one-GPU hosts): NCCL across a network (docs/multihost.md)
      half=$(( NP / 2 )); h0=$(seq -s, 0 $((half - 1))); h1=$(seq -s, $half $((NP - 1)))
      mh() { local name=$1; shift; local s=$EPOCHREALTIME
             timeout 300 $PY benchmarks/multihost.py "$@" >"$LOG/mh_$name.txt" 2>&1; local rc=$?
             $PY -c "print('$name: exit $rc, %.1f s' % ($EPOCHREALTIME - $s))" >>"$LOG/mh_times.txt"; }
      mh 2host --hosts 2 --gpus $h0 $h1 --nccl-log "$LOG/mh_nccl_2host" -- allreduce -b 1M -e 256M -f 4
      mh 2host_nic --hosts 2 --gpus $h0 $h1 --slow-nic 1=2gbit -- allreduce -b 1M -e 64M -f 4
      for how in torchrun slurm mpi; do mh "2host_$how" --hosts 2 --gpus $h0 $h1 --launcher $how -- allgather -b 1M -e 64M -f 4; done
      if [ "$NP" -ge 4 ]; then
        mh 4host --hosts 4 --gpus 0 1 2 3 -- allreduce -b 1M -e 256M -f 4
        mh 4host_pre --hosts 4 --gpus 0 1 2 3 --launcher torchrun -- preflight
        mh 4host_pre_nic --hosts 4 --gpus 0 1 2 3 --launcher torchrun --slow-nic 2=2gbit -- preflight
      fi
      mh 2host_pre --hosts 2 --gpus $h0 $h1 --launcher torchrun -- preflight
      mh 2host_pre_nic --hosts 2 --gpus $h0 $h1 --launcher torchrun --slow-nic 1=2gbit -- preflight ;;
    pytest_multihost)
      timeout ${PYTEST_TIMEOUT:-500} $PY -m pytest -q -m gpu tests/test_multihost.py >"$LOG/pytest_multihost.txt" 2>&1 ;;
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
    startup)  # one-size runs against the bare scripts: startup.md (report.py's Start-up table) and startup.json
      timeout 1200 $PY benchmarks/startup.py --out "$LOG" --repeat "${REPEAT:-5}" --torchrun \
        ${NCCL_TESTS:+--nccl-tests "$NCCL_TESTS"} >"$LOG/startup.txt" 2>&1 ;;
    targets)  # the speed targets' verdicts from this folder's full_* and latency logs, also on stdout
      $PY benchmarks/speed_targets.py "$LOG" --reference-dir "$REFDIR" --np "$NP" --tag "${TAG:-}" 2>&1 \
        | tee "$LOG/targets${TAG:-}.md" ;;
    report)  # docs/BENCHMARKS.md's tables from this folder
      $PY benchmarks/report.py "$LOG" --reference-dir "$REFDIR" --np "$NP" --tag "${TAG:-}" >"$LOG/report.md" \
        2>"$LOG/report.err" ;;
    *)
      # any other word runs as a shell command line from the EXTRA_<word> variable
      var="EXTRA_$stage"; eval "${!var:-true}" >"$LOG/extra_$stage.txt" 2>&1 ;;
  esac
done
stamp "done"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$LOG"
