"""Who meets whom in which round of pair tests: pure functions, no torch.

A round is a set of disjoint pairs of endpoints (ranks, or nodes whose pairs exchange rail
by rail) that run at the same time. Screening uses one of two schedules, chosen by the
number of endpoints:

- **all pairs** (round-robin, the circle method: tournament_rounds) while that takes
  at most `all_pairs_rounds` rounds: n-1 rounds for n nodes (n with n odd);
- **shuffled round-robin** beyond: `rounds` rounds picked evenly from the circle method's
  n-1 after the nodes were put in a seeded random order. Each round is still a perfect
  matching (every node busy; with n odd one node rests) and no pair meets twice, so each
  node meets `rounds` different partners drawn from across the fleet, not its rack
  neighbours.

Localisation rounds (`repair_round`) then put each suspect with a partner that tested
clean, put each suspected pair together again, and pair the clean endpoints left over
among themselves, so that every endpoint stays busy and the round carries its own
reference pairs."""

from __future__ import annotations

import random

DEFAULT_ALL_PAIRS_ROUNDS = 15   # all pairs up to 16 nodes
DEFAULT_SCREEN_ROUNDS = 4


def tournament_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of pairs (a, b), a < b, covering every pair of range(n) exactly once, each
    endpoint in at most one pair per round: n-1 rounds (n with n odd). Circle method: 0
    stays put while the others rotate one seat per round; with n odd a phantom seat makes
    the one facing it sit that round out."""
    if n < 2:
        return []
    seats = list(range(n)) + ([None] if n % 2 else [])
    m = len(seats)
    rounds = []
    for _ in range(m - 1):
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]  # rotate everyone but seat 0
    return rounds


def peer_in_round(pairs: list[tuple[int, int]], me: int) -> int | None:
    """This endpoint's partner in a round, or None when it sits the round out."""
    for a, b in pairs:
        if me == a:
            return b
        if me == b:
            return a
    return None


def group_pair_rounds(groups: list[tuple[int, ...]]) -> list[list[tuple[int, int]]]:
    """Rounds that cover every pair inside each group (global ranks), the groups' own
    round-robin rounds run side by side: round k of every group at once."""
    per_group = [[[(g[a], g[b]) for a, b in pairs] for pairs in tournament_rounds(len(g))] for g in groups]
    depth = max((len(r) for r in per_group), default=0)
    return [sorted(p for rounds in per_group if k < len(rounds) for p in rounds[k]) for k in range(depth)]


def screening_rounds(n: int, all_pairs_rounds: int = DEFAULT_ALL_PAIRS_ROUNDS,
                     rounds: int = DEFAULT_SCREEN_ROUNDS, seed: int = 0) -> tuple[str, list[list[tuple[int, int]]]]:
    """(schedule name, rounds of node-index pairs (a, b), a < b) for n nodes."""
    full = n - 1 if n % 2 == 0 else n
    if n < 2:
        return "none", []
    if full <= all_pairs_rounds or rounds >= full:
        return "all pairs", tournament_rounds(n)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    picks = sorted({(k * full) // rounds for k in range(rounds)})
    out = []
    for k in picks:
        out.append(sorted((min(order[a], order[b]), max(order[a], order[b])) for a, b in circle_round(n, k)))
    return "shuffled round-robin", out


def circle_round(n: int, k: int) -> list[tuple[int, int]]:
    """Round k of tournament_rounds(n), made alone in O(n) (the whole table is O(n^2): 33
    million pairs at 8,192 nodes)."""
    m = n + (n % 2)
    others = list(range(1, m))
    shift = k % (m - 1)
    others = others[len(others) - shift:] + others[:len(others) - shift] if shift else others
    seats = [0] + others
    pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
    return sorted((min(a, b), max(a, b)) for a, b in pairs if a < n and b < n)


def check_round(pairs: list[tuple[int, int]], n: int) -> None:
    """ValueError unless the pairs are disjoint and name nodes of range(n)."""
    seen: set = set()
    for a, b in pairs:
        if a == b or not (0 <= a < n and 0 <= b < n):
            raise ValueError(f"bad pair ({a}, {b}) for {n} nodes")
        if a in seen or b in seen:
            raise ValueError(f"node {a if a in seen else b} is in two pairs of one round")
        seen.update((a, b))


def repair_round(wanted: list[tuple[int, str]], clean: list[int], met: set, busy_ok: list[int],
                 seed: int = 0, fits=None) -> tuple[list[tuple[int, int]], list[int]]:
    """One localisation round: (pairs, the suspects that got no partner this round).

    `wanted`: (node, kind) in order of need; kind "clean" asks for a partner from `clean`,
    one it has not met yet where there is one ({frozenset((a, b))} in `met`), kind
    "retest:<b>" asks for node b itself (a suspected link measured again). `busy_ok`: nodes that may be paired among
    themselves with whatever is left (the clean ones; dead and drained nodes are left out).
    `fits(node, partner)`: whether a clean partner makes a pair of the kind the node was
    found low in (None: any)."""
    rng = random.Random(seed)
    free = list(clean)
    rng.shuffle(free)
    used: set = set()
    pairs, waiting = [], []
    for node, kind in wanted:
        if node in used:
            waiting.append(node)
            continue
        if kind.startswith("retest:"):
            other = int(kind.split(":", 1)[1])
            if other in used:
                waiting.append(node)
                continue
            partner = other
        else:
            open_ = [c for c in free if c not in used and c != node and (fits is None or fits(node, c))]
            # a partner not met yet is a new witness; in a small fleet where every clean node
            # was met, one met before is a repeat, still a fresh test against a node known fast
            partner = next((c for c in open_ if frozenset((node, c)) not in met), open_[0] if open_ else None)
            if partner is None:
                waiting.append(node)
                continue
        used.update((node, partner))
        pairs.append((min(node, partner), max(node, partner)))
    allowed = set(busy_ok)
    rest = [c for c in free if c not in used and c in allowed]
    seen = set(rest)
    rest += [c for c in busy_ok if c not in used and c not in seen]
    pairs += pair_up(rest, met)
    return sorted(pairs), waiting


def pair_up(nodes: list[int], met: set, look_ahead: int = 8) -> list[tuple[int, int]]:
    """Pairs of neighbours in `nodes`, each preferring, among the next few, one it has not
    met (a fresh pair is a new reference, not a repeat)."""
    rest = list(nodes)
    out = []
    i = 0
    while len(rest) - i >= 2:
        a = rest[i]
        window = range(i + 1, min(len(rest), i + 1 + look_ahead))
        j = next((k for k in window if frozenset((a, rest[k])) not in met), i + 1)
        rest[i + 1], rest[j] = rest[j], rest[i + 1]
        b = rest[i + 1]
        out.append((min(a, b), max(a, b)))
        i += 2
    return out


def known_good_rounds(suspects: list[int], good: list[int], host: dict, same_host: dict) -> tuple[list, list]:
    """Rounds of pairs that put each suspect with a known-good partner (on its own host when
    `same_host[s]`, else on another host), each rank at most once per round; the good ranks
    left over in a round are paired among themselves, as references. Returns (rounds,
    suspects that have no good partner of their kind)."""
    def fits(s, g):
        return (host[g] == host[s]) == same_host.get(s, True)

    alone = [s for s in suspects if not any(fits(s, g) for g in good)]
    left = [s for s in suspects if s not in alone]
    rounds = []
    while left:
        free, pairs = list(good), []
        for s in list(left):
            partner = next((g for g in free if fits(s, g)), None)
            if partner is not None:
                pairs.append((min(s, partner), max(s, partner)))
                free.remove(partner)
                left.remove(s)
        while len(free) >= 2:
            a = free.pop(0)
            b = next((g for g in free if host[g] == host[a]), free[0])
            free.remove(b)
            pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
    return rounds, alone
