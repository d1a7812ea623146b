"""NCCL's own view of a hang, as a second witness beside engine.hang's verdict.

Since NCCL 2.24 every NCCL process runs a RAS thread; one per host listens on
localhost:28028 (NCCL_RAS_ADDR moves it) and answers a text protocol: `CLIENT PROTOCOL 2`,
`TIMEOUT <s>` (how long it waits for each peer), `SET FORMAT json` (2.28.7 and later),
`STATUS`, then the report until the connection closes (NCCL's docs/troubleshooting/ras.rst).
Every NCCL process of a host binds that port (SO_REUSEPORT), and the kernel hands each
new connection to one of them: one that is stopped accepts nothing. So several
connections greet at once and the first process to answer is asked. NCCL 2.28.7-2.28.9
print a missing rank without the comma after its "nvml_dev" (fixed later); the report is
read with that comma put back.
Its report lists each communicator's ranks: those that answered, with the collectives their
host launched, and the missing ones (`unresponsive`, `considered_dead`). RAS counts
operations when the host launches them, so a rank whose GPU never reached the op looks
like the others to it (NVIDIA/nccl issue 1730); it calls a peer dead only after 60 s.

Witness asks it with a deadline, on a thread of its own, and says what it saw in one
clause, for this run's processes only (matched by process id: another job's NCCL may own
the port). RAS names hosts by address and a process id may repeat on other hosts
(containers): a rank number is given only where the id is one rank's alone. When a process
stopped shortly before, RAS waits for it up to its keep-alive limit (5 s) and more, longer
than the verdict waits: the clause then says no report came in time."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

DEFAULT_ADDR = ("localhost", 28028)
PROTOCOL = 2
PEER_WAIT_S = 1      # TIMEOUT sent to RAS: how long it waits for each peer's data
ANSWER_WAIT_S = 3.5  # the most the whole query may take
MAX_REPORT = 64 << 20  # bytes of report read at most
LAGGING = "one collective fewer launched by"  # the clause on ranks one launch short while one is silent


def address(environ=None) -> tuple[str, int]:
    """Where this host's RAS listens: NCCL_RAS_ADDR (host:port) or localhost:28028."""
    text = (environ if environ is not None else os.environ).get("NCCL_RAS_ADDR", "")
    host, _, port = text.rpartition(":")
    try:
        return (host.strip("[]") or DEFAULT_ADDR[0], int(port)) if text else DEFAULT_ADDR
    except ValueError:
        return DEFAULT_ADDR


def query(addr=None, peer_wait_s: int = PEER_WAIT_S, deadline_s: float = ANSWER_WAIT_S, tries: int = 8) -> dict:
    """RAS's JSON report; OSError/ValueError (with a reason) when it cannot be had by the
    deadline. `tries` connections greet at once; the first that answers is asked."""
    addr = addr or address()
    end = time.monotonic() + deadline_s
    sock, rest = _first_answering(addr, tries, end)
    with sock:
        conn = _Lines(sock, end, rest)
        for line, expect in ((f"TIMEOUT {peer_wait_s}", "OK"), ("SET FORMAT json", "OK")):  # refused before 2.28.7
            sock.sendall(line.encode() + b"\n")
            answer = conn.line()
            if not answer.upper().startswith(expect):
                raise ValueError(f"{line.split()[0].lower()} answered {answer[:60]!r}")
        sock.sendall(b"STATUS\n")
        return parse(conn.rest().decode(errors="replace"))


class _Lines:
    """Reads from a socket with one deadline for everything (a trickle cannot stretch it)
    and at most MAX_REPORT bytes."""

    def __init__(self, sock: socket.socket, end: float, buffered: bytes = b""):
        self.sock, self.end, self.buf = sock, end, buffered

    def _more(self, have: int) -> bytes:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("no full answer in time")
        self.sock.settimeout(left)
        data = self.sock.recv(1 << 16)
        if have + len(data) > MAX_REPORT:
            raise ValueError(f"a report over {MAX_REPORT >> 20} MiB")
        return data

    def line(self) -> str:
        while b"\n" not in self.buf:
            data = self._more(len(self.buf))
            if not data:
                raise ConnectionError("closed before its answer")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()

    def rest(self) -> bytes:
        """Everything up to the connection's end."""
        chunks, have = [self.buf], len(self.buf)
        while True:
            data = self._more(have)
            if not data:
                return b"".join(chunks)
            chunks.append(data)
            have += len(data)


def _first_answering(addr, tries: int, end: float) -> tuple[socket.socket, bytes]:
    """A connection whose process answered `CLIENT PROTOCOL`, with what it sent after that
    line; the other connections closed. A connection that fails is dropped, not the query."""
    import selectors

    socks, chosen, last_error = [], None, None
    try:
        for _ in range(max(1, tries)):
            try:
                sock = socket.create_connection(addr, timeout=max(0.05, min(1.0, end - time.monotonic())))
                sock.sendall(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
            except OSError as exc:
                last_error = exc
                continue
            sock.setblocking(False)
            socks.append(sock)
        if not socks:
            raise last_error or ConnectionError("no connection")
        with selectors.DefaultSelector() as sel:
            for sock in socks:
                sel.register(sock, selectors.EVENT_READ)
            heard: dict = {}
            while chosen is None:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"none of {len(socks)} connections answered")
                for key, _ in sel.select(left):
                    sock = key.fileobj
                    try:
                        data = sock.recv(256)
                    except OSError:
                        data = b""
                    heard[sock] = heard.get(sock, b"") + data
                    if not data or len(heard[sock]) > 4096:
                        sel.unregister(sock)
                    elif b"\n" in heard[sock]:
                        line = heard[sock].split(b"\n", 1)[0].decode(errors="replace")
                        if not line.upper().startswith("SERVER PROTOCOL"):
                            raise ValueError(f"client answered {line[:60]!r}")
                        chosen = sock
                        break
                if chosen is None and not sel.get_map():
                    raise ConnectionError("every connection was closed unanswered")
        chosen.setblocking(True)
        return chosen, heard[chosen].split(b"\n", 1)[1]
    finally:
        for sock in socks:
            if sock is not chosen:
                sock.close()


def parse(text: str) -> dict:
    """The report as JSON; a comma missing at a line's end before the next key put back
    (NCCL 2.28.7-2.28.9 after a missing rank's "nvml_dev"). Valid JSON is read as it is."""
    try:
        doc = json.loads(text)
    except ValueError:
        lines = text.splitlines()
        fixed = list(lines)
        follow = ""  # the next non-empty line, scanning from the end
        for i in range(len(lines) - 1, -1, -1):
            end = lines[i].rstrip()
            if end and end[-1] not in "{[," and follow.startswith('"'):
                fixed[i] = end + ","
            if lines[i].strip():
                follow = lines[i].lstrip()
        doc = json.loads("\n".join(fixed))
    if not isinstance(doc, dict):
        raise ValueError(f"a report that is a JSON {type(doc).__name__}, not an object")
    return doc


def summary(doc: dict, pids: dict, name=str) -> str:
    """One clause on this run's communicators in a RAS report. `pids`: process id -> the
    ranks of this run with that id (the progress board's); `name(rank)`: how a rank is
    numbered in the text."""
    version = doc.get("nccl_version", "?")
    head = f"NCCL RAS ({version}, a second witness)"

    def entries(comm, key):
        return [r for r in comm.get(key) or [] if isinstance(r, dict)]
    ours = [c for c in doc.get("communicators") or [] if isinstance(c, dict)
            and any(r.get("pid") in pids for r in entries(c, "ranks") + entries(c, "missing_ranks"))]
    if not ours:
        return f"{head}: none of this run's processes in its report"

    def who(r: dict) -> str:
        mine = pids.get(r.get("pid")) or []
        label = f"rank {name(mine[0])} = " if len(mine) == 1 else ""
        return f"{label}pid {r.get('pid')} on {r.get('host', '?')}"

    def key(r: dict, comm: dict):
        """One process: its host and pid; where NCCL could not tell them (pid -1), its rank."""
        return (r.get("host"), r.get("pid")) if r.get("pid") not in (-1, None) else (id(comm), r.get("rank"))
    silent, absent, behind, lagging, failing = {}, {}, {}, {}, {}
    for comm in ours:
        comm_silent = False
        for r in entries(comm, "missing_ranks"):
            status = r.get("status") if isinstance(r.get("status"), dict) else {}
            if status.get("unresponsive") or status.get("considered_dead"):
                silent[key(r, comm)] = who(r) + (" (considered dead)" if status.get("considered_dead") else "")
                comm_silent = True
            else:
                absent[key(r, comm)] = who(r)
        ranks = entries(comm, "ranks")
        counts = {}
        for r in ranks:
            values = (r.get("collective_counts") or {}).values() if isinstance(r.get("collective_counts"), dict) else ()
            counts[id(r)] = sum(v for v in values if isinstance(v, int))
            status = r.get("status") if isinstance(r.get("status"), dict) else {}
            if status.get("async_error") or status.get("abort_flag"):
                failing[key(r, comm)] = f"{who(r)} (NCCL error {status.get('async_error')})"
        if len(set(counts.values())) > 1:
            top = max(counts.values())
            for r in ranks:
                if counts[id(r)] < top:
                    # one short while a member is silent: the ranks that answered stop where the
                    # silent one left each of them, seen one launch apart (not a rule of NCCL's;
                    # a rank held before its launch reads the same, and the census names it)
                    (lagging if comm_silent and top - counts[id(r)] == 1 else behind)[key(r, comm)] = \
                        f"{who(r)} ({counts[id(r)]} against {top})"
    parts = []
    if silent:
        parts.append(f"no answer from {', '.join(silent.values())}")
    if absent:
        parts.append(f"no data from {', '.join(absent.values())} (it answers; not a member of that communicator "
                     "at that moment)")
    if failing:
        parts.append(f"an error reported by {', '.join(failing.values())}")
    if behind:
        parts.append(f"fewer collectives launched by {', '.join(behind.values())}")
    if lagging:
        parts.append(f"{LAGGING} {', '.join(lagging.values())}, as ranks waiting for a silent one can be")
    if parts:
        return f"{head}: " + "; ".join(parts)
    return (f"{head}: every rank answered and launched as many collectives as the others: it sees no hang "
            "(it counts collectives the host launched, not what the GPU finished, nor point-to-point ops or "
            "graph replays)")


class Witness:
    """A RAS query started at once on a thread of its own; text() waits for it until the
    deadline given at the start."""

    def __init__(self, deadline_s: float = ANSWER_WAIT_S, addr=None):
        self.addr = addr or address()
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.doc: dict | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._ask, name="ncclbench-ras", daemon=True)
        self.thread.start()

    def _ask(self) -> None:
        try:
            self.doc = query(self.addr, deadline_s=self.deadline_s)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc.strerror or exc}"
        except Exception as exc:  # noqa: BLE001 - whatever came back, the verdict goes on without it
            self.error = f"{type(exc).__name__}: {exc}"[:200]

    def text(self, pids: dict, name=str) -> str:
        """The clause for the verdict line; `pids`: process id -> ranks of this run with it."""
        self.thread.join(max(0.0, self.deadline - time.monotonic()))
        where = f"NCCL RAS at {self.addr[0]}:{self.addr[1]}"
        if self.doc is not None:
            try:
                return summary(self.doc, pids, name)
            except Exception as exc:  # noqa: BLE001 - a report of a shape not foreseen
                return f"{where}: a report that could not be read ({type(exc).__name__}: {exc})"[:300]
        why = self.error or (f"none within {self.deadline_s:g} s: RAS waits longer for a process that stopped "
                             "shortly before")
        return f"{where}: no report ({why})"
