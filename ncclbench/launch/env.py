"""How was this process launched? One answer, worked out from the environment.

`detect()` reads the variables that launchers set for each process they start and
returns a `LaunchInfo`: who launched us, our rank and world size, where we sit on the
node, and the address that rank 0's TCPStore will listen on. Everything here is pure
(it reads only the mapping it is given, plus the host name), so every real-world
environment can be replayed in a unit test.

The launchers, the variables each one sets and the rule that picks one when several
claim this process are in ncclbench.launch.claims.
"""

from __future__ import annotations

import math
import os
import socket
import zlib
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from ncclbench.launch.claims import FIELDS, Claim, choose_claim
from ncclbench.launch.variables import LaunchEnvError, as_port, read_var

__all__ = ["LaunchInfo", "apply_to_environ", "derived_port", "detect"]

LAUNCHERS = ("explicit", "torchrun", "slurm", "openmpi", "pmi", "none")

LOOPBACK = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torch's conventional default
# Ports derived from job ids land here: unprivileged, below Linux's ephemeral range
# (32768-60999) so the OS does not hand them to outgoing connections, and clear of the
# ranges sites commonly reserve for srun / MPI (12000-12999, 60000+).
DERIVED_PORT_BASE = 20000
DERIVED_PORT_SPAN = 10000

_EXPLICIT_KEYS = frozenset(FIELDS) | {"master_addr", "master_port"}


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str  # one of LAUNCHERS
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str | None  # None only for launcher "none" (nothing to rendezvous with)
    master_port: int | None
    hostname: str

    @property
    def launched(self) -> bool:
        return self.launcher != "none"


def derived_port(seed: str) -> int:
    """A port every rank of one job computes alike from a job id, spread over
    DERIVED_PORT_BASE..+SPAN so that jobs sharing a node rarely collide. crc32, not
    hash(): Python salts str hashes per process."""
    return DERIVED_PORT_BASE + zlib.crc32(seed.encode()) % DERIVED_PORT_SPAN


# ---------------------------------------------------------------------------
# detect()
# ---------------------------------------------------------------------------

def detect(environ: Mapping[str, str] | None = None, *, explicit: dict | None = None) -> LaunchInfo:
    """This process's launch, from `environ` (default os.environ) and optional explicit
    CLI values (keys rank, world_size, local_rank, local_world_size, node_rank, nnodes,
    master_addr, master_port; None values are ignored). Raises LaunchEnvError."""
    env = os.environ if environ is None else environ
    given = {k: v for k, v in (explicit or {}).items()
             if v is not None and not (isinstance(v, str) and not v.strip())}
    unknown = set(given) - _EXPLICIT_KEYS
    if unknown:
        raise ValueError(f"unknown explicit launch option(s): {', '.join(sorted(unknown))}")

    chosen = choose_claim(env)
    values: dict[str, int] = {}
    names: dict[str, str] = {}
    claims: list[Claim] = []
    launcher = "none"
    if chosen is not None:
        primary, agreeing, launcher = chosen
        claims = [primary, *agreeing]
        for claim in reversed(claims):  # the primary's values overwrite the others'
            values.update(claim.values)
            names.update(claim.names)

    for key in FIELDS:
        if key in given:
            values[key] = _explicit_count(key, given[key])
            names[key] = _option_name(key)
    if "rank" in given or "world_size" in given:
        launcher = "explicit"
        if "world_size" not in values:
            raise LaunchEnvError(f"{_option_name('rank')}={given['rank']} needs "
                                 f"{_option_name('world_size')} (no launcher variables give one)")
        if "rank" not in values:
            if values["world_size"] != 1:
                raise LaunchEnvError(f"{_option_name('world_size')}={values['world_size']} needs "
                                     f"{_option_name('rank')} (no launcher variables give one)")
            values["rank"], names["rank"] = 0, "implied rank"
    elif launcher == "none":
        for key, value in (("rank", 0), ("world_size", 1)):
            values.setdefault(key, value)
            names.setdefault(key, f"unlaunched {key}")

    _fill_placement(values, names)
    _check_counts(values, names)
    master_addr, master_port = _master(env, given, values, names, claims, launcher)
    return LaunchInfo(launcher=launcher, master_addr=master_addr, master_port=master_port,
                      hostname=socket.gethostname(), **{k: values[k] for k in FIELDS})


def _option_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def _explicit_count(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise LaunchEnvError(f"{_option_name(key)}={value!r} is not an integer") from None
    if value < 0:
        raise LaunchEnvError(f"{_option_name(key)}={value} is negative")
    return value


def _fill_placement(values: dict[str, int], names: dict[str, str]) -> None:
    """Fill in what no launcher said about the node layout."""
    rank, world = values["rank"], values["world_size"]
    if "local_world_size" not in values:
        # Nothing says how ranks spread over nodes (e.g. RANK/WORLD_SIZE set by hand):
        # assume one node, which is what a bare `RANK=1 WORLD_SIZE=2 ncclbench` means.
        values["local_world_size"], names["local_world_size"] = world, "assumed single-node local_world_size"
    lws = values["local_world_size"]
    if "local_rank" not in values:
        values["local_rank"], names["local_rank"] = rank % max(lws, 1), "derived local_rank"
    # Open MPI / PMI / manual launches: assume ranks packed node by node.
    if "nnodes" not in values:
        values["nnodes"], names["nnodes"] = math.ceil(world / max(lws, 1)), "derived nnodes"
    if "node_rank" not in values:
        values["node_rank"], names["node_rank"] = rank // max(lws, 1), "derived node_rank"


def _check_counts(values: dict[str, int], names: dict[str, str]) -> None:
    def show(key: str) -> str:
        return f"{names[key]}={values[key]}"

    def must(ok: bool, message: str) -> None:
        if not ok:
            raise LaunchEnvError(message)

    must(values["world_size"] >= 1, f"{show('world_size')} must be at least 1")
    must(values["rank"] < values["world_size"], f"{show('rank')} is not below {show('world_size')}")
    must(values["local_world_size"] >= 1, f"{show('local_world_size')} must be at least 1")
    must(values["local_rank"] < values["local_world_size"],
         f"{show('local_rank')} is not below {show('local_world_size')}")
    must(values["local_world_size"] <= values["world_size"],
         f"{show('local_world_size')} is larger than {show('world_size')}")
    must(values["nnodes"] >= 1, f"{show('nnodes')} must be at least 1")
    must(values["node_rank"] < values["nnodes"], f"{show('node_rank')} is not below {show('nnodes')}")
    must(values["nnodes"] <= values["world_size"], f"{show('nnodes')} is larger than {show('world_size')}")


def _master(env, given, values, names, claims, launcher) -> tuple[str | None, int | None]:
    """Where rank 0's TCPStore listens. An explicit option, then MASTER_ADDR / MASTER_PORT
    (torch's env:// reads those, so they must win over anything derived), then what the
    launchers tell us."""
    world = values["world_size"]
    addr = given.get("master_addr") or read_var(env, "MASTER_ADDR")
    port, port_source = given.get("master_port"), "--master-port"
    if port is not None:
        port = as_port("--master-port", str(port))
    elif read_var(env, "MASTER_PORT") is not None:
        port, port_source = as_port("MASTER_PORT", read_var(env, "MASTER_PORT")), "MASTER_PORT"

    if launcher == "none":
        return addr, port  # no rendezvous needed; apply_to_environ fills loopback

    if addr is None:
        addr = next((c.master_addr for c in claims if c.master_addr), None)
    if addr is None and values["local_world_size"] == world:
        addr = LOOPBACK  # every rank is on this node
    if addr is None:
        addr = next((c.master_addr_guess for c in claims if c.master_addr_guess), None)
    if addr is None:
        raise LaunchEnvError(
            f"{launcher} started {names['world_size']}={world} ranks over several nodes "
            f"({names['local_world_size']}={values['local_world_size']}) and nothing says where rank 0 runs: "
            f"export MASTER_ADDR=<rank 0's host> to every rank (mpirun -x MASTER_ADDR)")

    if port is None:
        seed = next((c.port_seed for c in claims if c.port_seed), None)
        port = derived_port(seed) if seed else DEFAULT_MASTER_PORT
    if port == 0 and world > 1:
        raise LaunchEnvError(f"{port_source}=0 lets rank 0 pick a random port that the other "
                             f"{world - 1} ranks cannot know; set a fixed port")
    return addr, port


# ---------------------------------------------------------------------------
# Handing the result to torch.distributed
# ---------------------------------------------------------------------------

def apply_to_environ(info: LaunchInfo, environ: MutableMapping[str, str], *,
                     overwrite: bool = False) -> dict[str, str]:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    where missing, so that init_process_group(init_method="env://") works. Returns what
    it set. A variable already set to a different value raises LaunchEnvError (torch
    would silently use it), unless overwrite=True -- pass that when explicit CLI options
    went into `info`."""
    addr, port = info.master_addr, info.master_port
    if addr is None or port is None:
        if info.world_size != 1:
            raise LaunchEnvError(f"no master address/port for a world of {info.world_size} ranks")
        # A lone rank rendezvous with itself: loopback, and port 0 lets the OS pick a
        # free one, so two single-process runs on one host never collide.
        addr = LOOPBACK if addr is None else addr
        port = 0 if port is None else port
    wanted = {
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }
    changed: dict[str, str] = {}
    for name, value in wanted.items():
        current = read_var(environ, name)
        if current is not None and _same_setting(current, value):
            continue
        if current is not None and not overwrite:
            raise LaunchEnvError(f"{name}={current} is already set but this process is {name}={value} "
                                 f"(launcher {info.launcher}); unset {name}")
        environ[name] = value
        changed[name] = value
    return changed


def _same_setting(current: str, wanted: str) -> bool:
    if current.isdigit() and wanted.isdigit():
        return int(current) == int(wanted)
    return current == wanted
