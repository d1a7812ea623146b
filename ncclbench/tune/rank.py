"""One rank of a tune launch: every work item (collective x combination x repeat) on its own
fresh communicator, measured by the ordinary engine (runner.run_plan), one after another.

Rank 0 writes each item's nccl-tests text, JSON and CSV where the work file says, and one
line per item start and end to a status file, so that the launching process can tell
which item a crashed launch was running. A combination NCCL refuses (at the
communicator's init or at the first call) ends its item, not the launch."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace

from ncclbench import failpoints
from ncclbench.errors import CollectiveError, ExitCode, RankFailures, first_line
from ncclbench.tune.plan import Combination
from ncclbench.tune.precision import capture_failure


def combination_environment(combo: Combination):
    """NCCL_ALGO / NCCL_PROTO for the combination's communicator, restored afterwards."""
    from ncclbench.launch.launcher import environ_changed

    return environ_changed(combo.environment())


class StatusLog:
    """Rank 0's record of the items, one JSON line each event, on disk at once."""

    def __init__(self, path: str | None):
        self.path = path

    def write(self, **record) -> None:
        if not self.path:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def build_plans(work: dict, nranks: int) -> dict:
    """(collective, timing) -> Plan: eager, and with -G replays where the work times by graph."""
    from ncclbench.api import options as plan_options

    plans = {}
    for coll, opts in work["options"].items():
        plans[(coll, "eager")] = plan_options.build_plan(coll, plan_options.options_for(opts), work["backend"],
                                                         ["tune"], nranks)
        if work.get("graph_replays") and any(it.get("timing") == "graph" for it in work["items"]):
            graph = dict(opts, cudagraph=work["graph_replays"])
            plan = plan_options.build_plan(coll, plan_options.options_for(graph), work["backend"], ["tune"], nranks)
            plans[(coll, "graph")] = replace(plan, queue_ahead_s=work.get("queue_ahead_s", 0.0))
    return plans


def run_worker(work_path: str, backend_name: str, timeout_s: float) -> int:
    """Entry point of a rank started by `ncclbench tune`'s launcher. `work_path`: the work
    file, or follow.FOLLOW_PREFIX + a folder on a host whose ranks get the work from rank 0
    (follow.py); the backend and -T come on the command line, as the work arrives only with
    the backend's rendezvous."""
    from ncclbench.launch import launcher as launch
    from ncclbench.engine import signals
    from ncclbench.backends import create_backend
    from ncclbench.tune import follow

    info = launch.detect()
    launch.prepare_environ(info)
    shared = {}
    try:
        backend = create_backend(backend_name, info, timeout_s, False,
                                 guard=follow.sharing_guard(work_path, info, shared))
    except follow.EndOfRun:
        return ExitCode.OK
    work = shared["work"]
    plans = build_plans(work, info.world_size)
    signals.stop_on_termination_signals()
    status = StatusLog(work["status"] if backend.rank == 0 else None)
    status.write(event="launch", pid=os.getpid(), world_comm=world_communicator_made(backend))
    code = ExitCode.OK
    try:
        for n, item in enumerate(work["items"], 1):
            signals.stop_on_termination_signals()
            status.write(event="started", index=item["index"], pid=os.getpid())
            began = time.monotonic()
            outcome = settled_item(item, plans, backend, info, work)
            status.write(event="done", index=item["index"], pid=os.getpid(), **outcome)
            if backend.rank == 0:
                say_progress(work, item, n, outcome, time.monotonic() - began)
            if outcome["status"] in ("interrupted", "crashed"):
                code = ExitCode.INTERRUPTED if outcome["status"] == "interrupted" else ExitCode.NCCL_ERROR
                break
        signals.hold_termination_signals()
    finally:
        signals.exit_on_termination_signals(code)
        backend.close()
    return code


def settled_item(item, plans, backend, info, work) -> dict:
    """run_item's outcome, or `interrupted`; an item that failed while a peer died is
    `crashed` (the launch cannot go on without that rank). A graph item whose capture failed
    is run again eagerly (its outcome says so: timing, fallback)."""
    try:
        with failpoints.within(item=item["name"]):  # a fault planted for one item acts there only
            timing = item.get("timing", "eager")
            outcome = run_item(item, plans[(item["collective"], timing)], backend, info, work)
            outcome["timing"], failed = timing, None
            if timing == "graph" and outcome["status"] == "error":
                failed = capture_failure(outcome["errors"])
            if failed and peers_alive(backend):
                outcome = run_item(item, plans[(item["collective"], "eager")], backend, info, work)
                outcome.update(timing="eager", fallback=failed)
        if outcome["status"] == "error" and not peers_alive(backend):
            outcome["status"] = "crashed"
            outcome["errors"].append("a rank of the launch was gone after it")
        return outcome
    except KeyboardInterrupt:
        return {"status": "interrupted", "errors": ["interrupted"], "comm_ready": False}


def peers_alive(backend, seconds: float = 10.0) -> bool:
    """After a failed item: whether every rank still answers on the host-side group (a
    refused combination fails on every rank alike; a dead rank fails its peers' calls)."""
    from datetime import timedelta

    try:
        backend.dist.monitored_barrier(group=backend.control, timeout=timedelta(seconds=seconds))
        return True
    except KeyboardInterrupt:
        raise
    except Exception:  # noqa: BLE001 - a lost peer shows as any of gloo's errors
        return False


def world_communicator_made(backend) -> bool:
    """Whether torch created the world's NCCL communicator at start (bound to a device):
    its `Init COMPLETE` then comes first in rank 0's NCCL log, before the items'."""
    if not getattr(backend, "is_gpu", False):
        return False
    default = backend.dist.distributed_c10d._get_default_group()
    return getattr(default, "bound_device_id", None) is not None


def say_progress(work, item, n, outcome, seconds) -> None:
    combo = Combination.from_dict(item["combo"])
    what = outcome["status"] if outcome["status"] != "ok" else "done"
    if outcome["errors"] and outcome["status"] != "ok":
        what += f": {outcome['errors'][0][:160]}"
    if outcome.get("fallback"):
        what += f", timed eagerly: its graph capture failed ({outcome['fallback'][:120]})"
    print(f"ncclbench tune: {work['phase']} [{n}/{len(work['items'])}] {item['collective']} {combo.label} "
          f"(repeat {item['round']}) {what} ({seconds:.1f} s)", file=sys.stderr, flush=True)


def _quiet_sweep_hooks():
    """The command line's hooks, except that a failed combination is not said on stderr
    (tune's progress line says how each item ended) and no op runs before the sweep."""
    from ncclbench.engine.hooks import RankHooks

    class QuietSweep(RankHooks):
        read_path = False  # no extra op: NCCL's TUNING lines of each item are counted (tune/analysis.py)

        def sweep_failed(self, *args, **kwargs):
            return super().sweep_failed(*args, **kwargs)[0], False

    return QuietSweep()


def run_item(item, plan, backend, info, work) -> dict:
    """One combination on a fresh communicator, or, for an item of a --paired phase (it names
    its communicator set), on the one kept for that set (made at its first use); the probe
    of a --paired run still makes fresh ones: {status, errors, comm_ready, comm_made}."""
    from ncclbench.engine.runner import run_plan

    combo = Combination.from_dict(item["combo"])
    made = True
    with combination_environment(combo):
        try:
            if item.get("comm_set") is not None:
                made = backend.kept_communicator((combo.file_key, item["comm_set"]), combo.channels)
            else:
                backend.renew_communicator(combo.channels)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - NCCL refusing the setting at init is a result
            return {"status": "refused", "errors": [f"communicator init: {type(exc).__name__}: {first_line(exc, 300)}"],
                    "comm_ready": False}
        streams = []
        try:
            summary = run_plan(plan, backend, item_reporter(item, work, streams), hooks=_quiet_sweep_hooks())
        except (CollectiveError, RankFailures) as exc:  # ranks other than 0 hear of a failed call this way
            return {"status": "error", "errors": [str(exc)], "comm_ready": True, "comm_made": made}
        finally:
            for stream in streams:
                stream.close()
    return {"status": summary.status, "errors": list(summary.errors), "comm_ready": True, "comm_made": made}


def item_reporter(item, work, streams):
    """make_report for run_plan: the item's nccl-tests text, JSON and CSV under the work's
    folder, nothing on stdout (stdout is the tune table's)."""
    from ncclbench.results.output import OutputSpec, Reporter

    base = os.path.join(work["folder"], item["name"])

    def make_report(plan, run_info):
        combo = Combination.from_dict(item["combo"])
        run_info.notes.append(f"tune {work['phase']}: {combo.label}, repeat {item['round']}")
        stream = open(base + ".txt", "w", encoding="utf-8")
        streams.append(stream)
        spec = OutputSpec(json_path=base + ".json" if work["json"] else None,
                          csv_path=item.get("csv") if work["json"] else None, results_dir=None, progress=False)
        return Reporter(run_info, replace(spec, expected_rows=plan.expected_rows(run_info.nranks)), stream=stream)

    return make_report
