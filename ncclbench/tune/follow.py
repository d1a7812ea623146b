"""Ranks on several hosts: the same `tune` command runs on every host (`--nnodes N
--node-rank i --master-addr A`); node 0's decides everything, the others follow.

Each of tune's launches (probe, measurement, confirmation; --verify's four) is one
torchrun rendezvous of every host's ranks. Only node 0 knows what the next launch runs:
its rank 0 publishes the work in the launch's rendezvous store before any device work,
and every other rank reads it there, so a following host needs no copy of node 0's files.
The work carries the launch's environment (NCCL_GRAPH_REGISTER, a tuner plugin and its
config: the same paths must exist on every host); NCCL's debug log variables are left to
node 0, whose rank 0 alone is read. A following host starts launch after launch until one
says the run is over (node 0 makes that last, empty launch however its run ended; when it
refused the run before its first launch, that launch says why, and the others end with
that reason and exit 2), or
until a launch came and went without node 0's work (node 0 is gone): then it stops with
one line."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from ncclbench.errors import ExitCode

FOLLOW_PREFIX = "follow:"
WORK_KEY = "ncclbench/tune/work"
DONE_KEY = "ncclbench/tune/end-read"
NODE0_ONLY = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


class EndOfRun(Exception):
    """The launch that tells following hosts the run is over."""


def follow_folder(work_path: str) -> str | None:
    """The following host's marker folder, or None on node 0 (a work file's path)."""
    return work_path[len(FOLLOW_PREFIX):] if work_path.startswith(FOLLOW_PREFIX) else None


def apply_environment(env: dict, environ=None) -> None:
    """The launch's variables on a following host (None removes one), debug log ones left out."""
    environ = os.environ if environ is None else environ
    for name, value in (env or {}).items():
        if name in NODE0_ONLY:
            continue
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = str(value)


def _touch(folder: str, name: str) -> None:
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")


def sharing_guard(work_path: str, info, shared: dict):
    """create_backend's guard: with the rendezvous store, before any device work, rank 0
    publishes the work and every rank takes it (into shared['work']). EndOfRun for the
    run's last launch, once every rank has read it (rank 0 may host the store)."""

    def guard(store):
        if info.rank == 0:
            with open(work_path, encoding="utf-8") as f:
                store.set(WORK_KEY, f.read())
        work = json.loads(store.get(WORK_KEY).decode())
        folder = follow_folder(work_path)
        if folder is not None and info.local_rank == 0:
            _touch(folder, "received")
        if work.get("end"):
            store.add(DONE_KEY, 1)
            if folder is not None and info.local_rank == 0:
                if work.get("refused"):
                    with open(os.path.join(folder, "refused"), "w", encoding="utf-8") as f:
                        f.write(work["refused"])
                _touch(folder, "end")
            while info.rank == 0 and store.add(DONE_KEY, 0) < info.world_size:
                time.sleep(0.05)
            raise EndOfRun()
        if folder is not None:
            apply_environment(work.get("env"))
        shared["work"] = work
        return lambda _step, _what, fn: fn()

    return guard


def run_follower(setup, spawn) -> int:
    """A following host's whole run: `spawn(setup, argv, env)` launch after launch."""
    folder = tempfile.mkdtemp(prefix=f"ncclbench-tune-node{setup.request.node_rank}-")
    count = 0
    while True:
        for name in ("received", "end", "refused"):
            if os.path.exists(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
        code = spawn(setup, ["tune", "--worker", FOLLOW_PREFIX + folder], {})
        count += 1
        refused = os.path.join(folder, "refused")
        if os.path.exists(os.path.join(folder, "end")):
            if os.path.exists(refused):
                with open(refused, encoding="utf-8") as f:
                    why = f.read().strip()
                print(f"ncclbench: error: node {setup.request.node_rank} of {setup.nnodes}: node 0 refused the "
                      f"run ({why})", file=sys.stderr)
                return ExitCode.USAGE
            print(f"ncclbench tune: node {setup.request.node_rank} of {setup.nnodes}: took part in {count - 1} "
                  "launch(es) of node 0; node 0 prints the results", file=sys.stderr)
            return ExitCode.OK
        if code == ExitCode.INTERRUPTED:
            return code
        if not os.path.exists(os.path.join(folder, "received")):
            print(f"ncclbench: error: node {setup.request.node_rank}: launch {count} ended (exit code {code}) "
                  f"without node 0's work (rendezvous {setup.rendezvous_of(count - 1)}): is tune running there "
                  "with the same --nnodes, --master-addr and --master-port?", file=sys.stderr)
            return code or ExitCode.NCCL_ERROR


def end_work(folder: str, refused: str | None = None) -> str:
    """The work file of the run's last launch, which only tells following hosts to stop
    (and, when node 0 refused the run before its first launch, why)."""
    path = os.path.join(folder, "end.work.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"end": True, "refused": refused} if refused else {"end": True}, f)
    return path
