"""`tune --paired C`: every configuration measured side by side with NCCL's default on
communicators that live for the whole launch, and judged by its speed relative to the
default in the same repeat. Pure: no torch, no files.

Why. Across hosts the spread of single repeats on fresh communicators cannot get near 3 %:
communicators of one configuration differ from each other, and drift moves whole launches.
Side by side on live communicators, several per configuration, with hundreds of repeats,
the median ratio's interval can (see docs/design/tune-across-sockets.md).

How. Each configuration (the default and every forced combination) gets C communicators,
made when first used and kept until the launch ends; repeat r (from 1) runs every
configuration once, back to back, on its communicator set (r - 1) mod C, in an order turned
by one place every repeat, so that every configuration holds every place about as often.
At each size and for each combination the ratio of its busbw to the default's in the same
repeat is taken. Its median is given an interval that is the wider of a two-level bootstrap
(the communicator sets drawn again with replacement, then the repeats within each drawn
set) and a t-interval over the sets' own medians: with a handful of sets the bootstrap sees
too little of how communicators differ (all configurations equally fast, communicators 5 %
apart, 2 sets of 20: the bootstrap alone called the best of 7 a win at 53 % of sizes), and
Student's t pays for having only that many. Both are at 95 % shared out over the
combinations compared (Bonferroni), since the best of several is the one that is judged.
A set is told apart by the launch that ran it: a launch started again after a crash has new
communicators under the same set number.

The rule: at one size a combination wins when its median ratio is at least `min_gain` %
above 1, the interval's lower end is above 1, none of its results or the default's is
wrong, at least PAIRED_MIN_REPEATS repeats of the two ran side by side in two sets or more
(only such combinations are compared), both were timed alike (an eager fallback against a
replayed default is no ratio), and it is not what NCCL already runs there. The noise column
is the widest half-width, in %, of the compared combinations' intervals at that size (timed
like the default), so it says how precisely any of them was compared, not only the best."""

from __future__ import annotations

import math
import random
import statistics

from ncclbench.tune.ranges import RULE_TEXT, Series, Verdict, default_unusable, judge

PAIRED_MIN_REPEATS = 8    # a 95 % interval of a median from fewer repeats is mostly its extremes
DRAWS = 2000              # bootstrap draws: the 2.5 % tails rest on 50 draws each
SEED = 1                  # the same numbers give the same interval in every report
PAIRED_RULE_TEXT = ("paired: a combination wins at a size when the median of its busbw over the default's in the "
                    "same repeat (the gain column) is >= {gain:g} % above 1 and the lower end of its interval is "
                    "above 1 (the wider of a two-level bootstrap, communicator sets then repeats, and a t-interval "
                    "over the sets' medians, at 95 % shared over the combinations compared), none of its results is "
                    f"wrong, {PAIRED_MIN_REPEATS} repeats or more in 2 communicator sets or more ran side by side, "
                    "timed like the default, and it is not the algorithm, protocol and channel count NCCL already "
                    "runs there")
NOISE_TEXT = ("noise: the widest half-width, in %, of the compared combinations' intervals at that size; gain: the "
              "median of the per-repeat ratio, which drift can set apart from the ratio of the two busbw columns")


def rule_text(min_gain: float, paired: int) -> str:
    """The rule printed with every table and written in tune.json and the config's comments."""
    return (PAIRED_RULE_TEXT if paired else RULE_TEXT).format(gain=min_gain)


def comm_set(round_: int, sets: int) -> int:
    """The communicator set repeat `round_` (numbered from 1) runs on: (round_ - 1) mod sets."""
    return (round_ - 1) % sets


def rotated(configs: list, round_: int) -> list:
    """The order of `configs` in repeat `round_`: shifted by one place every repeat, so that
    over any run of repeats every configuration holds every place as often as any other
    (within one), whatever the number of sets; drift within a repeat then favours none."""
    if not configs:
        return []
    turn = (round_ - 1) % len(configs)
    return configs[turn:] + configs[:turn]


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom (closed forms for whole df)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...)), df - 3 powers
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...), df - 2 powers
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(coverage: float, df: int) -> float:
    """t with P(|T| <= t) = coverage (bisection)."""
    low, high = 0.0, 1.0
    while _t_within(high, df) < coverage:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_within(mid, df) < coverage else (low, mid)
    return high


def group_by_set(pairs: list[tuple]) -> dict:
    """{communicator set: its ratios} from (set, ratio) pairs, in first-seen order."""
    out: dict = {}
    for s, r in pairs:
        out.setdefault(s, []).append(r)
    return out


def ratio_interval(pairs: list[tuple], draws: int = DRAWS, seed: int = SEED,
                   coverage: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of the ratios in `pairs` ((communicator set, ratio) per repeat):
    the median over all repeats and an interval from a two-level bootstrap (the sets drawn
    again with replacement, then the repeats within each drawn set)."""
    middle = statistics.median(r for _s, r in pairs)
    groups = list(group_by_set(pairs).values())
    rng = random.Random(seed)
    medians = []
    for _ in range(draws):
        drawn = rng.choices(groups, k=len(groups))   # the sets again, then the repeats within each
        medians.append(statistics.median([r for g in drawn for r in rng.choices(g, k=len(g))]))
    medians.sort()
    tail = int((1 - coverage) / 2 * draws)
    return middle, medians[tail], medians[draws - 1 - tail]


def comparison_interval(pairs: list[tuple], compared: int = 1) -> tuple[float, float, float] | None:
    """(median, low, high) the rule judges on: the wider of the two-level bootstrap's interval
    and a t-interval over the per-set medians, on the log scale of the ratio (with few sets
    the bootstrap sees too little of how communicators differ; the t-interval pays for having
    only that many; on the log scale it never reaches below 0, as it did from 2 sets), each at 95 %
    shared out over the `compared` combinations (the best of several is the one compared).
    None with fewer than two communicator sets: nothing says how communicators differ."""
    by_set = group_by_set(pairs)
    if len(by_set) < 2:
        return None
    coverage = 1 - 0.05 / max(1, compared)
    middle, low, high = ratio_interval(pairs, coverage=coverage)
    means = [statistics.median(g) for g in by_set.values()]
    k, t = len(means), t_quantile(coverage, len(means) - 1)
    if min(means) > 0:  # on the log scale: a ratio's interval stays above 0 however few the sets
        logs = [math.log(m) for m in means]
        centre, half = statistics.fmean(logs), t * statistics.stdev(logs) / math.sqrt(k)
        t_low, t_high = math.exp(centre - half), math.exp(centre + half)
    else:
        centre, half = statistics.fmean(means), t * statistics.stdev(means) / math.sqrt(k)
        t_low, t_high = centre - half, centre + half
    return middle, min(low, t_low), max(high, t_high)


def paired_ratios(default: Series, other: Series, sets: int) -> list[tuple]:
    """(communicator set, other's busbw / the default's) for every repeat both ran and measured.
    A set is told apart by the launch that ran it (Series.sets): a launch started again
    after a crash makes new communicators under the same set number. A repeat the two ran
    in different launches (split by a relaunch) was not side by side and is left out."""
    mine = {r: (x, key) for r, x, key in zip(other.rounds or (), other.busbw, other.sets or [None] * len(other.busbw))}
    out = []
    for r, base, key in zip(default.rounds or (), default.busbw, default.sets or [None] * len(default.busbw)):
        x, other_key = mine.get(r, (None, None))
        if x is None or not math.isfinite(x) or not math.isfinite(base) or base <= 0 or other_key != key:
            continue  # an unmeasured or unreadable value (NaN, inf from a damaged file) pairs with nothing
        out.append(((comm_set(r, sets), key), x / base))
    return out


def half_width_pct(interval: tuple[float, float, float]) -> float:
    middle, low, high = interval
    return (high - low) / 2 / middle * 100 if middle > 0 else math.inf


def _could_win(default: Series, other: Series) -> bool:
    """Whether `other` may be called a win over `default` at all: timed the same way (a ratio
    side by side means nothing across timings) and not NCCL's own setting forced again."""
    same_setting = other.setting is not None and other.setting == default.setting
    return other.timing == default.timing and not same_setting


def judge_paired(size: int, default: Series, candidates: dict[str, Series], sets: int,
                 min_gain_pct: float = 2.0) -> Verdict:
    """The verdict at one size by the paired rule (candidates: label -> Series with rounds).
    Only combinations with PAIRED_MIN_REPEATS repeats side by side, in two sets or more, are
    compared (and give the noise column)."""
    v = Verdict(size, default)
    v.why = default_unusable(default)
    if v.why:
        return v
    if not any(b > 0 for b in default.busbw):
        v.why = "the default measured 0 GB/s"
        return v
    paired = {k: paired_ratios(default, s, sets) for k, s in candidates.items() if not s.wrong}
    enough = {k: p for k, p in paired.items() if len(p) >= PAIRED_MIN_REPEATS}
    # The best is chosen among the combinations that could win (timed like the default, not
    # NCCL's own setting), so one that cannot neither hides a winner nor widens its interval;
    # only where none could is the best of the rest shown, with why it is no win.
    fair = {k: p for k, p in enough.items() if _could_win(default, candidates[k])}
    pool = fair or enough
    intervals = {k: iv for k, p in enough.items() if (iv := comparison_interval(p, len(pool))) is not None}
    alike = [half_width_pct(intervals[k]) for k in pool if k in intervals and candidates[k].timing == default.timing]
    v.noise_pct = max(alike) if alike else None
    if not intervals:
        most = max((len(p) for p in paired.values()), default=0)
        v.why = ("no forced combination ran cleanly beside the default" if not most else
                 f"{most} repeat(s) side by side at most, or one communicator set: too few to tell a gain from "
                 f"noise, no win called (needs {PAIRED_MIN_REPEATS} in 2 sets or more)")
        return v
    chosen = [k for k in pool if k in intervals] or list(intervals)
    v.best = max(chosen, key=lambda k: intervals[k][0])
    v.best_series = candidates[v.best]
    middle, low, high = intervals[v.best]
    v.gain_pct = (middle - 1) * 100
    v.interval = (low, high)
    text = f"interval of the ratio {low:.3f}-{high:.3f}"
    if v.gain_pct <= 0:
        v.win, v.why = False, "the default is faster"
    elif v.gain_pct < min_gain_pct:
        v.win, v.why = False, f"gain below {min_gain_pct:g} %"
    elif low <= 1:
        v.win, v.why = False, f"within noise ({text})"
    elif v.best_series.timing != default.timing:
        v.win, v.why = False, (f"timed {v.best_series.timing or 'otherwise'} against the default's "
                               f"{default.timing or 'unknown'} timing: no ratio side by side")
    elif v.best_series.setting is not None and v.best_series.setting == default.setting:
        v.win, v.why = False, "NCCL's own choice"
    else:
        v.win, v.why = True, f"above noise ({text})"
    return v


def judge_by_rule(size: int, default: Series, candidates: dict[str, Series], repeats: int, min_gain_pct: float,
                  paired: int) -> Verdict:
    """The verdict at one size by the run's rule: paired (`paired` sets) or the spread rule."""
    if paired:
        return judge_paired(size, default, candidates, paired, min_gain_pct)
    return judge(size, default, candidates, repeats, min_gain_pct)
