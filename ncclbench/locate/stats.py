"""The statistics of localisation: a robust reference of higher-is-better readings, the
one-sided best-of, and how many repeats settle a verdict.

Noise on a shared host or fabric is one-sided: another job's traffic or a busy CPU only
ever slows a reading, a fault slows every one. So an endpoint or pair is judged at its best
reading, and the healthy spread is read from the better readings only."""

from __future__ import annotations

import math
import statistics

MAD_SIGMA = 1.4826   # a normal distribution's standard deviation per median absolute deviation
MAD_WIDTH = 3.0      # robust standard deviations a value may fall below the reference
# From UPPER_SPREAD_FROM values on, the spread is read from the values above the reference
# (the top quarter): for a normal distribution the median of their distances to the
# reference (the 75th percentile) is UPPER_Z standard deviations, and contention, which only
# slows readings, does not reach them.
UPPER_SPREAD_FROM = 8
UPPER_Z = 0.4758      # 87.5th minus 75th percentile of a standard normal
# Pairs are many and each is judged on every rail: a pair's cut lies PAIR_WIDTH healthy
# standard deviations below the reference (docs/design/localisation.md).
PAIR_WIDTH = 5.0
# Noise widens the band, up to this: where healthy pairs spread over more than this, a
# pair 20x below the reference is still slow.
MAX_WIDTH = 0.95
# The chance a healthy endpoint (or pair) at stake passes for bad, times how many are at
# stake: each is looked at after every test, so false alarms per run stay near this.
FALSE_ALARM_TARGET = 0.001
CONFIRM = 2   # the fewest tests (and distinct partners of a bad endpoint) that settle a verdict


def reference(values: list[float]) -> tuple[float, float]:
    """(reference, robust spread) of higher-is-better values: the median of the better half
    and 1.4826 x that half's median absolute deviation from it. The spread is 0 below three
    values in that half: a deviation from one or two values is no estimate of the noise."""
    ordered = sorted(values)
    upper = ordered[len(ordered) // 2:]
    ref = statistics.median(upper)
    if len(upper) < 3:
        return ref, 0.0
    return ref, MAD_SIGMA * statistics.median(abs(v - ref) for v in upper)


def healthy_spread(values: list[float]) -> tuple[float, float]:
    """(reference, healthy standard deviation): from UPPER_SPREAD_FROM values on, read from
    the values above the reference; below that, the better half's robust spread."""
    ref, spread = reference(values)
    if len(values) >= UPPER_SPREAD_FROM:
        above = [v - ref for v in values if v > ref]
        if len(above) >= 2:
            spread = statistics.median(above) / UPPER_Z
    return ref, spread


def worst_below(values: dict) -> float:
    """How far the lowest value falls below the reference, as a fraction (0 when none does):
    the margin a check had, reported beside its verdict."""
    if len(values) < 2:
        return 0.0
    ref, _ = reference(list(values.values()))
    return max(0.0, 1.0 - min(values.values()) / ref) if ref > 0 else 0.0


def slow_outliers(values: dict, band: float) -> dict:
    """{key: fraction below the reference} for the keys whose (higher-is-better) value falls
    below the reference by more than max(band, MAD_WIDTH robust spreads); nothing with fewer
    than two values (no peers to compare with)."""
    if len(values) < 2:
        return {}
    ref, spread = reference(list(values.values()))
    if ref <= 0:
        return {}
    cut = ref * (1.0 - max(band, MAD_WIDTH * spread / ref))
    return {key: 1.0 - v / ref for key, v in values.items() if v < cut}


def best_of(repeats: list[dict]) -> dict:
    """{key: the highest value over the repeats that have it}: what an endpoint or pair
    reaches at best."""
    out: dict = {}
    for values in repeats:
        for key, v in values.items():
            out[key] = max(out.get(key, v), v)
    return out


def best_time(samples: list[float]) -> float:
    """The fastest of one endpoint's timed iterations: the same rule for times."""
    return min(samples)


def aligned_best_time(per_rank_iters) -> float:
    """The best time of a collective from its ranks' per-iteration times: each iteration's
    slowest rank (it ends when its last rank does), then the best iteration. Iterations are
    aligned first: one rank's best and another's from different iterations time no
    collective that ran."""
    return min(max(per_iter) for per_iter in zip(*per_rank_iters))


def repeats_needed(low: int, total: int, at_stake: int, target: float = FALSE_ALARM_TARGET) -> int:
    """The fewest tests, all low, that make a healthy pair (or endpoint) unlikely: with a
    share c of healthy tests low (estimated (low + 1) / (total + 2)), at_stake x c^k below
    target; at least CONFIRM."""
    c = (low + 1) / (total + 2)
    k = math.log(target / max(1, at_stake)) / math.log(c)
    return max(CONFIRM, math.ceil(k - 1e-9))
