#!/usr/bin/env bash
# The path NCCL took, on one GPU host: three all_reduce runs (NCCL's defaults; NCCL_P2P_DISABLE=1;
# P2P and SHM disabled, so the network) with the user's own NCCL_DEBUG_FILE, each run's header
# lines, JSON path and `ncclbench explain` of its saved logs, plus `explain` live with P2P off.
# The per-process logs land in $OUT/nccl-logs/<case>/ (the layout of tests/fixtures/nccl-logs/).
# Usage: OUT=/tmp/out NGPUS=4 bash benchmarks/nccl_path_logs.sh
set -u
OUT=${OUT:-/tmp/nccl-path}
NGPUS=${NGPUS:-4}
export NCCL_NVLS_ENABLE=0   # a rule of the validation hosts
mkdir -p "$OUT/nccl-logs"
run_case() {  # name, then env assignments
    local name=$1; shift
    local dir="$OUT/nccl-logs/$name"
    mkdir -p "$dir"
    echo "== $name: $*"
    env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,P2P,SHM,NET,GRAPH NCCL_DEBUG_FILE="$dir/nccl.%h.%p.log" \
        ncclbench all_reduce -g "$NGPUS" -b 64M -e 1G -f 4 -n 10 -w 3 --no-save -J "$OUT/$name.json" \
        > "$OUT/$name.txt" 2> "$OUT/$name.err"
    echo "exit $?"
    grep -E '^# (NCCL path|  |Best busbw)' "$OUT/$name.txt"
    ncclbench explain "$dir" | tee "$OUT/$name.explain.txt"
}
run_case one-host-default NCCLBENCH_CASE=default
run_case one-host-p2p-disabled NCCL_P2P_DISABLE=1
run_case one-host-sockets NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
echo "== explain live, NCCL_P2P_DISABLE=1"
NCCL_P2P_DISABLE=1 ncclbench explain -g "$NGPUS" | tee "$OUT/explain-live-p2p-disabled.txt"
echo "== default header (ncclbench's own log switch)"
ncclbench all_reduce -g "$NGPUS" -b 256M -e 256M -n 10 --no-save | grep -E '^# (NCCL|  |Best)' | tee "$OUT/own-switch.txt"
