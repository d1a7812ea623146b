"""`ncclbench fleet` verdicts from measured numbers: pure functions and one state machine
(Localiser), no torch and no distributed code, so that the rules can be unit-tested at
thousands of nodes and rank 0 runs exactly what the tests run.

Nodes are indices 0..n-1 here; hosts only appear in the evidence text.

Rules (the robust reference of ncclbench.api.verdict: median of the better half, band = the
larger of `band` and 3 robust standard deviations):

- **Each node alone**: too few GPUs (against --gpus-per-node or the most common count), a
  GPU model other than the most common, or its node-local all_reduce / all_gather busbw slow
  against the other nodes'.
- **Pairs**: each rail of a node pair is judged against the screening reference of that rail
  (and an absolute floor where one is given); a pair is slow when any rail is. A pair
  tested more than once is slow when it was slow at least twice and more often than not,
  fine when it was fine at least as often as slow, and a suspect after a single slow test.
- **Bad node**: slow with at least two different partners, one of those pairs slow again
  when measured a second time (a node whose slow pairs were each measured once gets one
  of them retested first), and in at least two thirds of its pairs, counting only partners
  not already found bad (a bad node's partners look slow
  with it and nothing else); the worst node is named first, then the counts are redone.
- **Bad link**: a pair slow twice (screening and a retest) whose two nodes are each fine with
  at least two other partners.
- Everything else slow after the localisation rounds stays a suspect (named, not drained)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from ncclbench.api.verdict import MAD_SIGMA, reference, slow_outliers

CONFIRM = 2   # distinct partners / repeats that settle a verdict
# Pairs are many and each is judged on every rail: a cut 3 robust standard deviations below
# the better half's median (preflight's rule, for a handful of groups) flagged 5% of healthy
# pair tests with 8 rails and 8% noise in simulation. Past FULL_SPREAD_FROM values the spread
# is the MAD of all of them (the better half's understates it) and the cut FLEET_WIDTH of it
# below the reference: about 1 healthy pair test in 15,000 with 8 rails.
FULL_SPREAD_FROM = 20
FLEET_WIDTH = 5.0
# Noise widens the band, up to this: on a fleet so noisy that healthy pairs spread over more
# than this, a pair 20x below the reference is still slow (gloo on two shared cores: healthy
# pairs 0.2-1.0 GB/s, a 20 Mbit/s NIC 0.0024 GB/s).
MAX_WIDTH = 0.95


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
    exchange failed), the round and why it ran (screen | clean | retest | spare)."""

    round: int
    a: int
    b: int
    rails: tuple
    kind: str = "screen"
    error: str | None = None


@dataclass
class RailReference:
    """Per rail: (reference GB/s, cut GB/s): below the cut is slow."""

    per_rail: dict = field(default_factory=dict)
    floor: float | None = None

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

    def slow(self, test: PairTest) -> bool:
        return any(v is None or v < self.cut(r) for r, v in enumerate(test.rails))


def rail_reference(tests: list[PairTest], band: float, floor: float | None = None) -> RailReference:
    """The reference of each rail from the screening tests that completed."""
    out = RailReference(floor=floor)
    rails = max((len(t.rails) for t in tests), default=0)
    for r in range(rails):
        values = [t.rails[r] for t in tests if r < len(t.rails) and t.rails[r] is not None]
        if len(values) < 2:
            continue
        ref, spread = reference(values)
        if len(values) >= FULL_SPREAD_FROM:
            median = statistics.median(values)
            spread = MAD_SIGMA * statistics.median(abs(v - median) for v in values)
        width = min(max(band, FLEET_WIDTH * spread / ref), max(band, MAX_WIDTH)) if ref > 0 else 1.0
        out.per_rail[r] = (ref, ref * (1.0 - width))
    return out


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

    def record(self, tests: list[PairTest]) -> None:
        self.tests.extend(tests)

    def set_reference(self) -> None:
        screening = [t for t in self.tests if t.kind == "screen" and not {t.a, t.b} & self.dead]
        self.ref = rail_reference(screening, self.band, self.floor)

    # ---- per pair, per node ----
    def pair_states(self) -> dict:
        """{frozenset((a, b)): "slow" | "suspect" | "fine"} over the live pairs tested."""
        counts: dict = {}
        for t in self.tests:
            if t.kind == "spare" or {t.a, t.b} & self.dead:
                continue
            s, f = counts.get(frozenset((t.a, t.b)), (0, 0))
            counts[frozenset((t.a, t.b))] = (s + 1, f) if self.ref.slow(t) else (s, f + 1)
        out = {}
        for pair, (s, f) in counts.items():
            out[pair] = "fine" if f >= s else ("slow" if s >= CONFIRM else "suspect")
        return out

    def adjacency(self, states: dict) -> dict:
        """{node: [(partner, state)]} of the live pairs tested."""
        adj: dict = {}
        for pair, state in states.items():
            a, b = sorted(pair)
            adj.setdefault(a, []).append((b, state))
            adj.setdefault(b, []).append((a, state))
        return adj

    def bad_nodes(self, states: dict | None = None) -> set:
        """The bad-node rule, worst node first, counts redone after each (see the module)."""
        adj = self.adjacency(self.pair_states() if states is None else states)
        bad: set = set()
        while True:
            worst, best_ratio = None, 0.0
            for node, mine in adj.items():
                if node in bad or node in self.dead:
                    continue
                live = [s for o, s in mine if o not in bad]
                slow = sum(1 for s in live if s != "fine")
                confirmed = "slow" in live  # one of its slow pairs measured slow again
                if slow >= CONFIRM and confirmed and 3 * slow >= 2 * len(live) and slow / len(live) > best_ratio:
                    worst, best_ratio = node, slow / len(live)
            if worst is None:
                return bad
            bad.add(worst)

    @staticmethod
    def _fine_partners(node: int, adj: dict, bad: set) -> int:
        return sum(1 for o, s in adj.get(node, []) if s == "fine" and o not in bad)

    def wanted(self) -> list[tuple[int, str]]:
        """(node, "clean" | "retest:<other>") for what the verdict still needs, most urgent first."""
        states = self.pair_states()
        bad, adj = self.bad_nodes(states), self.adjacency(states)
        want: list = []
        asked: set = set()
        retested: set = set()
        for pair, state in sorted(states.items(), key=lambda item: sorted(item[0])):
            a, b = sorted(pair)
            if state == "fine" or {a, b} & bad:
                continue
            confirmed = {x for x in (a, b) if any(s == "slow" for _o, s in adj.get(x, []))}
            if state == "suspect" and not {a, b} & (confirmed | retested):
                want.append((a, f"retest:{b}"))  # no slow pair of theirs measured twice yet
                retested.update((a, b))
                continue
            short = [x for x in (a, b) if self._fine_partners(x, adj, bad) < CONFIRM]
            want += [(x, "clean") for x in short if x not in asked]
            asked.update(short)
        return want

    def clean_nodes(self) -> list[int]:
        states = self.pair_states()
        bad, adj = self.bad_nodes(states), self.adjacency(states)
        return [n for n in self.active if n not in self.dead and n not in bad
                and all(s == "fine" for o, s in adj.get(n, []) if o not in bad)]

    def met(self) -> set:
        return {frozenset((t.a, t.b)) for t in self.tests if t.kind != "spare"}

    # ---- the verdict ----
    def verdict(self, name) -> tuple[dict, dict, dict]:
        """({bad node: evidence}, {(a, b): evidence}, {suspect node: evidence}); `name(node)`
        gives a node's host for the text."""
        states = self.pair_states()
        bad, adj = self.bad_nodes(states), self.adjacency(states)
        bad_lines = {n: self._bad_line(n, adj, bad, name) for n in sorted(bad)}
        links, suspects = {}, {}
        for pair, state in sorted(states.items(), key=lambda item: sorted(item[0])):
            a, b = sorted(pair)
            if state == "fine" or {a, b} & bad:
                continue
            fine_a, fine_b = (self._fine_partners(x, adj, bad) for x in (a, b))
            line = self._pair_line(a, b, name)
            if state == "slow" and min(fine_a, fine_b) >= CONFIRM:
                links[(a, b)] = (f"{line}; {name(a)} is fine with {fine_a} other partners, {name(b)} with {fine_b}")
            else:
                for x in (a, b):
                    suspects.setdefault(x, f"not localised: {line}")
        return bad_lines, links, suspects

    def _tests_of(self, a: int, b: int) -> list[PairTest]:
        return [t for t in self.tests if {t.a, t.b} == {a, b}]

    def _pair_line(self, a: int, b: int, name) -> str:
        tests = self._tests_of(a, b)
        slow = [t for t in tests if self.ref.slow(t)]
        worst = max(slow or tests, key=lambda t: self.ref.below(t)[0])
        frac, rail = self.ref.below(worst)
        value = worst.rails[rail] if rail is not None else None
        ref = self.ref.ref(rail) if rail is not None else None
        what = "failed" if value is None else f"{value:.3g} GB/s"
        against = f", {100 * frac:.0f}% below the reference {ref:.3g} GB/s" if value is not None and ref else ""
        err = f" ({worst.error})" if worst.error and value is None else ""
        return (f"{name(a)} <-> {name(b)} rail {rail}: {what}{err}{against}, slow in {len(slow)} of "
                f"{len(tests)} test{'s' if len(tests) != 1 else ''}")

    def _bad_line(self, node: int, adj: dict, bad: set, name) -> str:
        mine = [(o, s) for o, s in adj.get(node, []) if o not in bad]
        slow = sorted(o for o, s in mine if s != "fine")
        worst = min(slow, key=lambda o: min((self._min_rail(t) for t in self._tests_of(node, o)), default=0))
        return (f"slow with {len(slow)} of its {len(mine)} partners, each of them fine with others "
                f"(worst: {self._pair_line(node, worst, name)})")

    def _min_rail(self, t: PairTest) -> float:
        return min((v if v is not None else -1.0) for v in t.rails) if t.rails else -1.0


def localisation_round(loc: Localiser, seed: int = 0) -> list[tuple[int, int, str]]:
    """The next localisation round: (a, b, kind) with kind "clean" (a suspect with a partner
    that tested clean), "retest" (a suspected link again) or "spare" (clean nodes left over,
    paired so that every node stays busy: load, not evidence); empty when nothing needs
    measuring."""
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
        if not pairs:
            break
        k = len(rounds) + done
        loc.record([PairTest(k, a, b, tuple(measure(k, a, b)), kind) for a, b, kind in pairs])
        done += 1
    return loc, name, rounds, done
