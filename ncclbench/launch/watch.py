"""A watcher outside each launched rank's process, so that a job that has ended (a -T verdict
named the rank that hung, or the ranks gave up) leaves no process behind on any host.

A rank stopped by a signal (state T) takes nothing but SIGKILL, and a rank alone on its host
has no host mate to send it: its launcher (torchrun's agent, srun, mpirun, ncclbench's own
across nodes) waits for it, or sends a SIGTERM that stays pending. Threads of the rank stop
with it. So each rank starts, as it begins (`start`), a small process of its own (no torch)
that listens on a TCP port; the rank registers that address in the rendezvous store with its
progress (engine.watchdog), and the rank that decides a timeout tells every registered watcher
once its verdict is out (`tell`). A watcher told so ends its rank with SIGKILL at once if the
rank is stopped or stuck in the kernel, else after GRACE_S if it is still there (it normally
leaves on its own), and says on its host's stderr which rank it ended and why. A watcher
ends as soon as its rank ends, and ignores the stop signals a launcher sends to a process
group: it never outlives its rank by more than POLL_S. A host frozen whole (its watcher
stopped too) or cut off from the network is out of its reach."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time

from ncclbench import procs

REGISTRY_KEY = "ncclbench/watch/{rank}"
GRACE_S = 10.0     # after the news: how long a rank that still runs gets to leave on its own
POLL_S = 0.25      # how often the watcher looks whether its rank is still there
TELL_S = 1.5       # how long telling all watchers may take (a host whose network is gone never answers)
ENV = "NCCLBENCH_WATCH"  # "0": start no watcher (a test of what happens without one)

TOKEN_ENV = "NCCLBENCH_WATCH_TOKEN"  # how the watcher gets its token (not on its command line)
_address: tuple[int, int, str] | None = None  # (port, watcher pid, token) of this rank's watcher


def start(rank: int) -> None:
    """Start this rank's watcher (once per process). Best effort: a rank without one runs
    as before."""
    global _address
    if _address is not None or os.environ.get(ENV) == "0" or not sys.platform.startswith("linux"):
        return
    import subprocess

    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("0.0.0.0", 0))
        listener.listen(16)
    except OSError:
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    token = os.urandom(16).hex()  # news must carry it: who reads the store may end ranks, nobody else
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               **{TOKEN_ENV: token})
    try:
        child = subprocess.Popen(
            [sys.executable, "-S", "-c", "import sys; from ncclbench.launch.watch import serve; "
             "serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))",
             str(listener.fileno()), str(os.getpid()), str(rank)],
            env=env, pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            close_fds=True)
    except OSError:
        return
    finally:
        port = listener.getsockname()[1]
        listener.close()
    _address = (port, child.pid, token)


def registration(master_addr: str | None = None) -> str | None:
    """`ip:port|watcher pid|host|token` for the store: the address this host is reached at from the
    rendezvous host (the interface its route there leaves by); None without a watcher."""
    if _address is None:
        return None
    target = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    ip = "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # a UDP connect sends nothing: it only picks the route
            ip = probe.getsockname()[0]
    except OSError:
        pass
    return f"{ip}:{_address[0]}|{_address[1]}|{socket.gethostname()}|{_address[2]}"


def register(store, rank: int) -> None:
    """Put this rank's watcher in the store (nothing without one)."""
    entry = registration()
    if entry is not None and store is not None:
        try:
            store.set(REGISTRY_KEY.format(rank=rank), entry)
        except Exception:  # noqa: BLE001 - a diagnostic aid: never a failure of the run
            pass


def registered(store, ranks) -> dict[int, tuple[str, int, str]]:
    """rank -> (ip, port, token) of the watchers of `ranks` in the store (the ranks without
    one left out)."""
    out: dict[int, tuple[str, int, str]] = {}
    for r in ranks:
        key = REGISTRY_KEY.format(rank=r)
        try:
            if not store.check([key]):
                continue
            fields = store.get(key).decode(errors="replace").split("|")
        except Exception:  # noqa: BLE001 - the store went away: the ones read so far
            break
        ip, _, port = fields[0].rpartition(":")
        if ip and port.isdigit() and len(fields) >= 4:
            out[r] = (ip, int(port), fields[3])
    return out


def tell(watchers: dict, why: str, culprits=(), seconds: float = TELL_S) -> list[int]:
    """Tell each watcher (rank -> (ip, port, token)) that the job has ended, with `why` (the
    verdict's line) and the ranks it named; the ranks whose watcher took it, within `seconds`
    in all (each in a thread of its own: a host whose network is gone holds only its own)."""
    reached: list[int] = []

    def one(rank, addr):
        ip, port, token = addr
        message = json.dumps({"why": why, "culprits": sorted(culprits), "token": token}) + "\n"
        try:
            with socket.create_connection((ip, port), timeout=seconds) as conn:
                conn.sendall(message.encode())
            reached.append(rank)
        except OSError:
            pass

    threads = [threading.Thread(target=one, args=(r, a), name="ncclbench-tell", daemon=True)
               for r, a in sorted(watchers.items())]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return sorted(reached)


# ---- the watcher process -----------------------------------------------------------------------
def serve(fd: int, rank_pid: int, rank: int) -> None:
    """The watcher: wait for the news on the listening socket `fd` while rank `rank` (process
    `rank_pid`, this process's parent) runs; end it as the module says once told."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a launcher's signal to the group is for the rank
    listener = socket.socket(fileno=fd)
    token = os.environ.pop(TOKEN_ENV, None)
    while _running(rank_pid):
        ready, _, _ = select.select([listener], [], [], POLL_S)
        if not ready:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        news = _read_news(conn)
        if news is not None and token is not None and news.get("token") == token:
            end_rank(rank_pid, rank, news)
            return


def _running(pid: int) -> bool:
    return os.getppid() == pid and procs.alive(pid)


def _read_news(conn: socket.socket) -> dict | None:
    conn.settimeout(2.0)
    data = b""
    try:
        with conn:
            while b"\n" not in data and len(data) < 1 << 20:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        news = json.loads(data.split(b"\n", 1)[0].decode(errors="replace"))
        return news if isinstance(news, dict) else None
    except (OSError, ValueError):
        return None


def ended_line(rank: int, pid: int, host: str, letter: str | None, named: bool, why: str,
               waited_s: float | None = None) -> str:
    """The line said on a rank's host when ncclbench ended it after the job ended."""
    waited = "" if waited_s is None else f" and still there {waited_s:g} s after the run ended"
    reason = "the run named it as the cause" if named else "the run had ended"
    return (f"ncclbench: error: rank {rank} (pid {pid}) on {host}, {procs.state_text(letter)}{waited}, was ended by "
            f"ncclbench (SIGKILL): {reason} ({why})")


def end_rank(pid: int, rank: int, news: dict, grace_s: float = GRACE_S) -> bool:
    """Once told: SIGKILL to the rank now if it is stopped or in the kernel, else once
    `grace_s` has passed with it still there; one line on stderr when it was ended."""
    deadline = time.monotonic() + grace_s
    while True:
        letter = procs.state(pid)
        if letter is None or letter in ("Z", "X") or not _running(pid):
            return False
        if letter in procs.FROZEN or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    named = rank in [int(r) for r in news.get("culprits") or []]
    print(ended_line(rank, pid, socket.gethostname(), letter, named, str(news.get("why") or "the run ended"),
                     None if letter in procs.FROZEN else grace_s), file=sys.stderr, flush=True)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True
