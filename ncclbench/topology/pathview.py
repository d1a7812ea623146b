"""One run's NCCL path, merged from every process's log summary (ncclpath.to_summary): the
transports and the rank pairs that used them, the network and NICs, GDR, PXN, channels,
NVLS and CollNet; its short label (what `compare` puts side by side) and the header lines."""

from __future__ import annotations

from dataclasses import dataclass

# which transport bounds a run's bandwidth when several appear: the network, then host memory, then GPU links
_ORDER = ("NET", "COLLNET", "SHM", "P2P")


def _rank_of_kind(kind: str) -> int:
    head = kind.split("/", 1)[0]
    return _ORDER.index(head) if head in _ORDER else len(_ORDER)


def _pairs_text(pairs, limit: int = 4) -> str:
    pairs = sorted(pairs)
    shown = ", ".join(f"{a}->{b}" for a, b in pairs[:limit])
    return shown + (f", +{len(pairs) - limit} more" if len(pairs) > limit else "")


def _crossed(comm: dict) -> bool:
    """Whether a communicator crossed a network: several nodes, or a NET/COLLNET link."""
    return (comm.get("nnodes") or 1) > 1 or any(str(link[2]).startswith(("NET", "COLLNET"))
                                                 for link in comm.get("links", []))


def _one(values: set) -> str | None:
    """The one value the processes agree on, or `a/b` where they differ; None when none said."""
    values = {str(v) for v in values if v is not None}
    return "/".join(sorted(values)) if values else None


@dataclass
class Path:
    """The path of one run: `processes` are ncclpath.to_summary dicts (one per process that
    could read its log); `unread` says, per rank, why a log could not be read."""

    processes: list
    unread: dict | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> "Path | None":
        if not d:
            return None
        return cls(list(d.get("processes", [])), dict(d.get("unread") or {}))

    def to_dict(self) -> dict:
        return {"label": self.label if self.connected else None, "facts": self.facts(), "processes": self.processes, "unread": self.unread or {},
                "network": self.network, "gdr": self.gdr, "pxn": self.pxn, "channels": self.channels,
                "nvls": self.nvls, "version": self.version, "env": self.env,
                "transports": {k: [list(p) for p in sorted(v)] for k, v in self.transports().items()},
                "nics": self.nics_by_rank()}

    @property
    def empty(self) -> bool:
        return not any(p.get("comms") for p in self.processes)

    @property
    def connected(self) -> bool:
        """Whether the log named any connection (a communicator of one rank has none; a log
        without NCCL's INIT lines, or cut before the first collective, names none either)."""
        return any(c.get("links") for c in self.comms())

    def unconnected_text(self) -> str:
        """Why a path that names communicators shows no transport."""
        sizes = [c.get("nranks") for c in self.comms()]
        if sizes and all(n is not None and n <= 1 for n in sizes):
            return "none (one rank: NCCL connects nothing)"
        known = [n for n in sizes if n]
        what = f"communicators of up to {max(known)} ranks" if known else "communicators"
        return (f"unknown (NCCL's log named {what} but no connection line: NCCL connects ranks at a "
                "communicator's first collective, and the log ends before it)")

    def comms(self):
        for p in self.processes:
            yield from p.get("comms", [])

    def transports(self) -> dict:
        """{kind: {(src, dst)}} over every communicator (ranks as the communicator numbers them)."""
        out: dict = {}
        for c in self.comms():
            for src, dst, kind, _channels in c.get("links", []):
                out.setdefault(kind, set()).add((src, dst))
        return dict(sorted(out.items(), key=lambda kv: (_rank_of_kind(kv[0]), kv[0])))

    @property
    def label(self) -> str:
        """`NET/Socket + P2P/CUMEM`: the transports used, the one that bounds bandwidth first."""
        kinds = list(self.transports())
        return " + ".join(kinds) if kinds else "no connection seen"

    @property
    def bottleneck(self) -> str | None:
        kinds = list(self.transports())
        return kinds[0] if kinds else None

    @property
    def uses_network(self) -> bool:
        return any(k.startswith(("NET", "COLLNET")) for k in self.transports())

    @property
    def network(self) -> str | None:
        return _one({p.get("network") for p in self.processes})

    @property
    def link_layers(self) -> set:
        """IB / RoCE of the NET/IB devices the processes listed."""
        return {n["detail"].rsplit("/", 1)[-1] for p in self.processes for n in (p.get("nics") or {}).get("IB", [])
                if "/" in n.get("detail", "")}

    @property
    def network_label(self) -> str | None:
        net = self.network
        if net == "IB" and self.link_layers == {"RoCE"}:
            return "RoCE"
        return net

    def network_comms(self) -> list:
        """The communicators that crossed a network (NET/COLLNET links, or several nodes),
        or every communicator when none did: NCCL prints PXN and GDR for a communicator
        within one host too (GDR 1 there says nothing of the network)."""
        comms = list(self.comms())
        return [c for c in comms if _crossed(c)] or comms

    @property
    def crosses_hosts(self) -> bool:
        """Whether a communicator crossed hosts (NET/COLLNET links, or several nodes): NCCL
        names its network (Socket on a host without RDMA devices) within one host too."""
        return any(_crossed(c) for c in self.comms())

    def network_span(self) -> tuple[set, list]:
        """Where the NET/COLLNET connections ran, by the host names of both ends' processes:
        ({"hosts"} between hosts, {"one host"} between processes of one host, {"unknown"} where
        no communicator id ties a rank to its process), and the peer ranks whose process is not
        among these logs (its host unknown: NCCL's nNodes counts groups of ranks that reach
        each other without the network, not hosts)."""
        where = {(c.get("key"), c.get("rank")): p.get("host") for p in self.processes for c in p.get("comms", [])
                 if c.get("key") and c.get("rank") is not None}
        # a run's merge: one summary per rank of the group, numbered as the group's communicator numbers them
        by_rank = {p.get("rank"): p.get("host") for p in self.processes if p.get("rank") is not None}
        span, unseen = set(), set()
        for p in self.processes:
            for c in p.get("comms", []):
                for src, dst, kind, _channels in c.get("links", []):
                    if not str(kind).startswith(("NET", "COLLNET")):
                        continue
                    peer = dst if src == c.get("rank") else src
                    host = where.get((c.get("key"), peer))
                    if host is None and len(by_rank) == c.get("nranks"):
                        host = by_rank.get(peer)
                    if host is None and c.get("key") and p.get("host"):
                        unseen.add(peer)
                    elif host is None or p.get("host") is None:
                        span.add("unknown")
                    else:
                        span.add("one host" if host == p.get("host") else "hosts")
        return span, sorted(unseen)

    @property
    def gdr(self) -> int | None:
        """1 when GPUDirect RDMA carried network traffic, 0 when it did not, None when
        unknown. From NCCL's ring line (`use ring PXN p GDR g`) and from each NET
        connection's own line (`via NET/IB/0/GDRDMA`, or without /GDRDMA): a communicator that
        connected only trees (2 hosts at a large size) prints no ring line."""
        comms = self.network_comms()
        values = {c.get("gdr") for c in comms if c.get("gdr") is not None}
        net_kinds = {str(link[2]) for c in comms for link in c.get("links", [])
                     if str(link[2]).startswith(("NET", "COLLNET"))}
        if any("GDRDMA" in k for k in net_kinds):
            values.add(1)
        elif net_kinds and not values:
            values.add(0)
        return max(values) if values else None

    @property
    def pxn(self) -> int | None:
        values = {c.get("pxn") for c in self.network_comms() if c.get("pxn") is not None}
        return max(values) if values else None

    @property
    def hosts(self) -> list:
        return sorted({p.get("host") for p in self.processes if p.get("host")})

    @property
    def channels(self) -> int | None:
        values = [c.get("channels") for c in self.comms() if c.get("channels")]
        return min(values) if values else None

    @property
    def nvls(self) -> bool | None:
        values = {c.get("nvls") for c in self.comms() if c.get("nvls") is not None}
        return None if not values else all(values)

    @property
    def collnet(self) -> str | None:
        return _one({c.get("collnet") for c in self.comms()})

    @property
    def algorithms(self) -> list[str]:
        """What NCCL's communicators connected, as `Connected all rings/trees` said: ring, tree."""
        return [name for name, key in (("ring", "rings"), ("tree", "trees")) if any(c.get(key) for c in self.comms())]

    @property
    def version(self) -> str | None:
        return _one({p.get("version") for p in self.processes})

    @property
    def env(self) -> dict:
        out: dict = {}
        for p in self.processes:
            for k, v in (p.get("env") or {}).items():
                out.setdefault(k, v)
        return dict(sorted(out.items()))

    def nics_by_rank(self) -> dict:
        """{rank (as str): [NIC names its NET connections used]}; rank is the communicator rank."""
        out: dict = {}
        for p in self.processes:
            nics = (p.get("nics") or {}).get(p.get("network") or "", [])
            names = {n["index"]: n["name"] for n in nics}
            for c in p.get("comms", []):
                used = [names.get(i, f"dev {i}") for i in c.get("net_devices", [])]
                rank = c.get("rank") if c.get("rank") is not None else p.get("rank")
                if used and rank is not None:
                    out.setdefault(str(rank), sorted(set(out.get(str(rank), [])) | set(used)))
        return out

    def nic_names(self) -> list[str]:
        """The NICs the NET connections used (by each process's device index)."""
        out = set()
        for p in self.processes:
            names = {n["index"]: n["name"] for n in (p.get("nics") or {}).get(p.get("network") or "", [])}
            out |= {names.get(i, f"dev {i}") for c in p.get("comms", []) for i in c.get("net_devices", [])}
        return sorted(out)

    def host_nic_rates(self) -> dict:
        """{host: ({NIC: GB/s}, {NICs a tbf qdisc caps})} of the NICs each host's own NET
        connections used, at the rates read on that host (ncclbench.topology.nccldebug)."""
        out: dict = {}
        for p in self.processes:
            names = {n["index"]: n["name"] for n in (p.get("nics") or {}).get(p.get("network") or "", [])}
            used = {names.get(i) for c in p.get("comms", []) for i in c.get("net_devices", [])}
            rates, shaped = out.setdefault(p.get("host") or "?", ({}, set()))
            for name, rate in (p.get("nic_rates") or {}).items():
                if name in used:
                    rates[name] = rate
                    if name in (p.get("nic_shaped") or {}):
                        shaped.add(name)
        return {h: v for h, v in out.items() if v[0]}

    def lines(self, forced: bool = False) -> list[str]:
        """The header's one or two lines (no `#`). `forced`: the communicators ran under
        different forced algorithms, protocols and channel counts (tune's probe): what those
        change (the channels, the algorithms connected) is left out."""
        if self.empty:
            return [self.unread_text() or "NCCL's log named no connection (the path is unknown)"]
        facts = self.fact_list(forced)
        if self.algorithms and not forced:  # in the header only: which sizes a run swept decides it, not the path
            facts.append(f"connected {'+'.join(self.algorithms)}")
        if self.env:
            facts.append("NCCL read " + " ".join(f"{k}={v}" for k, v in self.env.items()))
        if self.unread:
            facts.append(self.unread_text())
        if not self.connected:
            first = "NCCL path: " + self.unconnected_text()
        else:
            parts = []
            for kind, pairs in self.transports().items():
                text = f"{kind} ({_pairs_text(pairs)})"
                if kind.startswith("NET") and self.nic_names():
                    text += f" over {', '.join(self.nic_names())}"
                parts.append(text)
            first = "NCCL path: " + "; ".join(parts)
        return [first] + (["  " + ", ".join(facts)] if facts else [])

    def facts(self) -> str:
        """`network IB, GDR 1, PXN 1, 16 channels, NVLS available`: what `compare` also sets side by side."""
        return ", ".join(self.fact_list())

    def fact_list(self, forced: bool = False) -> list[str]:
        facts = []
        if self.uses_network:  # NCCL names its network and prints GDR/PXN on one host too, where they mean nothing
            facts += [f"{name} {value}" for name, value in (("network", self.network_label), ("GDR", self.gdr),
                                                            ("PXN", self.pxn)) if value is not None]
        if self.channels and not forced:
            facts.append(f"{self.channels} channels")
        if self.nvls is not None:
            facts.append("NVLS " + ("available" if self.nvls else "not available"))
        if self.collnet:
            facts.append(f"CollNet {self.collnet}")
        return facts

    def unread_text(self) -> str | None:
        if not self.unread:
            return None
        reasons: dict = {}
        for rank, why in sorted(self.unread.items(), key=lambda kv: int(kv[0])):
            reasons.setdefault(why, []).append(str(rank))
        return "; ".join(f"rank(s) {','.join(r)}: {why}" for why, r in reasons.items())

