"""What each launcher's variables claim about this process, and which claim wins.

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

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ncclbench.launch.slurm import parse_nodelist, parse_tasks_per_node
from ncclbench.launch.variables import LaunchEnvError, as_count, first_set, read_var

FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "nnodes")


@dataclass
class Claim:
    """What one launcher's variables say about this process."""

    launcher: str
    values: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # field -> variable it came from
    proven: bool = False            # torchrun only: TORCHELASTIC_RUN_ID is set
    master_addr: str | None = None  # reliable: first host of a SLURM node list
    master_addr_guess: str | None = None  # last resort: Open MPI's mpirun host
    port_seed: str | None = None    # job id every rank shares, for derived_port()

    def take(self, env: Mapping[str, str], fld: str, names: Iterable[str]) -> bool:
        found = first_set(env, names)
        if found is None:
            return False
        self.values[fld] = as_count(*found)
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

def _torchrun_claim(env: Mapping[str, str]) -> Claim | None:
    proven = read_var(env, "TORCHELASTIC_RUN_ID") is not None
    has_rank = read_var(env, "RANK") is not None
    has_size = read_var(env, "WORLD_SIZE") is not None
    if not (proven or has_rank or has_size):
        return None
    if not (has_rank and has_size):
        present = [n for n in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE") if read_var(env, n) is not None]
        missing = [n for n in ("RANK", "WORLD_SIZE") if read_var(env, n) is None]
        raise LaunchEnvError(f"{' and '.join(present)} {'is' if len(present) == 1 else 'are'} set "
                             f"but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    claim = Claim("torchrun", proven=proven)
    claim.take(env, "rank", ["RANK"])
    claim.take(env, "world_size", ["WORLD_SIZE"])
    claim.take(env, "local_rank", ["LOCAL_RANK"])
    claim.take(env, "local_world_size", ["LOCAL_WORLD_SIZE"])
    claim.take(env, "node_rank", ["GROUP_RANK"])
    claim.take(env, "nnodes", ["GROUP_WORLD_SIZE"])
    return claim


_SLURM_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")


def _slurm_claim(env: Mapping[str, str]) -> Claim | None:
    step = first_set(env, _SLURM_STEP_VARS)
    if read_var(env, "SLURM_PROCID") is None or step is None:
        return None  # sbatch / salloc shell, not a task that srun started
    tasks = first_set(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    if read_var(env, "SLURM_PTY_PORT") is not None and tasks is not None and tasks[1] == "1":
        return None  # `srun --pty bash`: an interactive shell, where one runs ncclbench -g N
    why = f"SLURM_PROCID and {step[0]} are set (an srun task)"
    claim = Claim("slurm")
    claim.take(env, "rank", ["SLURM_PROCID"])
    # Inside a step srun overwrites SLURM_NTASKS, SLURM_NNODES, SLURM_NODELIST and
    # SLURM_TASKS_PER_NODE with the step's values; the STEP_ names are the unambiguous
    # ones, the JOB_ names describe the whole allocation and come last.
    claim.require("world_size", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), env, why)
    claim.require("local_rank", ("SLURM_LOCALID",), env, why)
    claim.require("node_rank", ("SLURM_NODEID",), env, why)
    claim.take(env, "nnodes", ["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"])

    nodelist = first_set(env, ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"))
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

    job = first_set(env, ("SLURM_JOB_ID", "SLURM_JOBID"))
    if job is not None:
        # The step id too: two steps of one job running side by side must not share a port.
        claim.port_seed = f"slurm:{job[1]}.{step[1]}"
    return claim


def _slurm_local_world_size(env: Mapping[str, str], claim: Claim) -> None:
    """Tasks on this node: the per-node list indexed by SLURM_NODEID (exact even for
    uneven layouts such as "4,3"), else --ntasks-per-node, else an even split."""
    per_node = first_set(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
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


def _openmpi_claim(env: Mapping[str, str]) -> Claim | None:
    if read_var(env, "OMPI_COMM_WORLD_RANK") is None:
        return None
    why = "OMPI_COMM_WORLD_RANK is set (an Open MPI rank)"
    claim = Claim("openmpi")
    claim.take(env, "rank", ["OMPI_COMM_WORLD_RANK"])
    claim.require("world_size", ("OMPI_COMM_WORLD_SIZE",), env, why)
    claim.require("local_rank", ("OMPI_COMM_WORLD_LOCAL_RANK",), env, why)
    claim.require("local_world_size", ("OMPI_COMM_WORLD_LOCAL_SIZE",), env, why)
    # Open MPI does not say which node index we are on; _fill_placement derives it assuming
    # ranks are packed node by node (mpirun's default --map-by slot).
    hnp_uri = read_var(env, "OMPI_MCA_orte_hnp_uri")
    if hnp_uri is not None:
        claim.master_addr_guess = _host_of_orte_uri(hnp_uri)
    # Deliberately not PMIX_SERVER_URI*: those name this node's own PMIx server
    # (usually 127.0.0.1), so ranks on different nodes would pick different masters.
    seed = first_set(env, ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"))
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


def _pmi_claim(env: Mapping[str, str]) -> Claim | None:
    if read_var(env, "PMI_RANK") is None:
        return None
    why = "PMI_RANK is set (an MPICH / Intel MPI / PMI rank)"
    claim = Claim("pmi")
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
    seed = read_var(env, "PMI_JOBID")
    if seed is not None:
        claim.port_seed = f"pmi:{seed}"
    return claim


# ---------------------------------------------------------------------------
# Choosing among claims
# ---------------------------------------------------------------------------

def _same_process(a: Claim, b: Claim) -> bool:
    """Do two claims describe the same process? Rank and world size must match, and the
    local numbers too where both know them."""
    return all(a.values[f] == b.values[f] for f in FIELDS[:4] if f in a.values and f in b.values)


def _disagreement(a: Claim, b: Claim) -> str:
    parts = [f"{a.show(f)} vs {b.show(f)}" for f in FIELDS[:4]
             if f in a.values and f in b.values and a.values[f] != b.values[f]]
    return ", ".join(parts)


def choose_claim(env: Mapping[str, str]) -> tuple[Claim, list[Claim], str] | None:
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
