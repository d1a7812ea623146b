"""`ncclbench fleet`'s report: one verdict per node (ok | drain | link | suspect), the
evidence, and the files a scheduler and a spreadsheet read. Pure: built by rank 0 from what
it measured, unit-tested from made-up numbers.

The drain list holds the nodes to take out of service: short of GPUs or another model, slow
alone, slow with partners that tested clean, or dead/hung during the run. A slow link names
its two nodes and is not a drain (neither node is at fault alone; the cable or switch port
between them is) but it fails the run like a drain. Suspects (slow once, not settled within
the localisation rounds, or not judged further after a rank got stuck waiting for a lost
partner) are listed and fail nothing."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, field

from ncclbench.errors import ExitCode


@dataclass
class FleetReport:
    plan: dict
    nodes: list = field(default_factory=list)       # [{host, ranks, gpus, model, verdict, reasons, alone_busbw}]
    links: list = field(default_factory=list)       # [{hosts: [a, b], reason}]
    tests: list = field(default_factory=list)       # one row per node pair tested
    schedule: dict = field(default_factory=dict)
    cost_s: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def drain(self) -> list[dict]:
        return [{"host": n["host"], "reason": "; ".join(n["reasons"])} for n in self.nodes if n["verdict"] == "drain"]

    @property
    def exit_code(self) -> int:
        return int(ExitCode.REGRESSION if self.drain or self.links else ExitCode.OK)

    # ---- building ----
    @classmethod
    def build(cls, plan, layout, inventory, alone, errors, busbw, dead, loc, schedule, rounds, costs, lost=None,
              hung=None):
        name = lambda n: layout.names[n]  # noqa: E731 - the verdict's text names nodes by host
        bad, links, suspects = loc.verdict(name)
        for pair, line in (hung or {}).items():  # both ends stuck: a link that fails the run, neither node drained
            links.setdefault(pair, line)
        report = cls(plan={k: v for k, v in vars(plan).items()})
        for n, host in enumerate(layout.names):
            reasons = [r for r in (inventory.get(n), alone.get(n), errors.get(n), dead.get(n)) if r]
            if n in bad:
                reasons.append(f"pairs: {bad[n]}")
            verdict = "drain" if reasons else "ok"
            link_lines = [f"{'hung' if pair in (hung or {}) else 'slow'} link: {line}"
                          for pair, line in links.items() if n in pair]
            if verdict == "ok" and link_lines:
                verdict, reasons = "link", link_lines
            elif verdict == "ok" and n in suspects:
                verdict, reasons = "suspect", [suspects[n]]
            elif verdict == "ok" and lost and n in lost:
                verdict, reasons = "suspect", [lost[n]]
            report.nodes.append({"host": host, "ranks": layout.ranks[n], "gpus": layout.gpus[n],
                                 "model": layout.models[n], "verdict": verdict, "reasons": reasons,
                                 "alone_busbw_gbps": busbw.get(n)})
        report.links = [{"hosts": [name(a), name(b)], "reason": line} for (a, b), line in sorted(links.items())]
        report.tests = [test_row(t, loc, name) for t in loc.tests]
        report.schedule = {"screening": schedule, "screening_rounds": sum(1 for r in rounds if r and r[0][2] == "screen"),
                           "localisation_rounds": sum(1 for r in rounds if r and r[0][2] != "screen"),
                           "nodes_in_pairs": len(loc.active)}
        report.cost_s = dict(costs)
        if loc.band > plan.band:
            report.notes.append(f"pairs between the nodes ran over TCP sockets (NCCL's NET/Socket), whose healthy pairs "
                                f"spread wider: judged at a {100 * loc.band:.0f}% band, as preflight does (--band sets one)")
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
        out = [f"# ncclbench fleet: {len(self.nodes)} nodes, backend {self.plan['backend']}, at most "
               f"{self.plan['nbytes']} B per exchange per rail (each pair's size set by a probe to fit "
               f"{self.plan['budget_s']:g} s of pairs; the JSON and CSV give each test's bytes)",
               f"# pairs: {s.get('screening')} screening in {s.get('screening_rounds')} rounds, then "
               f"{s.get('localisation_rounds')} localisation rounds ({s.get('nodes_in_pairs')} nodes in pairs)",
               "#", f"# {'host':<24s} {'gpus':>4s} {'verdict':<8s} reason"]
        for n in self.nodes:
            reason = n["reasons"][0] if n["reasons"] else ""
            out.append(f"  {n['host']:<24s} {n['gpus']:>4d} {n['verdict']:<8s} {reason}")
            out.extend(f"  {'':<24s} {'':>4s} {'':<8s} {r}" for r in n["reasons"][1:])
        out.extend(f"# LINK {' <-> '.join(link['hosts'])}: {link['reason']}"
                   + (f" (NCCL path {link['path']})" if link.get("path") else "") for link in self.links)
        out.extend(f"# Note: {n}" for n in self.notes)
        out += [f"# {line}" for line in self.scontrol_lines()]
        cost = ", ".join(f"{k} {v:.1f} s" for k, v in self.cost_s.items())
        verdict = f"{len(self.drain)} node(s) to drain" + (f", {len(self.links)} slow link(s)" if self.links else "")
        out.append(f"# Fleet {'FAILED' if self.exit_code else 'passed'}: {verdict} ({cost})")
        return out

    def scontrol_lines(self) -> list[str]:
        from ncclbench.results import drain

        return drain.render([(d["host"], d["reason"]) for d in self.drain], "scontrol", "fleet")[0]

    def to_dict(self) -> dict:
        return {"drain": self.drain, "exit_code": self.exit_code, "nodes": self.nodes, "links": self.links,
                "schedule": self.schedule, "cost_s": self.cost_s, "notes": self.notes, "plan": self.plan,
                "tests": self.tests}

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
    frac, rail = loc.ref.below(t)
    value = t.rails[rail] if rail is not None and t.rails else None
    return {"round": t.round + 1, "kind": t.kind, "host_a": name(t.a), "host_b": name(t.b), "rail": rail,
            "bytes": t.nbytes[rail] if rail is not None and rail < len(t.nbytes) else None,
            "busbw_gbps": None if value is None else round(value, 6),
            "reference_gbps": None if rail is None or loc.ref.ref(rail) is None else round(loc.ref.ref(rail), 6),
            "below_reference_pct": round(100 * frac, 1), "slow": loc.ref.slow(t), "error": t.error}
