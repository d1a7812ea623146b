"""Tune's launches: `-g` ranks started for a list of work items, rank 0's status lines read
back, and a launch that dies (a crash, a -T timeout) started again for the items it had not
run; the item it was running is reported as crashed. Shared by the tuning run (run.py) and
--verify (verify.py). `setup` is a run.Setup."""

from __future__ import annotations

import json
import os

from ncclbench.errors import ExitCode
from ncclbench.topology import nccldebug
from ncclbench.tune.analysis import ItemResult
from ncclbench.tune.paired import comm_set, rotated

PROBE_OVERRIDES = {"iters": 1, "warmup_iters": 0, "check": 0, "run_cycles": 1}  # one untimed call per size
PROBE_SUBSYS = nccldebug.with_subsys(nccldebug.SUBSYS, "TUNING")  # the path's lines too


def work_items(setup, combos_for, rounds: int, csv: bool, first: int = 1, timing: str | None = None,
               paired: int = 0) -> list[dict]:
    """Items in run order: repeat after repeat (numbered from `first`), each over every
    collective and combination; each timed as `timing` says (None: the run's timing).
    `paired` C > 0: repeat r runs on communicator set (r - 1) mod C (kept by the ranks), its
    combinations in the order paired.rotated gives."""
    mode = timing or (setup.timing.mode if getattr(setup, "timing", None) else "eager")
    items = []
    for r in range(first, first + rounds):
        for coll in setup.request.collectives:
            combos = combos_for(coll)
            for combo in rotated(combos, r) if paired else combos:
                base = f"{coll}.{combo.file_key}"
                items.append({"index": len(items), "collective": coll, "combo": combo.to_dict(), "round": r,
                              "name": f"{base}.r{r}", "csv": base + ".csv" if csv else None, "timing": mode})
                if paired:
                    items[-1]["comm_set"] = comm_set(r, paired)
    return items


def run_phase(setup, phase: str, items: list[dict], env: dict, overrides=None, outputs=True):
    """Run `items` in as few launches as crashes allow: {index: ItemResult}, plus
    {pid: world communicator made} and the last launch's exit code."""
    folder = os.path.join(setup.output_dir, phase)
    control = os.path.join(setup.output_dir, "launches")  # out of the results' folders, which hold only results
    os.makedirs(folder, exist_ok=True)
    os.makedirs(control, exist_ok=True)
    status_path = os.path.join(control, phase.replace("/", "-") + ".status.jsonl")
    options = {coll: dict(setup.request.options, **(overrides or {})) for coll in setup.request.collectives}
    for item in items:
        if item.get("csv"):
            item["csv"] = os.path.join(folder, os.path.basename(item["csv"]))
    results: dict[int, ItemResult] = {}
    worlds: dict[int, bool] = {}
    pending, code, requeued = list(items), ExitCode.OK, set()
    while pending:
        work = {"phase": phase, "backend": setup.backend, "timeout": float(setup.request.options.get("timeout", 600)),
                "options": options, "items": pending, "folder": folder, "json": outputs, "status": status_path,
                "graph_replays": setup.timing.replays if getattr(setup, "timing", None) else 0,
                "queue_ahead_s": setup.timing.queue_ahead_s if getattr(setup, "timing", None) else 0.0,
                "env": env}  # ranks on other hosts set it themselves (follow.py)
        work_path = os.path.join(control, phase.replace("/", "-") + ".work.json")
        with open(work_path, "w", encoding="utf-8") as f:
            json.dump(work, f, indent=1)
        code = spawn(setup, ["tune", "--worker", work_path], env)
        done_before = set(results)
        started = read_status(status_path, results, worlds, code)
        finished = [it["index"] for it in pending if it["index"] in results and it["index"] not in done_before]
        pending = settle(pending, started, results, code, finished, requeued)
    return results, worlds, code


def read_status(path: str, results: dict, worlds: dict, code: int) -> dict[int, dict]:
    """Fold rank 0's status lines into `results`; returns the started items' records."""
    started = {}
    if not os.path.exists(path):
        return started
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if e.get("event") == "launch":
                worlds[e["pid"]] = bool(e.get("world_comm"))
            elif e.get("event") == "started":
                started[e["index"]] = e
            elif e.get("event") == "done" and e["index"] not in results:
                status = e["status"]
                if status == "interrupted" and code not in (ExitCode.INTERRUPTED, ExitCode.OK):
                    # the launcher tore the ranks down because one died: not the user's interrupt
                    status = "crashed"
                    e["errors"] = [f"a rank died (the launch ended with exit code {code})"]
                results[e["index"]] = ItemResult(status, e.get("errors", []), bool(e.get("comm_ready")), e.get("pid"),
                                                 e.get("timing", ""), e.get("fallback"))
    return started


def settle(pending, started, results, code, finished, requeued) -> list[dict]:
    """Items still to run after a launch, and what the launch did to the others.
    `finished`: items this launch ended, in order; `requeued`: items already run again once."""
    remaining = [it for it in pending if it["index"] not in results]
    if not remaining:
        return []
    if code == ExitCode.INTERRUPTED:
        for it in remaining:
            results[it["index"]] = ItemResult("not run", ["interrupted"])
        return []
    running = [it for it in remaining if it["index"] in started]
    if running:
        it = running[0]
        last = results.get(finished[-1]) if finished else None
        if last is not None and last.status == "error" and it["index"] not in requeued:
            # A rank died in the item before (its peers saw their calls fail and went on,
            # until the launcher tore them down in this one): that one is the crash.
            last.status = "crashed"
            last.errors.append(f"then the launch ended (exit code {code}): a rank died in it")
            requeued.add(it["index"])
            return remaining
        what = "timeout" if code == ExitCode.TIMEOUT else "crashed"
        results[it["index"]] = ItemResult(what, [f"the ranks ended (exit code {code}) while it ran"],
                                          False, started[it["index"]].get("pid"))
        return [x for x in remaining if x is not it]
    if len(remaining) < len(pending):
        return remaining  # progress was made, then the launch ended between items: go on
    for it in remaining:
        results[it["index"]] = ItemResult("not run", [f"the launch ended (exit code {code}) before it started"])
    return []


def spawn(setup, argv: list[str], env: dict, rdzv_timeout_s: int | None = None) -> int:
    """One launch of `-g` ranks with `env` added (None removes a variable) for it only; with
    ranks on several hosts, this host's part of it (the others follow: follow.py), waiting
    for them up to `rdzv_timeout_s` (None: torchrun's own limit)."""
    from ncclbench.launch import launcher as launch

    endpoint = setup.rendezvous_of(setup.launches)
    setup.launches += 1
    timeout = float(setup.request.options.get("timeout", 300))
    with launch.environ_changed(env):
        return launch.spawn_local(setup.request.ngpus, argv + ["--backend", setup.backend, "-T", str(timeout)],
                                  setup.nnodes, setup.request.node_rank, endpoint, rdzv_timeout_s)


def probe_env(folder: str) -> dict:
    return nccldebug.debug_env(folder, PROBE_SUBSYS)
