"""The path NCCL took, read on every rank from its own log and gathered on rank 0 (the
header, the JSON, the verdicts): topology.nccldebug finds the file, topology.ncclpath reads
it, topology.pathview merges the ranks' summaries."""

from __future__ import annotations

from ncclbench.topology.pathview import Path

GLOO_LINE = "NCCL path: none (gloo backend: TCP through the hosts' network stack, no NCCL)"


def gather(backend, since: int | None = None) -> Path | None:
    """Every rank: its log's summary, gathered through the backend's small-object exchange;
    rank 0 gets the merged Path, the others None. `since` (log_lines() before a connecting
    op): the group's own communicators, read from lines after that point where there are
    such (the process may hold others, e.g. preflight's groups across hosts beside one within
    a host): those of the group's size, and on rank 0, of as many nodes as the group's
    processes name hosts (comms_after)."""
    from ncclbench.topology import nccldebug

    size = getattr(backend, "group_size", None)
    try:
        marks = {} if since is None else {since: size}
        mine = nccldebug.own_summary(backend.rank, marks=marks)
        if since is not None and mine[0] is not None:
            mine = (comms_after(mine[0], since, size), mine[1])
    except Exception as exc:  # noqa: BLE001 - a log that cannot be parsed costs the path, never the run
        mine = (None, f"NCCL's log could not be read: {type(exc).__name__}: {exc}")
    everyone = backend.all_gather_object(mine)
    if backend.rank != 0:
        return None
    summaries = [s for s, _ in everyone if s]
    if since is not None:
        nodes = len({s.get("host") for s in summaries if s.get("host")})
        summaries = [dict(s, comms=[c for c in s.get("comms", []) if c.get("nnodes") in (None, nodes)]
                          or s.get("comms", [])) for s in summaries] if nodes else summaries
    return Path(summaries, {str(r): why for r, (s, why) in enumerate(everyone) if s is None})


def header_lines(path: Path | None, backend_name: str) -> list[str]:
    """The header's `NCCL path` lines (no `#`)."""
    if backend_name == "gloo":
        return [GLOO_LINE]
    if path is None:
        return ["NCCL path: not read"]
    if path.empty and not path.processes and not path.unread:
        return ["NCCL path: none (one rank per communicator: no connection to another GPU)"]
    if path.empty and not path.unread:
        return ["NCCL path: NCCL's log named no connection"]
    if path.empty:
        return ["NCCL path: unknown: " + path.unread_text()]
    return path.lines()


def read_for_run(plan, backend, runner, buffers) -> Path | None:
    """Before the report: one op so NCCL connects, then the gathered path (rank 0), on the
    NCCL backends; None on gloo."""
    if plan.backend == "gloo":
        return None
    if backend.group_size < 2:  # NCCL connects a rank to no peer: nothing to read
        return Path([], {}) if backend.rank == 0 else None
    before = log_lines()
    runner.connect(buffers)
    return gather(backend, since=before)


def log_lines() -> int | None:
    """How many NCCL lines this process's log holds so far (None: unreadable): the point
    after which a connecting op's lines come (gather's `since`)."""
    from ncclbench.topology import nccldebug

    try:
        summary, _why = nccldebug.own_summary()
    except Exception:  # noqa: BLE001 - context only
        return None
    return summary.get("lines", 0) if summary else 0


def comms_after(summary: dict, since: int, size: int | None = None) -> dict:
    """`summary` with the group's communicators: of `size` ranks that the log gave lines to
    after its first `since` lines, else of `size` ranks (the op connected nothing new: its
    communicator connected earlier), else those given lines after `since`, else all."""
    comms = summary.get("comms", [])
    newer = [c for c in comms if c.get("seen", 0) > since]
    sized = [c for c in comms if size is not None and c.get("nranks") == size]
    pick = [c for c in newer if c in sized] or sized or newer or comms
    return dict(summary, comms=pick)


def path_notes(path: dict | None, nvlink_peak: float | None, best: float | None, facts: dict | None = None,
               environ: dict | None = None) -> tuple[list[str], float | None] | None:
    """(a verdict's transport lines, the peak of the path) from the path NCCL's log named, or
    None when it was not read (`facts`, `environ`: the host's and the ranks' own, as
    pathexplain.causes reads them; then the verdict gives the topology and says the path was not read)."""
    from ncclbench.topology.pathexplain import against_peak, causes, path_peak

    view = Path.from_dict(path)
    if view is None or view.empty:
        return None
    peak, what = path_peak(view, nvlink_peak)
    lines = [line.strip() for line in view.lines()]
    if best is not None:
        lines.append(f"best busbw {best:.4g} GB/s{against_peak(best, peak, what)}")
    return lines + [f"cause: {c}" for c in causes(view, facts, environ)], peak


def latest_label() -> str | None:
    """The transports of this process's newest communicator, as its own NCCL log names them
    (`NET/Socket`, `P2P/CUMEM`); None when the log cannot be read."""
    from ncclbench.topology import nccldebug

    try:
        summary, _why = nccldebug.own_summary()
    except Exception:  # noqa: BLE001 - context only
        return None
    if not summary or not summary.get("comms"):
        return None
    view = Path([dict(summary, comms=summary["comms"][-1:])])
    return None if view.empty else view.label
