"""`ncclbench fleet`'s verdict (ncclbench.locate.localiser.simulate) on a made-up fabric
with one-sided contention: per share of contended pair tests, over T trials of N nodes with
3 bad nodes and 2 bad links planted (each slowed to 40%), the false drains, false links,
planted faults missed, suspects left and rounds run. Pure Python, no torch, no GPU.

    python benchmarks/fleet_noise.py --nodes 1024 --trials 20 --contended 0,0.05,0.1,0.2

Prints a markdown table (docs/fleet.md quotes it)."""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ncclbench.locate.localiser import planted_fabric, simulate  # noqa: E402
from ncclbench.locate.schedule import screening_rounds  # noqa: E402


def plant(n: int, seed: int) -> tuple[set, set]:
    """3 bad nodes and 2 bad links among the screening pairs of the other nodes."""
    rng = random.Random(1000 + seed)
    _, rounds = screening_rounds(n)
    bad = set(rng.sample(range(n), 3))
    links = set(rng.sample([p for r in rounds for p in r if not set(p) & bad], 2))
    return bad, links


def trial(n: int, contended: float, seed: int, rails: int, noise: float, max_localise: int) -> dict:
    bad, links = plant(n, seed)
    measure = planted_fabric(n, rails, bad, links, noise=noise, contended=contended, seed=seed)
    loc, _name, screened, extra = simulate(n, rails, measure, 0.2, 4, max_localise)
    found, found_links, suspects = loc.verdict(str)
    return {"false_drains": len(set(found) - bad), "missed_nodes": len(bad - set(found)),
            "false_links": len(set(found_links) - links), "missed_links": len(links - set(found_links)),
            "suspects": len(suspects), "rounds": len(screened) + extra}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--contended", default="0,0.05,0.1,0.2", help="shares of contended pair tests, comma-separated")
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--noise", type=float, default=0.05, help="Gaussian noise of every test, relative")
    ap.add_argument("--localise-rounds", type=int, default=6)
    a = ap.parse_args()
    print(f"{a.nodes} nodes x {a.rails} rails, {a.trials} trials, 3 bad nodes + 2 bad links planted per trial, "
          f"{100 * a.noise:g}% Gaussian noise, contended tests slowed 1.3-3x\n")
    print("| contended | false drains | false links | bad nodes missed | bad links missed | suspects | rounds |")
    print("|---|---|---|---|---|---|---|")
    for share in (float(x) for x in a.contended.split(",")):
        begun = time.monotonic()
        runs = [trial(a.nodes, share, s, a.rails, a.noise, a.localise_rounds) for s in range(a.trials)]
        tot = {k: sum(r[k] for r in runs) for k in runs[0] if k != "rounds"}
        rounds = sorted(r["rounds"] for r in runs)
        print(f"| {100 * share:g}% | {tot['false_drains']} | {tot['false_links']} | {tot['missed_nodes']} of "
              f"{3 * a.trials} | {tot['missed_links']} of {2 * a.trials} | {tot['suspects']} | "
              f"{rounds[0]}-{rounds[-1]} |", flush=True)
        print(f"  ({time.monotonic() - begun:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
