#!/usr/bin/env python3
"""Cast speed per dtype pair: numpy's exact casts (files/dtypes.py ``cast_bits``) against torch's,
side by side, one thread, in the 2 MB chunks the conversion casts (files/byte_moves.py CHUNK_BYTES),
numpy's into one reused output array as the conversion's;
and what importing torch costs. files/byte_moves.py ``CAST_RATES`` and ``TORCH_IMPORT_S`` come from
this script's output: a conversion imports torch for its casts only where the time torch's casts
save is larger than the import.

Run: python benchmarks/casts.py [--mb 64] [--repeat 3] [--out benchmarks/results/casts.json]
Values are weights-like (normal, scale 0.02). Rates are GB of source per second (min of --repeat).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PAIRS = [("bfloat16", "float16"), ("bfloat16", "float32"), ("float32", "float16"), ("float32", "bfloat16"),
         ("float16", "float32"), ("float16", "bfloat16")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="MB of source per pair")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    imports = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
               for _ in range(args.repeat)]
    import numpy as np
    import torch

    from trtllm_medusa_ports.files.byte_moves import CHUNK_BYTES
    from trtllm_medusa_ports.files.dtypes import cast_bits, itemsize, to_torch

    torch.set_num_threads(1)
    x = torch.randn(args.mb * 2**20 // 4, generator=torch.Generator().manual_seed(0)) * 0.02
    rows = []
    for src, dst in PAIRS:
        data = x.to(to_torch(src)).view(torch.uint8).numpy()
        # numpy casts into one reused output, as the conversion does (byte_moves ``_chunked``)
        out = np.empty(CHUNK_BYTES // itemsize(src), dtype=np.uint16 if itemsize(dst) == 2 else np.uint32)
        rate = {}
        for kind in ("numpy", "torch"):
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                for i in range(0, data.nbytes, CHUNK_BYTES):
                    chunk = data[i:i + CHUNK_BYTES]
                    if kind == "numpy":
                        cast_bits(chunk, src, dst, out=out[: chunk.nbytes // itemsize(src)])
                    else:
                        torch.frombuffer(chunk, dtype=to_torch(src)).to(to_torch(dst))
                best = min(best, time.perf_counter() - t)
            rate[kind] = data.nbytes / best / 1e9
        rows.append({"src": src, "dst": dst, "numpy_gb_s": round(rate["numpy"], 2), "torch_gb_s": round(rate["torch"], 2),
                     "torch_over_numpy": round(rate["torch"] / rate["numpy"], 2)})
        print(f"{src:>9s} -> {dst:9s} numpy {rate['numpy']:6.2f} GB/s  torch {rate['torch']:6.2f} GB/s  "
              f"torch/numpy {rate['torch'] / rate['numpy']:5.2f}", flush=True)
    print(f"import torch: {min(imports):.2f} s (min of {args.repeat} fresh interpreters)")
    if args.out:
        args.out.write_text(json.dumps({"chunk_bytes": CHUNK_BYTES, "threads": 1, "import_torch_s": round(min(imports), 2),
                                        "pairs": rows, "numpy": np.__version__, "torch": torch.__version__}, indent=2)
                            + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
