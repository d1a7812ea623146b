"""How was this process launched? One answer, worked out from the environment.

`detect()` reads the variables that launchers set for each process they start and
returns a `LaunchInfo`: who launched us, our rank and world size, where we sit on the
node, and the address that rank 0's TCPStore will listen on. Everything here is pure
(it reads only the mapping it is given, plus the host name), so every real-world
environment can be replayed in a unit test.

Launchers, innermost first (the innermost one forked this process):

  explicit  CLI options (--rank, --world-size, --master-addr, --master-port, ...)
  torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
            MASTER_ADDR, MASTER_PORT; TORCHELASTIC_RUN_ID proves torchrun set them
  openmpi   OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
  pmi       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH / Intel MPI hydra,
            srun --mpi=pmi2)
  slurm     SLURM_PROCID + SLURM_STEP_ID: a task of an srun step (the batch shell of an
            sbatch job has SLURM_PROCID=0 but no step id, and is not a launched rank;
            neither is the one-task shell of `srun --pty bash`, marked by SLURM_PTY_PORT)
  none      nothing: a lone process, rank 0 of 1

Launchers nest: srun starts torchrun agents, Open MPI daemons or hydra proxies, which
start the ranks; those ranks still carry srun's variables, describing the agent or
daemon rather than the rank. Conflict rule:

  1. TORCHELASTIC_RUN_ID set: torchrun forked us; its variables win and any SLURM / MPI
     variables (which describe the torchrun agent) are ignored.
  2. RANK / WORLD_SIZE set without TORCHELASTIC_RUN_ID (by hand, a wrapper, or stale):
     torch's env:// rendezvous will use them, so they win -- but if an MPI or srun
     launcher also claims this process (the innermost of openmpi, pmi, slurm) and
     disagrees on rank, world size, local rank or local world size, that is an error:
     the usual cause is RANK exported in a batch script and copied into every task.
  3. Open MPI and PMI both present and disagreeing: an error (only one can have forked us).
  4. An MPI launcher inside an srun step: the MPI variables win and the SLURM ones
     (which number the MPI daemons) are ignored -- except PMI variables that agree with
     SLURM's, which come from srun's own PMI-2 plugin: then it is reported as slurm.

Launchers that agree on (rank, world size) with the chosen one fill in what it lacks
(e.g. local ranks or the node list). Explicit CLI options override field by field and
are never a conflict.
"""

from __future__ import annotations

import math
import os
import re
import socket
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping, MutableMapping

__all__ = [
    "LaunchEnvError",
    "LaunchInfo",
    "SplitSpec",
    "apply_to_environ",
    "check_gpu_for_local_rank",
    "derived_port",
    "detect",
    "gpu_index_for_local_rank",
    "parse_nodelist",
    "parse_split",
    "parse_tasks_per_node",
    "split_color",
    "split_groups",
    "split_spec_from_environ",
]

LAUNCHERS = ("explicit", "torchrun", "slurm", "openmpi", "pmi", "none")

LOOPBACK = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torch's conventional default
# Ports derived from job ids land here: unprivileged, below Linux's ephemeral range
# (32768-60999) so the OS does not hand them to outgoing connections, and clear of the
# ranges sites commonly reserve for srun / MPI (12000-12999, 60000+).
DERIVED_PORT_BASE = 20000
DERIVED_PORT_SPAN = 10000
# Host and task lists longer than this are refused (a typo like n[1-100000000] would
# otherwise eat the memory of every rank at once); python-hostlist has the same bound.
MAX_NODELIST_HOSTS = 100_000

_FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "nnodes")
_EXPLICIT_KEYS = frozenset(_FIELDS) | {"master_addr", "master_port"}


class LaunchEnvError(Exception):
    """The environment (or the CLI options) describe an impossible launch. One line that
    names the variables involved."""


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


# ---------------------------------------------------------------------------
# Reading variables
# ---------------------------------------------------------------------------

def _get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when unset or blank (`export RANK=` in a script
    means "no rank", not a malformed one)."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _first(env: Mapping[str, str], names: Iterable[str]) -> tuple[str, str] | None:
    for name in names:
        value = _get(env, name)
        if value is not None:
            return name, value
    return None


def _as_count(name: str, raw: str) -> int:
    """A rank, size or id: a non-negative decimal integer."""
    try:
        value = int(raw, 10)
    except ValueError:
        raise LaunchEnvError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise LaunchEnvError(f"{name}={value} is negative")
    return value


def _as_port(name: str, raw: str) -> int:
    value = _as_count(name, raw)
    if value > 65535:
        raise LaunchEnvError(f"{name}={value} is not a TCP port (0-65535)")
    return value


def derived_port(seed: str) -> int:
    """A port every rank of one job computes alike from a job id, spread over
    DERIVED_PORT_BASE..+SPAN so that jobs sharing a node rarely collide. crc32, not
    hash(): Python salts str hashes per process."""
    return DERIVED_PORT_BASE + zlib.crc32(seed.encode()) % DERIVED_PORT_SPAN


@dataclass
class _Claim:
    """What one launcher's variables say about this process."""

    launcher: str
    values: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # field -> variable it came from
    proven: bool = False            # torchrun only: TORCHELASTIC_RUN_ID is set
    master_addr: str | None = None  # reliable: first host of a SLURM node list
    master_addr_guess: str | None = None  # last resort: Open MPI's mpirun host
    port_seed: str | None = None    # job id every rank shares, for derived_port()

    def take(self, env: Mapping[str, str], fld: str, names: Iterable[str]) -> bool:
        found = _first(env, names)
        if found is None:
            return False
        self.values[fld] = _as_count(*found)
        self.names[fld] = found[0]
        return True

    def show(self, fld: str) -> str:
        return f"{self.names[fld]}={self.values[fld]}"

    def require(self, fld: str, names: tuple[str, ...], env: Mapping[str, str], why: str) -> None:
        if not self.take(env, fld, names):
            raise LaunchEnvError(f"{why} but {' / '.join(names)} is missing")


# ---------------------------------------------------------------------------
# One reader per launcher: None when the launcher did not start this process
# ---------------------------------------------------------------------------

def _torchrun_claim(env: Mapping[str, str]) -> _Claim | None:
    proven = _get(env, "TORCHELASTIC_RUN_ID") is not None
    has_rank = _get(env, "RANK") is not None
    has_size = _get(env, "WORLD_SIZE") is not None
    if not (proven or has_rank or has_size):
        return None
    if not (has_rank and has_size):
        present = [n for n in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE") if _get(env, n) is not None]
        missing = [n for n in ("RANK", "WORLD_SIZE") if _get(env, n) is None]
        raise LaunchEnvError(f"{' and '.join(present)} {'is' if len(present) == 1 else 'are'} set "
                             f"but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    claim = _Claim("torchrun", proven=proven)
    claim.take(env, "rank", ["RANK"])
    claim.take(env, "world_size", ["WORLD_SIZE"])
    claim.take(env, "local_rank", ["LOCAL_RANK"])
    claim.take(env, "local_world_size", ["LOCAL_WORLD_SIZE"])
    claim.take(env, "node_rank", ["GROUP_RANK"])
    claim.take(env, "nnodes", ["GROUP_WORLD_SIZE"])
    return claim


_SLURM_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")


def _slurm_claim(env: Mapping[str, str]) -> _Claim | None:
    step = _first(env, _SLURM_STEP_VARS)
    if _get(env, "SLURM_PROCID") is None or step is None:
        return None  # sbatch / salloc shell, not a task that srun started
    tasks = _first(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    if _get(env, "SLURM_PTY_PORT") is not None and tasks is not None and tasks[1] == "1":
        return None  # `srun --pty bash`: an interactive shell, where one runs ncclbench -g N
    why = f"SLURM_PROCID and {step[0]} are set (an srun task)"
    claim = _Claim("slurm")
    claim.take(env, "rank", ["SLURM_PROCID"])
    # Inside a step srun overwrites SLURM_NTASKS, SLURM_NNODES, SLURM_NODELIST and
    # SLURM_TASKS_PER_NODE with the step's values; the STEP_ names are the unambiguous
    # ones, the JOB_ names describe the whole allocation and come last.
    claim.require("world_size", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), env, why)
    claim.require("local_rank", ("SLURM_LOCALID",), env, why)
    claim.require("node_rank", ("SLURM_NODEID",), env, why)
    claim.take(env, "nnodes", ["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"])

    nodelist = _first(env, ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"))
    hosts: list[str] = []
    if nodelist is not None:
        try:
            hosts = parse_nodelist(nodelist[1])
        except ValueError as exc:
            raise LaunchEnvError(f"{nodelist[0]}={nodelist[1]!r} is not a SLURM node list: {exc}") from None
        if "nnodes" not in claim.values:
            claim.values["nnodes"], claim.names["nnodes"] = len(hosts), f"hosts in {nodelist[0]}"
        # The job's list may be longer than the step's; only a step list must match.
        if nodelist[0] != "SLURM_JOB_NODELIST" and len(hosts) != claim.values["nnodes"]:
            raise LaunchEnvError(f"{nodelist[0]}={nodelist[1]!r} names {len(hosts)} hosts "
                                 f"but {claim.show('nnodes')}")
        # srun's block and cyclic distributions both put task 0 on the step's first node.
        claim.master_addr = hosts[0]
    if "nnodes" not in claim.values:
        raise LaunchEnvError(f"{why} but neither SLURM_STEP_NUM_NODES / SLURM_NNODES nor a node list is set")

    _slurm_local_world_size(env, claim)

    job = _first(env, ("SLURM_JOB_ID", "SLURM_JOBID"))
    if job is not None:
        # The step id too: two steps of one job running side by side must not share a port.
        claim.port_seed = f"slurm:{job[1]}.{step[1]}"
    return claim


def _slurm_local_world_size(env: Mapping[str, str], claim: _Claim) -> None:
    """Tasks on this node: the per-node list indexed by SLURM_NODEID (exact even for
    uneven layouts such as "4,3"), else --ntasks-per-node, else an even split."""
    per_node = _first(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if per_node is not None:
        name, raw = per_node
        try:
            counts = parse_tasks_per_node(raw)
        except ValueError as exc:
            raise LaunchEnvError(f"{name}={raw!r} is not a SLURM tasks-per-node list: {exc}") from None
        if len(counts) != claim.values["nnodes"]:
            raise LaunchEnvError(f"{name}={raw!r} lists {len(counts)} nodes but {claim.show('nnodes')}")
        if sum(counts) != claim.values["world_size"]:
            raise LaunchEnvError(f"{name}={raw!r} adds up to {sum(counts)} tasks "
                                 f"but {claim.show('world_size')}")
        node = claim.values["node_rank"]
        if node >= len(counts):
            raise LaunchEnvError(f"{claim.show('node_rank')} is not below {claim.show('nnodes')}")
        claim.values["local_world_size"], claim.names["local_world_size"] = counts[node], f"{name}[{node}]"
        return
    if claim.take(env, "local_world_size", ["SLURM_NTASKS_PER_NODE"]):
        return
    world, nnodes = claim.values["world_size"], claim.values["nnodes"]
    if nnodes and world % nnodes == 0:
        claim.values["local_world_size"] = world // nnodes
        claim.names["local_world_size"] = f"{claim.names['world_size']}/{claim.names['nnodes']}"
        return
    raise LaunchEnvError(f"cannot tell how many tasks run on this node: SLURM_TASKS_PER_NODE is missing "
                         f"and {claim.show('world_size')} does not divide evenly by {claim.show('nnodes')}")


def _openmpi_claim(env: Mapping[str, str]) -> _Claim | None:
    if _get(env, "OMPI_COMM_WORLD_RANK") is None:
        return None
    why = "OMPI_COMM_WORLD_RANK is set (an Open MPI rank)"
    claim = _Claim("openmpi")
    claim.take(env, "rank", ["OMPI_COMM_WORLD_RANK"])
    claim.require("world_size", ("OMPI_COMM_WORLD_SIZE",), env, why)
    claim.require("local_rank", ("OMPI_COMM_WORLD_LOCAL_RANK",), env, why)
    claim.require("local_world_size", ("OMPI_COMM_WORLD_LOCAL_SIZE",), env, why)
    # Open MPI does not say which node index we are on; _fill_placement derives it assuming
    # ranks are packed node by node (mpirun's default --map-by slot).
    hnp_uri = _get(env, "OMPI_MCA_orte_hnp_uri")
    if hnp_uri is not None:
        claim.master_addr_guess = _host_of_orte_uri(hnp_uri)
    # Deliberately not PMIX_SERVER_URI*: those name this node's own PMIx server
    # (usually 127.0.0.1), so ranks on different nodes would pick different masters.
    seed = _first(env, ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"))
    if seed is not None:
        claim.port_seed = f"ompi:{seed[1]}"
    return claim


def _host_of_orte_uri(uri: str) -> str | None:
    """mpirun's (the HNP's) first non-loopback address from an ORTE contact URI such as
    "2847211520.0;tcp://10.1.0.11,172.17.0.1:44057;tcp6://[fe80::1]:44058"."""
    for part in uri.split(";")[1:]:
        match = re.fullmatch(r"tcp://(.+):\d+", part.strip())
        if not match:
            continue
        for host in match.group(1).split(","):
            if host and not host.startswith("127.") and host != "localhost":
                return host
    return None


def _pmi_claim(env: Mapping[str, str]) -> _Claim | None:
    if _get(env, "PMI_RANK") is None:
        return None
    why = "PMI_RANK is set (an MPICH / Intel MPI / PMI rank)"
    claim = _Claim("pmi")
    claim.take(env, "rank", ["PMI_RANK"])
    claim.require("world_size", ("PMI_SIZE",), env, why)
    # Hydra sets both local variables; srun's PMI-2 plugin sets neither (SLURM's
    # variables then fill them in). One without the other is a broken environment.
    has_local = claim.take(env, "local_rank", ["MPI_LOCALRANKID"])
    has_local_size = claim.take(env, "local_world_size", ["MPI_LOCALNRANKS"])
    if has_local and not has_local_size:
        raise LaunchEnvError("MPI_LOCALRANKID is set but MPI_LOCALNRANKS is missing")
    if has_local_size and not has_local:
        raise LaunchEnvError("MPI_LOCALNRANKS is set but MPI_LOCALRANKID is missing")
    seed = _get(env, "PMI_JOBID")
    if seed is not None:
        claim.port_seed = f"pmi:{seed}"
    return claim


# ---------------------------------------------------------------------------
# Choosing among claims
# ---------------------------------------------------------------------------

def _same_process(a: _Claim, b: _Claim) -> bool:
    """Do two claims describe the same process? Rank and world size must match, and the
    local numbers too where both know them."""
    return all(a.values[f] == b.values[f] for f in _FIELDS[:4] if f in a.values and f in b.values)


def _disagreement(a: _Claim, b: _Claim) -> str:
    parts = [f"{a.show(f)} vs {b.show(f)}" for f in _FIELDS[:4]
             if f in a.values and f in b.values and a.values[f] != b.values[f]]
    return ", ".join(parts)


def _choose(env: Mapping[str, str]) -> tuple[_Claim, list[_Claim], str] | None:
    """(claim whose values we use, agreeing claims that fill its gaps, launcher label),
    or None when nothing launched us."""
    torchrun = _torchrun_claim(env)
    if torchrun is not None and torchrun.proven:
        return torchrun, [], "torchrun"  # rule 1

    openmpi, pmi, slurm = _openmpi_claim(env), _pmi_claim(env), _slurm_claim(env)
    if openmpi and pmi and not _same_process(openmpi, pmi):  # rule 3
        raise LaunchEnvError(f"Open MPI and PMI variables both describe this process and disagree "
                             f"({_disagreement(openmpi, pmi)}); unset the stale ones")
    # Innermost first (rule 4). srun's PMI-2 plugin sets PMI_* equal to SLURM's: srun
    # is then the launcher, and its richer variables go first.
    chain = [c for c in (openmpi, pmi, slurm) if c is not None]
    if pmi and slurm and not openmpi and _same_process(pmi, slurm):
        chain = [slurm, pmi]

    if torchrun is not None:  # rule 2: hand-set env:// variables
        if chain and not _same_process(torchrun, chain[0]):
            raise LaunchEnvError(
                f"RANK/WORLD_SIZE disagree with {chain[0].launcher} ({_disagreement(torchrun, chain[0])}) "
                f"and torchrun did not set them (no TORCHELASTIC_RUN_ID): probably exported before "
                f"the launcher copied them into every rank; unset RANK, WORLD_SIZE, LOCAL_RANK and "
                f"LOCAL_WORLD_SIZE")
        agreeing = [c for c in chain if _same_process(torchrun, c)]
        # A mirror of the real launcher's numbers (srun bash -c 'RANK=$SLURM_PROCID ...',
        # or our own apply_to_environ) is reported as that launcher.
        return torchrun, agreeing, (agreeing[0].launcher if agreeing else "torchrun")

    if not chain:
        return None
    primary = chain[0]
    return primary, [c for c in chain[1:] if _same_process(primary, c)], primary.launcher


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

    chosen = _choose(env)
    values: dict[str, int] = {}
    names: dict[str, str] = {}
    claims: list[_Claim] = []
    launcher = "none"
    if chosen is not None:
        primary, agreeing, launcher = chosen
        claims = [primary, *agreeing]
        for claim in reversed(claims):  # the primary's values overwrite the others'
            values.update(claim.values)
            names.update(claim.names)

    for key in _FIELDS:
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
                      hostname=socket.gethostname(), **{k: values[k] for k in _FIELDS})


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
    addr = given.get("master_addr") or _get(env, "MASTER_ADDR")
    port, port_source = given.get("master_port"), "--master-port"
    if port is not None:
        port = _as_port("--master-port", str(port))
    elif _get(env, "MASTER_PORT") is not None:
        port, port_source = _as_port("MASTER_PORT", _get(env, "MASTER_PORT")), "MASTER_PORT"

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
        current = _get(environ, name)
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


# ---------------------------------------------------------------------------
# GPU choice
# ---------------------------------------------------------------------------

def gpu_index_for_local_rank(info: LaunchInfo, visible_gpu_count: int,
                             environ: Mapping[str, str] | None = None) -> int:
    """The CUDA device index this rank should use: its local rank -- or 0 when the
    launcher bound one GPU to each task (srun --gpus-per-task=1, --gpu-bind=single:1,
    torchrun's virtual local ranks), which leaves exactly that GPU visible through a
    one-entry CUDA_VISIBLE_DEVICES. Raises LaunchEnvError when neither fits."""
    if visible_gpu_count < 0:
        raise ValueError(f"visible_gpu_count must be >= 0, got {visible_gpu_count}")
    env = os.environ if environ is None else environ
    if info.local_rank < visible_gpu_count:
        return info.local_rank
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible_gpu_count == 1 and visible is not None and visible.strip() and "," not in visible:
        return 0
    shown = "unset" if visible is None else visible
    raise LaunchEnvError(
        f"local rank {info.local_rank} has no GPU: only {visible_gpu_count} visible "
        f"(CUDA_VISIBLE_DEVICES={shown}); {info.launcher} started {info.local_world_size} ranks "
        f"on {info.hostname}: start at most {visible_gpu_count} per node")


def check_gpu_for_local_rank(info: LaunchInfo, visible_gpu_count: int,
                             environ: Mapping[str, str] | None = None) -> None:
    """Raise LaunchEnvError when this rank has no GPU of its own (see gpu_index_for_local_rank)."""
    gpu_index_for_local_rank(info, visible_gpu_count, environ)


# ---------------------------------------------------------------------------
# SLURM syntax
# ---------------------------------------------------------------------------

def parse_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list, e.g. "gpu[01-04,07]", "a[1-2],b3", "rack1-n[001-003]",
    "r[1-2]-n[1-2]" (several brackets expand like nested loops, the first outermost), with
    python-hostlist, as `scontrol show hostnames` would. Zero padding follows the lower bound
    ("[08-10]" -> 08 09 10). ValueError if malformed."""
    if text is None or not text.strip():
        raise ValueError("empty node list")
    text = text.strip()
    if any(ch.isspace() for ch in text):
        raise ValueError(f"whitespace in {text!r}")
    if ",," in text or text.startswith(",") or text.endswith(","):  # hostlist would skip the gap
        raise ValueError(f"empty entry in {text!r}")
    try:
        import hostlist  # python-hostlist; imported here so that only SLURM launches need it
    except ImportError:
        raise LaunchEnvError("reading a SLURM node list needs the python-hostlist package "
                             "(pip install python-hostlist)") from None
    try:
        hosts = hostlist.expand_hostlist(text, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"{exc} in {text!r}") from None
    if len(hosts) > MAX_NODELIST_HOSTS:
        raise ValueError(f"{text!r} expands to more than {MAX_NODELIST_HOSTS} hosts")
    return hosts


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand SLURM's tasks-per-node list: "8(x2)" -> [8, 8], "4,3" -> [4, 3],
    "2(x3),1" -> [2, 2, 2, 1]. ValueError if malformed."""
    if text is None or not text.strip():
        raise ValueError("empty tasks-per-node list")
    counts: list[int] = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"bad entry {part!r} (expected N or N(xM))")
        repeat = int(match.group(2) or 1)
        if repeat < 1:
            raise ValueError(f"bad repeat count in {part!r}")
        if len(counts) + repeat > MAX_NODELIST_HOSTS:
            raise ValueError(f"{text!r} lists more than {MAX_NODELIST_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts


# ---------------------------------------------------------------------------
# NCCL_TESTS_SPLIT: run several smaller groups side by side
# ---------------------------------------------------------------------------

_SPLIT_OPS = {"AND": "AND", "&": "AND", "OR": "OR", "|": "OR", "MOD": "MOD", "%": "MOD", "DIV": "DIV", "/": "DIV"}
_SPLIT_SPEC = re.compile(r"\s*(AND|OR|MOD|DIV|&|\||%|/)\s*(\S+)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class SplitSpec:
    """nccl-tests' NCCL_TESTS_SPLIT: color = rank <op> value; ranks with the same color
    form one group (MPI_Comm_split with key = rank, so groups keep rank order)."""

    op: str  # AND, OR, MOD or DIV
    value: int

    def color(self, rank: int) -> int:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if self.op == "AND":
            return rank & self.value
        if self.op == "OR":
            return rank | self.value
        if self.op == "MOD":
            return rank % self.value
        return rank // self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:#x}" if self.op in ("AND", "OR") else f"{self.op} {self.value}"


def parse_split(spec: str) -> SplitSpec:
    """Parse "<AND|OR|MOD|DIV> <value>" (also &, |, %, /; case-insensitive; value in
    decimal, 0x hex, 0b binary or 0o octal), as nccl-tests reads NCCL_TESTS_SPLIT."""
    match = _SPLIT_SPEC.fullmatch(spec or "")
    if not match:
        raise ValueError(f"bad split spec {spec!r}: expected '<AND|OR|MOD|DIV> <value>', e.g. 'MOD 8' or 'AND 0x7'")
    op = _SPLIT_OPS[match.group(1).upper()]
    value = _split_value(match.group(2), spec)
    if op in ("MOD", "DIV") and value == 0:
        raise ValueError(f"bad split spec {spec!r}: {op} 0 divides by zero")
    return SplitSpec(op, value)


def _split_value(text: str, spec: str) -> int:
    if re.fullmatch(r"0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|0|[1-9][0-9]*", text):
        return int(text, 0)
    if re.fullmatch(r"0[0-9]+", text):
        # nccl-tests (strtoul base 0) reads a leading zero as octal; refuse to guess.
        raise ValueError(f"bad split spec {spec!r}: {text!r} is ambiguous (octal in nccl-tests); "
                         f"write {int(text, 10)} or 0o{text.lstrip('0') or '0'}")
    raise ValueError(f"bad split spec {spec!r}: {text!r} is not a non-negative integer (decimal, 0x.., 0b.., 0o..)")


def split_color(rank: int, spec: str | SplitSpec) -> int:
    """The group color of `rank` under a split spec such as "MOD 8" (rank % 8)."""
    parsed = spec if isinstance(spec, SplitSpec) else parse_split(spec)
    return parsed.color(rank)


def split_groups(world_size: int, spec: str | SplitSpec) -> dict[int, list[int]]:
    """Color -> ranks in that group, in rank order, for every rank of the world."""
    parsed = spec if isinstance(spec, SplitSpec) else parse_split(spec)
    groups: dict[int, list[int]] = {}
    for rank in range(world_size):
        groups.setdefault(parsed.color(rank), []).append(rank)
    return dict(sorted(groups.items()))


def split_spec_from_environ(environ: Mapping[str, str] | None = None) -> SplitSpec | None:
    """The split nccl-tests would apply: NCCL_TESTS_SPLIT_MASK (hex, color = rank & mask)
    takes precedence over NCCL_TESTS_SPLIT; None when neither is set."""
    env = os.environ if environ is None else environ
    mask = _get(env, "NCCL_TESTS_SPLIT_MASK")
    if mask is not None:
        try:
            return SplitSpec("AND", int(mask, 16))
        except ValueError:
            raise ValueError(f"NCCL_TESTS_SPLIT_MASK={mask!r} is not a hex mask") from None
    spec = _get(env, "NCCL_TESTS_SPLIT")
    if spec is None:
        return None
    try:
        return parse_split(spec)
    except ValueError as exc:
        raise ValueError(f"NCCL_TESTS_SPLIT: {exc}") from None
