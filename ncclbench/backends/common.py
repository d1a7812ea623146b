"""What both backends share: the process group's timeout and store, a new group over every
rank, and the hypercube's exchange schedule. Both backend modules import this one; it
imports neither."""

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


def world_group(dist, name: str, nranks: int, timeout, device, channels: int | None = None):
    """A new process group over every rank on backend `name`, its NCCL communicator made now
    (bound to `device`) under the environment as it is; `channels`: its minCTAs = maxCTAs."""
    import inspect

    kwargs = {"timeout": timeout}
    if name == "nccl":
        if channels:
            options = dist.ProcessGroupNCCL.Options()
            options.config.min_ctas = channels
            options.config.max_ctas = channels
            kwargs["pg_options"] = options
        if "device_id" in inspect.signature(dist.new_group).parameters:
            kwargs["device_id"] = device  # created now, not at the first collective
    return dist.new_group(list(range(nranks)), backend=name, **kwargs)
