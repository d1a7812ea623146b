"""`ncclbench fleet` on each rank: find the bad nodes among many in one job.

Control runs through the rendezvous store (rank 0 hosts it), never through a collective of
the whole world: after start-up no step waits for every rank, so a node that dies or hangs
costs one round's deadline and is named, and the run goes on for the others.

Per round, rank 0 writes each rank's task (a peer, or nothing) under its own key; each rank
reads its key, measures, writes its result under its own key and bumps the round's counter;
rank 0 reads the results once the counter reaches the ranks alive (or the round's deadline
passes: the ranks missing then are dead). Store traffic per round: 2 small keys per rank and
one read of each result by rank 0 (docs/fleet.md has the cost model).

Phases: (1) the inventory (ranks and GPU model per node) and each node's ranks alone
(all_reduce, all_gather on a group of the node's ranks); (2) node pairs rail by rail, screening
rounds then localisation rounds (ncclbench.locate);
(3) the report (ncclbench.faults.fleet.report), written by rank 0; every rank exits with its code.

A rank never waits on its own task without a bound: each task runs on a task thread, and a
task still running task_limit_s() later (the host blocked in a wait on a GPU whose exchange never
ends, as behind a lost NCCL peer) is reported as stuck; that rank gets no more tasks and
answers each round at once, so the rounds, rank 0's among them, go on. Rank 0 blames a stuck
rank only when its partner answered (ncclbench.faults.fleet.run).

Here: what every rank shares (the plan, the store keys, the layout, the Worker that does the
tasks); ncclbench.faults.fleet.run starts a rank and runs rank 0's rounds on top of it."""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

from ncclbench.errors import TimeoutExpired, first_line

KEY_PREFIX = "ncclbench-fleet"
SLACK_S = 10.0        # a round's deadline: twice the exchange bound (group set-up, exchange) plus this
NODE_ITERS = 10
# A task still running this long after it began is stuck: the exchange bound (-T) twice plus
# half the round's slack, so that the rank says so before rank 0's deadline for the round.
def task_limit_s(timeout_s: float) -> float:
    return 2 * timeout_s + SLACK_S / 2


@dataclass(frozen=True)
class FleetPlan:
    backend: str
    nbytes: int
    node_bytes: int
    iters: int
    warmup: int
    timeout_s: float
    band: float                              # a node's best (ncclbench.locate.bands)
    link_band: float | None = None           # a pair's best (None: band)
    floor: float | None = None
    # the bands when NCCL's path between the nodes is its Socket network (None: the bands above)
    socket_band: float | None = None
    socket_link_band: float | None = None
    gpus_per_node: int | None = None
    all_pairs_rounds: int = 15
    screen_rounds: int = 4
    max_localise: int = 6
    budget_s: float = 30.0
    seed: int = 0
    sim_node_size: int | None = None
    json_path: str | None = None
    csv_path: str | None = None
    drain_path: str | None = None
    drain_format: str = "scontrol"
    metrics_path: str | None = None
    share_report: bool = False   # every rank gets the report (ncclbench.fleet); the command prints it on rank 0


@dataclass
class Layout:
    """Who is where, as rank 0 reads it from every rank's facts."""

    names: list = field(default_factory=list)          # node index -> host
    ranks: list = field(default_factory=list)          # node index -> global ranks by local rank
    gpus: dict = field(default_factory=dict)           # node -> ranks with a device
    models: dict = field(default_factory=dict)         # node -> GPU model (None on CPU)
    node_of: dict = field(default_factory=dict)        # rank -> node


def say(message: str) -> None:
    print(f"ncclbench fleet: {message}", file=sys.stderr, flush=True)


class Control:
    """The store keys of one run; rank 0 collects, everyone posts."""

    def __init__(self, store, rank: int, world: int, wait_s: float):
        import torch.distributed as dist

        self.store = dist.PrefixStore(KEY_PREFIX, store)
        self.rank, self.world, self.wait_s = rank, world, wait_s

    def post(self, step: str, value) -> None:
        self.store.set(f"{step}/res/{self.rank}", json.dumps(value))
        self.store.add(f"{step}/n", 1)

    def collect(self, step: str, alive: list[int], deadline: float) -> tuple[dict, list[int]]:
        """({rank: value} of the ranks that posted by the deadline, [ranks that did not])."""
        while time.monotonic() < deadline and self.store.add(f"{step}/n", 0) < len(alive):
            time.sleep(0.02)
        keys = [f"{step}/res/{r}" for r in alive]
        have = [r for r, k in zip(alive, keys) if self.store.check([k])] \
            if self.store.add(f"{step}/n", 0) < len(alive) else list(alive)
        values = self.store.multi_get([f"{step}/res/{r}" for r in have]) if have else []
        return {r: json.loads(bytes(v).decode()) for r, v in zip(have, values)}, [r for r in alive if r not in have]

    def publish(self, name: str, value) -> None:
        """One value every rank may read (the report, for the Python API on every rank)."""
        self.store.set(f"pub/{name}", json.dumps(value))

    def read(self, name: str):
        return json.loads(self.store.get(f"pub/{name}").decode())

    def assign(self, step: str, tasks: dict) -> None:
        if tasks:
            self.store.multi_set([f"{step}/task/{r}" for r in tasks], [json.dumps(t) for t in tasks.values()])

    def task(self, step: str):
        key = f"{step}/task/{self.rank}"
        try:
            self.store.wait([key], timedelta(seconds=self.wait_s))
            return json.loads(self.store.get(key).decode())
        except Exception as exc:  # noqa: BLE001 - the store's host (rank 0) is gone or late
            raise TimeoutExpired(f"rank 0 (the store's host) gave no task for {step} within {self.wait_s:.0f} s: "
                                 f"{first_line(exc, 120)}") from None


def my_facts(plan: FleetPlan, info) -> dict:
    host = socket.gethostname()
    if plan.sim_node_size:
        host = f"{host}-n{info.local_rank // plan.sim_node_size}"
    from ncclbench.topology import health

    device, model, reading = True, None, None
    if plan.backend == "nccl":
        import torch

        visible = torch.cuda.device_count()
        device = info.local_rank < visible or visible == 1
        if device:
            index = info.local_rank if visible > 1 else 0
            torch.cuda.set_device(index)
            model = torch.cuda.get_device_name(index)
            reading = health.read_local(index, host=host)
    if reading is None:
        reading = health.read_local(0, nvml=None, host=host)
    return {"host": host, "local_rank": info.local_rank, "device": device, "model": model, "health": reading}


def build_layout(facts: dict) -> Layout:
    out = Layout()
    for rank in sorted(facts):
        host = facts[rank]["host"]
        if host not in out.names:
            out.names.append(host)
            out.ranks.append([])
        out.ranks[out.names.index(host)].append(rank)
    for node, ranks in enumerate(out.ranks):
        ranks.sort(key=lambda r: (facts[r]["local_rank"], r))
        out.gpus[node] = sum(1 for r in ranks if facts[r]["device"])
        models = sorted({facts[r]["model"] for r in ranks if facts[r]["model"]})
        out.models[node] = models[0] if models else None
        for r in ranks:
            out.node_of[r] = node
    return out


class Worker:
    """Every rank (rank 0 too, through the Coordinator): do the tasks it is given until the end."""

    def __init__(self, plan: FleetPlan, ctl: Control, facts: dict):
        from ncclbench.engine.fleet_exchange import groups_made

        self.plan, self.ctl, self.facts = plan, ctl, facts
        self.buffers: dict = {}
        self.base = groups_made()
        self.thread: TaskThread | None = None
        self.stuck: str | None = None  # why this rank takes no more tasks
        self.report: dict | None = None  # the report rank 0 published, where the API asked for it

    def run(self) -> int:
        step = 0
        while True:
            task = self.ctl.task(f"s{step}")
            if "end" in task:
                if task.get("report"):  # the Python API returns the report on every rank
                    self.report = self.ctl.read("report")
                self.ctl.post(f"s{step}", {})  # the store's host waits for this before it leaves
                return int(task["end"])
            self.ctl.post(f"s{step}", self.bounded(task, step))
            step += 1

    def bounded(self, task: dict, step: int) -> dict:
        """do(task) on the task thread, waited for task_limit_s at most: past it, this rank
        is stuck (the thread may never come back) and answers every later task with that."""
        if self.stuck:
            return {"stuck": self.stuck}
        if not task:  # nothing to measure: only the one process group every step makes
            return self.do(task, step)
        if self.thread is None:
            self.thread = TaskThread()
        limit = task_limit_s(self.plan.timeout_s)
        done, result = self.thread.run(lambda: self.do(task, step), limit)
        if done:
            return result
        what = f"the exchange with rank {task['peer']}" if "peer" in task else "its node's collectives"
        self.stuck = f"stuck in {what} (step {step}) for more than {limit:g} s"
        return {"stuck": self.stuck}

    def do(self, task: dict, step: int) -> dict:
        """Run one task: {"node": [ranks]} the node's ranks alone, {"peer": r} a pair, {} rest.
        Every step makes exactly one process group on every rank (see fleet_exchange.align_groups)."""
        import torch.distributed as dist

        from ncclbench.engine import fleet_exchange as fx

        p = self.plan
        try:
            fx.align_groups(dist, self.base + step)
            if "node" not in task and "peer" not in task:
                fx.spare_group(dist)
            if "node" in task:
                return {"node": fx.measure_node(dist, p.backend, task["node"], p.node_bytes, NODE_ITERS, p.timeout_s)}
            if "peer" in task:
                pair = fx.measure_pair(dist, p.backend, task["peer"], p.nbytes, p.iters, p.warmup,
                                       p.timeout_s, self.buffers, task.get("target_s"))
                return {"pair": dict(pair, path=pair_path(p.backend))}
        except Exception as exc:  # noqa: BLE001 - the failure is the result: rank 0 judges it
            return {"error": f"{type(exc).__name__}: {first_line(exc, 160)}"}
        return {}


class TaskThread:
    """One thread that runs a rank's tasks, one at a time, on the CUDA device the rank chose
    (the current device is per thread)."""

    def __init__(self):
        import queue
        import threading

        self.device = _current_device()
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, name="ncclbench-fleet-task", daemon=True).start()

    def _serve(self) -> None:
        if self.device is not None:
            import torch

            torch.cuda.set_device(self.device)
        while True:
            job, box, done = self.jobs.get()
            try:
                box.append(job())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box.append({"error": f"{type(exc).__name__}: {first_line(exc, 160)}"})
            done.set()

    def run(self, job, limit_s: float) -> tuple[bool, dict | None]:
        """(finished within limit_s, its result)."""
        import threading

        box: list = []
        done = threading.Event()
        self.jobs.put((job, box, done))
        if not done.wait(limit_s):
            return False, None
        return True, box[0]


def _current_device() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def pair_path(backend: str) -> str | None:
    """The transports of the pair's communicator, as this rank's NCCL log names them."""
    if backend == "gloo":
        return None
    from ncclbench.engine.pathread import latest_label

    return latest_label()
