"""NVLink pairing: how many links join each pair of GPUs, and whether they go through an
NVSwitch. Pure functions over what the probes found."""

from __future__ import annotations

from typing import Sequence

from ncclbench.topology.model import LinkEnd, nvlink_count


def nvlink_pair_counts(
    link_ends: Sequence[Sequence[LinkEnd]],
    bus_ids: Sequence[str | None],
    nvlink_p2p_ok: Sequence[Sequence[bool | None]] | None = None,
) -> list[list[int]]:
    """How many NVLinks join each pair of GPUs, like the number in nvidia-smi's NV#.

    A link that ends at GPU j counts for (i, j). Links that end at an NVSwitch
    reach every GPU on the switch, so a pair whose GPUs both have switch links gets
    the smaller of their switch-link counts (nvidia-smi shows NV18 for every pair
    of an 8 x H100 board). Links whose far end NVML cannot name (in some VMs) are
    treated like switch links, but only for pairs that NVML's P2P status says talk
    over NVLink. Links to a GPU outside this list (hidden by CUDA_VISIBLE_DEVICES)
    count for no pair.
    """
    n = len(link_ends)
    index_of_bus = {bus: i for i, bus in enumerate(bus_ids) if bus}
    direct = [[0] * n for _ in range(n)]
    switch_links = [0] * n
    unresolved = [0] * n
    for i, ends in enumerate(link_ends):
        for end in ends:
            j = index_of_bus.get(end.remote_bus_id or "")
            if end.remote_type == "nvswitch":
                switch_links[i] += 1
            elif j is not None and j != i:
                direct[i][j] += 1
            elif end.remote_type is None:
                unresolved[i] += 1
    counts = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            nvlink_ok = nvlink_p2p_ok[i][j] if nvlink_p2p_ok is not None else None
            if direct[i][j]:
                counts[i][j] = direct[i][j]
            elif switch_links[i] and switch_links[j] and nvlink_ok is not False:
                counts[i][j] = min(switch_links[i], switch_links[j])
            elif unresolved[i] and unresolved[j] and nvlink_ok is True:
                counts[i][j] = min(unresolved[i], unresolved[j])
    return counts


def infer_nvswitch(
    link_matrix: Sequence[Sequence[str | None]], active_links: Sequence[int | None]
) -> tuple[bool | None, str]:
    """Decide from NV# codes and link counts whether the NVLinks go through a switch.

    Direct links are split between peers, so a GPU's NV# towards all its peers add
    up to at most its active links. If they add up to more, the same links reach
    several peers: they end at an NVSwitch. If they add up to exactly the links
    and there are two or more peers, the links are direct (a mesh). With a single
    peer that gets every link, both are possible and we cannot tell.
    """
    n = len(link_matrix)
    if n < 2:
        return None, "fewer than 2 GPUs"
    verdicts = []
    for i in range(n):
        links = active_links[i] if i < len(active_links) else None
        if not links:
            continue
        towards_peers = [nvlink_count(link_matrix[i][j]) for j in range(n) if j != i]
        if sum(towards_peers) > links:
            return True, (
                f"inferred: GPU {i} has {links} active NVLinks but NV# towards its peers add up "
                f"to {sum(towards_peers)}, so the links are shared through a switch"
            )
        if sum(towards_peers) == links and sum(1 for c in towards_peers if c) >= 2:
            verdicts.append(False)
    if verdicts and all(v is False for v in verdicts):
        return False, "inferred: each GPU's NVLinks are split between its peers (direct mesh)"
    return None, "cannot tell from NV# and link counts (a single peer gets all links, or no NVLink)"
