"""`ncclbench tune` in the user's process: check everything that can be checked, then run
the launches and read what they left.

Why this route (one launch holding a fresh communicator per combination): NCCL reads
NCCL_ALGO and NCCL_PROTO at every communicator's init (src/graph/tuning.cc,
ncclTopoTuneModel, through getenv), and ncclConfig_t's minCTAs/maxCTAs limit one
communicator's channels, so every combination fits in one process. A launch per
combination would pay process start-up, `import torch` (seconds) and the
world communicator's set-up again for each one. What NCCL reads once per process gets a
launch of its own: the debug log that shows its choices (the probe: NCCL_DEBUG=INFO writes
a line per call, which costs host time, so the measured launch runs without it) and, in
--verify, a tuner plugin (NCCL loads it once per process).

Launches (launches.py): the probe (one untimed call per size and combination, NCCL's choices
logged; combinations NCCL refuses are found here and not measured again), then the
measurement (every repeat of every combination, repeats interleaved so drift hits all alike)."""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field

from ncclbench.errors import ExitCode, PlanError, first_line
from ncclbench.tune.launches import PROBE_OVERRIDES, probe_env, run_phase, work_items
from ncclbench.tune.plan import DEFAULT, CandidatePlan, Combination, Context, candidates, unsupported_collective
from ncclbench.tune.paired import PAIRED_MIN_REPEATS
from ncclbench.tune.precision import DEFAULT_GRAPH_REPLAYS, Timing, choose_timing
from ncclbench.tune.ranges import DEFAULT_REPEATS, MIN_REPEATS

# options of the collective commands tune passes on (the rest keep their defaults)
RUN_OPTIONS = ("minbytes", "maxbytes", "stepbytes", "stepfactor", "op", "datatype", "iters", "warmup_iters",
               "check", "timeout", "average", "run_cycles")
CONFLICTING_ENV = {
    "NCCL_ALGO": "tune sets NCCL_ALGO for each combination and measures NCCL's default with it unset",
    "NCCL_PROTO": "tune sets NCCL_PROTO for each combination and measures NCCL's default with it unset",
}
CHANNEL_ENV = ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS")


@dataclass
class TuneRequest:
    collectives: list[str]        # registry names
    options: dict                 # RUN_OPTIONS values
    ngpus: int = 1
    backend: str | None = None
    rehearse: bool = False
    repeat: int = DEFAULT_REPEATS
    channels: tuple = ()
    algos: tuple | None = None
    protos: tuple | None = None
    min_gain: float = 2.0
    output_dir: str | None = None
    verify: str | None = None
    plugin: str | None = None
    plot: bool = True
    timing: str = "auto"          # precision.TIMINGS
    graph_replays: int = DEFAULT_GRAPH_REPLAYS
    nnodes: int = 1               # hosts taking part; each runs `tune ... --node-rank i`
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    paired: int = 0               # > 0: side by side on that many kept communicators per configuration (paired.py)
    metrics_path: str | None = None  # --metrics: Prometheus text of tune.json's verdicts


@dataclass
class Setup:
    request: TuneRequest
    backend: str
    plans: dict[str, CandidatePlan]
    nranks: int
    nnodes: int
    output_dir: str | None
    environ: dict = field(default_factory=dict)   # the NCCL_* variables as the user gave them
    notes: list[str] = field(default_factory=list)
    verify_rows: tuple | None = None              # --verify: (every config row, the rows for this run)
    plugin: object = None                         # --verify: verify.Plugin
    timing: Timing | None = None                  # how every combination is timed
    launches: int = 0                             # launches made so far (several hosts: the port of the next)

    def rendezvous_of(self, launch: int) -> str | None:
        """host:port of launch number `launch` (from 0) when ranks span hosts (None: one host).
        Consecutive launches alternate between two ports, so that a launch never meets the
        store of the one before it while that is still shutting down; every host counts its
        launches alike."""
        if self.nnodes == 1:
            return None
        req = self.request
        return f"{req.master_addr or '127.0.0.1'}:{req.master_port + launch % 2}"


def _fail(message: str, code: int = ExitCode.USAGE) -> PlanError:
    return PlanError(message, code)


def check_environment(request: TuneRequest, environ: dict) -> list[str]:
    """Refuse what would make the default column something else than NCCL's default;
    notes for what changes every column alike."""
    for name, why in CONFLICTING_ENV.items():
        if environ.get(name):
            raise _fail(f"{name}={environ[name]} is set: {why}; unset it")
    if environ.get("NCCL_TUNER_PLUGIN") and not request.verify and environ["NCCL_TUNER_PLUGIN"].lower() != "none":
        raise _fail(f"NCCL_TUNER_PLUGIN={environ['NCCL_TUNER_PLUGIN']} is set: the default column would be that "
                    "plugin's choice; unset it (--verify CONF --plugin SO measures a plugin)")
    notes = []
    limited = [n for n in CHANNEL_ENV if environ.get(n)]
    if limited and request.channels:
        raise _fail(f"{limited[0]}={environ[limited[0]]} is set: it overrides every communicator's channel "
                    "limit, so --channels would measure nothing different; unset it")
    if limited:
        notes.append(f"{', '.join(f'{n}={environ[n]}' for n in limited)} applies to every combination")
    if str(environ.get("NCCL_DEBUG", "")).upper() in ("INFO", "TRACE"):
        notes.append(f"NCCL_DEBUG={environ['NCCL_DEBUG']} is set: NCCL logs every call, which the times include")
    return notes


def requested_backend(request: TuneRequest) -> str:
    """nccl, or gloo for a rehearsal; one line saying what tune can do elsewhere."""
    if request.backend == "cupy":
        raise _fail("tune runs on torch.distributed's NCCL (--backend nccl): the cupy backend's communicators "
                    "are not rebuilt per combination")
    if request.rehearse:
        if request.backend not in (None, "gloo"):
            raise _fail("--rehearse runs on the gloo backend (drop --backend or use --backend gloo)")
        if request.verify:
            raise _fail("--verify measures NCCL with a tuner plugin: it cannot be rehearsed on gloo")
        return "gloo"
    if request.backend == "gloo":
        raise _fail("the gloo backend has no NCCL: NCCL_ALGO/NCCL_PROTO select nothing there, so there is "
                    "nothing to tune; --rehearse runs the same launches, table and files on gloo without "
                    "calling any winner")
    return "nccl"


def check_gpus(request: TuneRequest) -> None:
    from ncclbench.topology.visible import visible_gpu_count

    visible = visible_gpu_count()
    if visible == 0:
        raise PlanError("tune needs NCCL on CUDA GPUs and none is visible; --rehearse runs the launches, table "
                        "and files on the CPU (gloo) without calling any winner", ExitCode.BAD_GPU_COUNT)
    if request.ngpus > visible:
        raise PlanError(f"-g {request.ngpus} asks for more GPUs than the {visible} visible", ExitCode.BAD_GPU_COUNT)


def check_request(request: TuneRequest) -> None:
    """What the command line alone can be refused for."""
    from ncclbench.launch import launcher as launch

    if launch.detect().launcher != "none":
        raise _fail("tune starts its own launches (-g N ranks on this node): NCCL reads its debug log and tuner "
                    "plugin once per process; run it outside torchrun/srun/mpirun")
    if request.ngpus < 1:
        raise _fail(f"-g must be at least 1 (got {request.ngpus})")
    if request.nnodes < 1 or not 0 <= request.node_rank < request.nnodes:
        raise _fail(f"--node-rank {request.node_rank} is not one of the {request.nnodes} node(s) of --nnodes")
    if request.nnodes > 1 and not request.master_addr:
        raise _fail("--nnodes > 1 needs --master-addr (node 0's address, the same on every node)")
    if request.repeat < 1:
        raise _fail(f"--repeat must be at least 1 (got {request.repeat})")
    if request.verify and request.repeat < MIN_REPEATS:
        raise _fail(f"--verify needs --repeat {MIN_REPEATS} or more to tell a slower size from noise "
                    f"(got {request.repeat}; default {DEFAULT_REPEATS})")
    if request.paired < 0 or request.paired == 1:
        raise _fail(f"--paired must be 0 (off) or 2 or more communicators per configuration (got {request.paired}): "
                    "one says nothing of how communicators differ")
    if request.paired and request.verify:
        raise _fail("--paired does not apply to --verify: NCCL loads a tuner plugin once per process, so the default "
                    "and the plugin cannot run side by side in one launch")
    if request.paired and request.repeat < max(PAIRED_MIN_REPEATS, request.paired):
        raise _fail(f"--paired {request.paired} needs --repeat {max(PAIRED_MIN_REPEATS, request.paired)} or more "
                    f"(every communicator set used, and {PAIRED_MIN_REPEATS} repeats side by side for an interval); "
                    f"got {request.repeat}")
    for coll in request.collectives:
        why = unsupported_collective(coll)
        if why:
            raise _fail(f"tune {coll}: {why}")
    cycles = request.options.get("run_cycles", 1)
    if not isinstance(cycles, int) or cycles < 1:
        raise _fail(f"-N/--run_cycles must be at least 1 for tune (got {cycles!r}): every repeat ends")
    if not request.options.get("check"):
        raise _fail("tune always checks results (-c 1 or more): a forced protocol skips NCCL's own safety check")
    for key in ("datatype", "op"):
        if str(request.options.get(key, "")).strip().lower() == "all":
            raise _fail(f"tune measures one {'datatype' if key == 'datatype' else 'reduction op'}; `all` is not taken")


def candidate_plans(request: TuneRequest, ctx: Context, backend: str) -> dict[str, CandidatePlan]:
    from ncclbench.api import options as plan_options

    plans = {}
    for coll in request.collectives:
        plan_options.checked_plan(coll, request.options, backend, ["tune"], ctx.nranks)
        try:
            plans[coll] = candidates(coll, ctx, request.algos, request.protos, request.channels)
        except ValueError as exc:
            raise _fail(str(exc)) from None
        if not plans[coll].combos and ctx.nranks > 1:
            raise _fail(f"nothing to measure for {coll} besides the default: {'; '.join(plans[coll].notes())}")
    return plans


def prepare(request: TuneRequest, environ=None) -> Setup:
    """Everything checked before the first launch (PlanError: one line, exit 2; 5 without
    the GPUs asked for), cheapest first."""
    environ = dict(os.environ if environ is None else environ)
    check_request(request)
    backend = requested_backend(request)
    notes = check_environment(request, environ)
    nranks, nnodes = request.ngpus * request.nnodes, request.nnodes
    ctx = Context(nranks, nnodes, {k: v for k, v in environ.items() if k.startswith("NCCL_")},
                  str(request.options.get("op", "sum")).strip().lower())
    setup = Setup(request, backend, candidate_plans(request, ctx, backend), nranks, nnodes, None, ctx.environ, notes)
    try:
        setup.timing = choose_timing(backend, request.timing, request.graph_replays, int(request.options.get("iters", 20)),
                                     int(request.options.get("run_cycles", 1)))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if setup.timing.mode == "graph" and environ.get("NCCL_GRAPH_REGISTER", "0") != "0":
        notes.append(f"NCCL_GRAPH_REGISTER={environ['NCCL_GRAPH_REGISTER']} is replaced by 0 in the timed launches: "
                     "the tuner rows are for unregistered buffers")
    if request.verify:
        from ncclbench.tune.verify import check_plugin, nccl_version, relevant_rows

        config = read_verify_config(request.verify)
        setup.verify_rows = (config, relevant_rows(setup, config))
        setup.plugin = check_plugin(request.plugin, nccl_version)
    if backend == "nccl":
        check_gpus(request)
        if request.channels:
            check_channel_support()
    setup.output_dir = prepare_output(request.output_dir)
    return setup


def read_verify_config(path: str):
    from ncclbench.tune.files import read_config

    try:
        return read_config(path)
    except ValueError as exc:
        raise _fail(f"--verify {exc}") from None


def check_channel_support() -> None:
    import torch.distributed as dist

    options = getattr(dist, "ProcessGroupNCCL", None)
    if options is None or not hasattr(options.Options(), "config"):
        raise _fail("--channels needs torch's ProcessGroupNCCL.Options().config (ncclConfig_t minCTAs/maxCTAs), "
                    "which this torch lacks")


def prepare_output(folder: str | None) -> str:
    from ncclbench.results.output import default_results_dir, probe_directory

    if folder is None:
        folder = os.path.join(default_results_dir(), "tune-" + _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    for part in ("raw", "probe", "verify", "launches", "confirm"):
        if os.path.exists(os.path.join(folder, part)):
            raise _fail(f"{folder} already holds a tune run ({part}/); choose another -o/--output-dir")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise _fail(f"cannot create output folder {folder}: {exc.strerror}") from None
    probe_directory(folder, f"cannot write to output folder {folder}")
    return folder


# ---- the whole run ----------------------------------------------------------------------------
def run_tune(request: TuneRequest) -> int:
    if request.nnodes > 1 and request.node_rank > 0:
        from ncclbench.tune.follow import run_follower
        from ncclbench.tune.launches import spawn

        return run_follower(prepare_follower(request), spawn)
    try:
        setup = prepare(request)
    except Exception as exc:
        if request.nnodes > 1:
            release_followers(request, first_line(exc, 300))
        raise
    try:
        return execute(setup)
    finally:
        if setup.nnodes > 1:
            end_followers(setup)


def prepare_follower(request: TuneRequest) -> Setup:
    """A following host checks what it can alone; node 0 checks the rest."""
    check_request(request)
    backend = requested_backend(request)
    if backend == "nccl":
        check_gpus(request)
    return Setup(request, backend, {}, request.ngpus * request.nnodes, request.nnodes, None)


def end_followers(setup: Setup, rdzv_timeout_s: int | None = None, refused: str | None = None) -> None:
    """The run's last launch: following hosts read that it is over (or that node 0 refused
    it, and why) and stop."""
    from ncclbench.tune.follow import end_work
    from ncclbench.tune.launches import spawn

    folder = os.path.join(setup.output_dir, "launches")
    os.makedirs(folder, exist_ok=True)
    spawn(setup, ["tune", "--worker", end_work(folder, refused)], {}, rdzv_timeout_s)


RELEASE_WAIT_S = 30   # how long node 0, refused before its first launch, waits for the other nodes


def release_followers(request: TuneRequest, why: str) -> None:
    """Node 0 refused the run before its first launch, for a reason the other nodes do not
    check (its environment, output folder, --verify file or plugin): without the run's last
    launch they would wait in their first rendezvous for torchrun's 600 s. That launch is
    made, telling them `why`, waiting for them RELEASE_WAIT_S at most (in a scratch folder,
    removed after); where the other nodes refuse the run alike (check_request, the
    backend), they are gone already and nothing is made."""
    import shutil
    import tempfile

    try:
        check_request(request)
        backend = requested_backend(request)
    except PlanError:
        return
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix="ncclbench-tune-refused-")
        setup = Setup(request, backend, {}, request.ngpus * request.nnodes, request.nnodes, folder)
        end_followers(setup, RELEASE_WAIT_S, refused=why)
    except Exception:  # noqa: BLE001 - node 0's own error is the one to say
        pass
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def execute(setup: Setup) -> int:
    """The launches and the report of a prepared run."""
    request = setup.request
    if request.verify:
        from ncclbench.tune.verify import run_verify

        return run_verify(setup)
    from ncclbench.tune.report import finish

    probe_items, probe_results, worlds = [], {}, {}
    if setup.backend == "nccl":
        folder = os.path.join(setup.output_dir, "probe")
        probe_items = work_items(setup, lambda c: [DEFAULT, *setup.plans[c].combos], 1, csv=False, timing="eager")
        probe_results, worlds, code = run_phase(setup, "probe", probe_items, probe_env(folder), PROBE_OVERRIDES,
                                                outputs=False)
        if code == ExitCode.INTERRUPTED:
            return finish(setup, probe_items, probe_results, worlds, [], {}, interrupted=True)
    runnable = runnable_combos(setup, probe_items, probe_results)
    items = work_items(setup, lambda c: runnable[c], request.repeat, csv=True, paired=request.paired)
    results, _worlds, code = run_phase(setup, "raw", items, setup.timing.env)
    return finish(setup, probe_items, probe_results, worlds, items, results,
                  interrupted=code == ExitCode.INTERRUPTED,
                  confirm=lambda winners, sizes: confirm_launch(setup, winners, sizes))


def confirm_launch(setup: Setup, winners: dict[str, list[Combination]], sizes: list[int]):
    """Launch 2: NCCL's default and every combination that won somewhere in launch 1, timed
    the same way, repeats interleaved, in fresh processes, over the part of the sweep that
    holds the winning sizes. (items, results, exit code)."""
    items = work_items(setup, lambda c: [DEFAULT, *winners[c]] if c in winners else [], setup.request.repeat,
                       csv=False, paired=setup.request.paired)
    results, _worlds, code = run_phase(setup, "confirm", items, setup.timing.env, sweep_span(setup, sizes))
    return items, results, code


def sweep_span(setup: Setup, sizes: list[int]) -> dict:
    """-b/-e for the sizes of the run's sweep from the last one at or below the smallest of
    `sizes` to the first at or above the largest (a printed size can be a little below the
    size asked for): the same sizes as launch 1 there, none outside."""
    from ncclbench.api import options as plan_options

    swept = sorted({s for coll in setup.request.collectives for s in plan_options.checked_plan(
        coll, setup.request.options, setup.backend, ["tune"], setup.nranks).sizes()})
    if not sizes or not swept:
        return {}
    low = max([s for s in swept if s <= min(sizes)], default=swept[0])
    high = min([s for s in swept if s >= max(sizes)], default=swept[-1])
    return {"minbytes": low, "maxbytes": high}


def runnable_combos(setup: Setup, probe_items, probe_results) -> dict[str, list[Combination]]:
    """The default and every combination the probe ran cleanly (all of them on gloo)."""
    out = {c: [DEFAULT, *setup.plans[c].combos] for c in setup.request.collectives}
    if not probe_items:
        return out
    ok = {(it["collective"], Combination.from_dict(it["combo"])) for it in probe_items
          if probe_results.get(it["index"]) and probe_results[it["index"]].status == "ok"}
    return {c: [DEFAULT] + [k for k in setup.plans[c].combos if (c, k) in ok] for c in out}
