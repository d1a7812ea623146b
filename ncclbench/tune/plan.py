"""Which NCCL_ALGO x NCCL_PROTO (x channel limit) combinations a collective can be measured
under, before anything starts.

The algorithms and protocols each collective has in NCCL's tuning model are its registry
entry's (`tuning`, ncclbench.engine.collectives). The same model (src/graph/tuning.cc)
turns NVLS_TREE off on a single node, CollNet off unless it is enabled, and PAT off with
more than one GPU per node: that part, which depends on the machine, is here. Anything else
NCCL cannot do on a given machine is found at run time and reported as refused."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.engine.collectives import REGISTRY

MAX_CHANNELS = 64  # MAXCHANNELS in NCCL's src/include/device.h: the most a communicator can have


@dataclass(frozen=True)
class Name:
    """One algorithm or protocol in the three spellings NCCL uses for it."""

    key: str     # ours, and the tuner plugin's config spelling: nvls_tree
    env: str     # NCCL_ALGO / NCCL_PROTO token (ncclAlgoStr / ncclProtoStr): NVLSTree
    log: str     # the TUNING debug line (ncclAlgoToString / ncclProtoToString): NVLS_TREE
    index: int   # NCCL_ALGO_* / NCCL_PROTO_* (numeric in pre-2.24 TUNING lines)


ALGORITHMS = (
    Name("tree", "Tree", "TREE", 0), Name("ring", "Ring", "RING", 1),
    Name("collnet_direct", "CollNetDirect", "COLLNET_DIRECT", 2),
    Name("collnet_chain", "CollNetChain", "COLLNET_CHAIN", 3),
    Name("nvls", "NVLS", "NVLS", 4), Name("nvls_tree", "NVLSTree", "NVLS_TREE", 5), Name("pat", "PAT", "PAT", 6),
)
PROTOCOLS = (Name("ll", "LL", "LL", 0), Name("ll128", "LL128", "LL128", 1), Name("simple", "Simple", "SIMPLE", 2))
ALGO = {a.key: a for a in ALGORITHMS}
PROTO = {p.key: p for p in PROTOCOLS}

# registry name -> {algorithm: protocols} in NCCL's tuning model
MODEL = {c.name: c.tuning.algorithms for c in REGISTRY.values() if c.tuning}
# registry name -> (tuner plugin config name, NCCL's function name in debug lines)
COLLECTIVES = {c.name: (c.tuning.plugin, c.tuning.log) for c in REGISTRY.values() if c.tuning}
ONE_RANK_NOTE = ("one rank: NCCL copies the buffer locally and chooses no algorithm or protocol "
                 "(src/enqueue.cc), so there is nothing to tune")


@dataclass(frozen=True, order=True)
class Combination:
    """A forced setting; all None is NCCL's default (nothing forced)."""

    algo: str | None = None
    proto: str | None = None
    channels: int | None = None   # minCTAs = maxCTAs of the communicator; None: NCCL's own count

    @property
    def is_default(self) -> bool:
        return self.algo is None and self.proto is None and self.channels is None

    @property
    def label(self) -> str:
        if self.is_default:
            return "default"
        text = f"{self.algo}/{self.proto}"
        return text + (f" ch{self.channels}" if self.channels else "")

    @property
    def file_key(self) -> str:
        """A file-name part: default, tree-ll128, ring-simple-ch16."""
        return self.label.replace("/", "-").replace(" ", "-")

    def environment(self) -> dict[str, str | None]:
        """NCCL_ALGO / NCCL_PROTO for this combination's communicator (None: unset)."""
        if self.is_default or self.algo is None:
            return {"NCCL_ALGO": None, "NCCL_PROTO": None}
        return {"NCCL_ALGO": ALGO[self.algo].env, "NCCL_PROTO": PROTO[self.proto].env}

    def to_dict(self) -> dict:
        return {"algo": self.algo, "proto": self.proto, "channels": self.channels}

    @classmethod
    def from_dict(cls, d: dict) -> "Combination":
        return cls(d.get("algo"), d.get("proto"), d.get("channels"))


DEFAULT = Combination()


@dataclass(frozen=True)
class Context:
    """What decides which combinations NCCL can run, known before anything starts."""

    nranks: int
    nnodes: int = 1
    environ: dict = field(default_factory=dict)   # the NCCL_* variables the ranks will see
    op: str = "sum"


@dataclass
class CandidatePlan:
    collective: str
    combos: list[Combination]             # forced combinations, default not included
    left_out: list[tuple[str, str]]       # (what, why) for combinations not measured

    def notes(self) -> list[str]:
        return [f"{what}: {why}" for what, why in self.left_out]


def _match(text: str, names, kind: str) -> str:
    token = text.strip().lower().replace("_", "").replace("-", "")
    for n in names:
        if token in (n.key.replace("_", ""), n.env.lower(), n.log.lower().replace("_", "")):
            return n.key
    raise ValueError(f"unknown {kind} {text.strip()!r} (NCCL's {kind}s: {', '.join(n.key for n in names)})")


def parse_names(text: str | None, kind: str) -> tuple[str, ...] | None:
    """`tree,ring` -> ('tree', 'ring'); NCCL_ALGO spellings (NVLSTree) and the plugin's
    (nvls_tree) both accepted. None for None. ValueError names the bad entry."""
    if text is None:
        return None
    names = ALGORITHMS if kind == "algorithm" else PROTOCOLS
    items = [t for t in str(text).split(",")]
    if not any(t.strip() for t in items):
        raise ValueError(f"empty {kind} list")
    out = []
    for item in items:
        if not item.strip():
            raise ValueError(f"empty entry in the {kind} list {text!r}")
        key = _match(item, names, kind)
        if key not in out:
            out.append(key)
    return tuple(out)


def parse_channels(text: str | None) -> tuple[int, ...]:
    """`8,16,32` -> (8, 16, 32): channel counts a communicator can be limited to (1..64)."""
    if text is None:
        return ()
    out = []
    for item in str(text).split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"channel count {item!r} is not a whole number (e.g. --channels 8,16,32)") from None
        if not 1 <= value <= MAX_CHANNELS:
            raise ValueError(f"channel count {value} is outside 1..{MAX_CHANNELS} (NCCL's MAXCHANNELS)")
        if value in out:
            raise ValueError(f"channel count {value} is given twice")
        out.append(value)
    return tuple(out)


def unsupported_collective(name: str) -> str | None:
    """Why `tune` cannot run this (registry) collective, or None."""
    if name in MODEL:
        return None
    return (f"{name} runs as NCCL point-to-point sends and receives, where NCCL_ALGO and NCCL_PROTO "
            f"select nothing (tune takes {', '.join(MODEL)})")


def _context_reason(collective: str, algo: str, ctx: Context) -> str | None:
    env = ctx.environ
    if algo in ("nvls", "nvls_tree") and str(env.get("NCCL_NVLS_ENABLE", "")).strip() == "0":
        return "NCCL_NVLS_ENABLE=0 is set in the environment"
    if algo == "nvls_tree" and ctx.nnodes == 1:
        return "NCCL turns NVLS_TREE off on a single node"
    if algo.startswith("collnet"):
        if ctx.nnodes == 1:
            return "CollNet offloads to the network: a single node has none to use"
        if str(env.get("NCCL_COLLNET_ENABLE", "")).strip() != "1":
            return "CollNet needs NCCL_COLLNET_ENABLE=1 and a CollNet-capable network plugin"
    if algo == "pat":
        if ctx.nranks != ctx.nnodes and str(env.get("NCCL_PAT_ENABLE", "")).strip() != "1":
            return "NCCL runs PAT only with one GPU per node (NCCL_PAT_ENABLE=1 forces it)"
    if ctx.op in REGISTRY[collective].tuning.ops_without.get(algo, ()):
        return f"NCCL's {ALGO[algo].log} {collective} has no {ctx.op} (premul-sum or post-divide)"
    return None


def candidates(collective: str, ctx: Context, algos=None, protos=None, channels=()) -> CandidatePlan:
    """The forced combinations to measure next to the default, and what was left out and
    why. ValueError when the restriction names nothing this collective has in NCCL."""
    why = unsupported_collective(collective)
    if why:
        raise ValueError(why)
    model = MODEL[collective]
    if algos is not None and not set(algos) & set(model):
        raise ValueError(f"--algos {','.join(algos)}: none is an NCCL {collective} algorithm "
                         f"({collective} has {', '.join(model)})")
    pairs = [(a, p) for a in model for p in model[a]
             if (algos is None or a in algos) and (protos is None or p in protos)]
    if not pairs:
        raise ValueError(f"--protos {','.join(protos)}: NCCL runs {collective} with "
                         f"{', '.join(sorted({p for a in model for p in model[a] if algos is None or a in algos}))}"
                         " for the algorithms asked")
    left_out = [(a, f"not an NCCL {collective} algorithm") for a in (algos or ()) if a not in model]
    if ctx.nranks == 1:
        return CandidatePlan(collective, [], [("every combination", ONE_RANK_NOTE)])
    kept = []
    for algo in dict.fromkeys(a for a, _ in pairs):
        reason = _context_reason(collective, algo, ctx)
        if reason:
            left_out.append((algo, reason))
        else:
            kept += [(a, p) for a, p in pairs if a == algo]
    combos = [Combination(a, p, c) for a, p in kept for c in (None, *channels)]
    return CandidatePlan(collective, combos, left_out)
