"""`ncclbench fleet` verdicts from measured numbers: pure functions and one state machine
(Localiser), no torch and no distributed code, so that the rules can be unit-tested at
thousands of nodes and rank 0 runs exactly what the tests run.

Nodes are indices 0..n-1 here; hosts only appear in the evidence text.

Noise on a shared fabric is one-sided: another job's traffic, or a busy CPU, only ever
slows a measurement, never speeds it up. A NIC caps every pair of its node. So the number
judged is what a node or a pair reaches at best, never an average:

- **Each node alone**: too few GPUs (against --gpus-per-node or the most common count), a
  GPU model other than the most common, or its node-local all_reduce / all_gather busbw slow
  against the other nodes' (the robust reference of ncclbench.api.verdict), at its best over
  up to 1 + CONFIRM readings (a node slow in one is measured again).
- **The cut** of each rail: the reference is the median of the better half of the screening
  tests; the healthy spread is read from the values above it only (the top quarter of the
  tests, which contention does not reach); the cut lies max(band, 5 healthy standard
  deviations) below the reference (at most MAX_WIDTH).
- **A node's best**: per rail, the most it reached in any test with any partner. A node is
  *low* when its best on some rail stays below the cut (a healthy NIC shows its speed with
  one healthy partner); else it is *high*.
- **A pair's best**: per rail, the most it reached over its repeats; a pair is low when its
  best stays below the cut on some rail.
- **How many tests settle a verdict**: contention strikes some healthy tests, rarely the
  same pair twice. Each reading is scored by its lowest rail's fraction of that rail's cut.
  For a low node or pair scoring v at its best, c is the share of the other readings
  (screening and spare tests not its own) scoring at or below v, (m + 1) / (N + 2):
  a healthy one stays that low through k tests with chance about c^k. k is the least (at
  least 2) for which the nodes (or pairs) at stake times c^k stays below FALSE_ALARM_TARGET:
  a node 100x slow needs 2 tests, one just below the cut, more.
- **Bad node**: low, with k tests against high partners (two or more of them), all
  below the cut on that rail. **Bad link**: a low pair of two high nodes, low in all of its
  k tests. What looks slow and is not settled yet is re-tested: a low node with a fresh
  high partner, a low pair as itself (contention rarely strikes the same pair twice).
- Whatever is still low and unsettled after the localisation rounds is a suspect (named,
  not drained, fails nothing)."""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field

from ncclbench.api.verdict import reference, slow_outliers

CONFIRM = 2   # the fewest tests (and distinct partners of a bad node) that settle a verdict
# Pairs are many and each is judged on every rail: the cut lies FLEET_WIDTH healthy standard
# deviations below the reference (about 1 healthy pair test in 15,000 with 8 rails falls
# below it by Gaussian noise alone). From UPPER_SPREAD_FROM values on, the spread is read
# from the values above the reference (the top quarter): for a normal distribution the
# median of their distances to the reference (the 75th percentile) is UPPER_Z standard
# deviations, and contention, which only slows tests, does not reach them.
UPPER_SPREAD_FROM = 8
UPPER_Z = 0.4758      # 87.5th minus 75th percentile of a standard normal
FLEET_WIDTH = 5.0
# Noise widens the band, up to this: on a fleet so noisy that healthy pairs spread over more
# than this, a pair 20x below the reference is still slow.
MAX_WIDTH = 0.95
# The chance a healthy node (or pair) at stake passes for bad, times how many are at stake:
# each is looked at after every test (up to about ten), so false alarms per run stay below
# about ten times this.
FALSE_ALARM_TARGET = 0.001


# ---- each node alone ------------------------------------------------------------------------------
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


# ---- pairs -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairTest:
    """One measurement of a node pair: busbw per rail (GB/s per direction; None where the
    exchange failed), the round and why it ran (screen | clean | retest | spare), and the
    bytes each rail exchanged (empty when not recorded)."""

    round: int
    a: int
    b: int
    rails: tuple
    kind: str = "screen"
    error: str | None = None
    nbytes: tuple = ()


def rail_values(test: PairTest) -> list[float]:
    """Busbw per rail, a failed rail as 0."""
    return [0.0 if v is None else v for v in test.rails]


@dataclass
class RailReference:
    """Per rail: (reference GB/s, cut GB/s): below the cut is slow."""

    per_rail: dict = field(default_factory=dict)
    floor: float | None = None
    _cuts: list = field(default_factory=list, repr=False, compare=False)

    def cut(self, rail: int) -> float:
        ref_cut = self.per_rail.get(rail, (None, 0.0))[1]
        return max(ref_cut, self.floor or 0.0)

    def ref(self, rail: int) -> float | None:
        return self.per_rail.get(rail, (None, None))[0]

    def below(self, test: PairTest) -> tuple[float, int | None]:
        """(largest fraction below the reference over the rails, that rail); 1.0 on a failed rail."""
        worst, where = 0.0, None
        for r, v in enumerate(test.rails):
            ref = self.ref(r) or self.floor
            frac = 1.0 if v is None else (max(0.0, 1.0 - v / ref) if ref else 0.0)
            if frac > worst or where is None:
                worst, where = frac, r
        return worst, where

    def low_rail(self, values) -> int | None:
        """The first rail whose value is below its cut (None: none is)."""
        if len(self._cuts) < len(values):
            self._cuts = [self.cut(r) for r in range(len(values))]
        cuts = self._cuts
        for r, v in enumerate(values):
            if v < cuts[r]:
                return r
        return None

    def slow(self, test: PairTest) -> bool:
        return self.low_rail(rail_values(test)) is not None


def healthy_spread(values: list[float]) -> tuple[float, float]:
    """(reference, healthy standard deviation) of higher-is-better values whose noise only
    ever lowers them: from UPPER_SPREAD_FROM values on, read from the values above the
    reference; below that, the better half's robust spread (ncclbench.api.verdict)."""
    ref, spread = reference(values)
    if len(values) >= UPPER_SPREAD_FROM:
        above = [v - ref for v in values if v > ref]
        if len(above) >= 2:
            spread = statistics.median(above) / UPPER_Z
    return ref, spread


def rail_reference(tests: list[PairTest], band: float, floor: float | None = None) -> RailReference:
    """The reference and cut of each rail from the screening tests that completed."""
    rails = max((len(t.rails) for t in tests), default=0)
    return reference_of([[t.rails[r] for t in tests if r < len(t.rails) and t.rails[r] is not None]
                         for r in range(rails)], band, floor)


def reference_of(per_rail: list[list[float]], band: float, floor: float | None = None) -> RailReference:
    """The reference and cut of each rail from its values: the cut lies max(band, FLEET_WIDTH
    healthy standard deviations) below the reference, at most max(band, MAX_WIDTH)."""
    out = RailReference(floor=floor)
    for r, values in enumerate(per_rail):
        if len(values) < 2:
            continue
        ref, spread = healthy_spread(values)
        width = min(max(band, FLEET_WIDTH * spread / ref), max(band, MAX_WIDTH)) if ref > 0 else 1.0
        out.per_rail[r] = (ref, ref * (1.0 - width))
    return out


def repeats_needed(low: int, total: int, at_stake: int, target: float = FALSE_ALARM_TARGET) -> int:
    """The fewest tests, all low, that make a healthy pair (or node) unlikely: with a share c
    of healthy tests low (estimated (low + 1) / (total + 2)), at_stake x c^k below target."""
    c = (low + 1) / (total + 2)
    k = math.log(target / max(1, at_stake)) / math.log(c)
    return max(CONFIRM, math.ceil(k - 1e-9))


def score(values, ref: RailReference) -> float:
    """The lowest rail's value as a fraction of its cut (below 1: low); rails without a cut
    do not count."""
    return min((v / ref.cut(r) for r, v in enumerate(values) if ref.cut(r) > 0), default=math.inf)


@dataclass
class Judgement:
    """One reading of every test so far (Localiser.judge)."""

    best: dict                 # node -> best busbw per rail
    node_ref: RailReference    # the nodes' bests: reference and cut per rail
    low_nodes: dict            # node -> the rail its best stays below the cut
    pair_tests: dict           # frozenset((a, b)) -> [PairTest]
    low_pairs: dict            # frozenset((a, b)) -> rail
    evidence: dict             # low node -> [PairTest] with high partners
    k_node: dict               # low node -> tests that settle it
    k_pair: dict               # low pair -> tests that settle it
    readings: int              # screening and spare tests: the readings repeats are counted against
    bad: set = field(default_factory=set)
    links: set = field(default_factory=set)

    @property
    def high(self) -> set:
        return set(self.best) - set(self.low_nodes)


class Localiser:
    """Pair tests in, bad nodes / bad links / suspects out, and the next localisation round.

    `active`: the nodes that take part in pairs (passed on their own); `dead` grows as nodes
    stop answering (their tests are dropped from the judgement)."""

    def __init__(self, active: list[int], band: float, floor: float | None = None):
        self.active = sorted(active)
        self.band, self.floor = band, floor
        self.tests: list[PairTest] = []
        self.dead: set = set()
        self.ref = RailReference(floor=floor)
        self._judged: tuple | None = None

    def record(self, tests: list[PairTest]) -> None:
        self.tests.extend(tests)

    def set_reference(self, band: float | None = None) -> None:
        """The pairs' cut from the screening tests, at `band` from now on when given (the
        nodes' cut, made at each judgement, follows it)."""
        if band is not None:
            self.band = band
        screening = [t for t in self.tests if t.kind == "screen" and not {t.a, t.b} & self.dead]
        self.ref = rail_reference(screening, self.band, self.floor)
        self._judged = None

    # ---- reading the tests ----
    def judge(self) -> Judgement:
        """The best of every node and pair, what is low, and what is settled (cached until
        tests are added or nodes die)."""
        key = (len(self.tests), frozenset(self.dead), id(self.ref))
        if self._judged and self._judged[0] == key:
            return self._judged[1]
        live = [t for t in self.tests if not {t.a, t.b} & self.dead]
        best: dict = {}
        pair_tests: dict = {}
        for t in live:
            values = rail_values(t)
            for x in (t.a, t.b):
                best[x] = [max(u, v) for u, v in zip(best[x], values)] if x in best else list(values)
            pair_tests.setdefault(frozenset((t.a, t.b)), []).append(t)
        # a node's best against the others' best: its own reference, from the nodes' bests
        node_ref = reference_of([list(v) for v in zip(*best.values())], self.band, self.floor) if best else self.ref
        low_nodes = {n: r for n, values in best.items() if (r := node_ref.low_rail(values)) is not None}
        high = set(best) - set(low_nodes)
        low_pairs = {}
        for pair, tests in pair_tests.items():
            if all(t.kind == "spare" for t in tests):
                continue  # spare pairs are load and references, never opened as candidates
            r = self.ref.low_rail([max(v) for v in zip(*(rail_values(t) for t in tests))])
            if r is not None:
                low_pairs[pair] = r
        # the readings: screening and spare tests (not chosen for being slow), as scores
        # against each cut (the lowest rail's fraction of its cut: a node is judged on its
        # worst rail); a node's or pair's own readings are no witness for or against it, and
        # all of them score at or below its best
        unbiased = [t for t in live if t.kind in ("screen", "spare")]
        by_node = sorted(score(rail_values(t), node_ref) for t in unbiased)
        by_pair = sorted(score(rail_values(t), self.ref) for t in unbiased)
        # the pairs that can be named: spare-only pairs are never candidates
        stake = len({frozenset((t.a, t.b)) for t in live if t.a in high and t.b in high and t.kind != "spare"})
        j = Judgement(best, node_ref, low_nodes, pair_tests, low_pairs, {}, {}, {}, len(unbiased))
        for n in low_nodes:
            own = sum(1 for t in unbiased if n in (t.a, t.b))
            low = bisect.bisect_right(by_node, score(best[n], node_ref)) - own
            j.k_node[n] = repeats_needed(max(0, low), len(unbiased) - own, len(best))
            j.evidence[n] = [t for t in live if n in (t.a, t.b) and (t.b if t.a == n else t.a) in high]
            partners = {t.b if t.a == n else t.a for t in j.evidence[n]}
            if len(j.evidence[n]) >= j.k_node[n] and len(partners) >= CONFIRM:
                j.bad.add(n)
        for pair in low_pairs:
            pair_best = [max(v) for v in zip(*(rail_values(t) for t in pair_tests[pair]))]
            # its own readings are no witness for or against it (all are at or below its best)
            own = sum(1 for t in pair_tests[pair] if t.kind in ("screen", "spare"))
            low = bisect.bisect_right(by_pair, score(pair_best, self.ref)) - own
            j.k_pair[pair] = repeats_needed(max(0, low), len(unbiased) - own, stake)
            if pair <= high and len(pair_tests[pair]) >= j.k_pair[pair]:
                j.links.add(pair)
        self._judged = (key, j)
        return j

    def wanted(self) -> list[tuple[int, str]]:
        """(node, "clean" | "retest:<other>") for what the verdict still needs: a low node
        short of tests against high partners, then a low pair of two high nodes short of
        repeats."""
        j = self.judge()
        want = [(n, "clean") for n in sorted(j.low_nodes) if n not in j.bad]
        # the pairs low in the most tests first: they are the likeliest links and need most rounds
        for pair in sorted(j.low_pairs, key=lambda p: (-len(j.pair_tests[p]), sorted(p))):
            if pair <= j.high and pair not in j.links:
                a, b = sorted(pair)
                want.append((a, f"retest:{b}"))
        return want

    def clean_nodes(self) -> list[int]:
        """The high nodes: partners that show a low node's speed."""
        high = self.judge().high
        return [n for n in self.active if n not in self.dead and n in high]

    def met(self) -> set:
        return {frozenset((t.a, t.b)) for t in self.tests}

    # ---- the verdict ----
    def verdict(self, name) -> tuple[dict, dict, dict]:
        """({bad node: evidence}, {(a, b): evidence}, {suspect node: evidence}); `name(node)`
        gives a node's host for the text."""
        j = self.judge()
        bad_lines = {n: self._bad_line(n, j, name) for n in sorted(j.bad)}
        links, suspects = {}, {}
        for n in sorted(set(j.low_nodes) - j.bad):
            r = j.low_nodes[n]
            suspects[n] = (f"not localised: rail {r} reaches at best {j.best[n][r]:.3g} GB/s (the nodes' cut "
                           f"{j.node_ref.cut(r):.3g}), {len(j.evidence[n])} of the {j.k_node[n]} tests needed against "
                           f"partners that reach it")
        for pair in sorted(j.low_pairs, key=sorted):
            a, b = sorted(pair)
            if pair & j.bad or not pair <= j.high:
                continue
            line = self._pair_line(a, b, name)
            if pair in j.links:
                links[(a, b)] = (f"{line}; {name(a)} reaches {self._best_text(a, j)} with others, "
                                 f"{name(b)} {self._best_text(b, j)}")
            else:
                for x in (a, b):
                    suspects.setdefault(x, f"not localised: {line} ({j.k_pair[pair]} needed)")
        return bad_lines, links, suspects

    def _best_text(self, node: int, j: Judgement) -> str:
        return "/".join(f"{v:.3g}" for v in j.best[node]) + " GB/s"

    def _tests_of(self, a: int, b: int) -> list[PairTest]:
        return [t for t in self.tests if {t.a, t.b} == {a, b}]

    def _pair_line(self, a: int, b: int, name) -> str:
        tests = self._tests_of(a, b)
        slow = [t for t in tests if self.ref.slow(t)]
        values = [max(v) for v in zip(*(rail_values(t) for t in tests))]
        rail = self.ref.low_rail(values)
        rail = 0 if rail is None else rail
        ref = self.ref.ref(rail)
        failed = all(t.rails[rail] is None for t in tests)
        err = next((t.error for t in tests if t.error), None)
        what = f"failed ({err})" if failed else f"at best {values[rail]:.3g} GB/s"
        against = f", {100 * (1 - values[rail] / ref):.0f}% below the reference {ref:.3g} GB/s" if ref and not failed else ""
        return (f"{name(a)} <-> {name(b)} rail {rail}: {what}{against}, slow in {len(slow)} of "
                f"{len(tests)} test{'s' if len(tests) != 1 else ''}")

    def _bad_line(self, node: int, j: Judgement, name) -> str:
        r = j.low_nodes[node]
        tests = j.evidence[node]
        partners = sorted({t.b if t.a == node else t.a for t in tests})
        ref = j.node_ref.ref(r)
        below = (f", {100 * (1 - j.best[node][r] / ref):.0f}% below what the nodes reach at best ({ref:.3g} GB/s)"
                 if ref else "")
        return (f"rail {r} reaches at best {j.best[node][r]:.3g} GB/s{below}, in {len(tests)} tests with "
                f"{len(partners)} partners ({', '.join(name(p) for p in partners[:4])}"
                f"{', ...' if len(partners) > 4 else ''}), each of which reaches the cut "
                f"{j.node_ref.cut(r):.3g} GB/s with others")


def localisation_round(loc: Localiser, seed: int = 0) -> list[tuple[int, int, str]]:
    """The next localisation round: (a, b, kind) with kind "clean" (a low node with a high
    partner it has not met), "retest" (a low pair again) or "spare" (high nodes left over,
    paired so that every node stays busy: more tests of the fleet's healthy speed); empty
    when nothing needs measuring."""
    from ncclbench.engine.fleet_schedule import repair_round

    want = loc.wanted()
    if not want:
        return []
    clean = loc.clean_nodes()
    pairs, _waiting = repair_round(want, clean, loc.met(), clean, seed)
    retests = {frozenset((node, int(kind.split(":")[1]))) for node, kind in want if kind.startswith("retest:")}
    suspects = {node for node, kind in want if kind == "clean"}
    out = []
    for a, b in pairs:
        kind = "retest" if frozenset((a, b)) in retests else ("clean" if {a, b} & suspects else "spare")
        out.append((a, b, kind))
    return out


def simulate(n: int, rails: int, measure, band: float, screen_rounds: int, max_localise: int,
             all_pairs_rounds: int = 15, seed: int = 0):
    """The whole pair phase on made-up numbers: `measure(round, a, b)` -> busbw per rail.
    (Localiser, screening schedule name, screening rounds, localisation rounds run). What
    rank 0 does with measured numbers, for tests at sizes no machine here can run."""
    from ncclbench.engine.fleet_schedule import screening_rounds

    name, rounds = screening_rounds(n, all_pairs_rounds, screen_rounds, seed)
    loc = Localiser(list(range(n)), band)
    for k, pairs in enumerate(rounds):
        loc.record([PairTest(k, a, b, tuple(measure(k, a, b)), "screen") for a, b in pairs])
    loc.set_reference()
    done = 0
    while done < max_localise:
        pairs = localisation_round(loc, seed + done)
        if not any(kind != "spare" for _a, _b, kind in pairs):
            break
        k = len(rounds) + done
        loc.record([PairTest(k, a, b, tuple(measure(k, a, b)), kind) for a, b, kind in pairs])
        done += 1
    return loc, name, rounds, done


def planted_fabric(n: int, rails: int, bad_nodes=(), bad_links=(), noise: float = 0.05, contended: float = 0.0,
                   slow: float = 0.4, seed: int = 0):
    """A made-up fabric for simulate(): every rail reaches 100 GB/s with Gaussian noise
    (`noise`, relative), a planted bad node or link `slow` x that on every rail, and a share
    `contended` of the pair tests slowed 1.3-3x on every rail by other traffic (one-sided:
    never faster)."""
    rng = random.Random(seed)
    bad = set(bad_nodes)
    links = {frozenset(p) for p in bad_links}

    def measure(_k, a, b):
        cap = slow if a in bad or b in bad or frozenset((a, b)) in links else 1.0
        factor = rng.uniform(1.3, 3.0) if rng.random() < contended else 1.0
        return [100.0 * cap * rng.gauss(1.0, noise) / factor for _ in range(rails)]
    return measure
