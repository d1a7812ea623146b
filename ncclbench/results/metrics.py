"""Prometheus metrics of a run (`--metrics FILE`), in node_exporter's textfile-collector
convention: text exposition with HELP and TYPE lines, no timestamps, written to a hidden
temporary name in the same folder and renamed, so the collector never reads half a file.

Built from what the commands already write as JSON: a sweep's nccl-tests document (one per
collective run), a fault-finding report (pairs, preflight, fleet: hosts' verdicts, slow
links, pair measurements), tune's document. Names carry the `ncclbench_` prefix and their
unit in base units (seconds, bytes, bytes per second, ratios 0-1), as Prometheus' naming
conventions ask; docs/monitoring.md lists them."""

from __future__ import annotations

import math
import os
import re
import sys
import time

PREFIX = "ncclbench_"
VERDICT_VALUES = {"ok": 0, "suspect": 1, "drain": 2}
GBPS = 1e9  # the JSON's GB/s (1e9 bytes/s, as nccl-tests)
RUN_INFO_LABELS = ("command", "collective", "backend", "ncclbench_version", "torch_version", "nccl_version",
                   "nccl_path", "gpu")

HELP = {
    "busbw_bytes_per_second": "Bus bandwidth of one size, dtype, op and placement (nccl-tests' busbw).",
    "algbw_bytes_per_second": "Algorithm bandwidth (bytes / time) of one size, dtype, op and placement.",
    "time_seconds": "Time per operation of one size, dtype, op and placement (host time with -C).",
    "wrong_elements": "Elements that arrived wrong (nccl-tests' #wrong) for one size and placement.",
    "average_busbw_bytes_per_second": "Mean bus bandwidth over every printed cell (nccl-tests' Avg bus bandwidth).",
    "peak_busbw_bytes_per_second": "Highest bus bandwidth of the sweep.",
    "run_ok": "1 when the run ended ok (status label), else 0.",
    "run_info": "Versions and the path NCCL took (labels); always 1.",
    "last_run_timestamp_seconds": "When the command wrote this file (Unix time).",
    "host_verdict": "Verdict on a host: 0 ok, 1 suspect, 2 drain.",
    "slow_link": "A slow link between two hosts (or two ranks of one host); always 1.",
    "slow_link_below_reference_ratio": "How far below the reference a slow link measured (0.18 = 18 % below).",
    "pair_busbw_bytes_per_second": "Bus bandwidth per direction of one pair test (its latest reading).",
    "group_best_busbw_bytes_per_second": "A group's best bus bandwidth per collective (preflight).",
    "report_passed": "1 when the fault-finding command passed, else 0.",
    "report_exit_code": "The fault-finding command's exit code.",
    "hosts_to_drain": "Hosts the command says to drain.",
    "tune_default_busbw_bytes_per_second": "Bus bandwidth of NCCL's own choice at one size (tune, median of repeats).",
    "tune_best_busbw_bytes_per_second": "Bus bandwidth of the best forced setting at one size (tune).",
    "tune_win": "1 when forcing the best setting beat NCCL's choice beyond noise at this size (tune), else 0.",
}


class Exposition:
    """Gauge families by name; a sample given twice with the same labels keeps the last value."""

    def __init__(self):
        self.families: dict[str, dict] = {}

    def add(self, name: str, labels: dict, value) -> None:
        if value is None or isinstance(value, str):
            return
        fam = self.families.setdefault(PREFIX + name, {"help": HELP[name], "samples": {}})
        items = tuple((k, "" if v is None else str(v)) for k, v in labels.items())
        fam["samples"][tuple(sorted(items))] = (items, float(value))

    def merge(self, other: "Exposition") -> None:
        for name, fam in other.families.items():
            mine = self.families.setdefault(name, {"help": fam["help"], "samples": {}})
            mine["samples"].update(fam["samples"])

    def text(self) -> str:
        out = []
        for name in sorted(self.families):
            fam = self.families[name]
            out += [f"# HELP {name} {escape_help(fam['help'])}", f"# TYPE {name} gauge"]
            for items, value in fam["samples"].values():
                labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in items)
                out.append(f"{name}{{{labels}}} {format_value(value)}" if labels else f"{name} {format_value(value)}")
        return "".join(line + "\n" for line in out)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


# ---- what goes in -------------------------------------------------------------------------------
def _number(x):
    """A JSON number, or None (nccl-tests writes NaN as "nan", N/A cells as null)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _scaled(x, factor):
    x = _number(x)
    return None if x is None else x * factor


def add_sweep(expo: Exposition, doc: dict) -> None:
    """One collective's run: a document of ncclbench's -J (nccl-tests v3 with an "ncclbench" block)."""
    nb = doc.get("ncclbench") or {}
    base = {"collective": nb.get("collective", ""), "backend": nb.get("backend", ""), "ranks": nb.get("ranks", "")}
    for row in doc.get("results") or []:
        cell_labels = dict(base, size_bytes=row.get("size"), dtype=row.get("type"), op=row.get("redop"),
                           root=str(row.get("root", "")).strip())
        for placement in ("out_of_place", "in_place"):
            cell = row.get(placement)
            if not isinstance(cell, dict):
                continue
            labels = dict(cell_labels, placement=placement)
            time_us = cell.get("time", cell.get("cpu_time"))
            expo.add("busbw_bytes_per_second", labels, _scaled(cell.get("bus_bw"), GBPS))
            expo.add("algbw_bytes_per_second", labels, _scaled(cell.get("alg_bw"), GBPS))
            expo.add("time_seconds", labels, _scaled(time_us, 1e-6))
            expo.add("wrong_elements", labels, _number(cell.get("nwrong")))
    avg = (doc.get("average_bus_bandwidth") or {}).get("bandwidth")
    expo.add("average_busbw_bytes_per_second", base, _scaled(avg, GBPS))
    expo.add("peak_busbw_bytes_per_second", base, _scaled(nb.get("peak_bus_bandwidth"), GBPS))
    status = nb.get("status") or ""
    expo.add("run_ok", dict(base, status=status), 1 if status == "ok" else 0)


def add_report(expo: Exposition, report: dict, command: str) -> None:
    """A fault-finding report: hosts' verdicts, slow links, pair tests, groups, the outcome.
    Reads the one report shape (hosts, links, pairs, drain) and the older keys of fleet's and
    pairs' JSON (nodes, tests, pairs with rank_a/rank_b)."""
    cmd = {"command": command}
    for h in report.get("hosts") or report.get("nodes") or []:
        value = VERDICT_VALUES.get(h.get("verdict"))
        if value is not None:
            expo.add("host_verdict", dict(cmd, host=h.get("host")), value)
    for link in report.get("links") or []:
        labels = dict(cmd, **_ends(link))
        labels["path"] = link.get("path") or ""
        expo.add("slow_link", labels, 1)
        pct = _number(link.get("below_pct"))
        expo.add("slow_link_below_reference_ratio", labels, None if pct is None else pct / 100)
    for pair in report.get("pairs") or report.get("tests") or []:
        labels = dict(cmd, **_ends(pair))
        labels["rail"] = "" if pair.get("rail") is None else pair.get("rail")
        expo.add("pair_busbw_bytes_per_second", labels, _scaled(pair.get("busbw_gbps"), GBPS))
    for g in report.get("groups") or []:
        for collective, value in (g.get("best_busbw") or {}).items():
            expo.add("group_best_busbw_bytes_per_second", dict(cmd, group=g.get("name"), collective=collective),
                     _scaled(value, GBPS))
    code = report.get("exit_code")
    passed = report.get("passed", None if code is None else code == 0)
    if passed is not None:
        expo.add("report_passed", cmd, 1 if passed else 0)
    expo.add("report_exit_code", cmd, _number(code))
    if "drain" in report:
        expo.add("hosts_to_drain", cmd, len(report.get("drain") or []))


def _ends(item: dict) -> dict:
    """host_a, host_b, rank_a, rank_b of a link or pair, in either spelling ("" where unknown)."""
    hosts = item.get("hosts") or [item.get("host_a"), item.get("host_b")]
    ranks = item.get("ranks") or [item.get("rank_a"), item.get("rank_b")]
    hosts, ranks = (list(hosts) + [None, None])[:2], (list(ranks) + [None, None])[:2]
    return {"host_a": hosts[0] or "", "host_b": hosts[1] or "",
            "rank_a": "" if ranks[0] is None else ranks[0], "rank_b": "" if ranks[1] is None else ranks[1]}


def add_tune(expo: Exposition, doc: dict) -> None:
    """tune's document: per collective and size, NCCL's choice, the best forced setting, the win."""
    for collective, outcome in (doc.get("collectives") or {}).items():
        for v in outcome.get("verdicts") or []:
            labels = {"collective": collective, "size_bytes": v.get("size")}
            expo.add("tune_default_busbw_bytes_per_second", labels, _scaled(v.get("default_busbw"), GBPS))
            expo.add("tune_best_busbw_bytes_per_second", dict(labels, setting=v.get("best") or ""),
                     _scaled(v.get("best_busbw"), GBPS))
            expo.add("tune_win", labels, 1 if v.get("win") else 0)


def add_run_info(expo: Exposition, command: str, info: dict, now: float | None = None) -> None:
    """The run's versions and NCCL's path (info: any of RUN_INFO_LABELS), and the write time."""
    labels = {k: info.get(k) or "" for k in RUN_INFO_LABELS}
    labels["command"] = command
    expo.add("run_info", labels, 1)
    expo.add("last_run_timestamp_seconds", {"command": command}, time.time() if now is None else now)


def _path_label(path) -> str:
    """The short name of the path NCCL took, from a path document (topology.pathview) or text."""
    if isinstance(path, dict):
        return path.get("label") or ""
    return path or ""


def sweep_info(doc: dict) -> dict:
    nb = doc.get("ncclbench") or {}
    path = nb.get("nccl_path") or {}
    return {"collective": nb.get("collective"), "backend": nb.get("backend"),
            "ncclbench_version": nb.get("ncclbench_version"), "torch_version": nb.get("torch_version"),
            "nccl_version": nb.get("nccl"), "nccl_path": _path_label(path),
            "gpu": nb.get("gpu")}


def process_info(backend: str = "") -> dict:
    """Versions known to this process without importing anything new (torch only if loaded)."""
    from ncclbench import __version__

    torch = sys.modules.get("torch")
    nccl = ""
    try:
        if torch is not None and backend == "nccl" and torch.cuda.is_available():
            nccl = "NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - a version is a nicety; the metrics are written without it
        nccl = ""
    return {"backend": backend, "ncclbench_version": __version__,
            "torch_version": getattr(torch, "__version__", "") if torch else "", "nccl_version": nccl}


# ---- the documents of each command --------------------------------------------------------------
def sweeps_text(command: str, docs: list[dict], now: float | None = None) -> str:
    expo = Exposition()
    for doc in docs:
        add_sweep(expo, doc)
        add_run_info(expo, command, sweep_info(doc), now)
    return expo.text()


def report_text(command: str, report: dict, info: dict | None = None, now: float | None = None) -> str:
    expo = Exposition()
    add_report(expo, report, command)
    named = [link.get("path") for link in report.get("links") or []]
    named += [_path_label(g.get("nccl_path")) for g in report.get("groups") or []] + [_path_label(report.get("nccl_path"))]
    paths = sorted({p for p in named if p})
    add_run_info(expo, command, dict(info or {}, nccl_path=",".join(paths)) if paths else (info or {}), now)
    return expo.text()


def tune_text(doc: dict, info: dict | None = None, now: float | None = None) -> str:
    expo = Exposition()
    add_tune(expo, doc)
    add_run_info(expo, "tune", dict(info or {}, nccl_version=doc.get("nccl") or (info or {}).get("nccl_version")), now)
    return expo.text()


# ---- reading back (a suite's later launches add to the file of its first) ----------------------
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse(text: str) -> Exposition:
    """The families of a file this module wrote (gauges, no timestamps)."""
    expo, helps = Exposition(), {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            helps[name] = help_text.replace("\\n", "\n").replace("\\\\", "\\")
            continue
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, body, value = m.groups()
        items = tuple((k, re.sub(r'\\(.)', lambda e: "\n" if e.group(1) == "n" else e.group(1), v))
                      for k, v in _LABEL.findall(body or ""))
        fam = expo.families.setdefault(name, {"help": helps.get(name, ""), "samples": {}})
        fam["samples"][tuple(sorted(items))] = (items, float(value))
    return expo


def write_textfile(path: str, text: str, merge: bool = False) -> None:
    """Write `text` to `path` through a hidden temporary file in the same folder and a rename
    (node_exporter reads only *.prom files, and never a half-written one). `merge`: keep the
    series already in the file that `text` does not replace."""
    if merge and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            old = parse(f.read(1 << 26))
        old.merge(parse(text))
        text = old.text()
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_or_warn(path: str, text: str) -> bool:
    """write_textfile(), or one warning on stderr when the file cannot be written."""
    try:
        write_textfile(path, text)
    except OSError as exc:
        print(f"ncclbench: warning: cannot write metrics file {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return False
    return True


def write_report_files(command: str, report: dict, backend: str, metrics_path=None, drain_path=None,
                       drain_format: str = "scontrol") -> None:
    """Rank 0's --metrics and --drain-file of a fault-finding report (pairs, preflight, fleet);
    a file that cannot be written is one warning, the report stands."""
    from ncclbench.results import drain

    if drain_path:
        drain.write_or_warn(drain_path, report, drain_format, command)
    if metrics_path:
        write_or_warn(metrics_path, report_text(command, report, process_info(backend)))
