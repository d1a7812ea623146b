"""Whether this host can hold the ranks a command would start on it, asked before any starts.

A rank's resident memory is estimated as IDLE_RANK_BYTES plus, on gloo (buffers in host
memory), its send and receive buffers, CHECK_COPIES times with the check on (the inputs and
expected values it builds). The sum over the ranks started here must fit what the kernel
calls available (MemAvailable, and a cgroup's limit where one is set) less RESERVE_BYTES; a
request that cannot fit ends in one line with exit 5, as too many GPUs does, instead of
starting ranks the kernel's out-of-memory killer ends (taking other jobs' processes along).
GPU memory is checked by each rank as before (engine.rankrunner.validate). How the constants
were measured: docs/design/memory-fit.md."""

from __future__ import annotations

import os

from ncclbench.errors import ExitCode, PlanError

IDLE_RANK_BYTES = 256 << 20   # 237 MiB measured, rounded up
CHECK_COPIES = 3.2            # (636 - 237) / 128 MiB = 3.1, rounded up
RESERVE_BYTES = 512 << 20     # left to the rest of the host


def _gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):.0f} MiB"


def available_bytes() -> int | None:
    """MemAvailable, or less where this process's cgroup (v2) allows less; None when unknown."""
    found = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                room = int(limit) - int(f.read().strip())
            found = room if found is None else min(found, room)
    except (OSError, ValueError):
        pass
    return found


def rank_bytes(plans, nranks: int, backend: str) -> int:
    """Estimated resident memory of one rank running `plans` in a world of `nranks`."""
    if backend in ("nccl", "cupy"):
        return IDLE_RANK_BYTES  # the buffers are on the GPU
    largest = 0
    for plan in plans:
        send, recv = plan.buffer_bytes(nranks)
        largest = max(largest, int((send + recv) * (CHECK_COPIES if plan.check else 1)))
    return IDLE_RANK_BYTES + largest


def check_host_capacity(plans, local_ranks: int, world_ranks: int, backend: str,
                        available: int | None = None) -> list[str]:
    """PlanError (exit 5) when `local_ranks` ranks of `plans` cannot fit this host's memory;
    else the warnings to print (gloo ranks beyond the CPUs)."""
    available = available_bytes() if available is None else available
    per_rank = rank_bytes(plans, world_ranks, backend)
    if available is not None and local_ranks * per_rank > available - RESERVE_BYTES:
        fit = max(0, (available - RESERVE_BYTES) // per_rank)
        raise PlanError(f"{local_ranks} ranks need about {_gib(local_ranks * per_rank)} of host memory "
                        f"({_gib(per_rank)} each: {_gib(IDLE_RANK_BYTES)} per idle rank plus its buffers) but "
                        f"{_gib(available)} is available; at most {fit} fit (lower -g or -e)",
                        ExitCode.BAD_GPU_COUNT)
    warnings = []
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if backend == "gloo" and local_ranks > cpus:
        warnings.append(f"warning: {local_ranks} gloo ranks on {cpus} CPU(s): ranks share cores, so the times "
                        "measure the scheduler as much as the collective")
    return warnings
