"""Named failpoints: the places where a test makes a run fail, stall, lie or slow down, so
that the reliability paths (wrong results, a dead, stalled or slow rank, a rank with
another plan, set-up failures) run for real in real processes.

Production code reaches a failpoint by name, with what it knows there as keywords:

    failpoint("engine.before_size", rank=r, size=s)
    free = failpoint("engine.free_memory", free, rank=r)

The optional positional value is handed back, or what a planted action replaced it with
(a free-memory figure, a plan fingerprint, a device-time factor, an op binder to slow).
Nothing is planted in normal use: a failpoint then costs one dictionary lookup, and none
is reached inside a timed region.

What is planted is read once per process, on first use, from three environment variables
(reset() reads them again, for a test that changes them in its own process):

NCCLBENCH_FAULT  `<kind>:rank=R[,size=BYTES][,seconds=S][,us=U][,factor=F]`, several
    joined by `;`, each acting on its own. `rank` is the engine's rank (in the Python API:
    the rank within the measured group), except for `slow`; `size`: at that size and above.
NCCLBENCH_FAULT_ITEM  with NCCLBENCH_FAULT: only inside the tune item of this name.
NCCLBENCH_PAIRS_SLOW  `R[,R...][:SECONDS]`: those ranks sleep SECONDS (0.1) after every
    pair exchange.

docs/failpoints.md lists each kind, the failpoint it plants at and what it does there."""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

ENV = "NCCLBENCH_FAULT"
STAMP_ENV = "NCCLBENCH_FAULT_STAMP"  # a folder: each fault that acts writes when it did (tests time from it)
ITEM_ENV = "NCCLBENCH_FAULT_ITEM"
PAIRS_SLOW_ENV = "NCCLBENCH_PAIRS_SLOW"
PAIRS_SLOW_SECONDS = 0.1

Action = Callable[["Plant", object, dict], object]  # (plant, value, context) -> the value handed back


@dataclass(frozen=True)
class Plant:
    """One planted fault: where it acts, on which rank and sizes, and what it does."""

    kind: str
    action: Action
    rank: int | None = None       # None: every rank
    rank_key: str = "rank"        # the context entry `rank` is compared with
    size: int | None = None       # at this size and above
    seconds: float = 3600.0
    factor: float = 1.0
    item: str | None = None       # only inside this tune item (outside every item too)
    at: int = 1                   # gpu_stall: before this timed iteration (from 1) of the size

    def matches(self, context: dict) -> bool:
        if self.rank is not None and context.get(self.rank_key) != self.rank:
            return False
        size = context.get("size")
        if self.size is not None and size is not None and size < self.size:
            return False
        return self.item is None or context.get("item", self.item) == self.item


_planted: dict[str, list[Plant]] | None = None
_armed: dict[str, Plant] = {}  # plants waiting at a later point (arm), taken once there (armed)
_scope: dict = {}  # context every failpoint gets meanwhile (within())


def failpoint(name: str, value=None, /, **context):
    """Reach failpoint `name`: what is planted there acts, in the order planted; returns
    `value`, or what an action replaced it with."""
    planted = (_planted if _planted is not None else _load()).get(name)
    if not planted:
        return value
    context = dict(_scope, **context)
    for plant in planted:
        if plant.matches(context):
            value = plant.action(plant, value, context)
    return value


def armed(name: str, **context) -> Plant | None:
    """The plant an earlier failpoint left for point `name` (the arm action), taken: where a
    failpoint's own call would cost too much (inside a timed loop), the code asks once before."""
    if not _armed:
        return None
    plant = _armed.get(name)
    if plant is None or not plant.matches(dict(_scope, **context)):
        return None
    return _armed.pop(name)


@contextmanager
def within(**context):
    """Every failpoint reached meanwhile also gets `context` (tune: the item's name)."""
    saved = dict(_scope)
    _scope.update(context)
    try:
        yield
    finally:
        _scope.clear()
        _scope.update(saved)


def reset() -> None:
    """Read the environment again at the next failpoint."""
    global _planted
    _planted = None
    _armed.clear()


def _load() -> dict[str, list[Plant]]:
    global _planted
    planted: dict[str, list[Plant]] = {}
    for name, plant in parse(os.environ.get(ENV), os.environ.get(ITEM_ENV)) + parse_pairs_slow(
            os.environ.get(PAIRS_SLOW_ENV)):
        planted.setdefault(name, []).append(plant)
    _planted = planted
    return planted


FIELDS = {"rank", "size", "seconds", "us", "factor", "at"}  # of a NCCLBENCH_FAULT entry


def parse(text: str | None, item: str | None = None) -> list[tuple[str, Plant]]:
    """NCCLBENCH_FAULT's text -> (failpoint name, plant) for each fault, in order."""
    out = []
    for part in (text or "").split(";"):
        kind, _, rest = part.strip().partition(":")
        if not kind:
            continue
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
        fields = dict(field.split("=", 1) for field in rest.split(",") if "=" in field)
        unknown = sorted(set(fields) - FIELDS) + [f for f in rest.split(",") if f.strip() and "=" not in f]
        if unknown:  # a misspelt rank= would plant the fault on rank 0
            raise ValueError(f"{ENV}: unknown field(s) {', '.join(unknown)} in {part.strip()!r}; "
                             f"known: {', '.join(sorted(FIELDS))}")
        try:
            rank, size = int(fields.get("rank", 0)), int(fields["size"]) if "size" in fields else None
            seconds = float(fields["us"]) / 1e6 if "us" in fields else float(fields.get("seconds", 3600))
            factor = float(fields.get("factor", 1))
            at = int(fields.get("at", 1))
            if at < 1:
                raise ValueError(f"at={at}: timed iterations count from 1")
        except ValueError as e:
            raise ValueError(f"{ENV}: {part.strip()!r}: {e} (sizes in bytes, times as numbers)") from None
        for name, action, rank_key in KINDS[kind]:
            out.append((name, Plant(kind, action, rank=rank if rank_key else None, rank_key=rank_key or "rank",
                                    size=size, seconds=seconds, factor=factor, item=item, at=at)))
    return out



def parse_pairs_slow(text: str | None) -> list[tuple[str, Plant]]:
    """NCCLBENCH_PAIRS_SLOW 'R[,R...][:SECONDS]' -> one plant per rank at pairs.exchange."""
    if not text or not text.strip():
        return []
    ranks_text, _, seconds_text = text.strip().partition(":")
    try:
        ranks = sorted({int(r) for r in ranks_text.split(",") if r.strip()})
        seconds = float(seconds_text) if seconds_text else PAIRS_SLOW_SECONDS
    except ValueError:
        raise ValueError(f"{PAIRS_SLOW_ENV}={text!r}: expected RANK[,RANK...][:SECONDS]") from None
    return [("pairs.exchange", Plant("pairs_slow", slowed_call, rank, seconds=seconds)) for rank in ranks]


# ---------------------------------------------------------------------------
# The actions, each (plant, value, context) -> the value handed back
# ---------------------------------------------------------------------------

def raising(message: str) -> Action:
    """Raise RuntimeError(message), its {fields} filled from the context."""
    def act(_plant, _value, context):
        raise RuntimeError(message.format(**context))
    return act


def sleep(plant: Plant, value, _context):
    time.sleep(plant.seconds)
    return value


GPU_SLEEP_HZ = 2.0e9  # cycles a second for gpu_sleep: at or above these GPUs' clocks, so it lasts at least S


def stamp(plant: Plant) -> None:
    """With NCCLBENCH_FAULT_STAMP set: note in that folder when `plant` acted (wall clock),
    so that a test times what follows from the fault itself, not from the launch."""
    folder = os.environ.get(STAMP_ENV)
    if folder:
        try:
            with open(os.path.join(folder, f"{plant.kind}.{os.getpid()}"), "w") as f:
                f.write(repr(time.time()))
        except OSError:
            pass


def gpu_sleep(plant: Plant, value, _context):
    """A kernel that spins for at least `seconds` queued on the current CUDA stream, which the
    collectives follow: the host goes on, the GPU reaches the next op only when it ends (a
    GPU that never reaches the operation while its process runs). Nothing on the CPU."""
    import torch

    if torch.cuda.is_available():
        stamp(plant)
        torch.cuda._sleep(int(plant.seconds * GPU_SLEEP_HZ))
    return value


def arm(target: str) -> Action:
    """Leave the plant for point `target`, which takes it once (armed())."""
    def act(plant, value, _context):
        _armed[target] = plant
        return value
    return act


def kill(_plant, _value, _context):
    os.kill(os.getpid(), signal.SIGKILL)


def freeze(_plant, value, _context):
    """Stopped by SIGSTOP (state T) at a chosen size, as `kill -STOP` from outside would stop
    it, but at a known point of the sweep."""
    os.kill(os.getpid(), signal.SIGSTOP)
    return value


def in_kernel(plant: Plant, value, _context):
    """This thread waits inside the kernel (state D, as in a driver call that does not return)
    for `seconds`: it starts a vfork child that sleeps in libc on a stack of its own, and a
    vfork parent waits in the kernel until that child ends. The child starts with every
    signal blocked, so only SIGKILL cuts the wait short (signals to the process wait, as they
    do for a real one); a watcher process of its own session ends the child at `seconds` or
    as soon as this process is gone. The process's other threads run on. Linux only, glibc
    2.25 or later (older ones cache the process id in memory the child shares)."""
    import ctypes
    import subprocess
    import sys

    libc = ctypes.CDLL(None, use_errno=True)
    libc.clone.restype = ctypes.c_int
    libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    stack = ctypes.create_string_buffer(256 << 10)
    top = (ctypes.addressof(stack) + len(stack) - 256) & ~15
    clone_vm, clone_vfork = 0x100, 0x4000
    sleep = ctypes.cast(libc.sleep, ctypes.c_void_p).value  # sleep(seconds): its one argument is clone's arg
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    watcher = subprocess.Popen([sys.executable, "-c", "import sys; from ncclbench.failpoints import watch_in_kernel; "
                                "watch_in_kernel(int(sys.argv[1]), float(sys.argv[2]))", str(os.getpid()),
                                str(plant.seconds)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:  # the child's own sleep ends it if the watcher is gone
        child = libc.clone(sleep, top, clone_vm | clone_vfork | signal.SIGCHLD, int(plant.seconds) + 2)
        err = ctypes.get_errno()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if child < 0:
        watcher.kill()
        watcher.wait()
        raise OSError(err, f"NCCLBENCH_FAULT in_kernel: clone failed: {os.strerror(err)}")
    try:
        os.waitpid(child, 0)
    except ChildProcessError:  # SIGCHLD ignored: the kernel reaped it
        pass
    try:
        watcher.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watcher.kill()
    return value


def watch_in_kernel(rank: int, seconds: float) -> None:
    """in_kernel's watcher (a process of its own): finds the rank's vfork child (its child
    with the rank's command line: they share one address space) and SIGKILLs it at `seconds`
    or once the rank is gone; returns when the child has ended, or when none came within 10 s."""
    from ncclbench import procs

    def read(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def parent(pid):
        text = read(f"/proc/{pid}/stat")
        return int(text.rsplit(b")", 1)[1].split()[1]) if text else None

    cmdline, child, start = read(f"/proc/{rank}/cmdline"), None, time.monotonic()
    while True:
        now = time.monotonic() - start
        if child is None:
            child = next((int(n) for n in os.listdir("/proc") if n.isdigit() and parent(n) == rank
                          and read(f"/proc/{n}/cmdline") == cmdline), None)
            if child is None and (now > 10 or not procs.alive(rank)):
                return
        elif not procs.alive(child):
            return
        elif now >= seconds or not procs.alive(rank):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.1)


def kill_held(plant: Plant, value, context):
    """Killed, its connections held open by a forked child for `seconds` or until the
    launcher is gone: its peers then wait inside the collective in C code, where no signal
    handler runs, as NCCL's peers of a dead rank do on a GPU host (on gloo a plain kill
    closes its sockets and its peers fail at once)."""
    _hold_connections(plant.seconds)
    return kill(plant, value, context)


def _hold_connections(seconds: float) -> None:
    from ncclbench import procs

    launcher = os.getppid()
    if os.fork() != 0:
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and procs.alive(launcher):
        time.sleep(0.2)
    os._exit(0)


def signal_burst(name: str) -> Action:
    """A burst of SIG`name` from another process, as the kernel's parent-death signal comes
    once per exiting thread of a SIGKILLed launcher, and Ctrl-C from the terminal and again
    from torchrun's agent."""
    def act(_plant, value, _context):
        import subprocess

        # 20 signals as fast as a shell sends them (most merge into one pending signal), then
        # 30 a few milliseconds apart: repeats land while the first unwinds and the summary
        # is written
        pid = os.getpid()
        script = (f"for i in $(seq 20); do kill -{name} {pid} || exit 0; done; "
                  f"for i in $(seq 30); do sleep 0.003; kill -{name} {pid} || exit 0; done")
        subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)  # the sweep stops during this sleep (if not, the test sees the size after it)
        return value
    return act


def terminate(_plant, value, _context):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # a handler that raises does so here
    return value


class _TermAtExit:
    """Held in a module global: its __del__ runs when the interpreter clears modules, after
    Python has put back the default signal handlers."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)


_at_exit: list[_TermAtExit] = []


def terminate_at_exit(_plant, value, _context):
    _at_exit.append(_TermAtExit())
    return value


def corrupt(_plant, value, context):
    """Flip a high bit of the middle element of the context's `view`, in place (a kernel,
    so capturable in a CUDA graph). Never a no-op in any type (adding 1 is one for a
    bfloat16 above 256), and far enough from the value that even avg's tolerance cannot
    absorb it."""
    view = context["view"]
    if view.numel():
        import torch

        width = view.element_size()
        bits = view.view(-1).view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width])
        middle = bits.numel() // 2
        bits[middle: middle + 1].bitwise_xor_(1 << (8 * width - 3))
    return value


def replacing(make: Callable[[Plant, object], object]) -> Action:
    """Hand back make(plant, value) instead of the value."""
    return lambda plant, value, _context: make(plant, value)


def calling(key: str, *args) -> Action:
    """Call the context's `key` with `args`: the real check, fed what the fault pretends."""
    def act(_plant, value, context):
        context[key](*args)
        return value
    return act


def slowed_call(plant: Plant, call, context):
    """`call`, waiting for the device (the context's `synchronize`) and then `seconds` after
    each time it runs: work this rank adds, as a slow node does."""
    synchronize = context["synchronize"]

    def slow_call(*args, **kwargs):
        out = call(*args, **kwargs)
        synchronize()
        time.sleep(plant.seconds)
        return out
    return slow_call


def slowed_binder(plant: Plant, bind, context):
    """`bind` (a backend's op binder) whose bound ops are each slowed_call."""
    return lambda *args, **kwargs: slowed_call(plant, bind(*args, **kwargs), context)


# kind -> (failpoint, action, the context entry its rank is, or None for every rank)
KINDS: dict[str, tuple[tuple[str, Action, str | None], ...]] = {
    "kill": (("engine.before_size", kill, "rank"),),
    "kill_held": (("engine.before_size", kill_held, "rank"),),
    "freeze": (("engine.before_size", freeze, "rank"),),
    "in_kernel": (("engine.before_size", in_kernel, "rank"),),
    "late_timeout": (("engine.watchdog_fires", sleep, "rank"),),
    "stall": (("engine.before_size", sleep, "rank"),),
    "pair_stall": (("fleet.pair", sleep, "rank"),),
    "gpu_sleep": (("engine.before_size", gpu_sleep, "rank"),),
    "gpu_stall": (("engine.before_size", arm("timing.loop"), "rank"),),
    "gpu_stall_connect": (("engine.before_connect", gpu_sleep, "rank"),),
    "terms": (("engine.before_size", signal_burst("TERM"), "rank"),),
    "ints": (("engine.before_size", signal_burst("INT"), "rank"),),
    "error": (("engine.before_size", raising(
        "CUDA error: an illegal memory access was encountered (NCCLBENCH_FAULT error)"), "rank"),),
    "corrupt": (("engine.check_output", corrupt, "rank"),),
    "corrupt_graph": (("engine.check_in_graph", corrupt, "rank"),),
    "plan": (("engine.plan_fingerprint", replacing(lambda _p, fp: dict(fp, max_bytes=fp["max_bytes"] * 2)),
              "rank"),),
    "plan_fail": (("engine.free_memory", replacing(lambda _p, _free: 0), "rank"),),
    "alloc_fail": (("engine.alloc", raising(
        "out of memory: tried to allocate {nbytes} bytes (NCCLBENCH_FAULT alloc_fail)"), "rank"),),
    "term_at_start": (("engine.after_report", terminate, "rank"),),
    "linger": (("engine.after_sweep", sleep, "rank"),),
    "term_at_exit": (("engine.after_outcome", terminate_at_exit, "rank"),),
    "slow_device": (("timing.device_time_factor", replacing(lambda plant, _factor: plant.factor), None),),
    "device_stall": (("backend.device_setup", sleep, "rank"),),
    "device_freeze": (("backend.device_setup", freeze, "rank"),),
    "no_gpu": (("backend.device_setup", calling("find_gpu", 0), "rank"),),
    "device_fail": (("backend.device_setup", raising(
        "CUDA error: an illegal memory access was encountered (NCCLBENCH_FAULT device_fail)"), "rank"),),
    "comm_fail": (("backend.communicator_setup", raising(
        "NCCL error: unhandled system error (NCCLBENCH_FAULT comm_fail)"), "rank"),),
    "capture_fail": (("timing.capture", raising(
        "operation not permitted when stream is capturing (NCCLBENCH_FAULT capture_fail)"), "rank"),),
    "slow": (("backend.bind", slowed_binder, "global_rank"), ("pairs.exchange", slowed_call, "global_rank"),
             ("fleet.node_op", slowed_call, "global_rank")),
}
