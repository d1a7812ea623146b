"""Preflight's localisation rules on gathered numbers: which groups are slow, which rank of a
mesh explains them, which pairs are compared with which. Pure functions of what every rank
gathered (the rules of one measurement are in ncclbench.faults.preflight.verdict), so every rank reaches
the same verdict and the rules can be unit-tested without processes."""

from __future__ import annotations

from ncclbench.api.measure import ranks_text


def group_name(instances: dict, dim: str, ranks: tuple) -> str:
    """A group as the report names it: its dimension, its index there, its ranks."""
    index = instances[dim].index(ranks) if ranks in instances.get(dim, []) else 0
    return f"{dim}[{index}] (ranks {ranks_text(ranks)})"


def best_cells(first: list, second: list) -> list:
    """Each group's cells at their best over two measurements (the higher busbw of each
    collective, size and placement, ncclbench.locate.stats.best_of): one-sided noise does
    not make a group slow."""
    from ncclbench.locate.stats import best_of

    best = best_of([{(c.group, c.key): c.busbw for c in cells} for cells in (first, second)])
    return [next(c for c in first + second if (c.group, c.key) == k and c.busbw == v) for k, v in best.items()]


def slow_groups(rel: dict, absolute: dict, instances: dict, floor) -> tuple[dict, list[str]]:
    """({(dim, group): [evidence]}, notes): slower than their peers, or below the floor
    (unless every group of the dimension is: that is the fabric or a setting, not a host)."""
    slow: dict = {}
    notes = []
    for d, found in rel.items():
        for g, hits in found.groups.items():
            # the largest size's evidence: where busbw means the most
            (coll, size, placement), busbw, frac = max(hits, key=lambda h: (h[0][1], h[2]))
            slow.setdefault((d, g), []).append(
                f"{coll} {size} B {placement}: {busbw:.3g} GB/s, {100 * frac:.0f}% below the other {d} groups")
    for d, failing in absolute.items():
        everyone = len(failing) == len(instances[d]) and len(instances[d]) > 1
        for g, lines in failing.items():
            slow.setdefault((d, g), []).extend(lines)
        if everyone:
            notes.append(f"every {d} group is below the floor {floor.describe()}: "
                         "a setting or the fabric, not one host")
    return slow, notes


def mesh_culprit(slow: dict, bad: dict, fine: set, host: dict, instances: dict) -> dict:
    """{rank: evidence} for the one rank that is in a slow group of every dimension with
    slow groups (two or more): a slow node slows each group it is in, its peers are slow
    in one dimension only. Used when the pair rounds neither accused nor cleared it (on
    a noisy host they may not settle either way)."""
    dims = sorted({d for d, _ in slow})
    if len(dims) < 2:
        return {}
    common = set(host)
    for d in dims:
        common &= {r for (dd, g) in slow if dd == d for r in g}
    if len(common) != 1 or bad:
        return {}
    r = next(iter(common))
    if r in fine:
        return {}
    groups = ", ".join(group_name(instances, d, g) for (d, g) in slow if r in g)
    return {r: f"is the only rank in a slow group of every dimension ({groups}); the pair rounds did not settle it"}


NIC_OUTLIER = 0.5  # a host whose NICs give under half the other hosts' rate


def sockets_between_hosts(paths: dict) -> bool:
    """Whether NCCL ran between hosts over its Socket network (ncclbench.locate.bands.over_sockets)
    by the paths ({group: pathview.Path.to_dict}) that crossed hosts (a path within one host
    names Socket too where the host has no RDMA devices)."""
    from ncclbench.locate.bands import over_sockets
    from ncclbench.topology.pathview import Path

    crossed = [p for p in map(Path.from_dict, paths.values()) if p is not None and p.crosses_hosts]
    return bool(crossed) and over_sockets(p.network or "?" for p in crossed)


def slow_nic_hosts(paths: dict, best: dict) -> dict:
    """{group: {host: evidence}}: in a group whose NCCL path crossed hosts, a host whose NICs
    (the ones its NET connections used, at the rate read on that host: the link's, or a tbf
    qdisc's cap where lower) give under half the median of the other hosts', while the
    group's best busbw stayed below the others' rate: the traffic between hosts ran at the
    slower NIC. This names a slow NIC where no measurement can: with two hosts every pair
    crosses it alike, so no host is slower than a peer (the rates agree on healthy hosts)."""
    import statistics

    from ncclbench.topology.pathview import Path

    out: dict = {}
    for g, d in paths.items():
        view = Path.from_dict(d)
        if view is None or not view.uses_network or best.get(g) is None:
            continue
        rates = {h: (sum(r.values()), sorted(r), shaped) for h, (r, shaped) in view.host_nic_rates().items()}
        for h, (rate, names, shaped) in rates.items():
            others = [v[0] for k, v in rates.items() if k != h]
            if not others:
                continue
            usual = statistics.median(others)
            if rate < NIC_OUTLIER * usual and best[g] < usual:
                how = " (a tbf qdisc caps what it sends)" if shaped else ""
                nic = f"NIC {names[0]} gives" if len(names) == 1 else f"NICs {' + '.join(names)} give"
                out.setdefault(g, {})[h] = (
                    f"is on {h}, whose {nic} {rate:.3g} GB/s{how}, under half the other hosts' "
                    f"{usual:.3g} GB/s, while the traffic between hosts ran at {best[g]:.3g} GB/s busbw")
    return out
