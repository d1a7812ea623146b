"""Preflight's pair tests, judged by the localisation core (ncclbench.locate), as `pairs` and
`fleet` are: the pairs inside each group of a swept dimension, and each suspect of a slow
group with known-good partners. Each is a screening pass, then localisation rounds of what
the Localiser still needs (a low rank with fresh partners that tested clean, a low pair as
itself). Every rank runs the same rounds: each decides from the same gathered numbers, and
each round's time is capped in advance (no rank decides by its own clock)."""

from __future__ import annotations

from typing import Callable, Protocol

from ncclbench.locate.localiser import LOCALISE_ROUNDS, Localiser

SCREEN_SHARE = 0.5         # of a pass's time: the screening; the rest, the localisation rounds


class RunFace(Protocol):
    """What preflight's tests of ranks alone and in pairs (this module and .within) read of
    the run (faults.preflight.run.Preflight); they return what they find and write nothing
    into it."""

    host: dict                                 # {rank: host name}
    shares: dict                               # {rank: its host and GPU} (faults.preflight.within.shares_of)
    setup: dict                                # the inputs every rank agreed on: band, link_band, datatype
    instances: dict                            # {dim: [groups]}
    pair_kind: Callable                        # (a, b) -> the pair's kind (ncclbench.locate.kinds)

    def who(self, rank: int) -> str: ...
    def kind_bands(self, kind: tuple) -> tuple[float, float] | None: ...
    def pair_bytes_for(self, cap_s: float) -> int: ...
    def measure_pairs(self, rounds: list, nbytes: int, cap_s: float) -> dict: ...
    def alone_times(self, nbytes: int, iters: int, only=None) -> dict: ...


def pair_localiser(pf: RunFace) -> Localiser:
    """Ranks as endpoints, pairs compared within their kind (pf.pair_kind) at their
    transport's bands (pf.kind_bands)."""
    s = pf.setup
    return Localiser(sorted(pf.host), s["band"], link_band=s["link_band"], classify=pf.pair_kind,
                     bands_of=pf.kind_bands)


def localise(pf: RunFace, rounds: list, share_s: float) -> Localiser:
    """A screening pass of `rounds`, then localisation rounds, within about `share_s`; every
    exchange of the pass on the same bytes (busbw of different sizes does not compare). The
    pairs tested are the Localiser's pair_records."""
    loc = pair_localiser(pf)
    if not rounds:
        return loc
    screen_cap = SCREEN_SHARE * share_s / len(rounds)
    nbytes = pf.pair_bytes_for(screen_cap)
    loc.record_pass(pf.measure_pairs(rounds, nbytes, screen_cap), "screen", 0)
    cap = (1 - SCREEN_SHARE) * share_s / LOCALISE_ROUNDS
    loc.localise(lambda asked: pf.measure_pairs(asked, nbytes, cap))
    return loc


def unjudged_notes(what: str, loc: Localiser) -> list[str]:
    """The Localiser's notes on pairs too few to be judged, each said of `what`."""
    return [f"{what}: {line}" for line in loc.unjudged_notes()]
