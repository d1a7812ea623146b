"""How far below the reference a reading may fall before it is slow, by the transport the
traffic took: one table for `pairs`, `preflight` and `fleet`.

Each band was chosen from the margins healthy runs showed, every reading judged at its best
(docs/design/localisation-bands.md has the runs). NCCL over NVLink/P2P, shared memory or
RDMA stays within a few percent; NCCL between hosts over TCP sockets follows both hosts'
proxy threads and TCP stacks; gloo on shared CPU cores spreads widest, one pair (a link)
wider than an endpoint's best pair, an endpoint's op alone wider again."""

from __future__ import annotations

from dataclasses import dataclass

from ncclbench.errors import PlanError


@dataclass(frozen=True)
class Bands:
    rank: float    # an endpoint (rank, node, group) at its best against its peers
    link: float    # one pair at its best against the other pairs of its kind
    alone: float   # an endpoint's own op, no partner


BY_TRANSPORT = {
    "p2p": Bands(0.2, 0.2, 0.2),      # NVLink or PCIe peer to peer, one host
    "shm": Bands(0.2, 0.2, 0.2),      # shared memory, one host
    "net": Bands(0.2, 0.2, 0.2),      # NCCL's NET over RDMA (InfiniBand, RoCE)
    "socket": Bands(0.5, 0.5, 0.2),   # NCCL's NET over TCP sockets
    "gloo": Bands(0.6, 0.95, 0.85),   # gloo: TCP through the hosts' stacks, on shared cores
}
# what a backend's traffic may take before NCCL's log says which
BACKEND_TRANSPORTS = {"nccl": ("p2p", "shm", "net"), "gloo": ("gloo",)}


def parse_band(value) -> float | None:
    """None for 'auto' (or None): the table decides; else a fraction from '20%' or '0.2'."""
    text = str(value).strip().lower()
    if value is None or text == "auto":
        return None
    try:
        band = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise PlanError(f"band {value!r}: use a percentage such as 20% or a fraction such as 0.2") from None
    if not 0 < band < 1:
        raise PlanError(f"band {value!r} must be between 0% and 100%")
    return band


def bands_for(asked: float | None, transports) -> Bands:
    """The bands of traffic that took any of `transports` (the widest of each): `asked` (a
    band given by the user) for all three where given."""
    if asked is not None:
        return Bands(asked, asked, asked)
    rows = [BY_TRANSPORT[t] for t in transports] or [BY_TRANSPORT["p2p"]]
    return Bands(max(b.rank for b in rows), max(b.link for b in rows), max(b.alone for b in rows))


def backend_bands(asked: float | None, backends) -> Bands:
    """The bands of groups on these backends ("nccl", "gloo"), before any path is known."""
    return bands_for(asked, [t for b in sorted(set(backends)) for t in BACKEND_TRANSPORTS.get(b, ("p2p",))])


def over_sockets(networks) -> bool:
    """Whether NCCL ran between hosts over its Socket network: each of `networks` (the
    network NCCL's log named for a path that crossed hosts: "Socket", "IB", ... or None
    where it named none) names Socket, and one does."""
    named = [n for n in networks if n]
    return bool(named) and all(n == "Socket" for n in named)
