"""Who hung: when a step overruns its deadline (-T), which rank caused it and which ranks only
waited for it.

Every rank whose watchdog fires (its process runs) posts a witness in the rendezvous store:
the step it was given, where its main thread is (engine.position: placement, timed
iteration), whether its GPU reached the step's first op (an event recorded just before it;
None on the CPU), and the process state, read in /proc, of the ranks on its own host (from
the progress board's pids), and its own main thread's state (a rank whose main thread is
stuck in the kernel, state D, may still answer from its watchdog thread). A rank stopped by a
signal (state T) cannot post; a rank whose host or network is gone cannot reach the store.
The reporting rank gathers the witnesses for up to GATHER_S (less once every rank has
answered or been seen stopped) and applies one rule (decide):

1. a rank whose last step on the progress board is before the step that overran never
   reached it (stalled on its host, or frozen before it);
2. a rank seen stopped (T, t), stuck in the kernel (D) or gone by a rank on its host;
3. with neither, a rank whose GPU had not reached the op (earlier work on its stream);
4. with none of these, a rank that posted nothing (stopped, or its host or network gone).

The other ranks waited for it and are said to have. A rank that timed out only because a peer
hung is never the cause. No rule fits (every rank answered, reached the step, its GPU too):
no rank is blamed, and the line says so."""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, field

from ncclbench import procs
from ncclbench.engine import timing
from ncclbench.launch import watch as rank_watch

GATHER_S = 3.0      # the reporting rank waits this long at most for the witnesses
VERDICT_WAIT_S = GATHER_S + 2.0  # the other ranks wait this long at most for its verdict
STORE_WAIT_S = 2.0  # one store operation of the census, at most (a frozen store host answers none)
NEVER, FROZEN, GPU, SILENT = "never reached", "frozen", "gpu", "silent"
LATE_WHERE = "a point not told (no answer yet: its own timeout had not fired, or it cannot answer)"
LATE_WAIT_S = 10.0  # after the reporting rank's timeout: the longest any rank waits for late ranks to answer
PROGRESS_SAMPLE_S = 0.3  # a device's marks are read twice this far apart: a stopped device does not move


@dataclass
class Witness:
    """What one rank says when its deadline passes."""

    rank: int
    step: int                 # the step its deadline was for
    what: str                 # what that step runs
    where: str | None = None  # where its main thread is (position)
    gpu: bool | None = None   # its GPU reached the step's first op (None: no GPU, or unknown)
    states: dict = field(default_factory=dict)  # rank -> /proc state letter (None: gone) of ranks on its host
    own: str | None = None    # its main thread's /proc state, read by its watchdog thread (D: in the kernel)
    loop: dict | None = None  # how far its device got in the timed loop (engine.timing.LoopProgress)

    def line(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, text: str) -> "Witness | None":
        try:
            d = json.loads(text)
            loop = d.get("loop")
            return cls(int(d["rank"]), int(d["step"]), str(d["what"]), d.get("where"), d.get("gpu"),
                       {int(k): v for k, v in (d.get("states") or {}).items()}, d.get("own"),
                       loop if isinstance(loop, dict) else None)
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class Verdict:
    what: str                                   # the step that overran
    culprits: list = field(default_factory=list)  # (rank, kind, clause)
    waiting: dict = field(default_factory=dict)   # rank -> where it waited (None: unknown)
    answered: tuple = ()                          # the ranks that posted a witness
    late: tuple = ()  # ranks at the step, not seen stopped, that had not answered (yet)
    second: object = None  # NCCL RAS's view (engine.ras), where asked: name(rank) -> its clause

    def ranks(self) -> list[int]:
        return [r for r, _, _ in self.culprits]

    def text(self, name=str) -> str:
        """The clauses after the line's head: the culprits, then who waited for them.
        `name(rank)`: how a rank is numbered in the text (the API's global ranks)."""
        parts = [clause for _, _, clause in self.culprits]
        by_where: dict = {}
        for r, where in sorted(self.waiting.items()):
            by_where.setdefault(where, []).append(name(r))
        them = ranks_text([name(r) for r in self.ranks()]) if self.culprits else None
        for k, (where, ranks) in enumerate(by_where.items()):
            who = ranks_text(ranks)
            verb = f"waited for {them}" if them else "waited inside it"
            at = f" at {where}" if where else ""
            parts.append(f"{who} {verb}{at}" if k == 0 else f"{who}{at}")
        if not self.culprits:
            parts.insert(0, "no rank was found behind, stopped, without its GPU or silent")
        if self.second is not None:
            parts.append(self.second(name))
        return "; ".join(parts)


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def decide(nranks: int, step: int, what: str, board: dict, witnesses: dict, states: dict,
           name=str) -> Verdict:
    """The pure rule. `board`: rank -> BoardEntry (its last step, pid, host); `witnesses`:
    rank -> Witness of the ranks that answered; `states`: rank -> /proc state letter (None:
    gone) of the ranks some witness could see on its host."""
    def who(r):
        e = board.get(r)
        return f"rank {name(r)} (pid {e.pid}) on {e.host}" if e and e.pid and e.host else f"rank {name(r)} (host unknown)"

    culprits = []
    for r in range(nranks):
        e, w, seen = board.get(r), witnesses.get(r), r in states
        letter = states.get(r)
        if e is not None and e.step < step:
            clause = f"{who(r)} never reached it: its last step was {e.what or e.step}"
            if w is not None and w.where:
                clause += f", where it is {w.where}"
            if seen:
                clause += f"; its process is {procs.state_text(letter)}"
            elif w is not None and w.own in procs.FROZEN:  # it answered from another thread
                clause += f"; its main thread is {procs.state_text(w.own)}"
            culprits.append((r, NEVER, clause))
        elif _stopped(states, r):
            culprits.append((r, FROZEN, f"{who(r)} is {procs.state_text(letter)} inside it"))
    if not culprits:
        behind = gpus_behind(witnesses, step)
        culprits = [(r, GPU, f"{who(r)}: its GPU never reached it (earlier work on its stream still runs)")
                    if witnesses[r].gpu is False else (r, GPU, f"{who(r)}: {behind[r]}")
                    for r in range(nranks) if r in witnesses and (witnesses[r].gpu is False or r in behind)]
    if not culprits:
        culprits = [(r, SILENT, f"{who(r)} did not answer (its process is stopped, or its host or network is gone)"
                     + (f"; its process is {procs.state_text(states[r])}" if r in states else ""))
                    for r in range(nranks) if r not in witnesses]
    named = {r for r, _, _ in culprits}
    waiting = {r: w.where for r, w in witnesses.items() if r not in named}
    # at the step and running, but no answer yet: it entered the step later (its -T fires
    # later), so it waits too; named so, never left out of the line
    late = tuple(r for r in range(nranks) if r not in named and r not in witnesses and not _stopped(states, r)
                 and board.get(r) is not None and board[r].step >= step)
    waiting.update({r: LATE_WHERE for r in late})
    return Verdict(what, culprits, waiting, tuple(sorted(witnesses)), late)


def gpus_behind(witnesses: dict, step: int) -> dict:
    """rank -> clause, for the ranks whose device is behind the others' inside one timed loop:
    its host issued marks its device has not passed, its device passed none while it was
    watched (a device that runs slowly moves: the ranks read at different moments), and the
    device of another rank in the same loop (same step and placement) passed more of them. Every rank's host may have
    issued every iteration (a GPU runs behind its host), so the host's position cannot tell
    whose GPU stopped; the devices' marks can: peers of a stalled GPU wait inside the next
    op, past the mark it has not reached."""
    loops: dict = {}
    for r, w in witnesses.items():
        loop = w.loop
        if w.step == step and loop and isinstance(loop.get("passed"), int) and isinstance(loop.get("issued"), int):
            loops.setdefault(loop.get("placement"), {})[r] = loop
    out = {}
    for placement, ranks in loops.items():
        if len(ranks) < 2:
            continue
        top = max(loop["passed"] for loop in ranks.values())
        for r, loop in ranks.items():
            if loop["passed"] < top and loop["passed"] < loop["issued"] and not loop.get("moved"):
                ahead = ranks_text([q for q, other in ranks.items() if other["passed"] > loop["passed"]])
                out[r] = (f"its GPU stopped in the timed loop{f' ({placement})' if placement else ''}: "
                          f"{_loop_point(loop)}, which the GPUs of {ahead} passed; its host issued "
                          f"{_iterations(loop, loop['issued'] - 1)} of {loop['steps']} (earlier work on its "
                          "stream still runs)")
    return out


def _iterations(loop: dict, marks: int) -> int:
    """Timed iterations that `marks` marks after the loop's start mark close."""
    return min(max(0, marks) * int(loop.get("block") or 1), int(loop.get("steps") or 0))


def _loop_point(loop: dict) -> str:
    """Where a device that passed `loop['passed']` marks stands, in timed iterations."""
    if loop["passed"] == 0:
        return "its stream has not reached the loop's start"
    return f"its stream has not passed the end of timed iteration {_iterations(loop, loop['passed'])}"


def _poll(done, wait_s: float, every: float) -> None:
    """Ask `done()` every `every` s until it holds or `wait_s` has passed; a store that went
    away (an exception) ends the wait: there is nothing left to wait for."""
    deadline = time.monotonic() + wait_s
    try:
        while not done() and time.monotonic() < deadline:
            time.sleep(every)
    except Exception:  # noqa: BLE001
        pass


def _stopped(states: dict, r: int) -> bool:
    """Rank `r` was seen unable to answer: stopped, stuck in the kernel, or gone."""
    return r in states and (states[r] is None or states[r] in procs.FROZEN or states[r] in ("Z", "X"))


_CULPRIT = re.compile(r"(?:^|[:;] )rank (\d+) \((?:pid \d+\) on \S+|host unknown\))")


def culprits_in(message: str) -> list[int]:
    """The ranks a verdict's text names as the cause (preflight reads them from the message
    every rank raises)."""
    return sorted({int(m) for m in _CULPRIT.findall(message)})


def within(seconds: float, fn, default=None):
    """`fn()`, or `default` if it has not returned within `seconds`: a store whose host is
    frozen answers nothing, and a connection to it can wait far longer than -T."""
    out = [default]

    def run():
        try:
            out[0] = fn()
        except Exception:  # noqa: BLE001 - no census: the caller goes on without it
            pass

    worker = threading.Thread(target=run, name="ncclbench-census", daemon=True)
    worker.start()
    worker.join(seconds)
    return out[0]


def gpu_reached(marker) -> bool | None:
    """Whether the device has passed `marker` (a torch or CuPy CUDA event; None on the CPU)."""
    if marker is None or isinstance(marker, float):
        return None
    try:
        query = getattr(marker, "query", None)
        if query is not None:
            return bool(query())
        done = getattr(marker, "done", None)
        return None if done is None else bool(done)
    except Exception:  # noqa: BLE001 - a broken context: no witness
        return None


def bounded(store, seconds: float = STORE_WAIT_S):
    """A connection of the census's own to `store` whose operations give up after `seconds`
    (the main thread may be inside the board's own, and a frozen store host answers none)."""
    if store is None:
        return None
    try:
        from datetime import timedelta

        own = store.clone()
        own.set_timeout(timedelta(seconds=seconds))
        return own
    except Exception:  # noqa: BLE001 - a store without clone(): the board's own
        return store


class Census:
    """One rank's part in naming the cause of a step that overran. `board`: the run's
    ProgressBoard; `prefix`: the store keys of this run's census; `marker`: the GPU event
    recorded before the step's first op, or None."""

    def __init__(self, board, step: int, what: str, prefix: str, marker=None, where: str | None = None,
                 peers=(), ras: bool = False):
        self.board, self.step, self.what, self.prefix = board, step, what, prefix
        self.ras = ras  # NCCL runs: the deciding rank asks NCCL's RAS too (engine.ras)
        self.marker, self.where = marker, where
        self.peers = list(peers)  # (rank, host, pid) of the other ranks, where known without the store
        self.rank, self.nranks = board.rank, board.nranks
        self.store = None  # connected on first use (connecting may itself hang: see within())
        self.entries: dict = {}
        self.seen: tuple = ({}, {})  # (witnesses, states) gathered so far

    def _key(self, name) -> str:
        return f"{self.prefix}{name}"

    def reporter_stopped(self) -> bool:
        """Rank 0, which decides, is on this host and stopped or stuck in the kernel: no verdict
        will come (and the store may live in it)."""
        host = socket.gethostname()
        return any(r == 0 and h == host and procs.state(pid) in procs.FROZEN for r, h, pid in self.peers)

    def claim(self) -> bool:
        """Whether this rank speaks in rank 0's stead (the first to claim it does)."""
        def first():
            self.store = self.store or bounded(getattr(self.board, "store", None))
            mine = str(self.rank)
            return self.store.compare_set(self._key("speaker"), "", mine).decode() == mine
        return bool(within(2 * STORE_WAIT_S, first, False))

    def local_states(self) -> dict:
        """/proc states of the other ranks on this host (from their board entries)."""
        host = socket.gethostname()
        return {r: procs.state(e.pid) for r, e in self.entries.items()
                if r != self.rank and e.host == host and e.pid}

    def post(self) -> Witness:
        me = self.me = Witness(self.rank, self.step, self.what, self.where, gpu_reached(self.marker), {},
                               procs.state(os.getpid()), timing.PROGRESS.sample(PROGRESS_SAMPLE_S))
        self.seen = ({self.rank: me}, {})
        self.store = self.store or bounded(getattr(self.board, "store", None))
        self.entries = self.board.entries(self.store) or {}
        me.states = self.local_states()
        self.seen = ({self.rank: me}, dict(me.states))
        try:
            self.store.set(self._key(self.rank), me.line())
        except Exception:  # noqa: BLE001 - no store: this rank decides on what it sees itself
            pass
        return me

    def decide(self) -> Verdict:
        """The rule on what was gathered so far."""
        witnesses, states = self.seen
        steps = [w.step for w in witnesses.values()] + [e.step for e in self.entries.values()]
        step = max(steps or [self.step])
        what = next((w.what for w in witnesses.values() if w.step == step),
                    next((e.what for e in self.entries.values() if e.step == step and e.what), self.what))
        return decide(self.nranks, step, what, self.entries, witnesses, states)

    def gather_within(self, seconds: float = GATHER_S + 2 * STORE_WAIT_S) -> Verdict:
        """gather(), or the rule on what came in if the store stops answering meanwhile; on
        NCCL, with RAS's view beside it (asked at once, so that it costs no time of its own
        while the witnesses come in)."""
        from ncclbench.engine import ras

        second = ras.Witness() if self.ras else None
        self.seen = ({}, {})
        verdict = within(seconds, self.gather)
        if verdict is None:
            if not self.seen[0]:
                self.seen = ({self.rank: Witness(self.rank, self.step, self.what, self.where,
                                                 gpu_reached(self.marker))}, {})
            verdict = self.decide()
        if second is not None:
            pids: dict = {}
            for r, e in sorted(self.entries.items()):
                if e.pid:
                    pids.setdefault(e.pid, []).append(r)
            # its words follow the caller's rank names (Verdict.text's `name`)
            verdict.second = functools.partial(second.text, pids)
        return verdict

    def gather(self, wait_s: float = GATHER_S) -> Verdict:
        """Post this rank's witness, read the others' until each rank has answered or been
        seen stopped (at most `wait_s`), and decide."""
        me = self.post()
        deadline = time.monotonic() + wait_s
        while True:
            self.seen = witnesses, states = self._read(me)
            silent = [r for r in range(self.nranks) if r not in witnesses and not _stopped(states, r)]
            if not silent or time.monotonic() >= deadline or self.store is None:
                break
            time.sleep(0.1)
            self.entries = self.board.entries(self.store) or self.entries
        return self.decide()

    def _read(self, me: Witness) -> tuple[dict, dict]:
        witnesses, states = {me.rank: me}, dict(me.states)
        if self.store is not None:
            for r in range(self.nranks):
                if r == self.rank:
                    continue
                try:
                    if self.store.check([self._key(r)]):
                        w = Witness.parse(self.store.get(self._key(r)).decode(errors="replace"))
                        if w is not None:
                            witnesses[r] = w
                except Exception:  # noqa: BLE001 - the store went away meanwhile
                    break
        for w in witnesses.values():
            for r, letter in w.states.items():
                if r not in witnesses and (r not in states or letter != states[r] and letter in procs.FROZEN):
                    states[r] = letter
        # a rank that answered runs, whatever an earlier look at its process said
        return witnesses, {r: s for r, s in states.items() if r not in witnesses}

    def post_verdict(self, text: str, answered: int = 0, wait_s: float = 2.0) -> None:
        """Post the verdict, and wait (at most `wait_s`) until the `answered` other ranks that
        posted a witness have read it: the store may live in this process."""
        try:
            self.store.set(self._key("verdict"), text)
        except Exception:  # noqa: BLE001
            return
        self.wait_heard(answered, wait_s)

    def post_late(self, ranks, wait_s: float) -> None:
        """Post the ranks the verdict found late and how long to wait for them (before the
        verdict: a rank that reads the verdict reads this next)."""
        try:
            self.store.set(self._key("late"), json.dumps({"ranks": list(ranks), "wait_s": wait_s}))
        except Exception:  # noqa: BLE001 - no store: nothing to wait for
            pass

    def wait_late(self) -> None:
        """Wait until the late ranks the reporting rank posted have answered, as long as it said."""
        try:
            posted = json.loads(self.store.get(self._key("late")).decode()) \
                if self.store.check([self._key("late")]) else {}
            ranks, wait_s = [int(r) for r in posted.get("ranks", [])], float(posted.get("wait_s", 0.0))
        except Exception:  # noqa: BLE001 - the store went away, or nothing posted
            return
        if ranks:
            self.wait_answers(ranks, wait_s)

    def wait_answers(self, ranks, wait_s: float) -> None:
        """Wait (at most `wait_s`) until each of `ranks` has posted its witness."""
        _poll(lambda: self.store.check([self._key(r) for r in ranks]), wait_s, 0.1)

    def wait_heard(self, answered: int, wait_s: float = 2.0) -> None:
        """Wait (at most `wait_s`) until `answered` other ranks said they have the verdict."""
        _poll(lambda: self.store.add(self._key("heard"), 0) >= answered, wait_s, 0.05)

    def heard(self) -> None:
        try:
            self.store.add(self._key("heard"), 1)
        except Exception:  # noqa: BLE001
            pass

    def post_and_wait(self, wait_s: float = VERDICT_WAIT_S) -> str | None:
        """post(), then the reporting rank's verdict; None if none came within `wait_s` (or
        the store stopped answering)."""
        return within(wait_s + STORE_WAIT_S, lambda: self.post_then(self._verdict, wait_s))

    def post_then(self, read, wait_s: float = VERDICT_WAIT_S):
        """post(), then `read()` until it gives the reporting rank's message (None after
        `wait_s`); says it has it (the reporting rank may host the store, and leave)."""
        self.post()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            message = read()
            if message is not None:
                self.heard()
                return message
            time.sleep(0.1)
        return None

    def _verdict(self) -> str | None:
        key = self._key("verdict")
        return self.store.get(key).decode(errors="replace") if self.store.check([key]) else None

    def tell_watchers(self, why: str, culprits=(), only=None) -> list[int]:
        """Tell the ranks' watchers (launch.watch) that the job has ended: every rank's, or
        those of the ranks in `only`; the ranks whose watcher took it."""
        if self.store is None:
            return []
        ranks = range(self.nranks) if only is None else sorted(only)
        chosen = within(3 * STORE_WAIT_S, lambda: rank_watch.registered(self.store, ranks), {})
        return rank_watch.tell(chosen, why, culprits) if chosen else []

    def frozen_here(self, verdict_ranks: list[int]) -> list[tuple[int, int]]:
        """(rank, pid) of the named ranks on this host that are stopped (T, t) now."""
        host = socket.gethostname()
        return [(r, e.pid) for r, e in self.entries.items()
                if r in verdict_ranks and e.host == host and e.pid and procs.state(e.pid) in procs.STOPPED]
