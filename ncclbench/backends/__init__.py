"""Backends: the small interface the timing engine and registry talk to.

A backend allocates buffers, runs each collective on (send, recv) views, times a
region on the device that runs the collectives, and moves small host objects between
ranks. The registry and the engine never import torch.cuda or cupy themselves."""

from __future__ import annotations

from ncclbench.errors import PlanError

BACKENDS = ("nccl", "gloo", "cupy")


def process_group_timeout(timeout_s: float):
    """The process group's own timeout: 30 s after ncclbench's per-size watchdog (-T), which
    names the size and the late rank; with -T 0 (no timeout, as in nccl-tests) one day."""
    from datetime import timedelta

    return timedelta(seconds=timeout_s + 30) if timeout_s > 0 else timedelta(days=1)


def create_backend(name: str, launch, timeout_s: float, stream_null: bool = False):
    """Start the backend for this rank; `launch` is a LaunchInfo, already consistent.
    `stream_null`: run on the legacy default stream instead of a stream of our own (-y)."""
    import torch  # noqa: F401 - every backend's first need; imported here so start-up can tell it apart

    from ncclbench import startup

    startup.mark("imported")
    if name in ("nccl", "gloo"):
        from ncclbench.backends.torch_dist import TorchBackend

        backend = TorchBackend(name, launch, timeout_s, stream_null)
    elif name == "cupy":
        from ncclbench.backends.cupy_nccl import CupyBackend

        backend = CupyBackend(launch, timeout_s, stream_null)
    else:
        raise PlanError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    startup.mark("backend_ready")
    return backend
