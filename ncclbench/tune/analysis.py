"""From what the launches left on disk (raw ncclbench JSON per item, NCCL's debug logs of
the probe) to verdicts, ranges and the rows of the two NCCL files. No torch here."""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
from dataclasses import dataclass, field

from ncclbench.dtypes import DTYPES
from ncclbench.tune import coverage, nccl_log
from ncclbench.tune.files import ConfigRow, PerfRow
from ncclbench.tune.paired import judge_by_rule
from ncclbench.tune.plan import COLLECTIVES, Combination
from ncclbench.tune.ranges import Series, Verdict, win_ranges

REFUSAL_WORDS = ("no algorithm/protocol available", "invalid usage", "ncclInvalidUsage", "invalid argument")


@dataclass
class ItemResult:
    """What rank 0 said about one work item (or what the launcher inferred)."""

    status: str                  # ok | wrong_results | refused | error | timeout | crashed | interrupted | not run
    errors: list[str] = field(default_factory=list)
    comm_ready: bool = False
    pid: int | None = None
    timing: str = ""                 # graph | eager: how it was timed in the end
    fallback: str | None = None      # why a graph item was timed eagerly (its capture failed)


def describe(result: ItemResult) -> str:
    """`refused by NCCL` for an error NCCL reported as a usage error, else the status."""
    text = " ".join(result.errors)
    if result.status == "error" and any(w.lower() in text.lower() for w in REFUSAL_WORDS):
        return "refused by NCCL"
    return {"refused": "refused by NCCL", "wrong_results": "wrong results", "ok": "ok"}.get(result.status, result.status)


# ---- the probe: what NCCL chose -------------------------------------------------------------
def probe_logs(folder: str) -> dict[int, nccl_log.Log]:
    """pid -> parsed debug log of that process (file names end in .<pid>.log)."""
    out = {}
    for path in glob.glob(os.path.join(folder, "nccl.*.log")):
        try:
            pid = int(path.rsplit(".", 2)[-2])
            with open(path, encoding="utf-8", errors="replace") as f:
                out[pid] = nccl_log.parse_log(f.read())
        except (ValueError, OSError):
            continue
    return out


FORCED_SETTINGS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")  # set per combination


def probe_path(folder: str):
    """The path NCCL took in the probe (pathview.Path, None where its logs name no
    communicator): every probe communicator's connections, as the logs of this host's ranks
    name them; the settings tune forces per combination are left out of what NCCL read."""
    from ncclbench.topology.ncclpath import read_logs, to_summary
    from ncclbench.topology.pathview import Path

    try:
        processes = [to_summary(p) for p in read_logs(sorted(glob.glob(os.path.join(folder, "nccl.*.log"))))]
    except OSError:
        return None
    for p in processes:
        p["env"] = {k: v for k, v in p["env"].items() if k not in FORCED_SETTINGS}
    view = Path(processes)
    return None if view.empty else view


def attribute_choices(items: list[dict], results: dict[int, ItemResult], logs: dict[int, nccl_log.Log],
                      world_comm: dict[int, bool]):
    """item index -> (nccl_log.Init, [Choice]) for every item whose communicator came up, matched in order
    to the communicators in rank 0's log of its launch (one launch, one rank-0 process,
    one log); `world_comm`: pid -> whether that process made its world communicator first."""
    out: dict[int, list] = {}
    by_pid: dict[int, list[int]] = {}
    crashed: dict[int, int] = {}
    for item in items:
        r = results.get(item["index"])
        if r is None or r.pid is None:
            continue
        if r.comm_ready:
            by_pid.setdefault(r.pid, []).append(item["index"])
        elif r.status in ("crashed", "timeout", "interrupted"):
            crashed[r.pid] = 1   # the launch's last item: its communicator may have come up
    for pid, indexes in by_pid.items():
        log = logs.get(pid)
        skip = 1 if world_comm.get(pid) else 0
        comms = nccl_log.communicators_for(log, skip, len(indexes), crashed.get(pid, 0)) if log else None
        if comms is None and skip and log and len(log.communicators) == len(indexes):
            comms = nccl_log.communicators_for(log, 0, len(indexes))  # the world's was not created at start after all
        if comms is not None:
            out.update(zip(indexes, comms))
    return out


def log_bytes(count: int, dtype: str) -> int:
    """The bytes NCCL's TUNING line shows for a row: its count times the type's size."""
    return count * DTYPES[dtype].itemsize


def setting_at(choices, collective: str, nbytes: int) -> tuple | None:
    """(algo, proto, channels) NCCL ran most often at this size, or None if unknown."""
    counts = nccl_log.by_size(choices, COLLECTIVES[collective][1]).get(nbytes)
    if not counts:
        return None
    (algo, proto, channels, kernel), _ = counts.most_common(1)[0]
    return None if kernel else (algo, proto, channels)


# ---- the measurements -----------------------------------------------------------------------
@dataclass
class Measured:
    """One combination's rows over its repeats: size -> busbw, time, wrong per repeat."""

    busbw: dict[int, list[float]] = field(default_factory=dict)
    time_us: dict[int, list[float]] = field(default_factory=dict)
    wrong: dict[int, bool] = field(default_factory=dict)
    rounds: dict[int, list[int]] = field(default_factory=dict)   # size -> the repeat of each busbw value
    launches: dict[int, list] = field(default_factory=dict)      # size -> the launch (rank 0's pid) of each
    log_bytes: dict[int, int] = field(default_factory=dict)
    nccl: str = ""
    torch: str = ""
    gpu: str = ""
    timings: set = field(default_factory=set)    # how its repeats were timed (graph, eager)
    fallback: str | None = None                  # a repeat's graph capture failure, when one fell back

    @property
    def timing(self) -> str:
        """graph when every repeat was replayed, else eager (a mix is judged as eager)."""
        return "graph" if self.timings == {"graph"} else "eager" if self.timings else ""


def read_rows(path: str, into: Measured, round_: int = 0, launch=None) -> None:
    """Add one raw ncclbench JSON's rows as repeat `round_`: per size the out-of-place busbw
    and time (the median over the file's cycles where -N ran each size more than once), wrong
    if either placement had a wrong element in any cycle."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    nb = doc.get("ncclbench", {})
    into.nccl, into.torch, into.gpu = nb.get("nccl", ""), nb.get("torch_version", ""), nb.get("gpu", "")
    cycles: dict[int, tuple[list[float], list[float]]] = {}
    for r in doc.get("results", []):
        size = int(r["size"])
        oop = r["out_of_place"]
        # N/A (one rank on torch's backends: no out-of-place call) stays N/A, as nan: the
        # in-place cell there times a call NCCL skips, not the out-of-place busbw asked for
        bus, time_us = oop.get("bus_bw"), oop.get("time", oop.get("cpu_time"))
        bw, times = cycles.setdefault(size, ([], []))
        bw.append(float("nan") if bus is None else float(bus))
        times.append(float("nan") if time_us is None else float(time_us))
        wrong = any(float(r[p]["nwrong"] or 0) > 0 for p in ("out_of_place", "in_place") if r[p]["nwrong"] is not None)
        into.wrong[size] = into.wrong.get(size, False) or wrong
        into.log_bytes[size] = log_bytes(int(r["count"]), r["type"])
    for size, (bw, times) in cycles.items():
        k = _median_cycle(bw)
        into.busbw.setdefault(size, []).append(float("nan") if k is None else bw[k])
        into.time_us.setdefault(size, []).append(float("nan") if k is None else times[k])
        into.rounds.setdefault(size, []).append(round_)
        into.launches.setdefault(size, []).append(launch)


def _median_cycle(busbw: list[float]) -> int | None:
    """The cycle whose busbw is the median (the lower middle one of an even count: a cycle
    that ran, not the mean of two), so that its time goes with it; None when any is N/A
    (one N/A cycle leaves the repeat unknown)."""
    if any(math.isnan(v) for v in busbw):
        return None
    order = sorted(range(len(busbw)), key=lambda i: busbw[i])
    return order[(len(order) - 1) // 2]


@dataclass
class CollectiveOutcome:
    collective: str
    combos: list[Combination]
    status: dict[str, str]                  # combination label -> what happened (ok, refused by NCCL, ...)
    errors: dict[str, str]
    measured: dict[str, Measured]
    choices: dict[str, dict[int, tuple]]    # label -> {size: (algo, proto, channels)} from the probe
    inits: dict = field(default_factory=dict)  # label -> nccl_log.Init: what its communicator's init read
    verdicts: list[Verdict] = field(default_factory=list)
    overridden: dict[str, list[int]] = field(default_factory=dict)  # label -> sizes NCCL ran something else


def series_of(m: Measured, size: int, setting=None, channel_limit=None) -> Series:
    """One size of a Measured as a Series."""
    return Series(m.busbw[size], m.wrong.get(size, False), setting, channel_limit, timing=m.timing,
                  rounds=m.rounds.get(size), sets=m.launches.get(size))


def verdicts_for(outcome: CollectiveOutcome, repeats: int, min_gain: float, paired: int = 0) -> list[Verdict]:
    """Every size's verdict; `paired` (C communicator sets, 0: off) judges by paired.py's rule."""
    default = outcome.measured.get("default")
    if default is None:
        return []
    out = []
    for size in sorted(s for s in default.busbw if s > 0):
        dseries = series_of(default, size, outcome.choices.get("default", {}).get(size))
        candidates = {}
        for combo in outcome.combos:
            m = outcome.measured.get(combo.label)
            if m is None or size not in m.busbw:
                continue
            setting = outcome.choices.get(combo.label, {}).get(size)
            if setting is not None and setting[:2] != (combo.algo, combo.proto):
                outcome.overridden.setdefault(combo.label, []).append(size)
                continue  # NCCL ran something else than what was forced: not this combination's number
            candidates[combo.label] = series_of(m, size, setting, combo.channels)
        out.append(judge_by_rule(size, dseries, candidates, repeats, min_gain, paired))
    return out


def zero_size_notes(outcome: CollectiveOutcome, nranks: int) -> list[str]:
    """Why a size asked for has no row: at these ranks it moves 0 B (nccl-tests prints it so)."""
    default = outcome.measured.get("default")
    if default is None or 0 not in default.busbw:
        return []
    return [f"{outcome.collective}: the smallest size(s) asked for move 0 B at {nranks} ranks (each rank's share "
            "rounds down to no element, printed as 0 B as nccl-tests does): measured, not judged"]


def measured_sizes(outcome: CollectiveOutcome) -> list[int]:
    """Every size above 0 that any combination of this collective measured."""
    return sorted({s for m in outcome.measured.values() for s in m.busbw if s > 0})


def config_rows(outcome: CollectiveOutcome, nnodes: int, nranks: int) -> tuple[list[ConfigRow], list[str]]:
    """The tuner config rows of one collective (coverage.py says why these): the ranges won
    (one call, unregistered buffers, as measured), then NCCL's own choice over every size,
    then ring/simple for calls NCCL cannot run an earlier row's pair for; and notes on wins that cannot be written. coverage.UnknownChoice when NCCL's choice is
    not known at a measured size."""
    notes = []
    name = COLLECTIVES[outcome.collective][0]
    unknown = [v.size for v in outcome.verdicts if v.win and v.best_series and v.best_series.row_setting is None]
    if unknown:
        notes.append(f"{outcome.collective}: {len(unknown)} winning size(s) without a TUNING line saying what NCCL "
                     "ran (or its channel count under a --channels limit): NCCL's own choice is kept there")
    rows = [ConfigRow(name, r.min_bytes, r.max_bytes, *r.setting, nnodes, nranks, 1, 0, role="won")
            for r in win_ranges(outcome.verdicts)]
    own = outcome.choices.get("default", {})
    rows += coverage.nccl_choice_rows(name, {s: own.get(s) for s in measured_sizes(outcome)}, nnodes, nranks)
    return rows + coverage.fallback_rows(name, nnodes, nranks, rows), notes


def perf_rows(outcome: CollectiveOutcome, nnodes: int, nranks: int) -> list[PerfRow]:
    """Every forced combination's median at every size it ran cleanly and as forced."""
    rows = []
    name = COLLECTIVES[outcome.collective][0]
    for combo in outcome.combos:
        m = outcome.measured.get(combo.label)
        if m is None:
            continue
        for size in sorted(m.busbw):
            if size <= 0 or m.wrong.get(size) or size in outcome.overridden.get(combo.label, []) \
                    or any(math.isnan(b) for b in m.busbw[size]):
                continue
            setting = outcome.choices.get(combo.label, {}).get(size)
            channels = setting[2] if setting and setting[2] else -1
            rows.append(PerfRow(name, size, combo.algo, combo.proto, channels, nnodes, nranks,
                                statistics.median(m.busbw[size]), statistics.median(m.time_us[size])))
    return rows


def choices_by_printed_size(choices, collective: str, measured: Measured | None) -> dict[int, tuple]:
    """{printed size: setting} using the rows' counts to find each size's TUNING bytes."""
    if not measured:
        return {}
    out = {}
    for size, nbytes in measured.log_bytes.items():
        s = setting_at(choices, collective, nbytes)
        if s is not None:
            out[size] = s
    return out


def init_text(combo: Combination, init) -> str:
    """What NCCL's init said it read for this combination's communicator, and whether that
    is what was set ('' when the probe's log has nothing on it)."""
    if init is None:
        return ""
    read = [f"{name}={value}" for name, value in (("NCCL_ALGO", init.algo_env), ("NCCL_PROTO", init.proto_env)) if value]
    text = f"NCCL read {' '.join(read) if read else 'no NCCL_ALGO/NCCL_PROTO'}"
    if init.channels is not None:
        text += f", {init.channels} channel(s)"
    wanted = combo.environment()
    if (init.algo_env, init.proto_env) != (wanted["NCCL_ALGO"], wanted["NCCL_PROTO"]) or \
            (combo.channels and init.channels != combo.channels):
        text += ": NOT what was set"
    return text

