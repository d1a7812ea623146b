"""The path NCCL took, read from its own INFO log (NCCL_DEBUG=INFO with the subsystems
INIT,ENV,P2P,SHM,NET,GRAPH): which network, which NICs, GPUDirect RDMA, PXN, the transport
of every connection, the channels, NVLS and CollNet. Pure text parsing: no torch, no CUDA.

Line formats, as NCCL 2.2x prints them (src/ paths of NVIDIA/nccl v2.28.9-1):
  init.cc             `NCCL version 2.28.9+cuda13.0`, `Using network Socket`,
                      `comm 0x.. rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0`,
                      `4 coll channels, 4 collnet channels, 0 nvls channels, 4 p2p channels, ...`,
                      `<func> comm 0x.. rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x.. - Init COMPLETE`
  transport/p2p.cc    `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM` (/read, /CE; P2P/IPC, P2P/direct pointer,
                      P2P/MNNVL, P2P/indirect/2[2])
  transport/shm.cc    `Channel 00 : 0[0] -> 1[1] via SHM/direct/direct` (CE for a copy engine side)
  transport/net.cc    `Channel 00/0 : 0[0] -> 2[2] [send] via NET/Socket/0` (/GDRDMA, (PCI), /Shared;
                      `NET/IB/0(1)/GDRDMA`: through rank 1's NIC, PXN)
  transport/coll_net.cc `CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA`
  transport/generic.cc `Connected all rings, use ring PXN 0 GDR 0`, `Connected all trees`
  transport/nvls.cc   `NVLS multicast support is available on dev 0` / `is not available`
  net_socket.cc       `NET/Socket : Using [0]eth0:198.18.0.10<0>`
  net_ib.cc           `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>`
  graph/topo.cc       `NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'`
  graph/paths.cc      `NCCL_P2P_DISABLE set by environment to 1`, `NCCL_P2P_LEVEL set by environment to LOC`
  misc/param.cc       `NCCL_IB_DISABLE set by environment to 1.`
debug.cc prefixes each line with `host:pid:tid [cudaDev] NCCL INFO `; a combined log (a job's
stdout) mixes those with any other output, and a pasted fragment may have no prefix at all."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path as _FsPath

from ncclbench.inputs import read_text

_PREFIX = re.compile(r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d*)\] NCCL (?P<level>INFO|WARN|TRACE) ")
_BARE = re.compile(r"NCCL (?P<level>INFO|WARN) ")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)")
_NETWORK = re.compile(r"Using network (?P<name>.+?)\s*$")
_NET_DEVICES = re.compile(r"NET/(?P<net>\w+) ?: Using(?P<list>(?: \[\d+\]\S+)+)")
_NET_DEVICE = re.compile(r"\[(?P<i>\d+)\](?P<name>[^:\s/]+)(?::(?P<rest>\S*))?")
_GDR_HCA = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:HCA (?P<n>\d+) '(?P<hca>[^']*)'|GPU (?P<gpu>\d+))")
_CONN = re.compile(r"Channel (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<sdev>\d+)\] -> (?P<dst>\d+)\[(?P<ddev>\d+)\]"
                   r"(?: \[(?P<dir>send|receive)\])? via (?P<via>NET/[^/\n]+?/\d+\S*|(?!NET/)\S+(?: pointer\S*)?)")
_COLLNET = re.compile(r"CollNet \d+/\d+ : \d+ \[(?:send|receive)\] via COLLNET/(?P<name>[^/\s]+)")
_RINGS = re.compile(r"Connected all rings(?:, use ring PXN (?P<pxn>\d+) GDR (?P<gdr>\d+))?")
_COMM = re.compile(r"comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<n>\d+) nNodes (?P<nodes>\d+) "
                   r"localRanks (?P<local>\d+)")
_COMPLETE = re.compile(r"comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<n>\d+) .*?"
                       r"(?:commId (?P<id>0x[0-9a-fA-F]+) )?- Init COMPLETE")
_BUS = re.compile(r" busId (?P<bus>[0-9a-fA-F]+) ")
_PARENT = re.compile(r" parent (?P<parent>0x[0-9a-fA-F]+) (?:splitCount|childCount) (?P<n>\d+) color (?P<color>-?\d+)")
_CHANNELS = re.compile(r"(?P<coll>\d+) coll channels, (?P<collnet>\d+) collnet channels, (?P<nvls>\d+) nvls channels, "
                       r"(?P<p2p>\d+) p2p channels")
_NVLS = re.compile(r"NVLS multicast support is (?P<not>not )?available")
_ENV = re.compile(r"(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?\s*$")
_PLUGIN = re.compile(r"(?:Successfully loaded external network plugin|NET/Plugin: Loaded net plugin) (?P<name>\S+)")


def pci_address(bus_id: str) -> str:
    """NCCL's busId (`%lx` of domain << 20 | bus << 12 | device << 4 | function) as a PCI address."""
    n = int(bus_id, 16)
    return f"{n >> 20:04x}:{(n >> 12) & 0xff:02x}:{(n >> 4) & 0xff:02x}.{n & 0xf:x}"


def kind_of(via: str) -> str:
    """The transport as people name it, device numbers left out: `P2P/CUMEM/read`,
    `P2P/IPC`, `P2P/direct`, `P2P/indirect`, `SHM` (`SHM/CE...` when a copy engine is
    used), `NET/IB/GDRDMA`, `NET/Socket`."""
    parts = via.split("/")
    if parts[0] == "P2P":
        if parts[1:2] == ["direct pointer"] or via.startswith("P2P/direct"):
            return "P2P/direct" + ("/read" if via.endswith("read") else "")
        if parts[1:2] == ["indirect"]:
            return "P2P/indirect"
        return "/".join(parts[:2] + [p for p in parts[2:] if p in ("read", "CE")])
    if parts[0] == "SHM":
        return "SHM" if parts[1:] in (["direct", "direct"], ["direct"], []) else via
    if parts[0] == "NET" and len(parts) > 1:
        extras = [p for p in parts[3:] if p]
        return "/".join(["NET", parts[1]] + extras)
    return via


def _link(m) -> tuple[tuple, str]:
    """A connection line's ((src, dst, kind), 'channel/connection index')."""
    return (int(m["src"]), int(m["dst"]), kind_of(m["via"])), f"{int(m['ch']):02d}/{m['conn'] or 0}"


@dataclass
class Nic:
    index: int
    name: str
    detail: str = ""      # address (sockets) or port/link layer (IB: `1/IB`, `1/RoCE`)


@dataclass
class Comm:
    """One communicator as one process saw it."""

    ptr: str | None = None
    comm_id: str | None = None
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    channels: int | None = None          # coll channels
    nvls_channels: int | None = None
    p2p_channels: int | None = None
    pxn: int | None = None               # `use ring PXN p GDR g`
    gdr: int | None = None
    rings: bool = False
    trees: bool = False
    nvls: bool | None = None             # multicast available on this GPU
    collnet: str | None = None           # the CollNet plugin it connected through
    complete: bool = False
    bus_id: str | None = None            # this rank's GPU, as NCCL numbers it (`busId 18000`: 0000:18:00.0)
    key: str | None = None               # the same in each of its processes: commId, or a split's `parent/count.color`
    links: dict = field(default_factory=dict)   # (src, dst, kind) -> {'cc/i'}: channel/connection index
    net_devices: set = field(default_factory=set)  # NET device indexes its connections used
    seen: int = 0                        # the number of the process's last NCCL line that was its

    def fits(self, m) -> bool:
        """Whether a connection line can be this communicator's: both ranks within its size, its
        own rank the end that prints it (the sender; for NET, the side in brackets), a network
        only where it spans nodes, P2P or SHM only where it has ranks on one node, and not a
        connection it already holds."""
        if self.nranks is None or self.rank is None:
            return False
        src, dst = int(m["src"]), int(m["dst"])
        printer = dst if m["dir"] == "receive" else src
        if max(src, dst) >= self.nranks or self.rank != printer:
            return False
        network = m["via"].startswith(("NET", "COLLNET"))
        if network and self.nnodes == 1:
            return False
        if not network and self.local_ranks == 1:
            return False
        return not self.has(m)

    def connected_collectives(self) -> bool:
        """Whether it holds ring or tree connections (index 0)."""
        return any(ch.endswith("/0") for chans in self.links.values() for ch in chans)

    def has(self, m) -> bool:
        """Whether it already holds this connection (a channel connects once: a repeat is another
        communicator's)."""
        key, channel = _link(m)
        return channel in self.links.get(key, ())

    def add_connection(self, m) -> None:
        """NCCL prints a P2P or SHM connection on the sending rank, a NET one on both (`[send]`
        and `[receive]`, both written source -> destination): kept once per channel."""
        key, channel = _link(m)
        self.links.setdefault(key, set()).add(channel)
        parts = m["via"].split("/")
        if parts[0] == "NET" and len(parts) > 2:
            dev = re.match(r"\d+", parts[2])
            if dev:
                self.net_devices.add(int(dev.group()))


@dataclass
class ProcessLog:
    """What one process's lines said."""

    source: str
    host: str | None = None
    pid: int | None = None
    version: str | None = None
    network: str | None = None               # `Using network X`: IB, Socket, or a plugin's name
    plugin: str | None = None
    nics: dict = field(default_factory=dict)  # net name -> [Nic]
    gdr_hcas: dict = field(default_factory=dict)  # HCA name -> bool
    env: dict = field(default_factory=dict)   # NCCL_* NCCL reports as set by the environment
    comms: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    lines: int = 0                            # NCCL lines read
    logged: set = field(default_factory=set)  # the subsystems (INIT, ENV, P2P, SHM, NET) some line of shows were on
    _pending: list = field(default_factory=list, repr=False)  # connection lines whose communicator is open
    _seq: Comm | None = field(default=None, repr=False)       # the communicator now connecting
    _conn: str = field(default="0", repr=False)               # the connection index of the run
    _prefer: int | None = field(default=None, repr=False)     # after a mark: the size of the op's communicator

    def _comm(self) -> Comm:
        if not self.comms:
            self.comms.append(Comm())
        self.comms[-1].seen = self.lines
        return self.comms[-1]

    # Since NCCL 2.22 a communicator connects at its first use of an algorithm, not at init,
    # so its `Channel ..` lines (which name no communicator) may follow another one's init.
    # A run of them belongs to the communicator they all fit (ranks within its size, its own
    # rank the printing end, a network only across nodes, P2P/SHM only with a rank on its node,
    # no channel it already holds): the one now connecting while it fits, else, once one alone
    # fits, that one; lines that fit several wait for a line that decides, or for the run's end
    # (`Connected all rings/trees`, another connection index, a new communicator, a mark), and
    # then go to the newest among them without ring or tree connections yet (for a run of
    # those) or to the one that had a line last (send/recv connections, index 1).
    def _connection(self, m) -> None:
        conn = m["conn"] or "0"
        if conn != self._conn:  # send/recv connections (index 1) and a ring's (0) are separate runs
            self.mark()
            self._conn = conn
        if self._seq is not None and self._seq.fits(m) and not self._pending:
            self._add(self._seq, [m])
            return
        self._pending.append(m)
        fitting = [c for c in self.comms if all(c.fits(x) for x in self._pending)]
        if len(fitting) == 1:
            self._seq = fitting[0]
            self._add(self._seq, self._pending)
            self._pending = []
        elif not fitting:
            self._flush(self._pending[:-1])
            self._pending = [m]
            if not any(c.fits(m) for c in self.comms):  # numbering no communicator line gave: the newest
                self._add(self._comm(), self._pending)
                self._pending = []

    def _flush(self, pending=None) -> Comm | None:
        pending = self._pending if pending is None else pending
        if pending:
            fitting = [c for c in self.comms if all(c.fits(x) for x in pending)]
            fitting = [c for c in fitting if c.nranks == self._prefer] or fitting
            if self._conn == "0":  # rings and trees: a communicator that has not connected them, the newest
                target = ([c for c in fitting if not c.connected_collectives()] or fitting or [self._comm()])[-1]
            else:  # send/recv connections come at any time: the communicator that had a line last
                target = max(reversed(fitting), key=lambda c: c.seen) if fitting else self._comm()
            self._add(target, pending)
            self._seq = target
        self._pending = []
        return self._seq

    def _add(self, comm: Comm, lines) -> None:
        for m in lines:
            comm.add_connection(m)
        comm.seen = self.lines

    def end_run(self) -> Comm | None:
        """A run of connection lines ended: the communicator it belonged to; when no line said,
        the only one there is, else None (a 2-rank tree connects without a line of its own)."""
        comm = self._flush() or (self._comm() if len(self.comms) <= 1 else None)
        self._seq = None
        if comm is not None:
            comm.seen = self.lines
        return comm

    def mark(self, size: int | None = None) -> None:
        """What follows is another operation's: no run of connection lines crosses here. `size`:
        the ranks of the communicator that operation runs on, preferred where lines fit several."""
        self._flush()
        self._seq = None
        if size is not None:
            self._prefer = size

    def _comm_for(self, ptr: str) -> Comm:
        self.mark()
        for c in reversed(self.comms):
            if c.ptr == ptr:
                return c
        if self.comms and self.comms[-1].ptr is None:
            self.comms[-1].ptr = ptr
            return self.comms[-1]
        self.comms.append(Comm(ptr=ptr))
        return self.comms[-1]

    def feed(self, message: str, level: str = "INFO") -> None:
        self.lines += 1
        if level == "WARN":
            self.warnings.append(message.strip())
            return
        for pattern, handle, subsys in _HANDLERS:
            m = pattern.search(message)
            if m:
                handle(self, m)
                shown = subsys(m) if callable(subsys) else subsys
                if shown:
                    self.logged.add(shown)
                return
        self.lines -= 1
        for pattern, subsys in _EVIDENCE:
            if pattern.search(message):
                self.logged.add(subsys)
                return


def _version(p: ProcessLog, m) -> None:
    p.version = p.version or m["v"]


def _network(p: ProcessLog, m) -> None:
    p.network = m["name"]


def _net_devices(p: ProcessLog, m) -> None:
    p.nics[m["net"]] = [Nic(int(d["i"]), d["name"], d["rest"] or "") for d in _NET_DEVICE.finditer(m["list"])]


def _gdr(p: ProcessLog, m) -> None:
    p.gdr_hcas[m["hca"] or f"GPU {m['gpu']}"] = m["state"] == "Enabled"


def _conn(p: ProcessLog, m) -> None:
    p._connection(m)


def _collnet(p: ProcessLog, m) -> None:
    p._comm().collnet = m["name"]


def _rings(p: ProcessLog, m) -> None:
    c = p.end_run()
    if c is None:
        return
    c.rings = True
    if m["pxn"] is not None:
        c.pxn, c.gdr = int(m["pxn"]), int(m["gdr"])


def _trees(p: ProcessLog, m) -> None:
    c = p.end_run()
    if c is not None:
        c.trees = True


def _comm_line(p: ProcessLog, m) -> None:
    c = p._comm_for(m["ptr"])
    c.seen = p.lines
    c.rank, c.nranks, c.nnodes, c.local_ranks = int(m["rank"]), int(m["n"]), int(m["nodes"]), int(m["local"])


def _complete(p: ProcessLog, m) -> None:
    c = p._comm_for(m["ptr"])
    c.rank, c.nranks, c.complete = int(m["rank"]), int(m["n"]), True
    c.comm_id = m["id"] or c.comm_id
    bus = _BUS.search(m.string)
    c.bus_id = pci_address(bus["bus"]) if bus else c.bus_id
    split = _PARENT.search(m.string)
    if split:  # a split names no commId: its parent's key, the parent's split count and its colour tell it apart
        parent = next((x for x in p.comms if x.ptr == split["parent"] and x.key), None)
        c.key = f"{parent.key}/{split['n']}.{split['color']}" if parent else c.key
    else:
        c.key = c.comm_id or c.key


def _channels(p: ProcessLog, m) -> None:
    c = p._comm()
    # (NCCL 2.28 prints its coll channel count as the collnet count too: that says nothing of CollNet)
    c.channels, c.nvls_channels, c.p2p_channels = int(m["coll"]), int(m["nvls"]), int(m["p2p"])


def _nvls(p: ProcessLog, m) -> None:
    p._comm().nvls = m["not"] is None


def _env(p: ProcessLog, m) -> None:
    p.env[m["name"]] = m["value"].strip()


def _plugin(p: ProcessLog, m) -> None:
    p.plugin = m["name"]


def _conn_subsys(m) -> str | None:
    """A connection line shows when INIT or its transport's subsystem is logged."""
    head = m["via"].split("/", 1)[0]
    return head if head in ("P2P", "SHM", "NET") else None


def _env_subsys(m) -> str | None:
    """ENV, except for the lines graph/paths.cc prints under every subsystem (no final dot)."""
    always = m["name"] in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL")
    return None if always and not m.string.rstrip().endswith(".") else "ENV"


# pattern, what a match feeds, the subsystem a match shows was logged (src/ of NCCL 2.28: INFO(NCCL_INIT, ...)
# lines show only under INIT; a connection's INFO(NCCL_INIT | NCCL_NET, ...) under either)
_HANDLERS = [  # most frequent first
    (_CONN, _conn, _conn_subsys), (_COLLNET, _collnet, "NET"), (_COMPLETE, _complete, "INIT"),
    (_COMM, _comm_line, "INIT"), (_RINGS, _rings, "INIT"), (re.compile(r"Connected all trees"), _trees, "INIT"),
    (_CHANNELS, _channels, "INIT"), (_NVLS, _nvls, "INIT"), (_GDR_HCA, _gdr, "NET"), (_NET_DEVICES, _net_devices, "NET"),
    (_NETWORK, _network, "INIT"), (_VERSION, _version, None), (_ENV, _env, _env_subsys), (_PLUGIN, _plugin, None),
]
# lines read only as a sign of their subsystem
_EVIDENCE = [
    (re.compile(r"NCCL_SOCKET_IFNAME set to "), "NET"),
    (re.compile(r"(?:MMAP|CUMEM) (?:allocated|imported) shareable (?:host )?buffer"), "SHM"),
]


def whole(text: str) -> str:
    """`text` without its last line where that is an NCCL line NCCL had not finished writing
    (no newline after it yet: a log copied, or read, while NCCL wrote it; what is left of such
    a line would read as another transport)."""
    last = text.rsplit("\n", 1)[-1]
    return text if not last or not _PREFIX.search(last) else text[:len(text) - len(last)]


def parse_text(text: str, source: str = "<text>", marks=()) -> list[ProcessLog]:
    """Every process whose NCCL lines `text` holds, in order of first appearance. Lines with
    NCCL's `host:pid:tid [dev]` prefix go to their process; lines without one (a pasted
    fragment, `NCCL INFO ...` alone) to one process named after `source`, unless the text has
    prefixed lines too: then only those with NCCL's bare `NCCL INFO`/`WARN` marker are read,
    the others being other output mixed in, as in a job's combined log). `marks`: counts of a
    process's NCCL lines after which another operation began (ProcessLog.mark); a dict maps
    each to the size of that operation's communicator."""
    lines = text.splitlines()
    prefixed = any(_PREFIX.search(line) for line in lines)
    found: dict = {}
    marks = dict(marks) if isinstance(marks, dict) else dict.fromkeys(marks)
    for line in lines:
        m = _PREFIX.search(line)
        if m:
            key = (m["host"], int(m["pid"]))
            message, level = line[m.end():], m["level"]
        else:
            bare = _BARE.search(line)
            if prefixed and not bare:
                continue
            key = (None, None)
            message, level = (line[bare.end():], bare["level"]) if bare else (line, "INFO")
        if key not in found:
            found[key] = ProcessLog(source=source, host=key[0], pid=key[1])
        if marks and found[key].lines in marks:
            found[key].mark(marks[found[key].lines])
        found[key].feed(message, level)
    if prefixed and (None, None) in found and not found[(None, None)].comms:
        del found[(None, None)]  # a bare `NCCL WARN` of other output, next to NCCL's own prefixed lines
    for p in found.values():
        p.mark()
    return [p for p in found.values() if p.lines]


def log_files(paths) -> list[_FsPath]:
    """The files `paths` name: files as given, folders by every file inside (sorted)."""
    out = []
    for raw in paths:
        path = _FsPath(raw)
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.is_file())
        else:
            out.append(path)
    return out


def read_logs(paths) -> list[ProcessLog]:
    """Every process in the files and folders `paths` name; InputFileError (one line) for one
    that cannot be read or is not a bounded text file (ncclbench.inputs)."""
    processes = []
    for path in log_files(paths):
        processes += parse_text(whole(read_text(path, "nccl log", lenient=True)), str(path))
    return processes


def to_summary(p: ProcessLog, rank: int | None = None) -> dict:
    """A process's log as a small JSON-able dict (what travels between ranks and into files)."""
    return {
        "rank": rank, "host": p.host, "pid": p.pid, "version": p.version, "network": p.network, "plugin": p.plugin,
        "nics": {net: [asdict(n) for n in nics] for net, nics in p.nics.items()},
        "gdr_hcas": dict(p.gdr_hcas), "env": dict(p.env), "warnings": p.warnings[:5],
        "comms": [_comm_summary(c) for c in p.comms], "lines": p.lines,
    }


def _comm_summary(c: Comm) -> dict:
    d = {k: v for k, v in asdict(c).items() if k not in ("links", "net_devices")}
    d["links"] = [[s, t, k, sorted(ch)] for (s, t, k), ch in sorted(c.links.items())]
    d["net_devices"] = sorted(c.net_devices)
    return d


