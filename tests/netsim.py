"""Simulated nodes that are real network hosts: one network namespace per node, with its
own hostname (a UTS namespace), one veth on a shared bridge, an address in 198.18.0.0/15,
and `ncclbench fleet --nnodes N --node-rank i` (torchrun's agent) started inside it. Faults
are traffic control on a node's interface: a token bucket (a slow NIC) or an htb class with a
filter on one destination (a slow link). Everything made here is removed by `close()`, and
the context manager calls it even when a test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

SUBNET = "198.18.{}.{}"


def why_not() -> str | None:
    """None when namespaces, veths, a bridge and tc can be made here; else the reason."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    for tool in ("ip", "tc", "unshare"):
        if not shutil.which(tool):
            return f"{tool} is missing (scripts/ci/install_cluster_tools.sh installs iproute2)"
    probe = f"nbp{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


class SimFleet:
    def __init__(self, n: int):
        self.tag = uuid.uuid4().hex[:5]
        self.n = n
        self.bridge = f"nbbr{self.tag}"
        self.spaces = [f"nb{self.tag}n{i}" for i in range(n)]
        self.hosts = [f"simnode{i}" for i in range(n)]
        self.addrs = [SUBNET.format(0, i + 1) for i in range(n)]
        self.procs: list = []

    def __enter__(self):
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "link", "set", self.bridge, "up")
            for i, ns in enumerate(self.spaces):
                sh("ip", "netns", "add", ns)
                veth = f"nbv{self.tag}{i}"
                sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                sh("ip", "link", "set", veth, "master", self.bridge, "up")
                sh("ip", "-n", ns, "addr", "add", f"{self.addrs[i]}/16", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def slow_nic(self, i: int, rate: str = "20mbit") -> None:
        sh("ip", "netns", "exec", self.spaces[i], "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
           "rate", rate, "burst", "32kbit", "latency", "400ms")

    def slow_link(self, i: int, j: int, rate: str = "20mbit") -> None:
        """Traffic between nodes i and j only, both ways."""
        for a, b in ((i, j), (j, i)):
            ns = ["ip", "netns", "exec", self.spaces[a], "tc"]
            sh(*ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
            sh(*ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
            sh(*ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", rate)
            sh(*ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
               "match", "ip", "dst", f"{self.addrs[b]}/32", "flowid", "1:20")

    def start(self, i: int, argv: list[str], nproc: int = 1, port: int = 29555, env: dict | None = None):
        """`ncclbench fleet ... --nnodes N --node-rank i` inside node i, as its own hostname."""
        full = dict(env or os.environ)
        full.update({"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            full.pop(name, None)
        inner = argv + ["-g", str(nproc), "--nnodes", str(self.n), "--node-rank", str(i),
                        "--master-addr", self.addrs[0], "--master-port", str(port)]
        cmd = ["ip", "netns", "exec", self.spaces[i], "unshare", "--uts", "sh", "-c",
               f'hostname {self.hosts[i]} && exec "$@"', "sh", *inner]
        proc = subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill_node(self, i: int) -> None:
        """Every process of node i (its launcher and ranks), by SIGKILL, as a node that dies."""
        out = subprocess.run(["ip", "netns", "pids", self.spaces[i]], capture_output=True, text=True).stdout
        for pid in (int(p) for p in out.split()):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait()
        for i, ns in enumerate(self.spaces):
            self.kill_node(i)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
