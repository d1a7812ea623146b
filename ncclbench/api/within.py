"""Preflight inside one group: what a single group tells about its own ranks, with no peer
group to compare it with and no floor.

Ranks in lock-step all take as long as the slowest one, so a group's own numbers cannot say
which rank holds it back. Two measurements can:

- **Each rank alone**: every rank runs the same op in a one-rank group of its own (no
  partner to wait for: all_gather out of place, a copy through the library's own path) at
  the same time; a rank whose op is slower than the other ranks' is slow itself (its host,
  its GPU, its library), whatever its partners do.
- **The pairs inside a group** (groups of PAIR_SWEEP_RANKS[0] to [1] ranks): every pair of
  its members exchanges both ways, the groups' round-robin rounds side by side; a rank slow
  with most of its partners is slow, a pair slow on its own is a slow link.

Both are measured twice; only what is flagged both times counts."""

from __future__ import annotations

import math

from ncclbench.api.preflight_verdict import group_name
from ncclbench.engine.collectives import ALL_GATHER

PAIR_SWEEP_RANKS = (3, 16)   # below 3: one pair has no reference; above 16: too many rounds for a preflight
SOLO_COLLECTIVE = ALL_GATHER


def solo_times(pf, nbytes: int, iters: int) -> dict:
    """{global rank: seconds per op} of every rank's op alone (median iteration)."""
    import torch.distributed as dist

    from ncclbench.api.measure import _measure

    me = dist.get_rank()
    group = pf.solo_group
    if group is None:  # only this rank creates its group (no whole-world step per group)
        group = pf.solo_group = dist.new_group([me], use_local_synchronization=True)
    options = dict(iters=iters, warmup_iters=2, check=0, per_iter_timing=1, datatype=pf.setup["datatype"],
                   timeout=pf.timeout_s)
    rows = _measure(SOLO_COLLECTIVE.name, str(nbytes), group, options, label=f"rank {me} alone", parent=pf.world,
                    exit_on_timeout=pf.exit_on_timeout)
    cell = rows[0].out_of_place if rows.has_rows and len(rows) else None
    mine = None
    if cell is not None and math.isfinite(cell.time_us):
        mine = (cell.per_iter or {}).get("p50_us") or cell.time_us
    everyone = pf.world.exchange(mine, "preflight: gathering the ranks' own times", pf.timeout_s)
    return {r: t / 1e6 for r, t in enumerate(everyone) if t}


def judge_alone(pf, nbytes: int, iters: int) -> dict:
    """{rank: evidence} for the ranks slow alone in both measurements."""
    from ncclbench.api.verdict import judge_solo, worst_below

    if len(pf.host) < 2:
        return {}
    first = solo_times(pf, nbytes, iters)
    pf.margins["alone"] = round(worst_below({r: 1.0 / t for r, t in first.items()}), 4)
    flagged = judge_solo(first, pf.setup["band"])
    if not flagged:
        return {}
    second = solo_times(pf, nbytes, iters)
    again = judge_solo(second, pf.setup["band"])
    out = {}
    for r in sorted(set(flagged) & set(again)):
        others = sorted(t for q, t in second.items() if q != r)
        median = others[len(others) // 2]
        out[r] = (f"alone (its own {SOLO_COLLECTIVE.name}, {nbytes} B, no partner) takes {1e6 * second[r]:.4g} us per op "
                  f"against {1e6 * median:.4g} us on the other ranks ({100 * again[r]:.0f}% slower in rate), each time")
    return out


def swept_groups(pf) -> dict:
    """{dim: its groups} whose groups are small enough and large enough for a pair sweep."""
    low, high = PAIR_SWEEP_RANKS
    return {d: groups for d, groups in pf.instances.items() if all(low <= len(g) <= high for g in groups)}


def judge_inside_pairs(pf, nbytes: int) -> tuple[dict, dict]:
    """({rank: evidence}, {(a, b): evidence}) from two pair sweeps inside each swept group."""
    from ncclbench.api.verdict import group_pair_rounds, judge_group_pairs

    bad, links = {}, {}
    for dim, groups in swept_groups(pf).items():
        rounds = group_pair_rounds(groups)
        repeats = [pf._pairs(rounds, nbytes) for _ in range(2)]
        below: dict = {}
        found, slow_links = judge_group_pairs(repeats, groups, pf.pair_kind, pf.setup["band"], below)
        pf.margins[f"pairs in {dim}"] = round(max(below.values(), default=0.0), 4)
        unjudged = sorted(p for p in repeats[0] if p not in below)
        if unjudged:
            pf.notes.append(f"{dim}: pair(s) {', '.join(f'{a}-{b}' for a, b in unjudged)} not judged: fewer than three "
                            "pairs of their kind (host, link type, NCCL channel sharing) in their group to compare with")
        for r, line in found.items():
            bad.setdefault(r, f"in {group_name(pf.instances, dim, next(g for g in groups if r in g))}: {line}")
        for pair, line in slow_links.items():
            where = group_name(pf.instances, dim, next(g for g in groups if pair[0] in g))
            links.setdefault(pair, f"in {where}: {line}")
    return bad, links


def one_group_note(dim: str, size: int) -> str:
    """The note on a dimension of one group: how its ranks are judged (pairs are swept only
    inside groups of PAIR_SWEEP_RANKS)."""
    low, high = PAIR_SWEEP_RANKS
    how = ("alone and in pairs inside it" if low <= size <= high else
           f"alone only (pairs are swept inside groups of {low} to {high} ranks; a slow link here is not found)")
    return (f"{dim}: one group, no peer group to compare it with: its ranks are judged {how}; the group as a whole "
            "only against a floor (--min-peak-busbw)")
