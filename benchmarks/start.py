#!/usr/bin/env python3
"""Where a small conversion's fixed time goes, piece by piece, beside `cp -r` of the same inputs.

    python benchmarks/start.py [--size 0.5] [--repeat 5] [--workdir DIR] [--out FILE]

On `benchmarks/convert.py`'s inputs of --size GB (float16 Qwen2 + 4 heads, built there and cached in
the same --workdir), each step runs in a fresh interpreter and adds one stage to the one before:
1. start and exit the interpreter (`python -c pass`);
2. import numpy and the package (`import trtllm_medusa_ports.conversion.convert`);
3. read and validate every header and plan every byte move (the conversion, stopped just before
   its first write);
4. the whole conversion (tp 2, float16, into a new directory).
Each figure is the fastest of --repeat runs, each after `os.sync()` and a 1 s pause. The pieces are
the differences between steps; `cp -r` is timed the same way. The package is byte-compiled first,
as an installed copy is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PLAN_ONLY = """
import sys
from pathlib import Path
from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
from trtllm_medusa_ports.files import byte_moves

class Planned(Exception):
    pass

def stop(*a, **k):
    raise Planned
byte_moves.ByteMover.run = stop
try:
    convert(ConvertOptions(model_dir=Path(sys.argv[1]), medusa_model_dir=Path(sys.argv[2]),
                           output_dir=Path(sys.argv[3]), dtype="float16", tp_size=2, quiet=True))
except Planned:
    pass
else:
    raise SystemExit("the conversion wrote nothing through ByteMover: nothing was timed")
"""
FULL = """
import sys
from pathlib import Path
from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
convert(ConvertOptions(model_dir=Path(sys.argv[1]), medusa_model_dir=Path(sys.argv[2]),
                       output_dir=Path(sys.argv[3]), dtype="float16", tp_size=2, quiet=True))
"""


def main() -> int:
    from convert import compile_package, helper

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=0.5, help="base size in GB (benchmarks/convert.py's inputs)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "trtllm-medusa-bench",
                    help="benchmarks/convert.py's --workdir (inputs and shape cache)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    compile_package()
    paths = helper("--_build", json.dumps([str(args.workdir), args.size, "float16", True]))
    base, heads = paths["base"], paths["heads"]
    dst = args.workdir / "out-start"
    env = dict(os.environ, TRTLLM_MEDUSA_CACHE=str(args.workdir / "shape-cache"))
    py = sys.executable
    steps = {
        "interpreter": [py, "-c", "pass"],
        "imports": [py, "-c", "import trtllm_medusa_ports.conversion.convert"],
        "headers_and_plan": [py, "-c", PLAN_ONLY, base, heads, str(dst)],
        "conversion": [py, "-c", FULL, base, heads, str(dst)],
        "cp": ["cp", "-r", base, heads, str(dst) + "/"],
    }
    subprocess.run(steps["conversion"], env=env, check=True)  # fills the shape cache, as any first conversion
    best = {k: float("inf") for k in steps}
    for _ in range(args.repeat):
        for name, cmd in steps.items():
            shutil.rmtree(dst, ignore_errors=True)
            if name == "cp":
                dst.mkdir(parents=True)
            os.sync()
            time.sleep(1)
            t = time.perf_counter()
            subprocess.run(cmd, env=env, check=True)
            best[name] = min(best[name], time.perf_counter() - t)
    shutil.rmtree(dst, ignore_errors=True)
    order = ["interpreter", "imports", "headers_and_plan", "conversion"]
    pieces = {order[0]: best[order[0]]}
    for prev, cur in zip(order, order[1:]):
        pieces[cur if cur != "conversion" else "writing"] = best[cur] - best[prev]
    res = {"size_gb": args.size, "repeat": args.repeat, "cumulative_s": {k: round(v, 3) for k, v in best.items()},
           "pieces_s": {k: round(v, 3) for k, v in pieces.items()},
           "start_before_writing_s": round(best["headers_and_plan"], 3),
           "ours_over_cp": round(best["conversion"] / best["cp"], 2)}
    for k, v in pieces.items():
        print(f"{k:18s} {v:6.3f} s")
    print(f"{'conversion':18s} {best['conversion']:6.3f} s   cp -r {best['cp']:.3f} s   ours/cp "
          f"{res['ours_over_cp']:.2f}   before the first byte: {best['headers_and_plan']:.3f} s")
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
