"""Preflight's pair tests, judged by the localisation core (ncclbench.locate), as `pairs` and
`fleet` are: the pairs inside each group of a swept dimension, and each suspect of a slow
group with known-good partners. Each is a screening pass, then localisation rounds of what
the Localiser still needs (a low rank with fresh partners that tested clean, a low pair as
itself). Every rank runs the same rounds: each decides from the same gathered numbers, and
each round's time is capped in advance (no rank decides by its own clock)."""

from __future__ import annotations

from ncclbench.locate.localiser import LOCALISE_ROUNDS, MIN_CLASS_PAIRS, Localiser, PairTest, localisation_round

SCREEN_SHARE = 0.5         # of a pass's time: the screening; the rest, the localisation rounds


def pair_localiser(pf) -> Localiser:
    """Ranks as endpoints, pairs compared within their kind (pf.pair_kind) at their
    transport's bands (pf.kind_bands)."""
    s = pf.setup
    return Localiser(sorted(pf.host), s["band"], link_band=s["link_band"], classify=pf.pair_kind,
                     bands_of=pf.kind_bands)


def localise(pf, rounds: list, share_s: float) -> Localiser:
    """A screening pass of `rounds`, then localisation rounds, within about `share_s`; every
    exchange of the pass on the same bytes (busbw of different sizes does not compare)."""
    loc = pair_localiser(pf)
    if not rounds:
        return loc
    screen_cap = SCREEN_SHARE * share_s / len(rounds)
    nbytes = pf.pair_bytes_for(screen_cap)
    record(loc, pf._pairs(rounds, nbytes, screen_cap), "screen", 0)
    loc.set_reference()
    cap = (1 - SCREEN_SHARE) * share_s / LOCALISE_ROUNDS
    for k in range(LOCALISE_ROUNDS):
        asked = localisation_round(loc, k)
        if not any(kind != "spare" for _a, _b, kind in asked):
            break
        busbw = pf._pairs([[(a, b) for a, b, _kind in asked]], nbytes, cap)
        record(loc, busbw, {(a, b): kind for a, b, kind in asked}, k + 1)
    pf.pair_records += loc.pair_records(pf.host.get)
    return loc


def record(loc: Localiser, busbw: dict, kind, round_no: int) -> None:
    """A pass's pairs ({(a, b): GB/s}) as tests (`kind`: why they ran, one for all or by pair)."""
    loc.record([PairTest(round_no, a, b, (v,), kind if isinstance(kind, str) else kind.get((a, b), "spare"))
                for (a, b), v in sorted(busbw.items())])


def unjudged_notes(what: str, loc: Localiser) -> list[str]:
    """One line per kind of pairs too few to be judged."""
    from ncclbench.locate.kinds import kind_text

    return [f"{what}: pair(s) {', '.join(f'{a}-{b}' for a, b in ps)} not judged: only {len(ps)} pair(s) "
            f"{kind_text(k)}, {MIN_CLASS_PAIRS} are needed to compare with" for k, ps in loc.unjudged().items()]
