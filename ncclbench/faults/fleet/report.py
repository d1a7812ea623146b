"""`ncclbench fleet`'s report: one verdict per node (ok | suspect | drain, the shape of
ncclbench.locate.finding), the evidence, and the files a scheduler and a spreadsheet read. Pure: built by rank 0 from what
it measured, unit-tested from made-up numbers.

The drain list holds the nodes to take out of service: short of GPUs or another model, slow
alone, slow with partners that tested clean, or dead/hung during the run. A slow link names
its two nodes and is not a drain (neither node is at fault alone; the cable or switch port
between them is; both are suspects) but it fails the run like a drain. Suspects (slow once, not settled within
the localisation rounds, or not judged further after a rank got stuck waiting for a lost
partner) are listed and fail nothing."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, field

from ncclbench.errors import ExitCode
from ncclbench.locate.finding import Finding
from ncclbench.locate.finding import build as build_finding


@dataclass
class FleetReport:
    plan: dict
    finding: Finding = field(default_factory=Finding)   # hosts, links, drain (ncclbench.locate.finding)
    tests: list = field(default_factory=list)           # one row per node pair tested
    pairs: list = field(default_factory=list)           # each node pair at its best (locate's shape)
    schedule: dict = field(default_factory=dict)
    cost_s: dict = field(default_factory=dict)
    margins: dict = field(default_factory=dict)

    @property
    def hosts(self) -> list:
        return self.finding.hosts

    @property
    def links(self) -> list:
        return self.finding.links

    @property
    def notes(self) -> list:
        return self.finding.notes

    @property
    def drain(self) -> list[str]:
        return self.finding.drain

    @property
    def exit_code(self) -> int:
        return int(ExitCode.REGRESSION if self.finding.localised else ExitCode.OK)

    @classmethod
    def from_dict(cls, doc: dict) -> "FleetReport":
        """The report from its dict (to_dict): what the Python API returns on every rank."""
        finding = Finding(hosts=doc["hosts"], links=doc["links"], notes=doc["notes"])
        return cls(plan=doc["plan"], finding=finding, tests=doc["tests"], pairs=doc.get("pairs", []),
                   schedule=doc["schedule"], cost_s=doc["cost_s"], margins=doc["margins"])

    def raise_if_failed(self) -> None:
        """FleetError naming what to drain and the slow links, when there is any."""
        from ncclbench.errors import FleetError

        if self.exit_code:
            links = ", ".join(" <-> ".join(link["hosts"]) for link in self.links)
            raise FleetError(f"fleet failed: drain {', '.join(self.drain) or 'nothing'}"
                             + (f"; slow link(s) {links}" if links else ""), self.exit_code)

    # ---- building ----
    @classmethod
    def build(cls, plan, layout, inventory, alone, errors, busbw, dead, loc, schedule, rounds, costs, lost=None,
              hung=None):
        name = lambda n: layout.names[n]  # noqa: E731 - the verdict's text names nodes by host
        bad, slow_links, suspects = loc.verdict(name)
        links = {pair: {"evidence": line, "below_pct": loc.pair_below(*pair)}
                 for pair, line in slow_links.items()}
        for pair, line in (hung or {}).items():  # both ends stuck: a link that fails the run, neither node drained
            links.setdefault(tuple(sorted(pair)), {"evidence": f"hung: {line}", "below_pct": None})
        drained = {}
        for n in range(len(layout.names)):
            reasons = [r for r in (inventory.get(n), alone.get(n), errors.get(n), dead.get(n)) if r]
            if n in bad:
                reasons.append(f"pairs: {bad[n]}")
            if reasons:
                drained[n] = reasons
        unsettled = {n: [line] for n, line in suspects.items() if n not in drained}
        unsettled.update({n: [line] for n, line in (lost or {}).items() if n not in drained and n not in unsettled})
        where = {n: (host, layout.ranks[n]) for n, host in enumerate(layout.names)}
        finding = build_finding(where, drained, unsettled, links)
        for h in finding.hosts:
            n = layout.names.index(h["host"])
            h.update(gpus=layout.gpus[n], model=layout.models[n], alone_busbw_gbps=busbw.get(n))
        report = cls(plan={k: v for k, v in vars(plan).items()}, finding=finding)
        report.tests = [test_row(t, loc, name) for t in loc.tests]
        report.pairs = loc.pair_records(name, ranks_of=lambda n: list(layout.ranks[n]))
        report.schedule = {"screening": schedule, "screening_rounds": sum(1 for r in rounds if r and r[0][2] == "screen"),
                           "localisation_rounds": sum(1 for r in rounds if r and r[0][2] != "screen"),
                           "nodes_in_pairs": len(loc.active)}
        report.cost_s = dict(costs)
        report.margins = loc.margins()
        if loc.band > plan.band:
            report.notes.append(f"pairs between the nodes ran over TCP sockets (NCCL's NET/Socket), whose healthy pairs "
                                f"spread wider: judged at a {100 * loc.band:.0f}% band (--band sets one)")
        report.plan["band_used"] = loc.band
        if len(loc.active) == 2 and not plan.floor:
            report.notes.append("two nodes in pairs: one pair has nothing to compare with; give --min-busbw to judge it")
        return report

    def add_retests(self, retested: dict, not_ok: set) -> None:
        """{host: times measured alone again}: in the schedule, and a note for each host that
        was slow in a reading alone and then within the band at its best (`not_ok`: the hosts
        judged otherwise: slow at their best, failed, gone or not judged further)."""
        self.schedule["node_alone_retests"] = dict(sorted(retested.items()))
        for host, times in sorted(retested.items()):
            if host not in not_ok:
                self.notes.append(f"{host} was slow in a reading of its node alone and within the band at its best "
                                  f"of {times + 1} readings")

    def add_paths(self, paths: dict) -> None:
        """The path NCCL's log named for each node pair ({(host a, host b): label}) on its links and tests."""
        def path_of(a, b):
            return paths.get((a, b)) or paths.get((b, a))
        for link in self.links:
            link["path"] = path_of(*link["hosts"])
        for t in self.tests:
            t["path"] = path_of(t["host_a"], t["host_b"])

    # ---- output ----
    def lines(self) -> list[str]:
        s = self.schedule
        out = [f"# ncclbench fleet: {len(self.hosts)} nodes, backend {self.plan['backend']}, at most "
               f"{self.plan['nbytes']} B per exchange per rail (each pair's size set by a probe to fit "
               f"{self.plan['budget_s']:g} s of pairs; the JSON and CSV give each test's bytes)",
               f"# pairs: {s.get('screening')} screening in {s.get('screening_rounds')} rounds, then "
               f"{s.get('localisation_rounds')} localisation rounds ({s.get('nodes_in_pairs')} nodes in pairs)",
               "#", f"# {'host':<24s} {'gpus':>4s} {'verdict':<8s} reason"]
        for n in self.hosts:
            reason = n["evidence"][0] if n["evidence"] else ""
            out.append(f"  {n['host']:<24s} {n['gpus']:>4d} {n['verdict']:<8s} {reason}")
            out.extend(f"  {'':<24s} {'':>4s} {'':<8s} {r}" for r in n["evidence"][1:])
        out.extend(f"# LINK {' <-> '.join(link['hosts'])}: {link['evidence']}"
                   + (f" (NCCL path {link['path']})" if link.get("path") else "") for link in self.links)
        if self.margins:
            out.append(f"# Worst fall below the reference: nodes {100 * self.margins['endpoints']:.0f}%, "
                       f"pairs {100 * self.margins['pairs']:.0f}%")
        out.extend(f"# Note: {n}" for n in self.notes)
        out += [f"# {line}" for line in self.scontrol_lines()]
        cost = ", ".join(f"{k} {v:.1f} s" for k, v in self.cost_s.items())
        verdict = f"{len(self.drain)} node(s) to drain" + (f", {len(self.links)} slow link(s)" if self.links else "")
        out.append(f"# Fleet {'FAILED' if self.exit_code else 'passed'}: {verdict} ({cost})")
        return out

    def scontrol_lines(self) -> list[str]:
        from ncclbench.results import drain

        return drain.render({"drain": self.drain, "hosts": self.hosts}, "scontrol", "fleet")[0]

    def to_dict(self) -> dict:
        return {"command": "fleet", "passed": not self.exit_code, "exit_code": self.exit_code,
                **self.finding.to_dict(), "margins": self.margins, "pairs": self.pairs,
                "schedule": self.schedule, "cost_s": self.cost_s, "plan": self.plan, "tests": self.tests}

    def emit(self) -> None:
        """Print the report (stdout) and write the files asked for."""
        sys.stdout.write("\n".join(self.lines()) + "\n")
        sys.stdout.flush()
        p = self.plan
        if p.get("json_path"):
            with open(p["json_path"], "w") as f:
                json.dump(self.to_dict(), f, indent=1)
                f.write("\n")
        if p.get("csv_path"):
            with open(p["csv_path"], "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
                writer.writeheader()
                writer.writerows(self.tests)
        from ncclbench.results.metrics import write_report_files

        write_report_files("fleet", self.to_dict(), p.get("backend", ""), p.get("metrics_path"), p.get("drain_path"),
                           p.get("drain_format") or "scontrol")


CSV_FIELDS = ["round", "kind", "host_a", "host_b", "rail", "bytes", "busbw_gbps", "reference_gbps",
              "below_reference_pct", "slow", "error", "path"]


def test_row(t, loc, name) -> dict:
    """A pair test as a flat row (its worst rail: busbw at its best timed exchange, and the
    bytes that rail's probe chose)."""
    ref = loc.ref_of(t)
    frac, rail = ref.below(t)
    value = t.rails[rail] if rail is not None and t.rails else None
    return {"round": t.round + 1, "kind": t.kind, "host_a": name(t.a), "host_b": name(t.b), "rail": rail,
            "bytes": t.nbytes[rail] if rail is not None and rail < len(t.nbytes) else None,
            "busbw_gbps": None if value is None else round(value, 6),
            "reference_gbps": None if rail is None or ref.ref(rail) is None else round(ref.ref(rail), 6),
            "below_reference_pct": round(100 * frac, 1), "slow": ref.slow(t), "error": t.error}
