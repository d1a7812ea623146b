"""Which pairs are compared with which: the way NCCL carries a pair's traffic decides what
speed is healthy for it, so pairs are judged only against pairs of their own kind."""

from __future__ import annotations


def pair_kind(host: dict, topo: dict, facts: list, a: int, b: int, nccl: bool = True) -> tuple:
    """What a pair is compared with, the way NCCL carries it. On one host: the GPU link
    type where the host's topology says (NVLink and PCIe pairs differ), and whether NCCL
    spreads the exchange over shared channels: it places point-to-point traffic by the
    distance between the two ranks in the communicator, and at half the communicator's
    size sending and receiving share the same channels (docs/design/localisation.md).
    Across hosts: over the network, NIC to NIC; channel sharing is an
    NVLink matter and plays no part, so every cross-host pair is of one kind unless the
    two hosts' NICs differ in rate (the slower NIC of the two sets the pair's peak).
    `nccl`: whether the pairs run on NCCL (gloo has no channels)."""
    if host[a] != host[b]:
        return False, "net", _nic_rate(topo, host[a], host[b])
    n = len(host)
    shared_channels = nccl and 2 * ((b - a) % n) == n
    codes = (topo.get(host[a]) or {}).get("codes")
    da, db = facts[a]["device"], facts[b]["device"]
    link = codes[da][db] if codes and da is not None and db is not None and max(da, db) < len(codes) else None
    return True, link, shared_channels


def _nic_rate(topo: dict, *hosts: str) -> float | None:
    """The slower of the hosts' fastest active RDMA ports (GB/s), or None where unknown."""
    rates = []
    for h in hosts:
        mine = [n.get("rate_gbps") for n in (topo.get(h) or {}).get("nics", [])
                if (n.get("state") or "").upper() == "ACTIVE" and n.get("rate_gbps")]
        if not mine:
            return None
        rates.append(max(mine))
    return min(rates)


def kind_text(kind: tuple) -> str:
    """A pair kind in words, for the note on pairs that were not judged."""
    same, link, third = kind
    if not same:
        return "across hosts over the network" + (f" (NIC {third:g} GB/s)" if third else "")
    return ("on one host" + (f" over {link}" if link else "")
            + (" at half the communicator (shared NCCL channels)" if third else ""))
