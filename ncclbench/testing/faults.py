"""Test-only fault injection, driven by NCCLBENCH_FAULT, so that the reliability paths
(wrong results, a dead rank, a stalled rank, a rank with another plan) run for real in
tests. Format: `<kind>:rank=R[,size=BYTES][,seconds=S]`, several joined by `;`; kinds corrupt |
corrupt_graph (under -G: one wrong element written by the check's CUDA graph itself) |
kill | kill_held (killed, its connections held open by a forked child for S seconds or until
its launcher is gone: its peers then wait inside the collective in C code, where no signal
handler runs, as NCCL's peers of a dead rank do on a GPU host; on gloo a plain kill closes
its sockets and its peers fail at once) | stall | error (a CUDA error
raised in the sweep) | plan | linger (sleep S seconds after the sweep, while the outcome is written) |
terms | ints (a burst of SIGTERMs or SIGINTs from another process, as the kernel's
parent-death signal comes once per exiting thread of a SIGKILLed launcher, and Ctrl-C comes
from the terminal and again from torchrun's agent) | term_at_start (one SIGTERM while the
report's header is written, before the sweep) | term_at_exit (one SIGTERM while the rank's
interpreter shuts down after its outcome is decided, as torchrun's agent sends to the ranks
left when one has died) | slow_device (every rank's timed duration
multiplied by factor=F, as a device slower than the host's issue rate looks; rank ignored) |
slow (`slow:rank=R,us=U`: the process of global rank R, that is torch.distributed's rank,
sleeps U microseconds after each op it issues on a group the Python API adopted, and in each
preflight pair exchange: a slow node).
Set-up failures on one rank only: no_gpu (the rank finds no GPU of its own) | device_fail (a
CUDA error while its device is set up) | device_stall (S seconds in it) | comm_fail (an error while the communicator starts) |
plan_fail (the free-memory check finds no memory free) | alloc_fail (the buffers cannot be
allocated, as when another process holds the memory).
`rank` is the engine's rank (in the Python API: the rank within the measured group), except
for `slow`. Unset in normal use; nothing here runs then."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "NCCLBENCH_FAULT"


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    size: int | None = None
    seconds: float = 3600.0
    factor: float = 1.0

    def applies(self, rank: int, size: int | None = None) -> bool:
        return rank == self.rank and (self.size is None or size is None or size >= self.size)


def active(*kinds: str, rank: int | None = None) -> Fault | None:
    """The first fault of one of `kinds` in NCCLBENCH_FAULT (faults separated by `;`); with
    `rank`, the first one for that rank (so that `error:rank=0;error:rank=1` plants both)."""
    for text in os.environ.get(ENV, "").split(";"):
        kind, _, rest = text.strip().partition(":")
        if kind in kinds:
            fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
            if rank is not None and int(fields.get("rank", 0)) != rank:
                continue
            seconds = float(fields["us"]) / 1e6 if "us" in fields else float(fields.get("seconds", 3600))
            return Fault(kind, int(fields.get("rank", 0)), int(fields["size"]) if "size" in fields else None,
                         seconds, float(fields.get("factor", 1)))
    return None


def before_size(rank: int, size: int) -> None:
    """Called before each size is measured."""
    f = active("kill", "kill_held", "stall", "terms", "ints", "error", rank=rank)
    if f is None or not f.applies(rank, size):
        return
    if f.kind in ("terms", "ints"):
        import subprocess

        # 20 signals as fast as a shell sends them (most merge into one pending signal), then
        # 30 a few milliseconds apart: repeats land while the first unwinds and the summary
        # is written
        name, pid = ("TERM" if f.kind == "terms" else "INT"), os.getpid()
        script = (f"for i in $(seq 20); do kill -{name} {pid} || exit 0; done; "
                  f"for i in $(seq 30); do sleep 0.003; kill -{name} {pid} || exit 0; done")
        subprocess.Popen(["sh", "-c", script],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)  # the sweep stops during this sleep (if not, the test sees the size after it)
    if f.kind == "error":
        raise RuntimeError("CUDA error: an illegal memory access was encountered (NCCLBENCH_FAULT error)")
    if f.kind == "kill_held":
        _hold_connections(f.seconds)
    if f.kind in ("kill", "kill_held"):
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "stall":
        time.sleep(f.seconds)


def _hold_connections(seconds: float) -> None:
    """Fork a child that keeps this process's sockets open after it dies, for up to
    `seconds` or until the process that launched this one is gone."""
    launcher = os.getppid()
    if os.fork() != 0:
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _running(launcher):
        time.sleep(0.2)
    os._exit(0)


def _running(pid: int) -> bool:
    """Whether `pid` runs: a launcher that has exited but is not yet reaped by whoever
    started it (a zombie) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def corrupt_output(rank: int, view, size: int) -> None:
    """Plant one wrong element in this rank's checked output (at sizes >= size= only)."""
    f = active("corrupt")
    if f is not None and f.applies(rank, size) and view.numel():
        _flip_middle_element(view)


def corrupt_in_graph(rank: int, view, size: int) -> None:
    """Called while the check's op is captured in a CUDA graph (-G), after the collective:
    the element is then made wrong by the graph's replay, which only a check that runs the
    graph can see (at sizes >= size= only)."""
    f = active("corrupt_graph")
    if f is not None and f.applies(rank, size) and view.numel():
        _flip_middle_element(view)


def _flip_middle_element(view) -> None:
    """Flip a high bit of the middle element, in place (a kernel, so capturable). Never a
    no-op in any type (adding 1 is one for a bfloat16 above 256), and far enough from the
    value that even avg's tolerance cannot absorb it."""
    import torch

    width = view.element_size()
    bits = view.view(-1).view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width])
    middle = bits.numel() // 2
    bits[middle: middle + 1].bitwise_xor_(1 << (8 * width - 3))


def plan_tweak(rank: int, fingerprint: dict) -> dict:
    """Fingerprint entries this rank changes in its own plan (to test the plan agreement)."""
    f = active("plan")
    if f is not None and f.applies(rank):
        return {"max_bytes": fingerprint["max_bytes"] * 2}
    return {}


def after_sweep(rank: int) -> None:
    """Called once the sweep has ended, before its outcome is written."""
    f = active("linger")
    if f is not None and f.applies(rank):
        time.sleep(f.seconds)


def after_report(rank: int) -> None:
    """Called once the report has begun (rank 0's header printed, JSON 'running'), before
    the sweep."""
    f = active("term_at_start")
    if f is not None and f.applies(rank):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # a handler that raises does so here


class _TermAtExit:
    """Held in a module global: its __del__ runs when the interpreter clears modules, after
    Python has put back the default signal handlers."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)


_at_exit = []


def after_outcome(rank: int) -> None:
    """Called once the rank's outcome is decided and written (term_at_exit)."""
    f = active("term_at_exit")
    if f is not None and f.applies(rank):
        _at_exit.append(_TermAtExit())


def device_time_factor() -> float:
    """What the timed (device) durations are multiplied by (slow_device)."""
    f = active("slow_device")
    return f.factor if f is not None else 1.0


def device_setup(launch) -> None:
    """Called before this rank sets up its device."""
    f = active("device_stall")
    if f is not None and f.applies(launch.rank):
        time.sleep(f.seconds)
    f = active("no_gpu")
    if f is not None and f.applies(launch.rank):
        from ncclbench.backends.torch_dist import gpu_for_rank

        gpu_for_rank(launch, 0)  # the real check, as on a node where no GPU is visible
    f = active("device_fail")
    if f is not None and f.applies(launch.rank):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (NCCLBENCH_FAULT device_fail)")


def communicator_setup(rank: int) -> None:
    """Called before this rank starts its communicator."""
    f = active("comm_fail")
    if f is not None and f.applies(rank):
        raise RuntimeError("NCCL error: unhandled system error (NCCLBENCH_FAULT comm_fail)")


def free_memory(rank: int, free: int | None) -> int | None:
    """The free device memory this rank's check sees (plan_fail: none)."""
    f = active("plan_fail")
    return 0 if f is not None and f.applies(rank) else free


def before_alloc(rank: int, nbytes: int) -> None:
    """Called before this rank allocates its buffers."""
    f = active("alloc_fail")
    if f is not None and f.applies(rank):
        raise RuntimeError(f"out of memory: tried to allocate {nbytes} bytes (NCCLBENCH_FAULT alloc_fail)")


def op_delay(global_rank: int) -> float:
    """Seconds this process sleeps after each op it issues (`slow`), 0.0 without the fault."""
    f = active("slow")
    return f.seconds if f is not None and f.applies(global_rank) else 0.0


def slowed(bind, delay_s: float, synchronize):
    """`bind` (a backend's op binder) whose ops wait for the device and then sleep `delay_s`:
    work this rank adds to every op, as a slow node does. Only installed when `slow` is set,
    so the measured path of a normal run has no trace of it."""
    def slow_bind(*args, **kwargs):
        call = bind(*args, **kwargs)

        def slow_call():
            call()
            synchronize()
            time.sleep(delay_s)
        return slow_call
    return slow_bind
