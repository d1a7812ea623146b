"""The backend contract: what the engine, the API and the tools call on a backend. Both
backends (torch_dist.TorchBackend for nccl and gloo, cupy_nccl.CupyBackend) satisfy it;
tests/test_registry.py compares their methods and signatures with this one.

A backend is made by `create_backend` as `cls(name, launch, timeout_s, stream_null,
device=..., store=...)` after `cls.prepare_device(name, launch, stream_null)`.

Collectives take typed 1-D views (send, recv) and issue one op on the backend's stream;
each registry entry (ncclbench.engine.collectives) says which of these methods it calls and
with what. Adding a collective that needs a new kind of call adds a method here and in
each backend."""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol


class Backend(Protocol):
    name: str              # nccl | gloo | cupy: the capabilities (capabilities.py) that apply
    rank: int              # in the world
    nranks: int
    group_rank: int        # in this rank's communicator (--split groups; the world without)
    group_size: int
    group_index: int
    device: Any            # torch.device the buffers live on
    control: Any           # the process group host-side messages go over (None: the world's)
    dist: Any              # torch.distributed, for the tools that exchange beside the benchmark
    torch: Any

    @staticmethod
    def prepare_device(name: str, launch, stream_null: bool = False) -> Any:
        """This rank's device, made current (the part of the set-up that needs no peer)."""

    # ---- communicators ----------------------------------------------------------------
    def use_groups(self, groups: list[list[int]]) -> None:
        """Run the collectives inside this rank's group of `groups` (world ranks)."""

    def renew_communicator(self, channels: int | None = None) -> None:
        """A fresh communicator over every rank (tune: NCCL reads NCCL_ALGO/PROTO at init)."""

    # ---- description ------------------------------------------------------------------
    @property
    def is_gpu(self) -> bool: ...

    def timing_name(self) -> str: ...

    def library_version(self) -> tuple[int, str]:
        """(nccl-tests style code such as 22809, human text)."""

    def device_info(self) -> dict: ...

    # ---- memory -----------------------------------------------------------------------
    def alloc_bytes(self, nbytes: int) -> Any: ...

    def prepare_registration(self, mode: int) -> str | None:
        """-R: get ready to register the buffers allocated next; a header note when it cannot."""

    def register_buffers(self) -> str | None: ...

    def deregister_buffers(self) -> None: ...

    def memory_usage(self, peak: bool = False) -> dict: ...

    def free_memory(self) -> int | None: ...

    # ---- collectives ------------------------------------------------------------------
    def all_reduce(self, send, recv, op: str) -> None: ...

    def broadcast(self, send, recv, root: int) -> None: ...

    def reduce(self, send, recv, op: str, root: int) -> None: ...

    def all_gather(self, send, recv) -> None: ...

    def reduce_scatter(self, send, recv, op: str) -> None: ...

    def alltoall(self, send, recv) -> None: ...

    def gather(self, send, recv, root: int) -> None: ...

    def scatter(self, send, recv, root: int) -> None: ...

    def alltoallv(self, send, recv, layout) -> None: ...

    def sendrecv(self, send, recv) -> None: ...

    def hypercube(self, send, recv) -> None: ...

    def bind(self, coll, send, recv, op, root, layout) -> Callable[[], None]:
        """A zero-argument call issuing the registry entry `coll`'s op on these buffers, as
        cheaply as the backend can (the eager timed loop calls it `iters` times)."""

    def op_group(self, coll_name: str) -> tuple[Callable[[], ContextManager] | None, str | None]:
        """-m: (factory of a context that puts the ops issued in it in one group, or None;
        a one-line reason when None)."""

    # ---- timing -----------------------------------------------------------------------
    def markers(self, n: int) -> list: ...

    def mark(self, marker) -> Any: ...

    def reached(self, mark) -> bool | None:
        """Whether the device has passed `mark`, without waiting and from any thread (a
        hang's census reads how far each device got); None where it cannot tell."""

    def elapsed(self, start, end) -> float:
        """Seconds between two marks (after synchronize())."""

    def synchronize(self) -> None: ...

    def hold(self, seconds: float) -> None:
        """Keep the device busy at least `seconds` on the collectives' stream (nothing on the CPU)."""

    def capture(self, issue_ops: Callable[[], None], empty_ok: bool = False) -> Callable[[], None]:
        """Capture `issue_ops()` in a CUDA graph; a function that replays it. `empty_ok`: the
        ops move nothing (0 B), so the graph is rightly empty."""

    def release_graphs(self) -> None: ...

    # ---- host side --------------------------------------------------------------------
    def barrier(self) -> None: ...

    def all_gather_object(self, obj) -> list:
        """Every rank's small host object, in rank order."""

    def close(self) -> None: ...

    def abort(self) -> None:
        """End the communicators now, from any thread (a peer died inside a collective)."""
