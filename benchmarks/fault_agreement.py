"""`pairs`, `preflight` and `fleet` on 4 simulated hosts that are real network hosts
(tests/netsim.py: namespaces, own hostname, a bridge), one rank each: RUNS runs of each
command in each case (healthy; host 2's NIC capped; the link host1 <-> host3 capped), and
per command and case how often the answer was right: healthy, nothing drained and no link;
NIC, host 2 drained alone; link, that host pair under `links` and nothing drained. Needs
root. With --gpu, NCCL over sockets between the hosts, the hosts sharing GPU 0 under CUDA
MPS (NCCL_NVLS_ENABLE is left to the caller's environment).

    python benchmarks/fault_agreement.py --runs 5 [--rate 200mbit] [--gpu] [--load N] [--out results.jsonl]

--load N keeps N busy loops running on the CPU through every run (false alarms under load).

Prints one line per run and the table docs/BENCHMARKS.md quotes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import netsim  # noqa: E402

COMMANDS = {
    "pairs": ["pairs", "-b", "1M", "-n", "5", "-T", "60"],
    "preflight": ["preflight", "--budget", "4", "-T", "60"],
    "fleet": ["fleet", "-T", "20"],
}
WANT = {"healthy": ([], []), "nic": (["simnode2"], []), "link": ([], [["simnode1", "simnode3"]])}
# preflight alone (--cases alone --commands preflight): host 2's rank 100 us late per collective,
# about 2x its op alone on a GPU; `pairs` and `fleet` do not time a rank's op alone
WANT["alone"] = (["simnode2"], [])
CASE_ENV = {"alone": {"NCCLBENCH_FAULT": "slow:rank=2,us=100"}}


def one_run(command: str, case: str, rate: str, gpu: bool, folder: str, k: int) -> dict:
    out = os.path.join(folder, f"{command}-{case}-{k}.json")
    backend = ["--backend", "nccl" if gpu else "gloo"]
    gpus = ["0"] * 4 if gpu else None
    began = time.monotonic()
    with netsim.SimFleet(4, gpus=gpus, mps=gpu) as fleet:
        if case == "nic":
            fleet.slow_nic(2, rate)
        elif case == "link":
            fleet.slow_link(1, 3, rate)
        argv = [sys.executable, "-m", "ncclbench", *COMMANDS[command], *backend, "--json", out]
        procs = [fleet.start(i, argv, 1, port=29571, env=CASE_ENV.get(case)) for i in range(4)]
        try:
            stdout, stderr = procs[0].communicate(timeout=400)
            for p in procs[1:]:
                p.communicate(timeout=120)
        except Exception as exc:  # noqa: BLE001 - a run that hangs is a result too
            return {"command": command, "case": case, "error": f"{type(exc).__name__}: {exc}"}
    took = time.monotonic() - began
    if not os.path.exists(out):
        return {"command": command, "case": case, "error": (stderr or "")[-300:], "exit": procs[0].returncode}
    doc = json.loads(Path(out).read_text())
    drain, links = doc["drain"], [link["hosts"] for link in doc["links"]]
    right = (drain, links) == WANT[case]
    said = {h["host"]: h.get("evidence") for h in doc.get("hosts", []) if h.get("verdict") != "ok"}
    return {"command": command, "case": case, "exit": procs[0].returncode, "drain": drain, "links": links,
            "right": right, "margins": doc.get("margins"), "seconds": round(took, 1),
            **({} if right else {"evidence": said, "notes": doc.get("notes")})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--cases", default="healthy,nic,link")
    ap.add_argument("--out", default=None, help="append one JSON line per run")
    ap.add_argument("--load", type=int, default=0, help="busy loops on the CPU through every run")
    a = ap.parse_args()
    why = netsim.why_not()
    if why:
        sys.exit(f"fault_agreement: {why}")
    results = []
    load = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(a.load)]
    try:
        run_all(a, results)
    finally:
        for p in load:
            p.kill()
            p.wait()
    print("\n| command | case | right | wrong (what was said) |\n|---|---|---|---|")
    for command in a.commands.split(","):
        for case in a.cases.split(","):
            mine = [r for r in results if r["command"] == command and r["case"] == case]
            wrong = [r for r in mine if not r.get("right")]
            said = "; ".join(r.get("error") or f"drain {r['drain']} links {r['links']}" for r in wrong)
            secs = [r["seconds"] for r in mine if "seconds" in r]
            took = f" ({min(secs):.0f}-{max(secs):.0f} s)" if secs else ""
            print(f"| {command} | {case} | {len(mine) - len(wrong)} of {len(mine)}{took} | {said} |")


def run_all(a, results: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for k in range(a.runs):
            for case in a.cases.split(","):
                for command in a.commands.split(","):
                    r = one_run(command, case, a.rate, a.gpu, folder, k)
                    results.append(r)
                    print(json.dumps(r), flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
