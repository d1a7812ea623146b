"""ncclbench under the real launchers, on this one host, with gloo ranks (no mocks):

  * Open MPI's mpirun: 4 ranks read OMPI_COMM_WORLD_* and form one world;
  * SLURM: a private slurmctld + slurmd + munged started for this module, the
    repository's scripts/slurm/ncclbench.sbatch submitted with `sbatch --wait`;
  * two torchrun "nodes" on loopback (torchrun itself, and ncclbench's own --nnodes).

Each launch must produce exactly one nccl-tests table (rank 0's) naming every rank, with
no wrong elements. Tools that are missing skip with the reason; scripts/ci/install_cluster_tools.sh
installs them (CI runs it first). Every process started here is stopped by pid, tree and
all, even when a test fails or times out.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, table_rows

VENV_BIN = os.path.dirname(sys.executable)
SYSTEM_SBIN = "/usr/sbin:/sbin"  # daemons live here, and not every PATH has it
TINY = ["--backend", "gloo", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-T", "60", "--no-save"]
LAUNCH_TIMEOUT = 180  # seconds for one launch; gloo ranks on 2 cores take 10-25 s

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def find_tool(name: str) -> str | None:
    return shutil.which(name, path=f"{VENV_BIN}:{os.environ.get('PATH', '')}:{SYSTEM_SBIN}")


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it for a socket bound to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (CI may itself run under one),
    with the venv's ncclbench and torchrun first on PATH."""
    launcher_prefixes = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_")
    launcher_names = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NCCLBENCH_SPAWNED"}
    env = {k: v for k, v in os.environ.items()
           if k not in launcher_names and not k.startswith(launcher_prefixes)}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def ncclbench_cmd() -> list[str]:
    exe = shutil.which("ncclbench", path=VENV_BIN)
    return [exe] if exe else [sys.executable, "-m", "ncclbench"]


def torchrun_cmd() -> list[str]:
    exe = shutil.which("torchrun", path=VENV_BIN)
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def stop_tree(proc: subprocess.Popen) -> None:
    """Stop a process we started and everything below it, by pid: SIGTERM first (torchrun
    and mpirun then stop their ranks themselves), SIGKILL what is left after 10 s.
    torchrun starts each rank in a session of its own, so a process group kill would miss them."""
    if proc.poll() is not None:
        return
    try:
        parent = psutil.Process(proc.pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(tree, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_together(cmds: list[list[str]], env: dict, timeout: float = LAUNCH_TIMEOUT, cwd=None):
    """Start every command at once (the "nodes" of one job), wait for all; on timeout stop
    them all and fail with what they printed. Returns [(returncode, stdout, stderr)]."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=cwd) for cmd in cmds]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            stop_tree(proc)
        dumps = [f"$ {' '.join(cmd)}\n{p.stdout.read() if p.stdout else ''}{p.stderr.read() if p.stderr else ''}"
                 for cmd, p in zip(cmds, procs)]
        pytest.fail(f"no result within {timeout:.0f} s:\n" + "\n".join(d[-3000:] for d in dumps))
    finally:
        for proc in procs:
            stop_tree(proc)
    return results


def assert_one_good_table(stdout: str, nranks: int) -> None:
    """Exactly one nccl-tests table, listing ranks 0..nranks-1, every row with #wrong 0."""
    assert stdout.count("# Collective test starting") == 1, stdout
    ranks = [int(m) for m in re.findall(r"^#  Rank\s+(\d+) Group", stdout, re.MULTILINE)]
    assert ranks == list(range(nranks)), stdout
    rows = table_rows(stdout)
    assert [int(r[0]) for r in rows] == [1024, 4096], stdout
    for row in rows:
        assert row[8] == "0" and row[12] == "0", f"wrong elements in {row}"  # both #wrong columns
    assert "# Out of bounds values : 0 OK" in stdout


def assert_no_table(stdout: str) -> None:
    assert "# Using devices" not in stdout and not table_rows(stdout), stdout


# ---------------------------------------------------------------------------
# Open MPI
# ---------------------------------------------------------------------------

def test_mpirun_four_ranks_form_one_world():
    mpirun = find_tool("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (scripts/ci/install_cluster_tools.sh installs Open MPI)")
    cmd = [mpirun, "-np", "4", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")  # CI containers run as root; Open MPI refuses by default
    # No MASTER_ADDR/PORT: each rank derives loopback and a port from Open MPI's job id.
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    [(code, out, err)] = run_together([cmd + ncclbench_cmd() + ["allreduce", *TINY]], env)
    assert code == 0, out + err
    assert_one_good_table(out, 4)


def test_mpirun_wrapper_script_runs_two_ranks():
    """scripts/mpirun-ncclbench.sh as documented for CPU-only hosts (NP=2 ... --backend gloo)."""
    if find_tool("mpirun") is None:
        pytest.skip("mpirun is not installed (scripts/ci/install_cluster_tools.sh installs Open MPI)")
    env = clean_env(NP="2", MPIRUN=find_tool("mpirun"), MPIRUN_ARGS="--bind-to none --oversubscribe",
                    OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    [(code, out, err)] = run_together([[str(ROOT / "scripts" / "mpirun-ncclbench.sh"), "allreduce", *TINY]], env)
    assert code == 0, out + err
    assert_one_good_table(out, 2)


# ---------------------------------------------------------------------------
# SLURM: a one-node cluster of our own
# ---------------------------------------------------------------------------

SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scancel", "munged")

SLURM_CONF = """\
# Generated by tests/test_cluster.py: a one-node cluster on {host} for the tests only.
ClusterName=ncclbenchtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
MailProg=/bin/true
# No cgroups: containers rarely let us create them, and the tests need no confinement.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# CPUs below may exceed what slurmd detects (CI machines vary); trust the file.
SlurmdParameters=config_overrides
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def node_name() -> str:
    """This host's short name if it resolves (ranks connect to the step's first node by
    name), else localhost."""
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
        return host
    except OSError:
        return "localhost"


class SlurmCluster:
    """munged, slurmctld and slurmd in a private directory with a generated slurm.conf."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="ncclbench-slurm-"))
        # munged refuses a socket directory that others cannot traverse
        self.dir.chmod(0o755)
        self.host = node_name()
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.env = clean_env(SLURM_CONF=str(self.conf))

    def tool(self, name: str) -> str:
        path = find_tool(name)
        assert path, name
        return path

    # ---- start -----------------------------------------------------------------------
    def start(self) -> None:
        self.write_munge_key()
        self.write_conf()
        self.spawn("munged", [self.tool("munged"), "--foreground", "--force",
                              f"--socket={self.munge_socket}", f"--key-file={self.dir / 'key' / 'munge.key'}",
                              f"--log-file={self.dir / 'munged.log'}", f"--pid-file={self.dir / 'munged.pid'}",
                              f"--seed-file={self.dir / 'munged.seed'}"])
        self.wait_for(lambda: self.munge_socket.exists(), 15, "munged to create its socket")
        self.spawn("slurmctld", [self.tool("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self.spawn("slurmd", [self.tool("slurmd"), "-D", "-N", self.host, "-f", str(self.conf)])
        self.wait_for(lambda: self.node_state() == "idle", 60, f"node {self.host} to be idle in sinfo")

    def write_munge_key(self) -> None:
        key_dir = self.dir / "key"
        key_dir.mkdir(mode=0o700)
        (self.dir / "munge").mkdir(mode=0o755)
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def write_conf(self) -> None:
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(mode=0o755)
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, dir=self.dir, ctld_port=free_port(), slurmd_port=free_port(),
            munge_socket=self.munge_socket, cpus=max(os.cpu_count() or 1, 4)))

    def spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, cwd=self.dir, start_new_session=True)
        log.close()  # the child has its own copy
        self.procs.append((name, proc))

    def node_state(self) -> str:
        proc = subprocess.run([self.tool("sinfo"), "-h", "-N", "-o", "%t"], capture_output=True, text=True,
                              env=self.env, timeout=30)
        return proc.stdout.strip().rstrip("*~#!%$@^-")

    def wait_for(self, condition, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited with {proc.returncode} while waiting for {what}\n{self.logs()}")
            if condition():
                return
            time.sleep(0.5)
        pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.dir.glob("*.out")) + sorted(self.dir.glob("*.log")):
            text = path.read_text(errors="replace").strip()
            parts.append(f"--- {path.name} ---\n" + "\n".join(text.splitlines()[-25:]))
        return "\n".join(parts)

    # ---- stop ------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel what is left of our jobs, then stop the daemons (slurmd first, munged last:
        the others need it to say goodbye), and remove the directory."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self.procs):
            subprocess.run([self.tool("scancel"), "--user", str(os.geteuid()), "--full"],
                           env=self.env, capture_output=True, timeout=30)
        order = {"slurmd": 0, "slurmctld": 1, "munged": 2}
        for _name, proc in sorted(self.procs, key=lambda item: order[item[0]]):
            stop_tree(proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_cluster():
    missing = [t for t in SLURM_TOOLS if find_tool(t) is None]
    if missing:
        pytest.skip(f"SLURM/MUNGE not installed (missing {', '.join(missing)}); "
                    "scripts/ci/install_cluster_tools.sh installs slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.skip("a private slurmd must run as root (it starts job steps as the submitting user)")
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_srun_environment_is_detected_as_slurm(slurm_cluster):
    """Each task of a real srun step reads itself as launcher slurm, with its own rank."""
    probe = ("from ncclbench.launch.launcher import detect; i = detect(); "
             "print(i.launcher, i.rank, i.world_size, i.local_rank, i.local_world_size, i.master_addr)")
    proc = subprocess.run([slurm_cluster.tool("srun"), "-N", "1", "-n", "2", "--time=2", sys.executable, "-c", probe],
                          capture_output=True, text=True, env=slurm_cluster.env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr + slurm_cluster.logs()
    lines = sorted(proc.stdout.split("\n")[:-1])
    assert lines == [f"slurm {r} 2 {r} 2 {slurm_cluster.host}" for r in range(2)], proc.stdout


def test_sbatch_script_runs_one_job(slurm_cluster, tmp_path):
    """scripts/slurm/ncclbench.sbatch as it is, with its documented CPU-only knobs: its
    default layout (1 node x 2 tasks) and log file name (%x-%j.out in the submit dir)."""
    env = dict(slurm_cluster.env, NCCLBENCH_BACKEND="gloo", NCCLBENCH_ARGS=" ".join(TINY[2:]))
    proc = subprocess.run([slurm_cluster.tool("sbatch"), "--wait", str(ROOT / "scripts" / "slurm" / "ncclbench.sbatch")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=LAUNCH_TIMEOUT)
    job = re.search(r"Submitted batch job (\d+)", proc.stdout)
    log = tmp_path / f"ncclbench-{job.group(1)}.out" if job else None
    text = log.read_text() if log and log.exists() else "(no job log)"
    assert proc.returncode == 0, proc.stdout + proc.stderr + text + slurm_cluster.logs()
    assert text.startswith(f"# ncclbench job {job.group(1)}: 1 node(s) {slurm_cluster.host}, 2 ranks"), text
    assert_one_good_table(text, 2)


@pytest.mark.parametrize("name", ["ncclbench.sbatch", "ncclbench-torchrun.sbatch", "ncclbench-fleet.sbatch"])
def test_sbatch_templates_pass_test_only(slurm_cluster, tmp_path, name):
    """The SLURM templates as shipped: sbatch --test-only accepts their #SBATCH lines on a
    real controller (it schedules nothing)."""
    proc = subprocess.run([slurm_cluster.tool("sbatch"), "--test-only", str(ROOT / "scripts" / "slurm" / name)],
                          capture_output=True, text=True, env=slurm_cluster.env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr + slurm_cluster.logs()
    assert "to start at" in proc.stdout + proc.stderr  # "sbatch: Job <id> to start at <time> using ..."


# ---------------------------------------------------------------------------
# Two torchrun "nodes" on loopback
# ---------------------------------------------------------------------------

def two_nodes(node_cmd) -> list[tuple[int, str, str]]:
    port = free_port()
    return run_together([node_cmd(k, port) for k in (0, 1)], clean_env(OMP_NUM_THREADS="1"))


def test_two_torchrun_nodes_form_one_world():
    def node(k, port):
        return torchrun_cmd() + ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(k),
                                 "--master-addr", "127.0.0.1", "--master-port", str(port),
                                 "-m", "ncclbench", "allreduce", *TINY]

    (code0, out0, err0), (code1, out1, err1) = two_nodes(node)
    assert code0 == 0 and code1 == 0, out0 + err0 + out1 + err1
    assert_one_good_table(out0, 4)
    assert_no_table(out1)


def test_two_self_spawned_nodes_form_one_world():
    def node(k, port):
        return ncclbench_cmd() + ["allreduce", "-g", "2", "--nnodes", "2", "--node-rank", str(k),
                                  "--master-addr", "127.0.0.1", "--master-port", str(port), *TINY]

    (code0, out0, err0), (code1, out1, err1) = two_nodes(node)
    assert code0 == 0 and code1 == 0, out0 + err0 + out1 + err1
    assert_one_good_table(out0, 4)
    assert_no_table(out1)
