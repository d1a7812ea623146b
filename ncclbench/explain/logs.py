"""The log files `ncclbench explain` is given, read into processes (ncclpath.ProcessLog): files
as named, folders by every file inside; a process found twice (its NCCL_DEBUG_FILE and the
job's combined output) is counted once."""

from __future__ import annotations

import os

from ncclbench.errors import BadInput
from ncclbench.topology.ncclpath import ProcessLog, log_files, read_logs


def read_processes(paths) -> tuple[list[ProcessLog], list[str], int]:
    """(the processes, the files read, how many processes were found twice); BadInput (one
    line, exit 2) for a missing or unreadable file, or when no NCCL line about a communicator
    is in them."""
    for raw in paths:
        if not os.path.exists(raw):
            raise BadInput(f"no such file or folder: {raw}")
    files = log_files(paths)
    if not files:
        raise BadInput(f"no files in {', '.join(map(str, paths))}")
    try:
        processes = read_logs(files)
    except OSError as exc:
        raise BadInput(f"cannot read {exc.filename}: {exc.strerror}") from None
    if not any(p.comms for p in processes):
        raise BadInput(f"no NCCL INFO line about a communicator in {len(files)} file(s) "
                       "(the log needs NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,P2P,SHM,NET,GRAPH)")
    kept = once(processes)
    return kept, [str(f) for f in files], len(processes) - len(kept)


def once(processes: list[ProcessLog]) -> list[ProcessLog]:
    """`processes` with each one found in several files kept once, where it logged most: the
    same host, process id and communicators."""
    best: dict = {}
    order = []
    for p in processes:
        keys = tuple(c.key for c in p.comms)
        key = (p.host, p.pid, keys) if p.host and p.pid is not None and keys and all(keys) else id(p)
        if key not in best:
            order.append(key)
            best[key] = p
        elif p.lines > best[key].lines:
            best[key] = p
    return [best[k] for k in order]
