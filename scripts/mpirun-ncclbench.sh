#!/usr/bin/env bash
# mpirun-ncclbench.sh -- run ncclbench under mpirun, one MPI rank per GPU, like
# `mpirun -np 16 -H a:8,b:8 all_reduce_perf ...` with nccl-tests. Each rank reads its rank
# from Open MPI's (OMPI_COMM_WORLD_*) or hydra's (PMI_*) variables; this wrapper exports
# the rendezvous address and forwards the NCCL settings of the calling shell.
#
# Usage:  [KNOB=value ...] scripts/mpirun-ncclbench.sh <collective> [ncclbench options]
#   scripts/mpirun-ncclbench.sh allreduce -b 8 -e 128M -f 2           # all GPUs of this host
#   NP=16 HOSTS=gpu-a:8,gpu-b:8 scripts/mpirun-ncclbench.sh allgather -b 1M -e 1G -f 2
#   NP=32 HOSTFILE=hosts.txt scripts/mpirun-ncclbench.sh alltoall -b 1M -e 1G
#   NP=4 scripts/mpirun-ncclbench.sh allreduce -b 8 -e 1M --backend gloo  # CPU only
#   DRY_RUN=1 NP=16 HOSTS=a:8,b:8 scripts/mpirun-ncclbench.sh allreduce     # print, do not run
#
# Knobs (environment):
#   NP            ranks in total (default: GPUs on this host per nvidia-smi; required without GPUs)
#   HOSTS         hosts with slots, "host:slots,host:slots" (-H / -hosts); default: this host,
#                 or the whole allocation when mpirun runs inside a SLURM job
#   HOSTFILE      a hostfile instead of HOSTS (--hostfile / -f)
#   MPIRUN        the launcher (default mpirun)
#   MPI_FLAVOR    openmpi | hydra (MPICH, Intel MPI) | auto (default: from `$MPIRUN --version`)
#   MPIRUN_ARGS   extra launcher options, split on spaces (Open MPI default: --bind-to none,
#                 so a rank's NCCL threads are not squeezed onto one core)
#   MASTER_ADDR   rank 0's host (default: first host of HOSTS / HOSTFILE / the SLURM
#                 allocation; unset on a single host, where ranks use 127.0.0.1)
#   MASTER_PORT   rendezvous port (default 20000 + this script's PID mod 10000, so runs
#                 started side by side do not collide)
#   FORWARD_ENV   more variables to forward, by name or by prefix ending in "_"
#                 (e.g. "FI_ UCX_ HF_HOME"); Open MPI only forwards what -x names
#   NCCLBENCH_BIN command that runs ncclbench (default "ncclbench")
#   DRY_RUN=1     print the command instead of running it
# Always forwarded: NCCL_*, TORCH_NCCL_*, TORCH_DISTRIBUTED_*, MASTER_ADDR, MASTER_PORT, and
# when set PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, CUDA_VISIBLE_DEVICES. Hydra
# forwards the whole environment (-genvall).

set -euo pipefail

die() { echo "mpirun-ncclbench: $*" >&2; exit 2; }

[[ $# -ge 1 ]] || die "usage: [NP=N] [HOSTS=a:8,b:8] $0 <collective> [ncclbench options]"

mpirun_bin="${MPIRUN:-mpirun}"
read -r -a bench_bin <<< "${NCCLBENCH_BIN:-ncclbench}"

# --- how many ranks --------------------------------------------------------------------
np="${NP:-}"
if [[ -z "$np" ]]; then
    if command -v nvidia-smi > /dev/null; then
        np="$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)"
    fi
    [[ "${np:-0}" -gt 0 ]] || die "no GPU found by nvidia-smi: set NP (e.g. NP=4 ... --backend gloo)"
fi
[[ "$np" =~ ^[1-9][0-9]*$ ]] || die "NP=$np is not a positive integer"

# --- which MPI -------------------------------------------------------------------------
flavor="${MPI_FLAVOR:-auto}"
if [[ "$flavor" == auto ]]; then
    version="$("$mpirun_bin" --version 2>&1 || true)"
    case "$version" in
        *"Open MPI"* | *OpenRTE* | *prterun*) flavor=openmpi ;;
        *HYDRA* | *Hydra* | *"Intel(R) MPI"*) flavor=hydra ;;
        *) die "cannot tell which MPI '$mpirun_bin' is: set MPI_FLAVOR=openmpi or hydra" ;;
    esac
fi
[[ "$flavor" == openmpi || "$flavor" == hydra ]] || die "MPI_FLAVOR=$flavor: use openmpi, hydra or auto"

# --- rendezvous ------------------------------------------------------------------------
first_host() {
    if [[ -n "${HOSTS:-}" ]]; then
        local first="${HOSTS%%,*}"
        echo "${first%%:*}"
    elif [[ -n "${HOSTFILE:-}" ]]; then
        [[ -r "$HOSTFILE" ]] || die "cannot read HOSTFILE=$HOSTFILE"
        # "host slots=8" (Open MPI) or "host:8" (hydra); skip comments and blank lines.
        awk '!/^[[:space:]]*(#|$)/ { sub(/:.*/, "", $1); print $1; exit }' "$HOSTFILE"
    elif [[ -n "${SLURM_JOB_NODELIST:-}" ]] && command -v scontrol > /dev/null; then
        # mpirun inside a SLURM job uses the allocation, rank 0 on its first node.
        scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1'
    fi
}
if [[ -z "${MASTER_ADDR:-}" ]]; then
    MASTER_ADDR="$(first_host)"
    [[ -n "$MASTER_ADDR" ]] || unset MASTER_ADDR  # one host: ncclbench uses 127.0.0.1
fi
MASTER_PORT="${MASTER_PORT:-$(( 20000 + $$ % 10000 ))}"
export MASTER_PORT
[[ -z "${MASTER_ADDR:-}" ]] || export MASTER_ADDR

# Rank variables here can only be leftovers; mpirun would hand them to the local ranks
# and ncclbench would stop on the contradiction with the MPI rank.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE TORCHELASTIC_RUN_ID

# --- what to forward -------------------------------------------------------------------
forward=()
read -r -a forward_patterns <<< "NCCL_ TORCH_NCCL_ TORCH_DISTRIBUTED_ ${FORWARD_ENV:-}"
for name in $(compgen -e | sort); do
    for pattern in MASTER_ADDR MASTER_PORT PATH LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV \
                   CUDA_VISIBLE_DEVICES "${forward_patterns[@]}"; do
        if [[ "$name" == "$pattern" || ( "$pattern" == *_ && "$name" == "$pattern"* ) ]]; then
            forward+=("$name")
            break
        fi
    done
done

# --- the command -----------------------------------------------------------------------
if [[ "$flavor" == openmpi ]]; then
    read -r -a launcher_args <<< "${MPIRUN_ARGS---bind-to none}"
    cmd=("$mpirun_bin" -np "$np")
    [[ -z "${HOSTS:-}" ]] || cmd+=(-H "$HOSTS")
    [[ -z "${HOSTFILE:-}" ]] || cmd+=(--hostfile "$HOSTFILE")
    [[ "$(id -u)" != 0 ]] || cmd+=(--allow-run-as-root)  # CI containers run as root
    for name in "${forward[@]}"; do
        cmd+=(-x "$name")
    done
else
    read -r -a launcher_args <<< "${MPIRUN_ARGS:-}"
    cmd=("$mpirun_bin" -n "$np" -genvall)
    [[ -z "${HOSTS:-}" ]] || cmd+=(-hosts "$HOSTS")
    [[ -z "${HOSTFILE:-}" ]] || cmd+=(-f "$HOSTFILE")
fi
cmd+=(${launcher_args[@]+"${launcher_args[@]}"} "${bench_bin[@]}" "$@")

echo "# MASTER_ADDR=${MASTER_ADDR:-<127.0.0.1 on each rank>} MASTER_PORT=$MASTER_PORT" >&2
echo "# ${cmd[*]}" >&2
if [[ -n "${DRY_RUN:-}" && "${DRY_RUN}" != 0 ]]; then
    exit 0
fi
exec "${cmd[@]}"
