"""NCCL's own log, turned on and found: the one place that sets NCCL_DEBUG, NCCL_DEBUG_SUBSYS
and NCCL_DEBUG_FILE for a process (a run's ranks, tune's probes) and reads this process's
file back.

NCCL reads these variables once, when it first logs (src/debug.cc, at its first
communicator), and writes `NCCL_DEBUG_FILE` with `%h` replaced by the host name up to its
first dot (`%` and `/` made `-`) and `%p` by the process id, line-buffered. A user's own
NCCL_DEBUG or NCCL_DEBUG_FILE is left as they set it: their file is read when they named one
and asked for INFO; otherwise the path is said to be unreadable, and why."""

from __future__ import annotations

import atexit
import functools
import glob
import os
import shutil
import socket
import tempfile

# what the path needs: INIT (network, channels, rings), ENV (settings NCCL read), P2P/SHM/NET (each connection), GRAPH
SUBSYS = "INIT,ENV,P2P,SHM,NET,GRAPH"
FILE_NAME = "nccl.%h.%p.log"
VARIABLES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def debug_env(folder: str, subsys: str = SUBSYS) -> dict:
    """The variables that send NCCL's INFO lines of `subsys` to one file per process in `folder`."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": subsys, "NCCL_DEBUG_FILE": os.path.join(folder, FILE_NAME)}


def with_subsys(subsys: str, extra: str) -> str:
    """`subsys` plus the names of `extra` it lacks (INIT,ENV + TUNING -> INIT,ENV,TUNING)."""
    names = [s for s in subsys.split(",") if s]
    return ",".join(names + [s for s in extra.split(",") if s and s not in names])


class _State:
    armed_by_us: dict = {}     # the variables this process set (left out of the header's environment)
    folder: str | None = None  # the temporary folder of our own log
    handle = None              # our file, kept open once found (and then removed from disk)


def arm(environ=os.environ) -> dict:
    """Turn NCCL's log on for this process unless the user set NCCL_DEBUG or NCCL_DEBUG_FILE;
    returns what was set ({} when nothing). Call before NCCL's first communicator."""
    if _State.armed_by_us or any(environ.get(v) for v in ("NCCL_DEBUG", "NCCL_DEBUG_FILE")):
        return {}
    _remove_stale(tempfile.gettempdir())
    _State.folder = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, _State.folder, True)
    values = debug_env(_State.folder)
    environ.update(values)
    _State.armed_by_us = dict(values)
    return values


_PREFIX = "ncclbench-nccl-log-"


def _remove_stale(folder: str) -> None:
    """Log folders of ended processes: a rank that ends by os._exit (a lost peer, a held
    signal) before its log was read leaves its folder behind; the next run removes it."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def ours(name: str, value: str) -> bool:
    """Whether NAME=VALUE in this process's environment was set by arm() (not by the user)."""
    return _State.armed_by_us.get(name) == value


def expand(pattern: str, pid: int | None = None, host: str | None = None) -> str:
    """NCCL_DEBUG_FILE's name for this process, as NCCL expands it."""
    host = (host if host is not None else socket.gethostname()).split(".", 1)[0].replace("%", "-").replace("/", "-")
    pid = os.getpid() if pid is None else pid
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        nxt = pattern[i + 1] if i + 1 < len(pattern) else ""
        if c == "%" and nxt in ("h", "p", "%"):
            out.append({"h": host, "p": str(pid), "%": "%"}[nxt])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def unreadable_reason(environ=os.environ) -> str | None:
    """Why this process's NCCL log cannot be read, or None when it can be."""
    level = str(environ.get("NCCL_DEBUG", "")).strip().upper()
    pattern = environ.get("NCCL_DEBUG_FILE", "")
    if level not in ("INFO", "TRACE"):
        return (f"NCCL_DEBUG={environ.get('NCCL_DEBUG')} is set: NCCL writes no INFO lines, so the path it took "
                "cannot be read" if level else "NCCL's log is off (NCCL_DEBUG is not INFO), so the path cannot be read")
    subsys = str(environ.get("NCCL_DEBUG_SUBSYS", "")).strip().upper()
    if subsys:  # NCCL logs each connection under INIT and its transport's subsystem (P2P, SHM, NET)
        names = {n.strip() for n in subsys.lstrip("^").split(",")}
        wanted = {"INIT", "P2P", "SHM", "NET"}
        on = (not names >= wanted and "ALL" not in names) if subsys.startswith("^") else bool(names & (wanted | {"ALL"}))
        if not on:
            return (f"NCCL_DEBUG_SUBSYS={environ.get('NCCL_DEBUG_SUBSYS')} leaves out INIT, P2P, SHM and NET: NCCL's "
                    "log names no connection, so the path it took cannot be read")
    if not pattern:
        return ("NCCL_DEBUG=INFO without NCCL_DEBUG_FILE: NCCL writes its log to stdout, where ncclbench cannot "
                "read the path (add NCCL_DEBUG_FILE=dir/nccl.%h.%p.log)")
    return None


def own_text(environ=os.environ) -> tuple[str | None, str | None]:
    """(this process's NCCL log as written so far, None) or (None, why not)."""
    reason = unreadable_reason(environ)
    if reason:
        return None, reason
    if _State.handle is not None:
        _State.handle.seek(0)
        return _bounded(_State.handle)
    name = expand(environ["NCCL_DEBUG_FILE"])
    found = [name] if os.path.isfile(name) else glob.glob(glob.escape(expand(environ["NCCL_DEBUG_FILE"], host="\0"))
                                                          .replace("\0", "*"))
    if not found:
        started = "" if _State.armed_by_us else " (it names no such file, or NCCL started before its variables were set)"
        return None, f"NCCL wrote no log file {name}{started}"
    if not os.path.isfile(found[0]):  # /dev/stderr or a pipe: a read would wait for ever
        return None, f"NCCL's log {found[0]} is not a regular file, which ncclbench cannot read back"
    try:
        handle = open(found[0], errors="replace")
    except OSError as exc:
        return None, f"cannot read NCCL's log {found[0]}: {exc.strerror}"
    if _State.armed_by_us:  # ours: kept open, gone from disk (a rank may end by os._exit, with no clean-up)
        _State.handle = handle
        shutil.rmtree(_State.folder, ignore_errors=True)
        handle.seek(0)
        return _bounded(handle)
    with handle:
        return _bounded(handle)


def _bounded(handle) -> tuple[str | None, str | None]:
    """(the handle's text, None), or (None, why) when it is longer than an NCCL log may be."""
    from ncclbench.inputs import InputFileError, read_open

    try:
        return read_open(handle, handle.name, "nccl log"), None
    except InputFileError as exc:
        return None, str(exc)


def own_summary(rank: int | None = None, environ=os.environ, marks=()) -> tuple[dict | None, str | None]:
    """(this process's path summary (ncclpath.to_summary), None) or (None, why not). `marks`:
    line counts where an operation of ours began (ncclpath.parse_text)."""
    from ncclbench.topology.ncclpath import parse_text, to_summary, whole

    text, reason = own_text(environ)
    if text is None:
        return None, reason
    text = whole(text)
    processes = ([p for p in parse_text(text, "own log", marks) if p.pid in (None, os.getpid())]
                 or parse_text(text, marks=marks))
    if not processes:
        return None, "NCCL's log holds no path lines yet"
    summary = to_summary(processes[-1], rank)
    summary["nic_rates"] = _nic_rates(summary)
    summary["pcie"] = _pcie(summary)
    return summary, None


def _pcie(summary: dict) -> dict:
    """{PCI address: its current link} of this process's GPUs (the busId of its communicators)."""
    from ncclbench.topology.pathhost import pcie_link

    links = {c["bus_id"]: pcie_link(c["bus_id"]) for c in summary.get("comms", []) if c.get("bus_id")}
    return {bus: link for bus, link in links.items() if link}


def _nic_rates(summary: dict) -> dict:
    """{NIC name: GB/s} for the NICs this process's log lists, read on this host: the link's
    rate, or the interface's egress shaping where that is lower (summary["nic_shaped"])."""
    out, shaped = {}, {}
    for nics in (summary.get("nics") or {}).values():
        for n in nics:
            rate, is_shaped = _nic_rate(n["name"], n.get("detail", ""))
            if rate:
                out[n["name"]] = rate
            if is_shaped:
                shaped[n["name"]] = rate
    if shaped:
        summary["nic_shaped"] = shaped
    return out


@functools.lru_cache(maxsize=64)
def _nic_rate(name: str, detail: str) -> tuple[float | None, bool]:
    """(GB/s, whether a tbf qdisc set it) of one NIC, read once per process: every summary of
    the log (fleet reads one after each pair) would otherwise read sysfs and dump the qdiscs."""
    from ncclbench.topology.pathhost import ib_devices, nic_rate_gbps
    from ncclbench.topology.shaping import egress_rate_gbps

    rate = nic_rate_gbps(name, detail)
    cap = None if name in ib_devices() else egress_rate_gbps(name)
    if cap and (not rate or cap < rate):
        return cap, True
    return rate, False
