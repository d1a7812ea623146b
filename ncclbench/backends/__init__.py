"""Backends: the small interface the timing engine and registry talk to.

A backend allocates buffers, runs each collective on (send, recv) views, times a
region on the device that runs the collectives, and moves small host objects between
ranks: the contract is written in `protocol.py`, what each backend can run in
`capabilities.py`. The registry and the engine never import torch.cuda or cupy themselves."""

from __future__ import annotations

from ncclbench.backends.capabilities import BACKENDS
from ncclbench.backends.common import process_group_timeout
from ncclbench.errors import PlanError


def create_backend(name: str, launch, timeout_s: float, stream_null: bool = False, guard=None):
    """Start the backend for this rank; `launch` is a LaunchInfo, already consistent.
    `stream_null`: run on the legacy default stream instead of a stream of our own (-y).
    `guard(store)`, when given, is called with the rendezvous store (torch's env://
    rendezvous, made first, before any device work) and returns `run(step, what, fn)`,
    which runs each set-up step that can fail on some ranks only (the GPU, the
    communicator) so that every rank learns how it went on the others."""
    import torch  # noqa: F401 - every backend's first need; imported here so start-up can tell it apart

    from ncclbench import startup
    from ncclbench.topology import nccldebug

    if name != "gloo":
        nccldebug.arm()  # NCCL's log on (unless the user set it), so that its path can be read

    startup.mark("imported")
    if name in ("nccl", "gloo"):
        from ncclbench.backends.torch_dist import TorchBackend as backend_class
    elif name == "cupy":
        from ncclbench.backends.cupy_nccl import CupyBackend as backend_class
    else:
        raise PlanError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if guard is None:
        backend = backend_class(name, launch, timeout_s, stream_null)
        startup.mark("backend_ready")
        return backend
    from ncclbench.backends.torch_dist import gpu_for_rank
    from ncclbench.failpoints import failpoint

    store = meeting_store(launch, timeout_s)
    run = guard(store)

    def device():
        failpoint("backend.device_setup", rank=launch.rank, find_gpu=lambda visible: gpu_for_rank(launch, visible))
        return backend_class.prepare_device(name, launch, stream_null)

    def communicator():
        failpoint("backend.communicator_setup", rank=launch.rank)
        return backend_class(name, launch, timeout_s, stream_null, device=dev, store=store)

    dev = run("device", "setting up the device", device)
    backend = run("communicator", f"starting the {name} communicator", communicator)
    startup.mark("backend_ready")
    return backend


def meeting_store(launch, timeout_s: float):
    """torch's env:// rendezvous (MASTER_ADDR/MASTER_PORT), as init_process_group makes it,
    done before the backend so that a rank whose GPU set-up fails can say so to the others."""
    import torch.distributed as dist

    timeout = process_group_timeout(timeout_s)
    store, _rank, _size = next(dist.rendezvous("env://", launch.rank, launch.world_size, timeout=timeout))
    store.set_timeout(timeout)
    return store
