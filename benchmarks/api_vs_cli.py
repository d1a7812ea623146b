"""ncclbench.measure() inside a torchrun job against the command line, same plan, same GPUs:
does the Python API measure what the CLI measures? Runs them alternately (`--repeats`
times each, so drift on a shared host hits both) and prints a markdown table of the median
time and bandwidth per size and placement, with the ratio API / CLI.

    NCCL_NVLS_ENABLE=0 python benchmarks/api_vs_cli.py --collective all_gather --sizes 1M:1G:x4 --nproc 1

(One GPU: busbw is 0 for every collective at one rank, so time and algbw are compared.)
The rank side (`--rank-side`) is this same file under torchrun."""

import argparse
import os
import subprocess
import sys
from pathlib import Path


def rank_side(args) -> None:
    import torch
    import torch.distributed as dist

    import ncclbench

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    else:  # a dry run of the script on a machine without GPU
        dist.init_process_group("gloo")
    rows = ncclbench.measure(args.collective, args.sizes, iters=args.iters, warmup_iters=args.warmup)
    if rows.has_rows:
        rows.to_pandas().to_csv(args.csv, index=False)
    dist.destroy_process_group()


def cli_args(args, csv: Path) -> list[str]:
    from ncclbench.api.measure import parse_sizes

    s = parse_sizes(args.sizes)
    out = [args.collective, "-b", str(s["minbytes"]), "-e", str(s["maxbytes"]), "-n", str(args.iters),
           "-w", str(args.warmup), "--no-save", "-q", "--csv", str(csv)]
    if "stepfactor" in s:
        out += ["-f", f"{s['stepfactor']:g}"]
    elif "stepbytes" in s:
        out += ["-i", str(s["stepbytes"])]
    import torch

    out += [] if torch.cuda.is_available() else ["--backend", "gloo"]
    return out + (["-g", str(args.nproc)] if args.nproc > 1 else [])


def run_pair(args, k: int, out: Path) -> None:
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    cli = subprocess.run([sys.executable, "-m", "ncclbench", *cli_args(args, out / f"cli_{k}.csv")],
                         env=env, capture_output=True, text=True)
    if cli.returncode:
        sys.exit(f"CLI run {k} failed ({cli.returncode}): {cli.stderr[-2000:]}")
    api = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(args.nproc), __file__, "--rank-side", "--collective", args.collective,
                          "--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup),
                          "--csv", str(out / f"api_{k}.csv")], env=env, capture_output=True, text=True)
    if api.returncode:
        sys.exit(f"API run {k} failed ({api.returncode}): {api.stderr[-2000:]}")


def table(out: Path, repeats: int) -> list[str]:
    import pandas as pd

    def load(kind):
        frames = [pd.read_csv(out / f"{kind}_{k}.csv") for k in range(repeats)]
        return pd.concat(frames).groupby(["size_bytes", "placement"])[["time_us", "algbw_gbps", "busbw_gbps"]]

    cli, api = load("cli").median(), load("api").median()
    lines = ["| size (B) | placement | CLI time (us) | API time (us) | API/CLI time | CLI algbw | API algbw | "
             "CLI busbw | API busbw |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (size, placement), c in cli.iterrows():
        a = api.loc[(size, placement)]
        lines.append(f"| {size} | {placement} | {c.time_us:.2f} | {a.time_us:.2f} | {a.time_us / c.time_us:.3f} | "
                     f"{c.algbw_gbps:.2f} | {a.algbw_gbps:.2f} | {c.busbw_gbps:.2f} | {a.busbw_gbps:.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collective", default="all_gather")
    p.add_argument("--sizes", default="1M:1G:x4")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="api_vs_cli")
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--csv", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_side:
        rank_side(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(args.repeats):
        run_pair(args, k, out)
    print(f"# {args.collective} {args.sizes}, {args.nproc} rank(s), -n {args.iters} -w {args.warmup}, "
          f"median of {args.repeats} alternating runs each")
    print("\n".join(table(out, args.repeats)))


if __name__ == "__main__":
    main()
