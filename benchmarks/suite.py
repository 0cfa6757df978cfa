#!/usr/bin/env python3
"""The test suite's time at two git revisions, run side by side: the README's test command in a clean clone of
each, in turns (A B A B ...), so that a busy or a slow machine weighs on both alike.

For each run (``measure.run_measured``, OMP_NUM_THREADS=1 as every benchmark here; the tests' conftest sets one
torch thread per worker anyway): wall time, CPU time (user + system of pytest and its xdist workers, from
``wait4``), and the number of tests passed. Reported per revision and mode (``parallel``: the README's command, every core;
``serial``: the same with ``-n 0``) as the median of the rounds, and as the ratio of the candidate's median to the
baseline's.

    python3 benchmarks/suite.py fc0fbe1 HEAD                    # 2 rounds in parallel, 1 in serial
    python3 benchmarks/suite.py fc0fbe1 HEAD --rounds 3 --serial_rounds 0

Each revision is cloned into a temporary directory of its own (removed afterwards); the repository is only read.
Results: ``benchmarks/results/suite.json`` (``--output``), with the Python, library versions and CPU they were
measured on (``environment``): compare figures only within one file. Never run by CI: one round is several minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import run_measured  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: the README's test command, as .ci/run calls it
COMMAND = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]


def _clone(revision: str, into: Path) -> tuple[Path, str]:
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", revision], capture_output=True, text=True,
                         check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "-q", sha], check=True)
    return into, sha


def _run(tree: Path, extra: list[str]) -> dict:
    """One run of the suite in ``tree``: wall and CPU seconds (its reaped workers included), tests passed, exit
    code. The tree's own package comes first on ``PYTHONPATH`` (each revision tests its own code, whatever is
    installed)."""
    r = run_measured([*COMMAND, *extra], ok_codes=None, cwd=tree,
                     env={"PYTHONPATH": str(tree) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    found = re.findall(r"(\d+) passed", r["stdout"])
    return {"rc": r["rc"], "wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1),
            "passed": int(found[-1]) if found else 0, "tail": r["stdout"].strip().splitlines()[-1:]}


def _summary(runs: list[dict], baseline: str, candidate: str) -> dict:
    out: dict = {}
    for mode in sorted({r["mode"] for r in runs}):
        per = {}
        for rev in (baseline, candidate):
            mine = [r for r in runs if r["mode"] == mode and r["revision"] == rev]
            per[rev] = {"wall_s": round(statistics.median(r["wall_s"] for r in mine), 1),
                        "cpu_s": round(statistics.median(r["cpu_s"] for r in mine), 1),
                        "passed": sorted({r["passed"] for r in mine}), "rounds": len(mine)}
        out[mode] = {**per, "wall_ratio": round(per[candidate]["wall_s"] / per[baseline]["wall_s"], 3),
                     "cpu_ratio": round(per[candidate]["cpu_s"] / per[baseline]["cpu_s"], 3)}
    return out


def _environment() -> dict:
    """What the figures depend on beyond the code: the interpreter, the libraries the suite runs on, the CPU
    (the same revision has taken 52-57 s on one 2-core machine and 90-130 s on others)."""
    from importlib import metadata

    versions = {}
    for dist in ("torch", "transformers", "safetensors", "pytest", "pytest-xdist"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    cpu = None
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), None)
    return {"python": platform.python_version(), "cpu": cpu, **versions}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline", help="git revision measured first in each round (e.g. the last release)")
    ap.add_argument("candidate", help="git revision compared with it (e.g. HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="parallel runs of each revision (default 2)")
    ap.add_argument("--serial_rounds", type=int, default=1, help="serial (-n 0) runs of each revision (default 1)")
    ap.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "suite.json")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.serial_rounds < 0:
        ap.error("--rounds must be at least 1 and --serial_rounds at least 0")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="suite-bench-") as tmp:
        trees = {}
        for rev in (args.baseline, args.candidate):
            try:
                trees[rev] = _clone(rev, Path(tmp) / f"rev{len(trees)}")
            except subprocess.CalledProcessError as exc:
                ap.error(f"cannot check out {rev!r} from {REPO} ({exc})")
        plan = [("parallel", [])] * args.rounds + [("serial", ["-n", "0"])] * args.serial_rounds
        for i, (mode, extra) in enumerate(plan):
            for rev in (args.baseline, args.candidate):
                tree, sha = trees[rev]
                print(f"[{i + 1}/{len(plan)}] {mode} {rev} ({sha[:7]})...", file=sys.stderr, flush=True)
                r = {"revision": rev, "sha": sha, "mode": mode, **_run(tree, extra)}
                print(f"    {r['wall_s']} s wall, {r['cpu_s']} s CPU, {r['passed']} passed (rc {r['rc']})",
                      file=sys.stderr, flush=True)
                runs.append(r)
    result = {"command": "python3 -m pytest -p no:cacheprovider", "cores": os.cpu_count(),
              "environment": _environment(), "runs": runs,
              "summary": _summary(runs, args.baseline, args.candidate)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
