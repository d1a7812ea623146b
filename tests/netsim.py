"""Simulated hosts that are real network hosts, on one machine: one network namespace per
host, with its own hostname (a UTS namespace) and its own view of /sys/class/net, one veth on
a shared bridge, an address in 198.18.0.0/15, and optionally its own GPUs
(`CUDA_VISIBLE_DEVICES`) and its own `NCCL_HOSTID`, so that NCCL sees separate hosts and
crosses the bridge with its NET transport (`via NET/Socket/0`) between them and P2P within
one.

Separate machines have CPUs of their own: `cpus` (or `split_cpus`) gives each host its own
CPU set, so one host's sockets, NCCL proxy threads and the kernel's network work for its
sends (a veth's sender does it) never share a core with another host's.

Hosts that share a GPU (fewer GPUs than hosts): without more, the GPU time-slices between
their processes, and an op between two such hosts waits on the slices (4.6 ms an all_reduce
of any size on an H200 shared by 2 hosts); `mps=True` runs CUDA's Multi-Process Service for
the fleet's lifetime, so their kernels run side by side (50-70 us at 8 B over the sockets).

Faults: a token bucket on a host's interface (a slow NIC), an htb class with a filter on one
destination (a slow link), a host's link down, every process of a host killed or frozen
(SIGSTOP).

Everything is made through netlink from Python (pyroute2, in the test extras) and a few libc
calls, so the rig needs no `ip`, `tc` or `unshare` programs: GPU machines often have none.
Everything made here is removed by `close()`; the context manager calls it even when a test
fails. Needs root.

Also a maintainers' command (benchmarks/multihost.py) builds on it."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

SUBNET = "198.18.{}.{}"
NETNS_DIR = Path("/var/run/netns")

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MNT_DETACH = 2

# variables a simulated host must not inherit from the process that builds it
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES", "NCCL_HOSTID")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_host(ns_name: str, hostname: str) -> None:
    """Make the calling process a process of that host: its network namespace, a UTS
    namespace of its own with the host's name, and a mount namespace whose /sys shows the
    host's interfaces (what `ip netns exec` does), so `/sys/class/net` agrees with netlink."""
    libc = _libc()
    fd = os.open(NETNS_DIR / ns_name, os.O_RDONLY)
    try:
        _check(libc.setns(fd, CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWUTS | CLONE_NEWNS), "unshare")
    name = hostname.encode()
    _check(libc.sethostname(name, len(name)), "sethostname")
    # best effort: where /sys cannot be remounted, netlink (what NCCL and gloo use) still is right
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) == 0:
        libc.umount2(b"/sys", MNT_DETACH)
        libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None)


def why_not() -> str | None:
    """None when namespaces, veths, a bridge and tc can be made here; else the reason."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    try:
        from pyroute2 import netns
    except ImportError:
        return "pyroute2 is missing (pip install -e '.[test]')"
    probe = f"nbp{uuid.uuid4().hex[:6]}"
    try:
        netns.create(probe)
        netns.remove(probe)
    except Exception as exc:  # noqa: BLE001 - any failure means: cannot build the rig here
        return f"cannot make a network namespace: {exc}"
    return None


def rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate: `40mbit`, `2gbit`, `500kbit`, `1000bit`."""
    text = rate.strip().lower()
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale / 8
    raise ValueError(f"rate {rate!r}: give NUMBER followed by bit, kbit, mbit or gbit")


def _gpu_cpus(index: int) -> set[int] | None:
    """The CPUs near GPU `index` (NVML's index: the PCI order, which CUDA's default order
    matches on machines of one GPU model), or None where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            words = ((os.cpu_count() or 64) + 63) // 64
            masks = pynvml.nvmlDeviceGetCpuAffinity(pynvml.nvmlDeviceGetHandleByIndex(index), words)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no GPU: the caller splits evenly
        return None
    from ncclbench.topology.pci import format_cpu_list, parse_index_ranges

    return set(parse_index_ranges(format_cpu_list(masks))) or None


def split_cpus(n: int, gpus: list[str] | None = None) -> list[set[int]]:
    """Each of `n` hosts its own CPUs, none shared: with `gpus`, the usable CPUs near each
    host's first GPU, shared out in even blocks among the hosts whose GPUs sit near the same
    ones; otherwise the usable CPUs in `n` even blocks. ValueError where there are fewer
    usable CPUs than hosts in a group."""
    usable = sorted(os.sched_getaffinity(0))
    near = [(_gpu_cpus(int(g.split(",")[0])) if gpus else None) for g in (gpus or [None] * n)]
    groups: dict[tuple, list[int]] = {}
    for i, cpus in enumerate(near):
        key = tuple(sorted(cpus & set(usable))) if cpus and cpus & set(usable) else tuple(usable)
        groups.setdefault(key, []).append(i)
    out: list[set[int]] = [set() for _ in range(n)]
    for key, hosts in groups.items():
        if len(key) < len(hosts):
            raise ValueError(f"{len(hosts)} hosts on {len(key)} CPU(s): a host needs one of its own")
        per = len(key) // len(hosts)
        for k, i in enumerate(hosts):
            out[i] = set(key[k * per:(k + 1) * per])
    return out


def _ns_inode(ns_name: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / ns_name).st_ino
    except OSError:
        return None


def pids_in(ns_name: str) -> list[int]:
    """Every process whose network namespace is that host's."""
    inode = _ns_inode(ns_name)
    found = []
    if inode is None:
        return found
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino == inode:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# Open MPI's launch agent (plm_rsh_agent, in place of ssh): `agent [ssh options] HOST COMMAND`
# runs COMMAND (orted's, one shell string) inside HOST's namespaces
MPI_AGENT = """#!{python}
import os, sys
sys.path.insert(0, {tests!r})
import netsim
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
host, command = args[0], " ".join(args[1:])
ns, name = dict(e.split("=", 1) for e in os.environ["NETSIM_AGENT_MAP"].split(","))[host].split(":")
netsim.enter_host(ns, name)
os.execvp("sh", ["sh", "-c", command])
"""

MPS_CONTROL = "nvidia-cuda-mps-control"


def shared_gpus(gpus: list[str] | None) -> list[str]:
    """The GPUs (CUDA_VISIBLE_DEVICES entries) that more than one host names."""
    hosts: dict[str, set[int]] = {}
    for i, spec in enumerate(gpus or []):
        for gpu in spec.split(","):
            hosts.setdefault(gpu.strip(), set()).add(i)
    return sorted(g for g, named_by in hosts.items() if len(named_by) > 1)


class RigError(RuntimeError):
    """The rig could not be built (CUDA MPS missing or refusing to start)."""


class Mps:
    """A CUDA MPS control daemon of its own (its own pipe and log folders), stopped with `quit`."""

    def __init__(self):
        self.env: dict[str, str] = {}
        self.control: str | None = None

    def start(self) -> None:
        self.control = shutil.which(MPS_CONTROL)
        if self.control is None:
            raise RigError(f"MPS asked for, but {MPS_CONTROL} is not on PATH")
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": tempfile.mkdtemp(prefix="nbmps-pipe-"),
                    "CUDA_MPS_LOG_DIRECTORY": tempfile.mkdtemp(prefix="nbmps-log-")}
        daemon_env = dict(os.environ, **self.env)
        daemon_env.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            r = subprocess.run([self.control, "-d"], env=daemon_env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.stop()  # a daemon that did start is told to quit; the folders go
            raise RigError(f"{MPS_CONTROL} -d: {exc}") from None
        if r.returncode != 0:
            self.stop()
            raise RigError(f"{MPS_CONTROL} -d ended {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}")

    def stop(self) -> None:
        if not self.env:
            return
        try:
            subprocess.run([self.control], input="quit\n", env=dict(os.environ, **self.env), capture_output=True,
                           text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass  # the rest of close() goes on: the namespaces and the bridge must go too
        for folder in self.env.values():
            shutil.rmtree(folder, ignore_errors=True)
        self.env = {}


class SimFleet:
    """`n` hosts on one bridge. `gpus` (optional) lists each host's GPUs as
    CUDA_VISIBLE_DEVICES values; a host with GPUs also gets its own NCCL_HOSTID and NCCL is
    told to use eth0 and no InfiniBand."""

    def __init__(self, n: int, gpus: list[str] | None = None, prefix: str = "simnode",
                 cpus: list[set[int]] | None = None, mps: bool = False):
        if cpus is not None and len(cpus) != n:
            raise ValueError(f"cpus names {len(cpus)} hosts' CPUs for {n} hosts")
        self.cpus = cpus
        self.tag = uuid.uuid4().hex[:5]
        self.n = n
        self.gpus = gpus
        self.bridge = f"nbbr{self.tag}"
        self.spaces = [f"nb{self.tag}n{i}" for i in range(n)]
        self.veths = [f"nbv{self.tag}{i}" for i in range(n)]
        self.hosts = [f"{prefix}{i}" for i in range(n)]
        self.addrs = [SUBNET.format(0, i + 1) for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        self._folders: list[str] = []  # made for a launch (mpirun's agent), removed by close()
        self._made_spaces: list[str] = []
        self._made_bridge = False
        self.mps = Mps() if mps else None

    # ---- building and removing -----------------------------------------------------------
    def __enter__(self):
        from pyroute2 import IPRoute, NetNS, netns

        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=self.bridge, kind="bridge")
                self._made_bridge = True
                bridge = ipr.link_lookup(ifname=self.bridge)[0]
                ipr.link("set", index=bridge, state="up")
                for i, ns in enumerate(self.spaces):
                    netns.create(ns)
                    self._made_spaces.append(ns)
                    ipr.link("add", ifname=self.veths[i], kind="veth", peer={"ifname": "eth0", "net_ns_fd": ns})
                    veth = ipr.link_lookup(ifname=self.veths[i])[0]
                    ipr.link("set", index=veth, master=bridge, state="up")
            for i, ns in enumerate(self.spaces):
                with NetNS(ns) as inside:
                    eth0 = inside.link_lookup(ifname="eth0")[0]
                    inside.addr("add", index=eth0, address=self.addrs[i], prefixlen=16)
                    inside.link("set", index=eth0, state="up")
                    inside.link("set", index=inside.link_lookup(ifname="lo")[0], state="up")
            if self.mps is not None:
                self.mps.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for i in range(len(self._made_spaces)):
            self.kill_node(i)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.mps is not None:
            self.mps.stop()
        for folder in self._folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._folders = []
        try:
            from pyroute2 import IPRoute, netns
        except ImportError:
            return
        for ns in self._made_spaces:
            try:
                netns.remove(ns)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._made_spaces = []
        if self._made_bridge:
            with IPRoute() as ipr:
                for name in [*self.veths, self.bridge]:
                    for index in ipr.link_lookup(ifname=name):
                        try:
                            ipr.link("del", index=index)
                        except Exception:  # noqa: BLE001 - a veth goes with its namespace
                            pass
            self._made_bridge = False

    # ---- faults --------------------------------------------------------------------------
    def _inside(self, i: int):
        from pyroute2 import NetNS

        return NetNS(self.spaces[i])

    def slow_nic(self, i: int, rate: str = "20mbit") -> None:
        """Everything host i sends goes through a token bucket of `rate` (`100mbit`, `2gbit`).
        The bucket holds 1 ms of the rate (at least 4 KiB): a fixed small burst holds rates
        above a few hundred Mbit/s well below their nominal value."""
        burst = max(4096, int(rate_bytes(rate) / 1000))
        with self._inside(i) as ns:
            eth0 = ns.link_lookup(ifname="eth0")[0]
            ns.tc("add", "tbf", index=eth0, rate=rate, burst=burst, latency="400ms")

    def slow_link(self, i: int, j: int, rate: str = "20mbit") -> None:
        """Traffic between hosts i and j only, both ways, at `rate`; the rest unlimited."""
        for a, b in ((i, j), (j, i)):
            dst = "".join(f"{int(part):02x}" for part in self.addrs[b].split("."))
            with self._inside(a) as ns:
                eth0 = ns.link_lookup(ifname="eth0")[0]
                ns.tc("add", "htb", index=eth0, handle="1:", default=0x10)
                # the rest unlimited in effect: 400 Gbit/s (a 64-bit rate), far above what a
                # veth moves; a 10 Gbit/s class here capped the host's other traffic too
                ns.tc("add-class", "htb", index=eth0, handle="1:10", parent="1:", rate="400gbit",
                      ceil="400gbit", burst=1 << 22, cburst=1 << 22)
                ns.tc("add-class", "htb", index=eth0, handle="1:20", parent="1:", rate=rate)
                ns.tc("add-filter", "u32", index=eth0, handle=0, parent="1:", prio=1, protocol=0x0800,
                      target="1:20", keys=[f"0x{dst}/0xffffffff+16"])

    def link_down(self, i: int) -> None:
        """Host i's cable pulled: its veth on the bridge goes down; its processes live on."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=self.veths[i])[0], state="down")

    def signal_node(self, i: int, sig: int) -> list[int]:
        pids = pids_in(self.spaces[i])
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill_node(self, i: int) -> None:
        """Every process of host i (its launcher and ranks), by SIGKILL, as a host that dies."""
        self.signal_node(i, signal.SIGKILL)

    def freeze(self, i: int) -> list[int]:
        """Every process of host i stopped (SIGSTOP): alive, holding its sockets, answering nothing."""
        return self.signal_node(i, signal.SIGSTOP)

    def thaw(self, i: int) -> None:
        self.signal_node(i, signal.SIGCONT)

    # ---- processes -----------------------------------------------------------------------
    def env_for(self, i: int, env: dict | None = None) -> dict:
        full = dict(os.environ if env is None else env)
        for name in LAUNCHER_VARS:
            full.pop(name, None)
        full.update({"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
        if self.gpus is not None:
            full.update({"CUDA_VISIBLE_DEVICES": self.gpus[i], "NCCL_HOSTID": self.hosts[i],
                         "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"})
        if env is not None:
            full.update({k: v for k, v in env.items() if k in ("CUDA_VISIBLE_DEVICES", "NCCL_HOSTID")})
        if self.mps is not None:
            full.update(self.mps.env)
        return full

    def run_in(self, i: int, argv: list[str], env: dict | None = None, **popen) -> subprocess.Popen:
        """Any command as a process of host i (its own session, so it can be killed whole)."""
        return self._run_env(i, argv, self.env_for(i, env), **popen)

    def start(self, i: int, argv: list[str], nproc: int = 1, port: int = 29555, env: dict | None = None):
        """`ncclbench ... -g nproc --nnodes N --node-rank i` inside host i (torchrun's agent)."""
        inner = argv + ["-g", str(nproc), "--nnodes", str(self.n), "--node-rank", str(i),
                        "--master-addr", self.addrs[0], "--master-port", str(port)]
        return self.run_in(i, inner, env=env)

    def launch(self, how: str, args: list[str], per_host: int, port: int = 29555,
               env: dict | None = None, ncclbench: list[str] | None = None) -> list[subprocess.Popen]:
        """One job of `per_host` ranks on every host, started as a user's launcher would:
        `spawn` (ncclbench's own -g/--nnodes, torchrun's agent inside), `torchrun` (the
        user's own torchrun on each host), `slurm` or `mpi` (each rank a process with the
        variables srun or Open MPI's mpirun give it), `mpirun` (Open MPI's own, from host 0:
        one process returned). Host 0's first process comes first."""
        import sys

        cli = ncclbench or [sys.executable, "-m", "ncclbench"]
        if how == "spawn":
            return [self.start(i, cli + args, per_host, port, env) for i in range(self.n)]
        if how == "torchrun":
            return [self.run_in(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.n),
                                    "--node-rank", str(i), "--nproc-per-node", str(per_host),
                                    "--master-addr", self.addrs[0], "--master-port", str(port),
                                    "-m", "ncclbench", *args], env=env) for i in range(self.n)]
        if how == "mpirun":
            return [self._mpirun(cli + args, per_host, port, env)]
        if how not in ("slurm", "mpi"):
            raise ValueError(f"unknown launcher {how!r}: spawn, torchrun, slurm, mpi or mpirun")
        world = self.n * per_host
        procs = []
        for i in range(self.n):
            for local in range(per_host):
                rank = i * per_host + local
                full = self.env_for(i, env)
                full.update(MASTER_ADDR=self.addrs[0], MASTER_PORT=str(port))
                if how == "slurm":
                    full.update(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID=str(rank),
                                SLURM_STEP_NUM_TASKS=str(world), SLURM_LOCALID=str(local),
                                SLURM_NODEID=str(i), SLURM_STEP_NUM_NODES=str(self.n),
                                SLURM_STEP_NODELIST=",".join(self.hosts),
                                SLURM_STEP_TASKS_PER_NODE=f"{per_host}(x{self.n})")
                else:
                    full.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(world),
                                OMPI_COMM_WORLD_LOCAL_RANK=str(local),
                                OMPI_COMM_WORLD_LOCAL_SIZE=str(per_host))
                procs.append(self._run_env(i, cli + args, full))
        return procs

    def _mpirun(self, argv: list[str], per_host: int, port: int, env: dict | None) -> subprocess.Popen:
        """Open MPI's own mpirun started on host 0, its daemon (orted) on each other host
        started through an agent that enters that host (in place of ssh); the ranks get the
        run's variables through mpirun's `-x`. CPU hosts only (one environment for all)."""
        import sys

        folder = tempfile.mkdtemp(prefix="nbmpi-")
        self._folders.append(folder)
        agent = Path(folder) / "agent"
        agent.write_text(MPI_AGENT.format(python=sys.executable, tests=str(Path(__file__).resolve().parent)))
        agent.chmod(0o755)
        full = self.env_for(0, env)
        full.update(MASTER_ADDR=self.addrs[0], MASTER_PORT=str(port),
                    NETSIM_AGENT_MAP=",".join(f"{a}={ns}:{h}" for a, ns, h in zip(self.addrs, self.spaces, self.hosts)))
        passed = [k for k in full if k in ("MASTER_ADDR", "MASTER_PORT", "PATH", "PYTHONPATH", "OMP_NUM_THREADS")
                  or k.startswith(("NCCLBENCH_", "NCCL_", "GLOO_", "TORCH_"))]
        cmd = ["mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", str(agent), "--mca", "oob_tcp_if_include",
               "eth0", "-H", ",".join(f"{a}:{per_host}" for a in self.addrs), "-np", str(self.n * per_host)]
        for k in passed:
            cmd += ["-x", k]
        return self._run_env(0, cmd + argv, full)

    def _run_env(self, i: int, argv: list[str], full_env: dict, **popen) -> subprocess.Popen:
        ns, host = self.spaces[i], self.hosts[i]
        cpus = self.cpus[i] if self.cpus else None

        def become_host():
            enter_host(ns, host)
            if cpus:
                os.sched_setaffinity(0, cpus)
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.PIPE)
        popen.setdefault("text", True)
        proc = subprocess.Popen(argv, env=full_env, start_new_session=True,
                                preexec_fn=become_host, **popen)
        self.procs.append(proc)
        return proc
