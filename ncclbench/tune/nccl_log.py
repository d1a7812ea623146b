"""NCCL's own debug lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING): what it chose
for each call, where each communicator begins, its version, and the tuner plugin's word.

The choice line has had three forms (src/enqueue.cc):
  2.24 on   `AllReduce: 16777216 Bytes -> Algo TREE proto LL128 channel{Lo..Hi}={0..15}`
            (and, 2.27 on, `AllReduce [Symmetric]: 1048576 Bytes -> Kernel <name> nchannels 16 nthreads 512`)
  2.23      `AllReduce: 16777216 Bytes -> Algo 0 proto 1 time 123.456000`
  2.20-2.22 `16777216 Bytes -> Algo 0 proto 1 time 123.456000`
NCCL prints it on the communicator's rank 0, once per call, with the bytes of one rank's
`count` (all_gather: the send count, reduce_scatter: the receive count), which is
nccl-tests' count column times the type's size."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ncclbench.tune.plan import ALGORITHMS, PROTOCOLS, _match

_NEW = re.compile(r"NCCL INFO (?P<func>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+) "
                  r"channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\}")
_SYMMETRIC = re.compile(r"NCCL INFO (?P<func>\w+) \[Symmetric\]: (?P<bytes>\d+) Bytes -> Kernel (?P<kernel>\S+) "
                        r"nchannels (?P<nch>\d+)")
_OLD = re.compile(r"NCCL INFO (?:(?P<func>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\d+) proto (?P<proto>\d+) time")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)")
_INIT_COMPLETE = "Init COMPLETE"
_PLUGIN = re.compile(r"NCCL INFO (?P<text>(?:Successfully loaded external tuner plugin|External tuner plugin|"
                     r"TUNER/\w+: (?:Loaded \d+ tuning configurations|Config file|No valid configurations))(?:.*))")
_WARN = re.compile(r"NCCL WARN (?P<text>.*)")
_ENV_SET = re.compile(r"NCCL INFO (?P<name>NCCL_ALGO|NCCL_PROTO) set by environment to (?P<value>\S+)")
_CHANNELS = re.compile(r"NCCL INFO (?P<n>\d+) coll channels,")


@dataclass
class Init:
    """What a communicator's init said before its `Init COMPLETE` (src/graph/tuning.cc and
    src/init.cc print these on every rank, one rank alone included)."""

    algo_env: str | None = None   # NCCL_ALGO as NCCL read it for this communicator
    proto_env: str | None = None
    channels: int | None = None   # the communicator's collective channels


@dataclass(frozen=True)
class Choice:
    """What NCCL ran one call with."""

    function: str | None    # AllReduce; None in pre-2.23 lines
    nbytes: int
    algo: str | None        # plan.ALGO key; None for a symmetric kernel or an unknown name
    proto: str | None
    channels: int | None    # channelHi - channelLo + 1 (the symmetric line's nchannels)
    kernel: str | None = None

    @property
    def label(self) -> str:
        ch = f" ch{self.channels}" if self.channels else ""
        if self.kernel:
            return f"symmetric {self.kernel}{ch}"
        return f"{self.algo or '?'}/{self.proto or '?'}{ch}"


def _name(token: str, names, kind: str) -> str | None:
    if token.isdigit():
        found = [n.key for n in names if n.index == int(token)]
        return found[0] if found else None
    try:
        return _match(token, names, kind)
    except ValueError:
        return None


def parse_choice(line: str) -> Choice | None:
    """The choice a TUNING line reports, or None for any other line."""
    m = _NEW.search(line)
    if m:
        return Choice(m["func"], int(m["bytes"]), _name(m["algo"], ALGORITHMS, "algorithm"),
                      _name(m["proto"], PROTOCOLS, "protocol"), int(m["hi"]) - int(m["lo"]) + 1)
    m = _SYMMETRIC.search(line)
    if m:
        return Choice(m["func"], int(m["bytes"]), None, None, int(m["nch"]), kernel=m["kernel"])
    m = _OLD.search(line)
    if m:
        return Choice(m["func"], int(m["bytes"]), _name(m["algo"], ALGORITHMS, "algorithm"),
                      _name(m["proto"], PROTOCOLS, "protocol"), None)
    return None


@dataclass
class Log:
    """One process's debug file, cut at each communicator's `Init COMPLETE`."""

    version: str | None = None
    before_first_init: list[Choice] = field(default_factory=list)
    communicators: list[list[Choice]] = field(default_factory=list)  # choices after each init, in order
    inits: list[Init] = field(default_factory=list)                  # each communicator's init, in order
    plugin: list[str] = field(default_factory=list)   # the tuner plugin's own lines
    warnings: list[str] = field(default_factory=list)

    @property
    def choices(self) -> list[Choice]:
        return self.before_first_init + [c for comm in self.communicators for c in comm]


def parse_log(text: str) -> Log:
    log, init = Log(), Init()
    for line in text.splitlines():
        choice = parse_choice(line)
        if choice is not None:
            (log.communicators[-1] if log.communicators else log.before_first_init).append(choice)
            continue
        if _INIT_COMPLETE in line and "NCCL INFO" in line:
            log.communicators.append([])
            log.inits.append(init)
            init = Init()
            continue
        m = _ENV_SET.search(line) or _CHANNELS.search(line)
        if m:
            if "n" in m.groupdict():
                init.channels = int(m["n"])
            elif m["name"] == "NCCL_ALGO":
                init.algo_env = m["value"]
            else:
                init.proto_env = m["value"]
            continue
        m = _VERSION.search(line)
        if m and log.version is None:
            log.version = m["v"]
            continue
        m = _PLUGIN.search(line)
        if m:
            log.plugin.append(m["text"].strip())
            continue
        m = _WARN.search(line)
        if m:
            log.warnings.append(m["text"].strip())
    return log


def by_size(choices, function: str | None = None) -> dict[int, Counter]:
    """{bytes: Counter of (algo, proto, channels, kernel)} for one NCCL function (lines that
    name another function are left out; pre-2.23 lines name none and are kept)."""
    out: dict[int, Counter] = {}
    for c in choices:
        if function and c.function and c.function != function:
            continue
        out.setdefault(c.nbytes, Counter())[(c.algo, c.proto, c.channels, c.kernel)] += 1
    return out


def communicators_for(log: Log, skip: int, count: int, trailing: int = 0) -> list[tuple[Init, list[Choice]]] | None:
    """The choices of `count` communicators that follow `skip` others (the process's world
    communicator), when the log holds exactly that many (up to `trailing` more after them:
    an item whose launch died after its communicator came up), else None: better no
    attribution than a wrong one."""
    comms = log.communicators
    if not skip + count <= len(comms) <= skip + count + trailing:
        return None
    return list(zip(log.inits, comms))[skip:skip + count]
