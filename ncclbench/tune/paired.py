"""`tune --paired C`: every configuration measured side by side with NCCL's default on
communicators that live for the whole launch, and judged by its speed relative to the
default in the same repeat. Pure: no torch, no files.

Why. Across hosts the spread of single repeats on fresh communicators cannot get near 3 %:
on 2 simulated hosts (NCCL over sockets, 4 H200) one configuration's communicators differed
from each other by up to 0.46-0.67 of the default's speed, and drift between launches moved
a comparison by 3-17 %. Side by side on live communicators, several per configuration, with
hundreds of repeats, the 95 % interval of the median ratio came within 3 % at 19 of 24
points (benchmarks/interleave_noise.py; docs/BENCHMARKS.md).

How. Each configuration (the default and every forced combination) gets C communicators,
made when first used and kept until the launch ends; repeat r runs every configuration
once, back to back, on its communicator set r mod C, in an order rotated by one place every
C repeats, so that no set always runs in the same place. At each size and for each
combination the ratio of its busbw to the default's in the same repeat is taken, and its
median is given a 95 % interval by a two-level bootstrap: the communicator sets drawn again
with replacement, then the repeats within each drawn set (what differs from one
communicator to the next is part of the interval, not hidden in it).

The rule: at one size a combination wins when its median ratio is at least `min_gain` %
above 1, the interval's lower end is above 1 (the default is slower beyond the
comparison's own precision), none of its results or the default's is wrong, at least
PAIRED_MIN_REPEATS repeats of the two ran side by side, both were timed alike (an eager
fallback against a replayed default is no ratio), and it is not what NCCL already runs
there. The noise column is the widest half-width, in %, of the intervals of the
combinations at that size (timed like the default), so it says how precisely any of them
was compared, not only the best."""

from __future__ import annotations

import math
import random
import statistics

from ncclbench.tune.ranges import RULE_TEXT, Series, Verdict

PAIRED_MIN_REPEATS = 8    # a 95 % interval of a median from fewer repeats is mostly its extremes
DRAWS = 2000              # bootstrap draws: the 2.5 % tails rest on 50 draws each
SEED = 1                  # the same numbers give the same interval in every report
PAIRED_RULE_TEXT = ("paired: a combination wins at a size when its busbw relative to the default's in the same "
                    "repeat has a median >= {gain:g} % above 1 and a 95 % interval (communicator sets, then repeats, "
                    "drawn again) whose lower end is above 1, none of its results is wrong, "
                    f"{PAIRED_MIN_REPEATS} repeats or more ran side by side, timed like the default, and it is not the "
                    "algorithm, protocol and channel count NCCL already runs there")
NOISE_TEXT = ("noise: the widest half-width of the 95 % intervals of the combinations' median ratio to the default at "
              "that size, in %")


def rule_text(min_gain: float, paired: int) -> str:
    """The rule printed with every table and written in tune.json and the config's comments."""
    return (PAIRED_RULE_TEXT if paired else RULE_TEXT).format(gain=min_gain)


def comm_set(round_: int, sets: int) -> int:
    """The communicator set repeat `round_` (numbered from 1) runs on."""
    return (round_ - 1) % sets


def rotated(configs: list, round_: int, sets: int) -> list:
    """The order of `configs` in repeat `round_`: shifted by one place every `sets` repeats,
    so that set c does not always run in the same place (the order then tracks the set)."""
    if not configs:
        return []
    turn = ((round_ - 1) // max(1, sets)) % len(configs)
    return configs[turn:] + configs[:turn]


def ratio_interval(pairs: list[tuple[int, float]], draws: int = DRAWS, seed: int = SEED) -> tuple[float, float, float]:
    """(median, low, high) of the ratios in `pairs` ((communicator set, ratio) per repeat):
    the median over all repeats and a 95 % interval from a two-level bootstrap."""
    by_set: dict[int, list[float]] = {}
    for s, r in pairs:
        by_set.setdefault(s, []).append(r)
    middle = statistics.median(r for _s, r in pairs)
    groups = list(by_set.values())
    rng = random.Random(seed)
    medians = []
    for _ in range(draws):
        drawn = rng.choices(groups, k=len(groups))   # the sets again, then the repeats within each
        medians.append(statistics.median([r for g in drawn for r in rng.choices(g, k=len(g))]))
    medians.sort()
    tail = int(0.025 * draws)
    return middle, medians[tail], medians[draws - 1 - tail]


def paired_ratios(default: Series, other: Series, sets: int) -> list[tuple[int, float]]:
    """(communicator set, other's busbw / the default's) for every repeat both ran and measured."""
    mine = dict(zip(other.rounds or (), other.busbw))
    out = []
    for r, base in zip(default.rounds or (), default.busbw):
        x = mine.get(r)
        if x is None or math.isnan(x) or math.isnan(base) or base <= 0:
            continue
        out.append((comm_set(r, sets), x / base))
    return out


def half_width_pct(interval: tuple[float, float, float]) -> float:
    middle, low, high = interval
    return (high - low) / 2 / middle * 100 if middle > 0 else math.inf


def judge_paired(size: int, default: Series, candidates: dict[str, Series], sets: int,
                 min_gain_pct: float = 2.0) -> Verdict:
    """The verdict at one size by the paired rule (candidates: label -> Series with rounds)."""
    v = Verdict(size, default)
    if not default.busbw:
        v.why = "the default did not run"
        return v
    eligible = {k: s for k, s in candidates.items() if not s.wrong}
    intervals = {}
    for label, s in candidates.items():
        pairs = paired_ratios(default, s, sets)
        if pairs:
            intervals[label] = (len(pairs), ratio_interval(pairs))
    alike = [half_width_pct(iv) for label, (_n, iv) in intervals.items()
             if candidates[label].timing == default.timing and not candidates[label].wrong]
    v.noise_pct = max(alike) if alike else None
    if default.wrong:
        v.why = "the default's results were wrong"
        return v
    eligible = {k: s for k, s in eligible.items() if k in intervals}
    if not eligible:
        v.why = "no forced combination ran cleanly beside the default"
        return v
    v.best = max(eligible, key=lambda k: intervals[k][1][0])
    v.best_series = eligible[v.best]
    n, (middle, low, high) = intervals[v.best]
    v.gain_pct = (middle - 1) * 100
    v.interval = (low, high)
    if n < PAIRED_MIN_REPEATS:
        v.why = (f"{n} repeat(s) side by side: too few to tell a gain from noise, no win called "
                 f"(needs {PAIRED_MIN_REPEATS})")
        return v
    if v.gain_pct <= 0:
        v.win, v.why = False, "the default is faster"
    elif v.gain_pct < min_gain_pct:
        v.win, v.why = False, f"gain below {min_gain_pct:g} %"
    elif low <= 1:
        v.win, v.why = False, f"within noise (95 % interval of the ratio {low:.3f}-{high:.3f})"
    elif v.best_series.timing != default.timing:
        v.win, v.why = False, (f"timed {v.best_series.timing or 'otherwise'} against the default's "
                               f"{default.timing or 'unknown'} timing: no ratio side by side")
    elif v.best_series.setting is not None and v.best_series.setting == default.setting:
        v.win, v.why = False, "NCCL's own choice"
    else:
        v.win, v.why = True, f"above noise (95 % interval of the ratio {low:.3f}-{high:.3f})"
    return v
