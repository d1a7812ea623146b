"""What `ncclbench explain` prints: per job, the path table, its facts, what the logs read
leave out, how far the best busbw is from the path's peak, and the known causes."""

from __future__ import annotations

import os

from ncclbench.explain.jobs import Job, coverage, coverage_notes, label, silent, split_jobs, subsystem_notes
from ncclbench.explain.logs import read_processes
from ncclbench.topology import pathexplain
from ncclbench.topology.ncclpath import to_summary
from ncclbench.topology.pathview import Path


def table(path: Path) -> list[str]:
    """The path as a table: one row per transport."""
    rows = [("transport", "rank pairs (src->dst)", "channels", "NICs")]
    nics = ", ".join(path.nic_names()) or "-"
    for kind, pairs in path.transports().items():
        channels = {ch for c in path.comms() for s, d, k, chs in c.get("links", []) if k == kind for ch in chs}
        shown = ", ".join(f"{a}->{b}" for a, b in sorted(pairs)[:8]) + (f" +{len(pairs) - 8}" if len(pairs) > 8 else "")
        rows.append((kind, shown, str(len({c.split('/')[0] for c in channels})),
                     nics if kind.startswith("NET") else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def report_lines(path: Path, *, best: float | None = None, nvlink_peak: float | None = None,
                 facts: dict | None = None, environ: dict | None = None, source: str = "", title: str = "",
                 notes=()) -> list[str]:
    """The path table, its facts, how far the best busbw is from its peak, the known causes.
    `title` goes before the header's words; `notes`: what the lines read leave out (then no
    conclusion is drawn from what they do not show)."""
    hosts = sorted({p.get("host") for p in path.processes if p.get("host")})
    where = f" on {', '.join(hosts)}" if hosts else ""
    version = f", NCCL {path.version}" if path.version else ""
    out = [f"# {title}NCCL path of {len(path.processes)} process(es){where}{version}{source}"]
    out += [f"# {note}" for note in notes]
    if path.empty:
        out.append(f"# {path.unread_text() or 'NCCL log named no connection (one rank, or no collective ran)'}")
    elif path.connected:  # the table names the transports: the header's first line would again
        out += table(path) + [f"# {line.strip()}" for line in path.lines()[1:]]
    else:
        out += [f"# {line.strip()}" for line in path.lines()]
    nics = path.nics_by_rank()
    if nics and len({tuple(v) for v in nics.values()}) > 1:  # one NIC for all is in the table already
        out.append("# NICs per rank: " + "; ".join(f"{r} {','.join(v)}" for r, v in
                                                  sorted(nics.items(), key=lambda kv: int(kv[0]))))
    if best is not None:
        out.append(pathexplain.peak_line(best, path, nvlink_peak))
    found = pathexplain.causes(path, facts, environ) if not path.empty else []
    if found:
        out.append("# Known causes of a lower number:")
        out += [f"#   - {c}" for c in found]
        if not path.env:
            out.append("#   (NCCL's log names no NCCL_* setting it read: none set, or ENV not logged)")
    elif path.connected and notes:
        out.append("# No known cause of a lower number shows in the lines read; they are not the whole path (above)")
    elif path.connected:
        out.append("# No known cause of a lower number shows in NCCL's log: the path is the expected one")
    return out


def _files_text(sources: list[str], whole: int) -> str:
    if len(sources) == whole:
        return f" (from {whole} file(s))"
    names = [os.path.basename(s) for s in sources]
    return f" (from {', '.join(names[:3])}{f' +{len(names) - 3}' if len(names) > 3 else ''})"


def job_lines(job: Job, files: list[str], n: int = 0, of: int = 1) -> list[str]:
    """One job's report; `n` of `of` where the files hold several."""
    cov = coverage(job)
    notes = coverage_notes(cov) + subsystem_notes(job.processes)
    title = ""
    if of > 1:
        title = f"Job {n} of {of}{f', communicator {cov.key}' if cov else ''}: "
        if not job.ids:
            notes.insert(0, "Their lines name no communicator id (no `Init COMPLETE ... commId` line): read as one group")
    path = Path([to_summary(p) for p in job.processes])
    return report_lines(path, source=_files_text(job.sources, len(files)), title=title, notes=notes)


def explain_logs(paths) -> list[str]:
    """The report on saved logs: each job in them on its own."""
    processes, files, twice = read_processes(paths)
    jobs = split_jobs(processes)
    out = [f"# {twice} process(es) appear in more than one file: each is read once"] if twice else []
    quiet = silent(processes, jobs)
    if quiet:
        out.append(f"# {len(quiet)} process(es) logged no communicator, nothing to explain: "
                   f"{', '.join(label(p) for p in quiet[:4])}{' ...' if len(quiet) > 4 else ''}")
    if len(jobs) == 1:
        return out + job_lines(jobs[0], files)
    out.append(f"# {len(jobs)} separate jobs in {len(files)} file(s) (no communicator in common): each is explained "
               "on its own")
    for n, job in enumerate(jobs, 1):
        out += ["#"] + job_lines(job, files, n, len(jobs))
    return out


def read_path(paths) -> tuple[Path, list[str]]:
    """(every process's path merged, the files read), jobs not told apart."""
    processes, files, _twice = read_processes(paths)
    return Path([to_summary(p) for p in processes]), files
