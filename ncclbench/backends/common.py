"""What both backends share: the process group's timeout and store, and the hypercube's
exchange schedule. Both backend modules import this one; it imports neither."""

from __future__ import annotations


def process_group_timeout(timeout_s: float):
    """The process group's own timeout: 30 s after ncclbench's per-size watchdog (-T), which
    names the size and the late rank; with -T 0 (no timeout, as in nccl-tests) one day."""
    from datetime import timedelta

    return timedelta(seconds=timeout_s + 30) if timeout_s > 0 else timedelta(days=1)


def process_group_store(store):
    """The store init_process_group would make of the rendezvous (same key prefix)."""
    if store is None:
        return {}
    import torch.distributed as dist

    return {"store": dist.PrefixStore("default_pg", store)}


def hypercube_schedule(nranks: int, rank: int) -> list[tuple[int, int, int]]:
    """(peer, first chunk sent, first chunk received) per step; each step moves `step` chunks."""
    steps, step = [], 1
    while step < nranks:
        peer = rank ^ step
        steps.append((peer, (rank // step) * step, (peer // step) * step))
        step *= 2
    return steps
