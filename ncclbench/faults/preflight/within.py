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

Ranks alone are measured once, and again where that flags something; the pairs go through
the localisation core (faults.preflight.pairs). Each rank and pair is judged at its best
(noise on a shared host only slows)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.faults.preflight.groups import group_name
from ncclbench.faults.preflight.pairs import RunFace
from ncclbench.engine.collectives import ALL_GATHER

PAIR_SWEEP_RANKS = (3, 16)   # below 3: one pair has no reference; above 16: too many rounds for a preflight
SOLO_COLLECTIVE = ALL_GATHER
# a GPU's op alone must outlast its host's call to be timed by the device
# (docs/design/preflight-size-by-time.md)
SOLO_MIN_BYTES_GPU = 256 << 20
# a rank flagged alone is measured again while it stays flagged, SOLO_RUNS runs in all, each
# after the first about SOLO_AGAIN_S (docs/design/preflight-alone-remeasure.md)
SOLO_RUNS = 4
SOLO_AGAIN_S = 0.25


def shares_of(host: dict, gpu: dict) -> dict:
    """{rank: what it shares with other ranks}: its host's cores, and its physical GPU (by
    UUID; several ranks on one GPU under MPS share its engines even on different hosts)."""
    return {r: frozenset({("host", h)} | ({("gpu", gpu[r])} if gpu.get(r) else set())) for r, h in host.items()}


def yardstick(best: dict, flagged, shares: dict):
    """The fastest rank not flagged, sharing nothing with a flagged rank where there is one
    (it then runs beside every wave); None when every rank is flagged."""
    busy = set().union(*(shares[r] for r in flagged)) if flagged else set()
    pool = [r for r in best if r not in flagged and not shares[r] & busy] or [r for r in best if r not in flagged]
    return min(pool, key=lambda r: best[r], default=None)


def waves_of(ranks: list, shares: dict) -> list[list]:
    """`ranks` in waves of ranks that share nothing (shares_of), in order: ranks of one host,
    or of one GPU, measured in turn, never beside each other on what they share."""
    waves: list[list] = []
    for r in ranks:
        wave = next((w for w in waves if all(not shares[q] & shares[r] for q in w)), None)
        if wave is None:
            waves.append([r])
        else:
            wave.append(r)
    return waves


def judge_ranks_alone(pf: RunFace, nbytes: int, iters: int) -> tuple[dict, float]:
    """({rank: evidence} for the ranks slow alone at their best, the margin: how far the
    slowest rank not named fell below the others at its best): measured once, all at once,
    and where that flags ranks, those again while the others wait, up to SOLO_RUNS runs in
    all. A re-measure runs the flagged ranks in waves of ranks that share neither a host nor
    a GPU (pf.shares: ranks of one host share its cores, ranks on one GPU its engines:
    docs/design/preflight-alone-remeasure.md). A yardstick, the fastest rank not flagged
    (sharing nothing with a flagged rank where there is one), runs beside each wave, or where
    it shares something with a rank of the wave, alone just before and just after it, its
    faster time kept.
    A re-measure counts scaled by the level of the ranks not flagged (the fastest one's best
    time) over the yardstick's time then, both ways: a moment slow for
    everyone clears nothing, and a rank measured on idle cores is not compared with the
    others' times on busy ones; a re-measure without a yardstick time counts for nothing.
    Each rank's best time against the others' best times; a rank is named only when every
    run flagged it (one that a changed reference flags late is not named unmeasured)."""
    from ncclbench.locate.alone import slow_alone
    from ncclbench.locate.stats import reference, worst_below

    if len(pf.host) < 2:
        return {}, 0.0
    alone_band = pf.setup.get("alone_band", pf.setup["band"])
    best = pf.alone_times(nbytes, iters)
    flagged = slow_alone(best, alone_band)
    runs = 1
    while flagged and runs < SOLO_RUNS:
        waves = waves_of(sorted(flagged), pf.shares)
        ref = yardstick(best, flagged, pf.shares)
        level = min((best[q] for q in best if q not in flagged), default=None)
        for wave in waves:
            # each wave about SOLO_AGAIN_S / waves (at least 3 timed ops, 2 warm-up), from its own slowest rank
            again_iters = max(3, min(iters, int(SOLO_AGAIN_S / len(waves) / max(best[r] for r in wave))))
            beside = ref is not None and all(not pf.shares[r] & pf.shares[ref] for r in wave)
            alone = ref is not None and not beside
            before = pf.alone_times(nbytes, again_iters, only={ref}) if alone else {}
            again = pf.alone_times(nbytes, again_iters, only=set(wave) | ({ref} if beside else set()))
            after = pf.alone_times(nbytes, again_iters, only={ref}) if alone else {}
            yard = again.get(ref) if beside else min((t for t in (before.get(ref), after.get(ref)) if t), default=None)
            if ref is not None and not yard:
                continue  # no yardstick time: the moment is unknown, the re-measure says nothing
            scale = level / yard if yard else 1.0
            for r in wave:
                if again.get(r):
                    best[r] = min(best[r], again[r] * scale)
        flagged = {r: v for r, v in slow_alone(best, alone_band).items() if r in flagged}
        runs += 1
    out = {}
    reference_s = 1.0 / reference([1.0 / t for t in best.values()])[0] if flagged else None
    for r in sorted(flagged):
        out[r] = (f"alone (its own {SOLO_COLLECTIVE.name}, {nbytes} B, no partner) takes {1e6 * best[r]:.4g} us per op "
                  f"at best against a reference of {1e6 * reference_s:.4g} us (the faster half of the {len(best)} "
                  f"ranks; {100 * flagged[r]:.0f}% slower in rate, best of {runs})")
    return out, round(worst_below({r: 1.0 / t for r, t in best.items() if r not in flagged}), 4)  # the healthy rest


def swept_groups(pf) -> dict:
    """{dim: its groups} whose groups are small enough and large enough for a pair sweep."""
    low, high = PAIR_SWEEP_RANKS
    return {d: groups for d, groups in pf.instances.items() if all(low <= len(g) <= high for g in groups)}


@dataclass
class InsidePairs:
    """What the pair sweeps inside groups found: {rank: evidence} slow with every partner,
    {(a, b): evidence} slow links, {rank: evidence} not settled, the margins, notes, and the
    pairs tested (the report's `pairs`)."""

    bad: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)
    unsettled: dict = field(default_factory=dict)
    margins: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    records: list = field(default_factory=list)


def judge_inside_pairs(pf: RunFace, share_s: float) -> InsidePairs:
    """The pair sweeps inside each swept group, judged by the localisation core within about
    `share_s` seconds: the groups' round-robin rounds, one dimension after another, as the
    screening; then the rounds the Localiser asks for."""
    from ncclbench.faults.preflight.pairs import localise, unjudged_notes
    from ncclbench.locate.schedule import group_pair_rounds

    swept = swept_groups(pf)
    rounds = [r for groups in swept.values() for r in group_pair_rounds(groups)]
    if not rounds:
        return InsidePairs()
    loc = localise(pf, rounds, share_s)
    bad, links, unsettled = loc.verdict(pf.who)
    margins = loc.margins()

    def where(rank):
        dim = next(d for d, groups in swept.items() if any(rank in g for g in groups))
        return group_name(pf.instances, dim, next(g for g in swept[dim] if rank in g))

    return InsidePairs({r: f"in {where(r)}: slow with every partner: {line}" for r, line in bad.items()},
                       {pair: f"in {where(pair[0])}: {line}" for pair, line in links.items()},
                       {r: f"in {where(r)}: {line}" for r, line in unsettled.items()},
                       {"ranks in pairs": margins["endpoints"], "pairs": margins["pairs"]},
                       unjudged_notes(", ".join(swept), loc), loc.pair_records(pf.host.get))


def one_group_note(dim: str, size: int) -> str:
    """The note on a dimension of one group: how its ranks are judged (pairs are swept only
    inside groups of PAIR_SWEEP_RANKS)."""
    low, high = PAIR_SWEEP_RANKS
    how = ("alone and in pairs inside it" if low <= size <= high else
           f"alone only (pairs are swept inside groups of {low} to {high} ranks; a slow link here is not found)")
    return (f"{dim}: one group, no peer group to compare it with: its ranks are judged {how}; the group as a whole "
            "only against a floor (--min-peak-busbw)")
