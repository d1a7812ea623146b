"""Endpoints alone: what an endpoint shows without a partner (its own op, or its node's
local collectives), and what it has (GPU count and model), against its peers.

A rank or node whose own op is slow against the others' at its best is slow itself (its
host, its GPU, its library), whatever its partners do: `slow_alone` is the one rule, the
robust reference of ncclbench.locate.stats."""

from __future__ import annotations

from collections import Counter

from ncclbench.locate.stats import reference, slow_outliers


def slow_alone(seconds: dict, band: float) -> dict:
    """{endpoint: fraction below the others in rate} for the endpoints whose own op (seconds
    per op at its best) is slow against the others'."""
    return slow_outliers({r: 1.0 / t for r, t in seconds.items() if t > 0}, band)


def expected_count(counts: dict, wanted: int | None) -> int:
    """--gpus-per-node, or the most common count (the larger one on a tie)."""
    if wanted:
        return wanted
    tally = Counter(counts.values())
    return max(tally, key=lambda c: (tally[c], c)) if tally else 0


def judge_inventory(counts: dict, models: dict, wanted: int | None) -> dict:
    """{node: reason} for nodes short of GPUs or with another GPU model than most nodes."""
    expected = expected_count(counts, wanted)
    tally = Counter(m for m in models.values() if m)
    common = tally.most_common(1)[0][0] if tally else None
    out = {}
    for node, count in counts.items():
        if count < expected:
            out[node] = f"has {count} GPU{'s' if count != 1 else ''} of {expected} expected"
        elif models.get(node) and common and models[node] != common and tally[common] > tally[models[node]]:
            out[node] = f"GPU model {models[node]!r}, the fleet's is {common!r}"
    return out


def judge_alone(busbw: dict, band: float) -> dict:
    """{node: reason} from {node: {collective: busbw GB/s}} of each node's local ranks alone,
    each collective judged against the other nodes'."""
    out: dict = {}
    for coll in sorted({c for v in busbw.values() for c in v}):
        values = {n: v[coll] for n, v in busbw.items() if coll in v}
        if len(values) < 2:
            continue
        ref, _ = reference(list(values.values()))
        for node, frac in sorted(slow_outliers(values, band).items()):
            line = (f"node-local {coll} {values[node]:.3g} GB/s busbw, {100 * frac:.0f}% below the fleet's "
                    f"reference {ref:.3g} GB/s")
            out[node] = f"{out[node]}; {line}" if node in out else line
    return out
