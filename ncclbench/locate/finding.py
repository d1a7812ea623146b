"""The one shape of what `pairs`, `preflight` and `fleet` found: each host with a verdict
(ok | suspect | drain) and its evidence, slow links as host pairs with their ranks, and the
drain list (host names). Built from the endpoints' verdicts (ranks or nodes) by every
command alike, written to JSON under the same keys, printed in the same lines."""

from __future__ import annotations

from dataclasses import dataclass, field

VERDICTS = ("ok", "suspect", "drain")   # in order of gravity: a metric's value is its index


@dataclass
class Finding:
    hosts: list = field(default_factory=list)   # [{host, ranks, verdict, evidence, causes}]
    links: list = field(default_factory=list)   # [{hosts, ranks, evidence, below_pct, path}]
    notes: list = field(default_factory=list)

    @property
    def drain(self) -> list[str]:
        return [h["host"] for h in self.hosts if h["verdict"] == "drain"]

    @property
    def localised(self) -> bool:
        """Something to act on: a host to drain or a slow link."""
        return bool(self.drain or self.links)

    def to_dict(self) -> dict:
        return {"hosts": self.hosts, "links": self.links, "drain": self.drain, "notes": self.notes}

    def lines(self) -> list[str]:
        """The verdict lines every command prints under its own table: hosts not ok, then links."""
        out = []
        for h in self.hosts:
            if h["verdict"] != "ok":
                out.append(f"# {h['verdict'].upper()} {h['host']} (rank{'s' if len(h['ranks']) != 1 else ''} "
                           f"{','.join(map(str, h['ranks']))})")
                out.extend(f"#     {e}" for e in h["evidence"])
                out.extend(f"#     cause: {c}" for c in h.get("causes", []))
        for link in self.links:
            via = f" (NCCL path {link['path']})" if link.get("path") else ""
            out.append(f"# LINK {' <-> '.join(link['hosts'])} (ranks {','.join(map(str, link['ranks']))}): "
                       f"{link['evidence']}{via}")
        return out

    def add_causes(self, causes: dict) -> None:
        """{host: [hardware or setting cause]} onto the hosts' records."""
        for h in self.hosts:
            h["causes"] = list(causes.get(h["host"], []))


def build(where: dict, drained: dict, suspects: dict, links: dict, host_evidence: dict | None = None) -> Finding:
    """The finding from the endpoints' verdicts.

    `where`: {endpoint: (host, [ranks])} for every endpoint judged; `drained`, `suspects`:
    {endpoint: [evidence lines]}; `links`: {(a, b): {"evidence", "below_pct", "path"}}
    between two endpoints; `host_evidence`: {host: [lines]} more evidence by host (a host
    with some is at least a suspect). A host with a drained endpoint is drained; a host at a
    slow link is a suspect (the cable, port or switch between the two is at fault, not
    either host alone): a link drains nothing."""
    hosts: dict = {}
    for e, (host, ranks) in where.items():
        rec = hosts.setdefault(host, {"host": host, "ranks": [], "verdict": "ok", "evidence": [], "causes": []})
        rec["ranks"] = sorted(set(rec["ranks"]) | set(ranks))

    def note(host, verdict, lines):
        rec = hosts[host]
        if VERDICTS.index(verdict) > VERDICTS.index(rec["verdict"]):
            rec["verdict"] = verdict
        rec["evidence"] += [line for line in lines if line not in rec["evidence"]]

    for e, lines in sorted(drained.items()):
        note(where[e][0], "drain", lines)
    for e, lines in sorted(suspects.items()):
        note(where[e][0], "suspect", lines)
    records = []
    for (a, b), info in sorted(links.items()):
        ha, hb = where[a][0], where[b][0]
        for me, other in ((ha, hb), (hb, ha)):
            note(me, "suspect", [f"slow link with {other}: {info['evidence']}"])
        records.append({"hosts": [ha, hb], "ranks": sorted(set(where[a][1]) | set(where[b][1])),
                        "evidence": info["evidence"], "below_pct": info.get("below_pct"), "path": info.get("path")})
    for host, lines in sorted((host_evidence or {}).items()):
        if host in hosts and lines:
            note(host, "suspect", lines)
    return Finding(hosts=[hosts[h] for h in sorted(hosts)], links=records)
