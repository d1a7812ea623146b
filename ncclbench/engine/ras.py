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

witness() asks it with a deadline and says what it saw in one clause, for this run's
ranks only (matched by process id: another job's NCCL may own the port)."""

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


def address(environ=None) -> tuple[str, int]:
    """Where this host's RAS listens: NCCL_RAS_ADDR (host:port) or localhost:28028."""
    text = (environ if environ is not None else os.environ).get("NCCL_RAS_ADDR", "")
    host, _, port = text.rpartition(":")
    try:
        return (host.strip("[]") or DEFAULT_ADDR[0], int(port)) if text else DEFAULT_ADDR
    except ValueError:
        return DEFAULT_ADDR


def query(addr=None, peer_wait_s: int = PEER_WAIT_S, deadline_s: float = ANSWER_WAIT_S, tries: int = 8) -> dict:
    """RAS's JSON report; OSError/ValueError (with a reason) when it cannot be had in time.
    `tries` connections greet at once; the first that answers is asked."""
    addr = addr or address()
    end = time.monotonic() + deadline_s
    sock = _first_answering(addr, tries, end)
    with sock, sock.makefile("rb") as reader:
        def ask(line: str, expect: str) -> None:
            sock.settimeout(max(0.05, end - time.monotonic()))
            sock.sendall(line.encode() + b"\n")
            answer = reader.readline().decode(errors="replace").strip()
            if not answer.upper().startswith(expect):
                raise ValueError(f"{line.split()[0].lower()} answered {answer[:60]!r}")
        ask(f"TIMEOUT {peer_wait_s}", "OK")
        ask("SET FORMAT json", "OK")  # refused before NCCL 2.28.7
        sock.sendall(b"STATUS\n")
        chunks = []
        while True:
            sock.settimeout(max(0.05, end - time.monotonic()))
            data = reader.read1(1 << 16)
            if not data:
                break
            chunks.append(data)
    return parse(b"".join(chunks).decode(errors="replace"))


def _first_answering(addr, tries: int, end: float) -> socket.socket:
    """A connection whose process answered `CLIENT PROTOCOL` (blocking again), the others closed."""
    import selectors

    socks, chosen = [], None
    try:
        for _ in range(max(1, tries)):
            sock = socket.create_connection(addr, timeout=max(0.05, min(1.0, end - time.monotonic())))
            sock.sendall(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
            sock.setblocking(False)
            socks.append(sock)
        with selectors.DefaultSelector() as sel:
            for sock in socks:
                sel.register(sock, selectors.EVENT_READ)
            heard = {}
            while chosen is None:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"none of {len(socks)} connections answered")
                for key, _ in sel.select(left):
                    data = key.fileobj.recv(256)
                    heard[key.fileobj] = heard.get(key.fileobj, b"") + data
                    if not data:
                        sel.unregister(key.fileobj)
                    elif b"\n" in heard[key.fileobj]:
                        line = heard[key.fileobj].split(b"\n", 1)[0].decode(errors="replace")
                        if not line.upper().startswith("SERVER PROTOCOL"):
                            raise ValueError(f"client answered {line[:60]!r}")
                        chosen = key.fileobj
                        break
                if not sel.get_map():
                    raise ConnectionError("every connection was closed unanswered")
        chosen.setblocking(True)
        return chosen
    finally:
        for sock in socks:
            if sock is not chosen:
                sock.close()


def parse(text: str) -> dict:
    """The report as JSON; a comma missing at a line's end before the next key put back
    (NCCL 2.28.7-2.28.9 after a missing rank's "nvml_dev")."""
    try:
        return json.loads(text)
    except ValueError:
        lines = text.splitlines()
        fixed = []
        for i, line in enumerate(lines):
            follow = next((x for x in lines[i + 1:] if x.strip()), "")
            end = line.rstrip()
            if end and end[-1] not in "{[," and follow.lstrip().startswith('"'):
                line = end + ","
            fixed.append(line)
        return json.loads("\n".join(fixed))


def summary(doc: dict, pids: dict[int, int]) -> str:
    """One clause on this run's communicators in a RAS report. `pids`: process id -> rank of
    this run (the progress board's)."""
    version = doc.get("nccl_version", "?")
    ours = [c for c in doc.get("communicators") or []
            if any(r.get("pid") in pids for r in (c.get("ranks") or []) + (c.get("missing_ranks") or []))]
    head = f"NCCL RAS ({version}, a second witness)"
    if not ours:
        return f"{head}: none of this run's processes in its report"

    def who(r: dict) -> str:
        mine = pids.get(r.get("pid"))
        return f"{'rank %d = ' % mine if mine is not None else ''}pid {r.get('pid')} on {r.get('host', '?')}"
    missing, behind = {}, {}
    for comm in ours:
        for r in comm.get("missing_ranks") or []:
            status = r.get("status") or {}
            dead = status.get("considered_dead")
            missing[r.get("pid")] = f"{who(r)}{' (considered dead)' if dead else ''}"
        counts = {r.get("pid"): sum((r.get("collective_counts") or {}).values()) for r in comm.get("ranks") or []}
        if counts and len(set(counts.values())) > 1:
            top = max(counts.values())
            for r in comm.get("ranks") or []:
                if counts[r.get("pid")] < top:
                    behind[r.get("pid")] = f"{who(r)} ({counts[r.get('pid')]} against {top})"
    if missing:
        return f"{head}: no answer from {', '.join(missing.values())}"
    if behind:
        return f"{head}: fewer collectives launched by {', '.join(behind.values())}"
    return (f"{head}: every rank answered and launched as many collectives as the others: it sees no hang "
            "(it counts what the host launched, not what the GPU finished)")


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
        except ValueError as exc:
            self.error = str(exc)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc.strerror or exc}"

    def text(self, pids: dict[int, int]) -> str:
        """The clause for the verdict line; `pids`: process id -> rank of this run."""
        self.thread.join(max(0.0, self.deadline - time.monotonic()))
        if self.doc is not None:
            return summary(self.doc, pids)
        why = self.error or f"none within {self.deadline_s:g} s"
        return f"NCCL RAS at {self.addr[0]}:{self.addr[1]}: no report ({why})"
