"""Pair tests in; bad endpoints, bad links and suspects out, and the next localisation round.

Endpoints are indices: ranks (`pairs`, `preflight`) or nodes (`fleet`, whose pair tests run
rail by rail); hosts only appear in the evidence text (ncclbench.locate.finding maps
endpoints to hosts). Pairs are compared only with pairs of their own class (`classify(a, b)`:
the pair kinds of ncclbench.locate.kinds; one class for fleet's node pairs), each class with
its own reference and bands, and a class of fewer than `min_pairs` pairs decides nothing.
Every reading is judged at its best (ncclbench.locate.stats):

- **The cut** of each class and rail: the reference is the median of the better half of
  the screening tests; the healthy spread is read from the values above it only; the cut
  lies max(band, PAIR_WIDTH healthy standard deviations) below the reference (at most
  MAX_WIDTH).
- **An endpoint's best**: per rail, the most it reached in any test of the class with any
  partner. It is *low* when its best on some rail stays below the endpoints' cut (a healthy
  NIC shows its speed with one healthy partner); else it is *high*.
- **A pair's best**: per rail, the most it reached over its repeats; a pair is low when its
  best stays below the pairs' cut on some rail.
- **How many tests settle a verdict**: contention strikes some healthy tests, rarely the
  same pair twice. Each reading is scored by its lowest rail's fraction of that rail's cut.
  For a low endpoint or pair scoring v at its best, c is the share of the other readings
  scoring at or below v, (m + 1) / (N + 2): a healthy one stays that low through k tests
  with chance about c^k. k is the least (at least CONFIRM) for which the endpoints (or
  pairs) at stake times c^k stays below FALSE_ALARM_TARGET.
- **Bad endpoint** (slow with every partner): low, with k tests against high partners (two
  or more of them), all below the cut. **Bad link**: a low pair of two high endpoints, low
  in all of its k tests. What looks slow and is not settled yet is re-tested: a low
  endpoint with a fresh high partner, a low pair as itself.
- Whatever is still low and unsettled after the localisation rounds is a suspect (named,
  not drained, fails nothing)."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from ncclbench.locate.stats import CONFIRM, MAX_WIDTH, PAIR_WIDTH, healthy_spread, repeats_needed


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


def rail_reference(tests: list[PairTest], band: float, floor: float | None = None) -> RailReference:
    """The reference and cut of each rail from the screening tests that completed."""
    rails = max((len(t.rails) for t in tests), default=0)
    return reference_of([[t.rails[r] for t in tests if r < len(t.rails) and t.rails[r] is not None]
                         for r in range(rails)], band, floor)


def reference_of(per_rail: list[list[float]], band: float, floor: float | None = None) -> RailReference:
    """The reference and cut of each rail from its values: the cut lies max(band, PAIR_WIDTH
    healthy standard deviations) below the reference, at most max(band, MAX_WIDTH)."""
    out = RailReference(floor=floor)
    for r, values in enumerate(per_rail):
        if len(values) < 2:
            continue
        ref, spread = healthy_spread(values)
        width = min(max(band, PAIR_WIDTH * spread / ref), max(band, MAX_WIDTH)) if ref > 0 else 1.0
        out.per_rail[r] = (ref, ref * (1.0 - width))
    return out


def score(values, ref: RailReference) -> float:
    """The lowest rail's value as a fraction of its cut (below 1: low); rails without a cut
    do not count."""
    return min((v / ref.cut(r) for r, v in enumerate(values) if ref.cut(r) > 0), default=math.inf)


@dataclass
class Judgement:
    """One reading of the tests of one class so far (Localiser.judge)."""

    best: dict                 # endpoint -> best busbw per rail
    node_ref: RailReference    # the endpoints' bests: reference and cut per rail
    low_nodes: dict            # endpoint -> the rail its best stays below the cut
    pair_tests: dict           # frozenset((a, b)) -> [PairTest]
    low_pairs: dict            # frozenset((a, b)) -> rail
    evidence: dict             # low endpoint -> [PairTest] with high partners
    k_node: dict               # low endpoint -> tests that settle it
    k_pair: dict               # low pair -> tests that settle it
    readings: int              # screening and spare tests: the readings repeats are counted against
    pair_ref: RailReference | None = None
    bad: set = field(default_factory=set)
    links: set = field(default_factory=set)

    @property
    def high(self) -> set:
        return set(self.best) - set(self.low_nodes)


MIN_CLASS_PAIRS = 2   # pairs of one class needed to compare any of them: one pair has no reference
LOCALISE_ROUNDS = 8   # localisation rounds of `pairs` and preflight at most (fleet's: --localise-rounds)


class Localiser:
    """Pair tests in, bad endpoints / bad links / suspects out, and the next localisation
    round.

    `active`: the endpoints that take part in pairs; `dead` grows as endpoints stop
    answering (their tests are dropped from the judgement). `band`, `link_band`: how far
    below the reference an endpoint's best, and a pair's best, may fall (`bands_of(class)`
    gives (band, link band) for a class, or None for these). `classify(a, b)`: a pair's
    class (None: one class); `min_pairs`: the fewest pairs of a class that are judged."""

    def __init__(self, active: list[int], band: float, floor: float | None = None, link_band: float | None = None,
                 classify=None, bands_of=None, min_pairs: int = MIN_CLASS_PAIRS):
        self.active = sorted(active)
        self.band, self.floor = band, floor
        self.link_band = band if link_band is None else link_band
        self.classify = classify or (lambda _a, _b: None)
        self.bands_of = bands_of
        self.min_pairs = min_pairs
        self.tests: list[PairTest] = []
        self.dead: set = set()
        self.refs: dict = {}       # class -> the pairs' RailReference
        self._judged: tuple | None = None

    def record(self, tests: list[PairTest]) -> None:
        self.tests.extend(tests)

    def bands(self, cls) -> tuple[float, float]:
        """(endpoint band, link band) of a class."""
        own = self.bands_of(cls) if self.bands_of else None
        return own or (self.band, self.link_band)

    def class_of(self, t: PairTest):
        return self.classify(t.a, t.b)

    def set_reference(self, band: float | None = None, link_band: float | None = None) -> None:
        """The pairs' cut of each class from its screening tests, at `band` and `link_band`
        from now on when given (the endpoints' cut, made at each judgement, follows)."""
        if band is not None:
            self.band = band
        if link_band is not None:
            self.link_band = link_band
        screening: dict = {}
        for t in self.tests:
            if t.kind == "screen" and not {t.a, t.b} & self.dead:
                screening.setdefault(self.class_of(t), []).append(t)
        self.refs = {cls: rail_reference(tests, self.bands(cls)[1], self.floor) for cls, tests in screening.items()}
        self._judged = None

    def ref_of(self, t: PairTest) -> RailReference:
        """The pairs' reference and cut a test is judged by."""
        return self.refs.get(self.class_of(t)) or RailReference(floor=self.floor)

    @property
    def ref(self) -> RailReference:
        """The one class's reference (fleet's node pairs are of one class)."""
        return next(iter(self.refs.values()), RailReference(floor=self.floor))

    # ---- reading the tests ----
    def judge(self) -> dict:
        """{class: Judgement} of the classes judged: the best of every endpoint and pair, what is
        low, and what is settled (cached until tests are added or endpoints die). An endpoint
        low in one class is low: its pairs in other classes name no link."""
        key = (len(self.tests), frozenset(self.dead), id(self.refs))
        if self._judged and self._judged[0] == key:
            return self._judged[1]
        by_class: dict = {}
        for t in self.tests:
            if not {t.a, t.b} & self.dead:
                by_class.setdefault(self.class_of(t), []).append(t)
        out = {cls: self._judge_class(cls, tests) for cls, tests in by_class.items()
               if len({frozenset((t.a, t.b)) for t in tests}) >= self.min_pairs}
        low_anywhere = {n for j in out.values() for n in j.low_nodes}
        for j in out.values():
            j.links = {p for p in j.links if not p & low_anywhere}
        self._judged = (key, out)
        return out

    def unjudged(self) -> dict:
        """{class: [pairs]} of the classes with too few pairs to be judged."""
        by_class: dict = {}
        for t in self.tests:
            if not {t.a, t.b} & self.dead:
                by_class.setdefault(self.class_of(t), set()).add(tuple(sorted((t.a, t.b))))
        return {cls: sorted(p) for cls, p in by_class.items() if len(p) < self.min_pairs}

    def _judge_class(self, cls, live: list[PairTest]) -> Judgement:
        band, _link = self.bands(cls)
        pair_ref = self.refs.get(cls) or RailReference(floor=self.floor)
        best: dict = {}
        pair_tests: dict = {}
        for t in live:
            values = rail_values(t)
            for x in (t.a, t.b):
                best[x] = [max(u, v) for u, v in zip(best[x], values)] if x in best else list(values)
            pair_tests.setdefault(frozenset((t.a, t.b)), []).append(t)
        # an endpoint's best against the others' best: its own reference, from the endpoints' bests
        node_ref = reference_of([list(v) for v in zip(*best.values())], band, self.floor) if best else pair_ref
        low_nodes = {n: r for n, values in best.items() if (r := node_ref.low_rail(values)) is not None}
        high = set(best) - set(low_nodes)
        low_pairs = {}
        for pair, tests in pair_tests.items():
            if all(t.kind == "spare" for t in tests):
                continue  # spare pairs are load and references, never opened as candidates
            r = pair_ref.low_rail([max(v) for v in zip(*(rail_values(t) for t in tests))])
            if r is not None:
                low_pairs[pair] = r
        # the readings: screening and spare tests (not chosen for being slow), as scores
        # against each cut (the lowest rail's fraction of its cut); an endpoint's or pair's
        # own readings are no witness for or against it, and all of them score at or below its best
        unbiased = [t for t in live if t.kind in ("screen", "spare")]
        by_node = sorted(score(rail_values(t), node_ref) for t in unbiased)
        by_pair = sorted(score(rail_values(t), pair_ref) for t in unbiased)
        stake = len({frozenset((t.a, t.b)) for t in live if t.a in high and t.b in high and t.kind != "spare"})
        j = Judgement(best, node_ref, low_nodes, pair_tests, low_pairs, {}, {}, {}, len(unbiased), pair_ref)
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
            own = sum(1 for t in pair_tests[pair] if t.kind in ("screen", "spare"))
            low = bisect.bisect_right(by_pair, score(pair_best, pair_ref)) - own
            j.k_pair[pair] = repeats_needed(max(0, low), len(unbiased) - own, stake)
            if pair <= high and len(pair_tests[pair]) >= j.k_pair[pair]:
                j.links.add(pair)
        return j

    def low_classes(self, node: int) -> list:
        """The classes an endpoint was found low in (empty: not low)."""
        return [cls for cls, j in self.judge().items() if node in j.low_nodes]

    def high(self) -> set:
        judged = self.judge().values()
        low = {n for j in judged for n in j.low_nodes}
        return {n for j in judged for n in j.best} - low

    def wanted(self) -> list[tuple[int, str]]:
        """(endpoint, "clean" | "retest:<other>") for what the verdict still needs: a low
        endpoint short of tests against high partners, then a low pair of two high endpoints
        short of repeats."""
        judged = self.judge()
        high = self.high()
        bad = {n for j in judged.values() for n in j.bad}
        want = [(n, "clean") for n in sorted({n for j in judged.values() for n in j.low_nodes} - bad)]
        pairs = [(p, j) for j in judged.values() for p in j.low_pairs]
        # the pairs low in the most tests first: they are the likeliest links and need most rounds
        for pair, j in sorted(pairs, key=lambda pj: (-len(pj[1].pair_tests[pj[0]]), sorted(pj[0]))):
            if pair <= high and pair not in j.links:
                a, b = sorted(pair)
                want.append((a, f"retest:{b}"))
        return want

    def clean_nodes(self) -> list[int]:
        """The high endpoints: partners that show a low endpoint's speed."""
        high = self.high()
        return [n for n in self.active if n not in self.dead and n in high]

    def fits(self, node: int, partner: int) -> bool:
        """Whether `partner` makes a pair of a class `node` was found low in (an endpoint low
        only in a class where it has no other partner stays unsettled: a suspect)."""
        classes = self.low_classes(node)
        return not classes or self.classify(node, partner) in classes

    def met(self) -> set:
        return {frozenset((t.a, t.b)) for t in self.tests}

    # ---- the verdict ----
    def verdict(self, name) -> tuple[dict, dict, dict]:
        """({bad endpoint: evidence}, {(a, b): evidence}, {suspect endpoint: evidence});
        `name(endpoint)` gives an endpoint's name for the text."""
        judged = self.judge()
        high = self.high()
        bad = {n for j in judged.values() for n in j.bad}
        bad_lines, links, suspects = {}, {}, {}
        for j in judged.values():
            for n in sorted(j.bad):
                bad_lines.setdefault(n, self._bad_line(n, j, name))
        for j in judged.values():
            for n in sorted(set(j.low_nodes) - bad):
                r = j.low_nodes[n]
                rail = _rail_text(r, j.best[n])
                suspects.setdefault(n, f"not localised: {rail}reaches at best {j.best[n][r]:.3g} GB/s (the cut "
                                       f"{j.node_ref.cut(r):.3g}), {len(j.evidence[n])} of the {j.k_node[n]} tests "
                                       "needed against partners that reach it")
        for j in judged.values():
            for pair in sorted(j.low_pairs, key=sorted):
                a, b = sorted(pair)
                if pair & bad or not pair <= high:
                    continue
                line = self._pair_line(a, b, name, j.pair_ref)
                if pair in j.links:
                    links[(a, b)] = (f"{line}; {name(a)} reaches {self._best_text(a, j)} with others, "
                                     f"{name(b)} {self._best_text(b, j)}")
                else:
                    for x in (a, b):
                        suspects.setdefault(x, f"not localised: {line} ({j.k_pair[pair]} needed)")
        return bad_lines, links, suspects

    def margins(self) -> dict:
        """{"endpoints": worst fraction below the endpoints' reference, "pairs": worst fraction
        below the pairs' reference} over what was judged and not named (a bad endpoint's pairs
        and the slow links left out): how close the healthy rest came to a verdict (0: nothing
        fell below)."""
        out = {"endpoints": 0.0, "pairs": 0.0}
        judged = self.judge()
        bad = {n for j in judged.values() for n in j.bad}
        for j in judged.values():
            for n, values in j.best.items():
                if n not in bad:
                    out["endpoints"] = max(out["endpoints"], _below(values, j.node_ref))
            for pair, tests in j.pair_tests.items():
                if not pair & bad and pair not in j.links:
                    values = [max(v) for v in zip(*(rail_values(t) for t in tests))]
                    out["pairs"] = max(out["pairs"], _below(values, j.pair_ref))
        return {k: round(v, 4) for k, v in out.items()}

    def pair_records(self, host_of, ranks_of=None) -> list[dict]:
        """Every pair at its best over its tests, in the shape every fault-finding command's
        `pairs` key has: {ranks, hosts, rail (the worst, where there are several), busbw_gbps,
        reference_gbps, below_pct, slow, tests}. `host_of(endpoint)`; `ranks_of(endpoint)`
        (default: the endpoint is a rank)."""
        by_pair: dict = {}
        for t in self.tests:
            by_pair.setdefault(tuple(sorted((t.a, t.b))), []).append(t)
        out = []
        for (a, b), tests in sorted(by_pair.items()):
            ref, best = self._pair_best(tests)
            values = best.rails
            frac, rail = ref.below(best)
            ranks = (ranks_of(a) + ranks_of(b)) if ranks_of else [a, b]
            out.append({"ranks": ranks, "hosts": [host_of(a), host_of(b)],
                        "rail": rail if len(values) > 1 else None,
                        "busbw_gbps": None if rail is None else round(values[rail], 6),
                        "reference_gbps": None if rail is None or ref.ref(rail) is None else round(ref.ref(rail), 6),
                        "below_pct": round(100 * frac, 1), "slow": ref.slow(best), "tests": len(tests)})
        return out

    def pair_below(self, a: int, b: int) -> float | None:
        """How far a pair's best (per rail, over its tests) falls below its reference, in
        percent at its worst rail; None for a pair never tested."""
        tests = self._tests_of(a, b)
        if not tests:
            return None
        ref, best = self._pair_best(tests)
        return round(100 * ref.below(best)[0], 1)

    def _pair_best(self, tests: list[PairTest]) -> tuple[RailReference, PairTest]:
        """(the reference a pair is judged by, its best per rail over `tests` as one test)."""
        t = tests[0]
        values = tuple(max(v) for v in zip(*(rail_values(x) for x in tests)))
        return self.ref_of(t), PairTest(0, t.a, t.b, values)

    # ---- running the rounds ----
    def record_pass(self, busbw: dict, why, round_no: int) -> None:
        """One pass of single-rail pairs ({(a, b): GB/s}) as tests; `why`: why they ran
        (screen | clean | retest | spare), one for all or {(a, b): why} (spare where absent)."""
        self.record([PairTest(round_no, a, b, (v,), why if isinstance(why, str) else why.get((a, b), "spare"))
                     for (a, b), v in sorted(busbw.items())])

    def localise(self, measure, rounds: int = None) -> int:
        """After the screening pass is recorded: the localisation rounds the verdict still
        needs, each measured by `measure([[(a, b), ...]])` -> {(a, b): GB/s}, at most `rounds`
        (LOCALISE_ROUNDS); how many ran. The same on every rank that has the same numbers."""
        rounds = LOCALISE_ROUNDS if rounds is None else rounds
        self.set_reference()
        done = 0
        while done < rounds:
            asked = localisation_round(self, done)
            if not any(kind != "spare" for _a, _b, kind in asked):
                break
            busbw = measure([[(a, b) for a, b, _kind in asked]])
            done += 1
            self.record_pass(busbw, {(a, b): kind for a, b, kind in asked}, done)
        return done

    def unjudged_notes(self) -> list[str]:
        """One line per kind of pairs too few to be judged (pair kinds of locate.kinds)."""
        from ncclbench.locate.kinds import kind_text

        return [f"pair(s) {', '.join(f'{a}-{b}' for a, b in ps)} not judged: only {len(ps)} pair(s) "
                f"{kind_text(k)}, {self.min_pairs} are needed to compare with" for k, ps in self.unjudged().items()]

    def _best_text(self, node: int, j: Judgement) -> str:
        return "/".join(f"{v:.3g}" for v in j.best[node]) + " GB/s"

    def _tests_of(self, a: int, b: int) -> list[PairTest]:
        return [t for t in self.tests if {t.a, t.b} == {a, b}]

    def _pair_line(self, a: int, b: int, name, ref: RailReference) -> str:
        tests = self._tests_of(a, b)
        slow = [t for t in tests if ref.slow(t)]
        values = [max(v) for v in zip(*(rail_values(t) for t in tests))]
        rail = ref.low_rail(values)
        rail = 0 if rail is None else rail
        value = ref.ref(rail)
        failed = all(t.rails[rail] is None for t in tests)
        err = next((t.error for t in tests if t.error), None)
        what = f"failed ({err})" if failed else f"at best {values[rail]:.3g} GB/s"
        against = (f", {100 * (1 - values[rail] / value):.0f}% below the reference {value:.3g} GB/s"
                   if value and not failed else "")
        where = _rail_text(rail, values).strip() or "pair"
        return (f"{name(a)} <-> {name(b)} {where}: {what}{against}, slow in {len(slow)} of "
                f"{len(tests)} test{'s' if len(tests) != 1 else ''}")

    def _bad_line(self, node: int, j: Judgement, name) -> str:
        r = j.low_nodes[node]
        tests = j.evidence[node]
        partners = sorted({t.b if t.a == node else t.a for t in tests})
        ref = j.node_ref.ref(r)
        below = (f", {100 * (1 - j.best[node][r] / ref):.0f}% below what the others reach at best ({ref:.3g} GB/s)"
                 if ref else "")
        rail = _rail_text(r, j.best[node])
        return (f"{rail}reaches at best {j.best[node][r]:.3g} GB/s{below}, in {len(tests)} tests with "
                f"{len(partners)} partners, each of which reaches the cut {j.node_ref.cut(r):.3g} GB/s with others")


def _rail_text(rail: int, values) -> str:
    """'rail r ' where there are several rails, '' where one."""
    return f"rail {rail} " if len(values) > 1 else ""


def _below(values, ref: RailReference) -> float:
    fracs = [1.0 - v / ref.ref(r) for r, v in enumerate(values) if ref.ref(r)]
    return max([0.0, *fracs])


def localisation_round(loc: Localiser, seed: int = 0) -> list[tuple[int, int, str]]:
    """The next localisation round: (a, b, kind) with kind "clean" (a low endpoint with a
    high partner it has not met, of the class it was found low in), "retest" (a low pair
    again) or "spare" (high endpoints left over, paired so that every one stays busy: more
    tests of the healthy speed); empty when nothing needs measuring."""
    from ncclbench.locate.schedule import repair_round

    want = loc.wanted()
    if not want:
        return []
    clean = loc.clean_nodes()
    pairs, _waiting = repair_round(want, clean, loc.met(), clean, seed, fits=loc.fits)
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
    from ncclbench.locate.schedule import screening_rounds

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
