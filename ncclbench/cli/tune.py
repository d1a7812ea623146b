"""`ncclbench tune`: the command line. Parsing only; the work is in run, rank and verify."""

from __future__ import annotations

import os
import sys

import click

from ncclbench.api.params import ALL_GPUS, CPU_RANKS_FOR_ALL, GPU_COUNT, FiniteFloat, SIZE, metrics_option

from ncclbench.cli.types import GetoptCommand
from ncclbench.errors import PlanError
from ncclbench.tune.precision import DEFAULT_GRAPH_REPLAYS
from ncclbench.tune.ranges import DEFAULT_REPEATS, MIN_REPEATS

_OPS = ("sum", "prod", "min", "max", "avg", "mulsum", "all")


class TuneCommand(GetoptCommand):
    """tune's -o was its output folder until -o became the reduction op's letter in every
    command: `-o PATH` (a path with a slash, or a folder that exists) still names the
    folder, with a notice; any other word is the op (docs/design/one-grammar.md)."""

    old_spellings = {"--output-dir": "--out"}

    def renamed(self, name, value):
        if name == "-o" and value is not None and value.strip().lower() not in _OPS \
                and ("/" in value or os.path.isdir(value)):
            return "--out"
        return super().renamed(name, value)


@click.command("tune", cls=TuneCommand)
@click.argument("collectives", nargs=-1)
@click.option("-g", "--ngpus", type=GPU_COUNT, default=1, show_default=True,
              help="Local ranks to spawn, one GPU each; all: one per visible GPU.")
@click.option("-b", "--minbytes", type=SIZE, default="8", show_default=True, help="Minimum size.")
@click.option("-e", "--maxbytes", type=SIZE, default="1G", show_default=True, help="Maximum size.")
@click.option("-i", "--stepbytes", type=SIZE, default="1M", show_default=True, help="Size increment without -f.")
@click.option("-f", "--stepfactor", type=FiniteFloat(), default=2.0, show_default=True, help="Size multiplication factor.")
@click.option("-n", "--iters", type=click.IntRange(min=1), default=20, show_default=True, help="Timed iterations per size.")
@click.option("-w", "--warmup_iters", "warmup_iters", type=click.IntRange(min=0), default=5, show_default=True,
              help="Warm-up iterations (5, not the collectives' 1: each combination starts on a new communicator, "
              "whose first ops also set up its connections).")
@click.option("-N", "--run_cycles", "run_cycles", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sweeps per repeat: each size measured this many times, spread over the repeat, and the median "
              "kept (where a path's speed wanders within a run, e.g. TCP sockets between hosts).")
@click.option("-d", "--datatype", default="float", show_default=True, help="One datatype.")
@click.option("-o", "--op", default="sum", show_default=True, help="One reduction op.")
@click.option("-c", "--check", type=click.IntRange(min=0), default=1, show_default=True,
              help="Result checks per size (at least 1: a forced protocol skips NCCL's own safety check).")
@click.option("-a", "--average", type=click.IntRange(0, 3), default=1, show_default=True,
              help="Time across ranks: 0 rank 0, 1 mean, 2 min, 3 max.")
@click.option("-T", "--timeout", type=FiniteFloat(min=0), default=300.0, show_default=True,
              help="Seconds one size may take; a combination that hangs is reported and the rest go on (300, not the "
              "collectives' 600: each hanging combination costs this much).")
@click.option("--repeat", type=int, default=DEFAULT_REPEATS, show_default=True,
              help=f"Measure every combination this many times (interleaved): the noise a win must clear; no win "
              f"and no --verify under {MIN_REPEATS}.")
@click.option("--paired", type=int, default=0, show_default=True, metavar="C",
              help="Side by side: C communicators per configuration kept for the launch, every configuration run "
              "back to back in each repeat, judged by the 95 % interval of its median ratio to the default (across "
              "hosts, where communicators differ: 8 sets or more and --repeat 40 or more; 2 sets can tell nothing). 0: a "
              "fresh communicator per repeat.")
@click.option("--min-gain", type=FiniteFloat(min=0), default=2.0, show_default=True,
              help="Smallest gain over NCCL's default, in %, worth calling a win.")
@click.option("--algos", default=None, help="Only these algorithms (tree,ring,nvls,nvls_tree,pat,collnet_direct,collnet_chain).")
@click.option("--protos", default=None, help="Only these protocols (ll,ll128,simple).")
@click.option("--channels", default=None, help="Also run each combination limited to these channel counts (e.g. 8,16,32).")
@click.option("-O", "--out", "output_dir", default=None, help="Folder for the results (default results/tune-<time>).")
@click.option("--backend", type=click.Choice(["nccl", "gloo", "cupy"]), default=None, help="nccl (the only one with "
              "something to tune); gloo only with --rehearse.")
@click.option("--rehearse", is_flag=True, help="Run the launches, table and files on gloo (CPU) to check a set-up; "
              "no winner is called.")
@click.option("--verify", "verify_conf", default=None, help="A tuner config (NCCL's example plugin format) to check.")
@click.option("--plugin", default=None, help="With --verify: the built example tuner plugin (.so).")
@click.option("--no-plot", is_flag=True, help="Do not draw the busbw plot.")
@click.option("--timing", type=click.Choice(["auto", "graph", "eager"]), default="auto", show_default=True,
              help="auto: CUDA-graph replay on GPUs (no host noise), eager on gloo.")
@click.option("-G", "--cudagraph", "graph_replays", type=int, default=DEFAULT_GRAPH_REPLAYS, show_default=True,
              help="Graph replays per measurement (each replays -n ops) when timing by graph.")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Hosts taking part: run the same command on each, with its --node-rank.")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="This host's index.")
@click.option("--master-addr", default=None, help="With --nnodes > 1: node 0's address.")
@click.option("--master-port", type=click.IntRange(1, 65534), default=29500, show_default=True,
              help="With --nnodes > 1: the rendezvous ports (this one and the next, alternately).")
@metrics_option
@click.option("--worker", default=None, hidden=True)
def tune_command(collectives, ngpus, minbytes, maxbytes, stepbytes, stepfactor, iters, warmup_iters, run_cycles,
                 datatype, op,
                 check, average, timeout, repeat, paired, min_gain, algos, protos, channels, output_dir, backend,
                 rehearse,
                 verify_conf, plugin, no_plot, timing, graph_replays, nnodes, node_rank, master_addr, master_port,
                 worker, metrics_path):
    """Find the sizes where forcing an NCCL algorithm/protocol (NCCL_ALGO x NCCL_PROTO, and
    channel limits) beats NCCL's own choice beyond run-to-run noise, and write a config for
    NCCL's example tuner plugin: those sizes, and NCCL's own choice at every other size.
    --verify measures a config deployed against NCCL's default at every size
    (docs/tuning.md)."""
    if worker:
        from ncclbench.tune.rank import run_worker

        sys.exit(int(run_worker(worker, backend or "nccl", timeout)))
    from ncclbench.tune.run import TuneRequest, run_tune

    request = TuneRequest(
        collectives=collective_names(collectives), ngpus=local_ranks(ngpus), backend=backend, rehearse=rehearse, repeat=repeat,
        options={"minbytes": minbytes, "maxbytes": maxbytes, "stepbytes": stepbytes, "stepfactor": stepfactor,
                 "op": op, "datatype": datatype, "iters": iters, "warmup_iters": warmup_iters, "check": check,
                 "timeout": timeout, "average": average, "run_cycles": run_cycles},
        channels=parsed(channels, "channels"), algos=parsed(algos, "algorithm"), protos=parsed(protos, "protocol"),
        min_gain=min_gain, output_dir=output_dir, verify=verify_conf, plugin=plugin,
        plot=not no_plot, timing=timing, graph_replays=graph_replays, nnodes=nnodes, node_rank=node_rank,
        master_addr=master_addr, master_port=master_port, paired=paired, metrics_path=metrics_path)
    if op.strip().lower() not in _OPS:
        raise PlanError(f"unknown op {op!r}: -o is the reduction op ({', '.join(_OPS)}); the output folder "
                        "is -O/--out")
    if bool(verify_conf) != bool(plugin):
        raise PlanError("--verify CONF and --plugin SO go together (the plugin reads the config)")
    sys.exit(int(run_tune(request)))


def collective_names(names) -> list[str]:
    from ncclbench.engine.collectives import lookup

    if not names:
        raise PlanError("name one or more collectives to tune (e.g. ncclbench tune allreduce -g 8)")
    out = []
    for name in names:
        try:
            coll = lookup(name).name
        except KeyError:
            raise PlanError(f"unknown collective {name!r}") from None
        if coll not in out:
            out.append(coll)
    return out


def parsed(text, kind):
    from ncclbench.tune.plan import parse_channels, parse_names

    try:
        return parse_channels(text) if kind == "channels" else parse_names(text, kind)
    except ValueError as exc:
        raise PlanError(f"--{'algos' if kind == 'algorithm' else 'protos' if kind == 'protocol' else kind}: {exc}") \
            from None


def local_ranks(ngpus) -> int:
    """-g as a count: `all` is one rank per visible GPU (CPU_RANKS_FOR_ALL for --rehearse
    without one; tune refuses a GPU run without GPUs later, saying why)."""
    if ngpus != ALL_GPUS:
        return ngpus
    from ncclbench.topology.visible import visible_gpu_count

    return visible_gpu_count() or CPU_RANKS_FOR_ALL
