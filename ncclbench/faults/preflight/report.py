"""Preflight's report in words and records: the failure lines (worst news first), each host's
verdict and evidence, one record per group, and the report every rank returns after a
timeout. Written from the verdicts of ncclbench.faults.preflight.groups, by every rank alike."""

from __future__ import annotations


from ncclbench.api.measure import ranks_text
from ncclbench.faults.preflight.groups import group_name


def explain(slow, bad, fine, wrong, inner_links, host: dict, instances: dict,
            pair_wrong: set) -> tuple[list, dict, list]:
    """Failure lines (worst news first), {host: [evidence]}, bad links."""
    failures, evidence, links = [], {}, []

    def note(rank, line):
        lines = evidence.setdefault(host[rank], [])
        if line not in lines:
            lines.append(line)

    def name(d, g):
        return group_name(instances, d, g)

    for d, by_group in wrong.items():
        for g, lines in by_group.items():
            failures.append(f"{name(d, g)} on {hosts_text(g, host)}: wrong results: {lines[0]}")
            for r in g:
                note(r, f"{name(d, g)}: {lines[0]}")
    for (d, g), lines in slow.items():
        culprits = [r for r in g if r in bad]
        head = f"{name(d, g)} on {hosts_text(g, host)}: {lines[0]}"
        if culprits:
            who = ", ".join(f"rank {r} ({host[r]}) {short_reason(bad[r])}" for r in culprits)
            failures.append(f"{head}; {who}: drain {', '.join(sorted({host[r] for r in culprits}))}")
            for r in culprits:
                note(r, f"{name(d, g)}: {lines[0]}")
        elif all(r in fine for r in g):
            failures.append(f"{head}; its ranks are fine with known-good partners: a link between them is slow")
            if len(g) == 2:
                links.append(list(g))
            for r in g:
                note(r, f"link inside {name(d, g)}: {lines[0]}")
        else:
            failures.append(f"{head}; not localised to one rank")
            for r in g:
                note(r, f"{name(d, g)} (not localised): {lines[0]}")
    explained = {r for (_d, g) in slow for r in g if r in bad}
    for r, line in sorted(bad.items()):
        note(r, f"rank {r} {line}")
        if r not in explained:
            failures.append(f"rank {r} ({host[r]}) {line}: drain {host[r]}")
    for (a, b), line in sorted(inner_links.items()):
        failures.append(f"the link between rank {a} ({host[a]}) and rank {b} ({host[b]}) is slow {line}; "
                        "neither rank is slow alone or with its other partners")
        links.append([a, b])
        for r in (a, b):
            note(r, f"link with rank {b if r == a else a}: {line}")
    for a, b in sorted(pair_wrong):
        failures.insert(0, f"wrong data between rank {a} ({host[a]}) and rank {b} ({host[b]}) "
                           "in the pair exchanges")
        note(a, failures[0])
        note(b, failures[0])
    return failures, evidence, links


def finding(evidence: dict, bad: dict, unsettled: dict, links: list, link_lines: dict, host_of: dict):
    """The finding in the shared shape (ncclbench.locate.finding): a host with a bad rank is
    drained, a host with other evidence (a slow group not localised, an unsettled rank) is a
    suspect; `links` ([a, b] rank pairs) with their evidence from `link_lines` ({(a, b): line})."""
    from ncclbench.locate.finding import build

    where = {r: (h, [r]) for r, h in host_of.items()}
    records = {tuple(sorted(p)): {"evidence": link_lines.get(tuple(sorted(p)), "a link between them is slow"),
                                  "below_pct": None} for p in links}
    return build(where, {r: [] for r in bad}, {r: [line] for r, line in unsettled.items() if r not in bad},
                 records, evidence)


def group_records(runs, peaks, slow, wrong, found: set, host: dict, instances: dict, collectives: list,
                  backends: dict, transport: dict, paths: dict | None = None) -> list[dict]:
    """One record per group; `found`: ranks found slow (or at a slow link) inside groups;
    `paths`: {group: the path NCCL's log named} where it was read."""
    out = []
    for dim, cells in runs.items():
        for g in instances[dim]:
            mine = [c for c in cells if c.group == g]
            best = {coll: max(c.busbw for c in mine if c.collective == coll)
                    for coll in collectives if any(c.collective == coll for c in mine)}
            verdict = "wrong" if g in wrong.get(dim, {}) else ("slow" if (dim, g) in slow or set(g) & found else "ok")
            out.append({"name": group_name(instances, dim, g), "dim": dim, "ranks": list(g),
                        "hosts": sorted({host[r] for r in g}), "backend": backends[dim],
                        "best_busbw": best, "link_peak_gbps": peaks.get(g), "verdict": verdict,
                        "transport": transport.get(g, []),
                        "nccl_path": ((paths or {}).get(g) or {}).get("label")})
    return out


def timed_out_report(message: str, host_of: dict, notes: list):
    """Every rank's report after a timeout: the late ranks' hosts to drain, from the
    message the first rank to give up left in the store."""
    from ncclbench.faults.preflight.verdict import PreflightReport

    from ncclbench.engine.hang import culprits_in

    from ncclbench.locate.finding import build

    late = culprits_in(message)
    where = [f"rank {r} ({host_of.get(r, 'host unknown')})" for r in late]
    known = {r: (h, [r]) for r, h in host_of.items()}
    hung = {r: [f"rank(s) {ranks_text([q for q in late if host_of.get(q) == host_of[r]])} hung: {message}"]
            for r in late if r in host_of}
    line = message + (f" ({', '.join(where)})" if where else "")
    return PreflightReport(passed=False, failures=[line], hosts=build(known, hung, {}, {}).hosts, timed_out=True,
                           notes=notes)


def short_reason(evidence: str) -> str:
    """The kind of evidence a rank was found slow by, for a group's failure line."""
    if evidence.startswith("alone"):
        return "is slow alone"
    if evidence.startswith("in "):
        return "is slow with all its partners in its group"
    if evidence.startswith("with known-good"):
        return "is slow with known-good partners"
    if evidence.startswith("is on "):
        return "is on the host with the slow NIC"
    return "is in a slow group of every dimension"


def hosts_text(ranks, host: dict) -> str:
    return ",".join(sorted({host[r] for r in ranks}))
