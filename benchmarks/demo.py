#!/usr/bin/env python3
"""The README's demo (`trtllm-medusa demo`) end to end, on an idle machine and with every core kept busy by other
processes: the wall time of each run, and each step's start as the demo prints it.

    python benchmarks/demo.py [--repeat 2] [--out FILE]

Each run is a fresh `trtllm-medusa demo --workdir TMP` (the package's console script, as a user runs it). The busy
case starts one endless Python loop a core (``os.sched_getaffinity``) 3 s before the demo, so that the load average
the demo's thread rule reads (threads.default_threads) has begun to rise, and stops them after it; the machine is
given 20 s to settle between runs. --threads_default also runs each case with the package's thread rule replaced
by torch's own default of a thread a core (in ``python -c``, not a switch of the package): the baseline the rule is
measured against.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY = "while True: pass"
#: the demo with the package's thread rule replaced by torch's own default (the baseline)
TORCH_DEFAULT = ("import sys, torch; import trtllm_medusa_ports.machine.threads as t; "
                 "t.default_threads = lambda: torch.get_num_threads(); "
                 "from trtllm_medusa_ports.cli import main; sys.exit(main(['demo', '--workdir', sys.argv[1]]))")


def one_run(busy: int, rule: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="demo-bench-")) / "out"
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        if busy:
            time.sleep(3)
        load = os.getloadavg()[0]
        cmd = (["trtllm-medusa", "demo", "--workdir", str(work)] if rule
               else [sys.executable, "-c", TORCH_DEFAULT, str(work)])
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    finally:
        for p in loops:
            p.kill()
            p.wait()
        shutil.rmtree(work.parent, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"the demo failed ({done.returncode}):\n{done.stderr[-3000:]}")
    steps = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\[(\d)/6\]\s+([\d.]+) s", done.stderr, re.M)}
    return {"wall_s": round(wall, 1), "load_average_at_start": round(load, 2), "step_starts_s": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads_default", action="store_true",
                    help="also run each case with torch's default threads (the baseline of the thread rule)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    cases = [("idle", 0, True), (f"{cores} busy processes", cores, True)]
    if args.threads_default:
        cases += [("idle, torch default threads", 0, False),
                  (f"{cores} busy processes, torch default threads", cores, False)]
    results = {}
    for name, busy, rule in cases:
        runs = []
        for _ in range(args.repeat):
            time.sleep(20)  # the load average of the run before settles
            runs.append(one_run(busy, rule))
            print(name, json.dumps(runs[-1]), file=sys.stderr)
        results[name] = {"runs": runs, "best_wall_s": min(r["wall_s"] for r in runs)}
    out = {"cores": cores, "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0], "results": results}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
