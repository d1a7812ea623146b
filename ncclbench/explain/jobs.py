"""The processes of the logs given, grouped into jobs: processes that share a communicator
(NCCL's commId, printed with each rank's `Init COMPLETE`) are one job; files whose processes
share none are separate jobs. Per job: which of its ranks and hosts have no log here (against
the nRanks and nNodes NCCL printed), and which of NCCL's logging subsystems its lines show
were off (NCCL_DEBUG_SUBSYS), so that the report concludes only what the lines read show."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.topology.ncclpath import ProcessLog


def ranks_text(ranks) -> str:
    """`0-3, 8, 10-11`: sorted ranks, runs joined."""
    ranks, out = sorted(set(ranks)), []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def label(p: ProcessLog) -> str:
    return f"{p.host}:{p.pid}" if p.host else p.source


@dataclass
class Job:
    """Processes that share communicators (`ids`: the commIds of those made by init, not split)."""

    processes: list
    ids: list = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(p.source for p in self.processes))


def split_jobs(processes: list[ProcessLog]) -> list[Job]:
    """Jobs in order of first appearance; processes whose lines name no commId (no INIT line,
    a pasted fragment, a log cut before `Init COMPLETE`) form one group of their own."""
    parent = list(range(len(processes)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict = {}
    for i, p in enumerate(processes):
        for c in p.comms:
            if c.comm_id:
                parent[root(i)] = root(first.setdefault(c.comm_id, i))
    groups: dict = {}
    for i, p in enumerate(processes):
        if any(c.comm_id for c in p.comms):
            groups.setdefault(root(i), []).append(p)
    jobs = [Job(ps, list(dict.fromkeys(c.comm_id for p in ps for c in p.comms if c.comm_id)))
            for ps in groups.values()]
    unnamed = [p for p in processes if not any(c.comm_id for c in p.comms)]
    if jobs:  # beside named jobs, a process that logged no communicator at all adds nothing to explain
        unnamed = [p for p in unnamed if p.comms]
    return jobs + ([Job(unnamed)] if unnamed else [])


def silent(processes: list[ProcessLog], jobs: list[Job]) -> list[ProcessLog]:
    """The processes no job holds: NCCL lines (its version, settings) but no communicator."""
    held = {id(p) for j in jobs for p in j.processes}
    return [p for p in processes if id(p) not in held]


@dataclass
class Coverage:
    """One communicator's ranks against the logs read: `found` rank -> the processes that logged it."""

    key: str | None              # None: the log names no id (then the job's communicators of one size are one)
    nranks: int
    nnodes: int | None
    found: dict
    hosts: list

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.nranks) if r not in self.found]

    @property
    def doubled(self) -> dict:
        return {r: who for r, who in sorted(self.found.items()) if len(who) > 1}


def coverage(job: Job) -> Coverage | None:
    """The job's widest communicator (most ranks; of those, the one most ranks logged) against
    its nRanks; None when no line names a communicator's size. Where the lines name no id (NCCL
    older than the commId in `Init COMPLETE`), communicators are told apart by size."""
    comms: dict = {}
    for p in job.processes:
        for c in p.comms:
            ident = c.key or (None if job.ids else (None, c.nranks))
            if ident and c.nranks and c.rank is not None:
                comms.setdefault(ident, []).append((p, c))
    if not comms:
        return None
    ident, members = max(comms.items(), key=lambda kv: (max(c.nranks for _, c in kv[1]), len(kv[1]),
                                                        "/" not in str(kv[0])))
    key = ident if isinstance(ident, str) else None
    found: dict = {}
    for p, c in members:
        found.setdefault(c.rank, [])
        if label(p) not in found[c.rank]:
            found[c.rank].append(label(p))
    nodes = [c.nnodes for _, c in members if c.nnodes]
    return Coverage(key, max(c.nranks for _, c in members), max(nodes) if nodes else None, found,
                    sorted({p.host for p, _ in members if p.host}))


def coverage_notes(cov: Coverage | None) -> list[str]:
    """What the logs read leave out of the job, and ranks logged twice; [] when whole."""
    if cov is None:
        return []
    out = []
    if cov.missing:
        have = ranks_text(cov.found)
        hosts = f", on {', '.join(cov.hosts)}" if cov.hosts else ""
        nodes = ""
        if cov.nnodes and cov.nnodes > max(len(cov.hosts), 1):  # a node: ranks joined without the network
            nodes = (f"; NCCL counts {cov.nnodes} nodes in it, these logs come from "
                     f"{len(cov.hosts) or 'an unnamed'} host(s)")
        name = f"communicator {cov.key}" if cov.key else "its communicator (the log names no id)"
        out.append(f"Missing: the logs of rank(s) {ranks_text(cov.missing)} of the {cov.nranks} in {name}; "
                   f"read: rank(s) {have}{hosts}{nodes}")
        out.append(f"What follows is what rank(s) {have} logged: connections among the missing ranks are not in it")
    name = f"communicator {cov.key}" if cov.key else "its communicator"
    for rank, who in cov.doubled.items():
        out.append(f"Rank {rank} of {name} was logged by {len(who)} processes ({', '.join(who)}): "
                   "these files hold more than one run of it (the same NCCL_COMM_ID?), merged here")
    return out


_TRANSPORTS = (("NET", "the network transport (NET/IB, NET/Socket, a plugin's)"), ("P2P", "P2P connections"),
               ("SHM", "SHM connections"))


def subsystem_notes(processes: list[ProcessLog]) -> list[str]:
    """Which of NCCL's logging subsystems the lines show were off, and what that hides. NCCL
    prints every connection under INIT and under its transport's subsystem (P2P, SHM, NET),
    so with INIT on the connections are whole; without it a transport whose subsystem was off
    shows nothing, which says nothing of whether it was used. A NET-logging process prints
    `NET/<net> : Using ...` when NCCL starts: without it, NET was off."""
    blind = [p for p in processes if "INIT" not in p.logged]
    if not blind:
        return []
    where = ""
    if len(blind) < len(processes):
        names = ", ".join(label(p) for p in blind[:4]) + (" ..." if len(blind) > 4 else "")
        where = f" in {len(blind)} of {len(processes)} processes ({names})"
    out = [f"No INIT line{where}: NCCL_DEBUG_SUBSYS left INIT out (or the log is a fragment): communicators, ranks, "
           "nodes, channels, GDR and PXN are unknown, and a connection shows only under its transport's subsystem"]
    for name, what in _TRANSPORTS:
        if any(name in p.logged for p in blind):
            continue
        if name == "NET":
            out.append(f"No NET line: NET was not logged, so {what} could not be read "
                       "(that no rank used the network does not follow)")
        else:
            out.append(f"No {name} line: {what} could not be read ({name} not logged, or none made)")
    return out
