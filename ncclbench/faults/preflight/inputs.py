"""Preflight's inputs, checked before anything is measured: the groups (and the --mesh layout
the command builds them from), the band, the budget and timeout, the floor, the collectives
and the datatype. Every rank checks them the same way, so that a bad input fails every rank
with one message rather than leaving some ranks to wait for the others."""

from __future__ import annotations

from ncclbench.engine.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, lookup
from ncclbench.errors import PlanError, first_line
from ncclbench.locate.bands import backend_bands, bands_for, parse_band

DEFAULT_TIMEOUT_S = 600.0  # for agreeing on the inputs, before the timeout asked for is known to be valid

PREFLIGHT_COLLECTIVES = (ALL_REDUCE.name, ALL_GATHER.name, REDUCE_SCATTER.name)
ONE_RANK = ("preflight needs at least 2 ranks: one rank crosses no link, so nothing would be judged "
            "(use -g 2 or more, or start it under torchrun/srun/mpirun)")

def resolve_groups(groups) -> list[tuple[str, object]]:
    """[(dimension name, this rank's group)] from None, one group, a dict or a list."""
    import torch.distributed as dist

    if groups is None:
        return [("world", None)]
    if isinstance(groups, dict):
        items = [(str(k), v) for k, v in groups.items()]
    elif isinstance(groups, (list, tuple)):
        items = [(f"group{i}", g) for i, g in enumerate(groups)]
    else:
        items = [("group", groups)]
    if not items:
        raise PlanError("preflight needs at least one group")
    for name, g in items:
        if g is dist.GroupMember.NON_GROUP_MEMBER or (g is not None and not isinstance(g, dist.ProcessGroup)):
            raise PlanError(f"groups[{name!r}] must be a ProcessGroup this rank is in (for a DeviceMesh: "
                            f"mesh.get_group({name!r}))")
        if dist.get_rank(g) < 0:
            raise PlanError(f"rank {dist.get_rank()} is not a member of groups[{name!r}]")
    return items


def agreement_timeout(timeout, budget_s) -> float:
    """The deadline for agreeing on the inputs, before they are checked: the one asked for
    (or the budget's default) where it reads as one, else DEFAULT_TIMEOUT_S. A rank that
    never calls preflight is then named within the caller's timeout, not 600 s later."""
    try:
        value = max(60.0, 3.0 * float(budget_s)) if timeout is None else float(timeout)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT_S
    return value if 0 <= value < 1e6 else DEFAULT_TIMEOUT_S


def check_inputs(a: dict, dist) -> dict:
    """The checked settings from preflight's arguments `a`, with each dimension's group and
    backend; PlanError naming the first input that does not read."""
    from ncclbench.backends.torch_dist import group_backend_name
    from ncclbench.dtypes import resolve_dtypes
    from ncclbench.faults.preflight.verdict import parse_floor, read_baseline

    try:
        budget = float(a["budget_s"])
        timeout = max(60.0, 3.0 * budget) if a["timeout"] is None else float(a["timeout"])
    except (TypeError, ValueError):
        raise PlanError(f"budget_s and timeout must be numbers of seconds (got {a['budget_s']!r}, "
                        f"{a['timeout']!r})") from None
    if not 0 < budget < 1e6 or not 0 <= timeout < 1e6:
        raise PlanError(f"budget_s must be above 0 and timeout at least 0 seconds (got {budget:g}, {timeout:g})")
    try:
        datatype = resolve_dtypes(a["datatype"])[0].name
    except ValueError as exc:
        raise PlanError(f"preflight: {first_line(exc)}") from None
    names = [a["collectives"]] if isinstance(a["collectives"], str) else list(a["collectives"])
    collectives = []
    for name in names:
        try:
            collectives.append(lookup(str(name)).name)
        except KeyError:
            raise PlanError(f"preflight: unknown collective {name!r} (use {', '.join(PREFLIGHT_COLLECTIVES)}, "
                            "or any ncclbench collective)") from None
    floor = parse_floor(a["floor"], a["tolerance"])
    baseline = read_baseline(floor.source, datatype) if floor.kind == "baseline" else None
    dims = resolve_groups(a["groups"])
    backends = {name: group_backend_name(dist, g) for name, g in dims}
    asked = parse_band(a["band"])
    bands = backend_bands(asked, backends.values())
    sockets = bands_for(asked, ["socket"])  # pairs across hosts where NCCL's log names its Socket network
    return dict(dims=dims, backends=backends, floor=floor, baseline=baseline, band=bands.rank, link_band=bands.link,
                socket_band=max(bands.rank, sockets.rank), socket_link_band=max(bands.link, sockets.link),
                alone_band=bands.alone, collectives=collectives, datatype=datatype, budget=budget, timeout=timeout)


def parse_mesh(spec: str, world: int) -> list[tuple[str, list[list[int]]]]:
    """'dp=2,tp=4' -> [(name, every group of that dimension as global ranks)], ranks laid
    out row-major as torch's init_device_mesh((2, 4)) does (the last dimension contiguous)."""
    dims = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, size = part.partition("=")
        if not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise PlanError(f"--mesh {spec!r}: expected NAME=SIZE[,NAME=SIZE...] such as dp=2,tp=4")
        dims.append((name.strip(), int(size)))
    if not dims or len({n for n, _ in dims}) != len(dims):
        raise PlanError(f"--mesh {spec!r}: give each dimension once, e.g. dp=2,tp=4")
    total = 1
    for _, size in dims:
        total *= size
    if total != world:
        raise PlanError(f"--mesh {spec!r} has {total} ranks but the job has {world}")
    out = []
    for k, (name, size) in enumerate(dims):
        stride = 1
        for _, inner in dims[k + 1:]:
            stride *= inner
        starts = [r for r in range(world) if (r // stride) % size == 0]
        out.append((name, [[start + i * stride for i in range(size)] for start in starts]))
    return out


def make_groups(mesh: str | None, host_of: list[str]) -> dict:
    """This rank's group of each dimension (every rank creates every group, in one order, as
    torch requires); without --mesh: the default group, and the ranks of each host when the
    job spans several with more than one rank on some host."""
    import torch.distributed as dist

    world, me = dist.get_world_size(), dist.get_rank()
    if mesh:
        layout = parse_mesh(mesh, world)
    else:
        hosts = sorted(set(host_of), key=host_of.index)
        layout = [("world", [list(range(world))])]
        if len(hosts) > 1 and len(hosts) < world:  # one rank per host: one-rank groups cross no link
            layout.append(("node", [[r for r in range(world) if host_of[r] == h] for h in hosts]))
    mine = {}
    for name, groups in layout:
        for ranks in groups:
            g = None if len(ranks) == world else dist.new_group(ranks)
            if me in ranks:
                mine[name] = g
    return mine
