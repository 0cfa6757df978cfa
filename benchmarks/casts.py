#!/usr/bin/env python3
"""Cast speed per dtype pair: numpy's exact casts (files/dtypes.py ``cast_bits``) against torch's,
side by side, one thread, in the 2 MB chunks the conversion casts (files/byte_moves.py CHUNK_BYTES),
numpy's into one reused output array as the conversion's; what importing torch costs; then the
bfloat16 -> float16 cast and the NaN/Inf check on one and on two threads per numpy block size.
files/byte_moves.py ``CAST_RATES``, ``TORCH_IMPORT_S`` and ``_CHECK_BLOCK`` and files/dtypes.py
``_BLOCK`` come from this script's output: a conversion imports torch for its casts only where the
time torch's casts save is larger than the import.

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
    blocks = two_lanes(x, args.repeat)
    if args.out:
        args.out.write_text(json.dumps({"chunk_bytes": CHUNK_BYTES, "threads": 1, "import_torch_s": round(min(imports), 2),
                                        "pairs": rows, "two_lanes_by_block": blocks, "numpy": np.__version__,
                                        "torch": torch.__version__}, indent=2) + "\n")
    return 0


def two_lanes(x, repeat: int) -> list[dict]:
    """bfloat16 -> float16 casts and NaN/Inf checks of CHUNK_BYTES chunks on one thread and on two
    side by side (the conversion's two lanes), per numpy block size (files/dtypes.py ``_BLOCK``,
    files/byte_moves.py ``_CHECK_BLOCK``): every numpy call takes the GIL, so small blocks make two
    lanes queue on it. GB/s of source in all."""
    import threading

    import numpy as np
    import torch

    from trtllm_medusa_ports.files import byte_moves, dtypes
    from trtllm_medusa_ports.files.byte_moves import CHUNK_BYTES

    data = x.to(torch.bfloat16).view(torch.uint8).numpy()
    halves = x.to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    chunks = [data[i:i + CHUNK_BYTES] for i in range(0, data.nbytes, CHUNK_BYTES)]
    checks = [halves[i:i + CHUNK_BYTES // 2] for i in range(0, halves.size, CHUNK_BYTES // 2)]
    saved = dtypes._BLOCK, byte_moves._CHECK_BLOCK

    def cast(part: list) -> None:
        out = np.empty(CHUNK_BYTES // 2, dtype=np.uint16)
        for c in part:
            dtypes.cast_bits(c, "bfloat16", "float16", out=out[: c.nbytes // 2])

    def check(part: list) -> None:
        for c in part:
            assert not byte_moves._non_finite(c, 0x7C00)

    def rate(work, items: list, threads: int) -> float:
        best = float("inf")
        for _ in range(repeat):
            th = [threading.Thread(target=work, args=(items[i::threads],)) for i in range(threads)]
            t = time.perf_counter()
            for a in th:
                a.start()
            for a in th:
                a.join()
            best = min(best, time.perf_counter() - t)
        return sum(i.nbytes for i in items) / best / 1e9

    rows = []
    try:
        for log2 in (14, 16, 18, 20):
            dtypes._BLOCK = byte_moves._CHECK_BLOCK = 1 << log2
            row = {"block_elements": 1 << log2}
            for name, work, items in (("cast", cast, chunks), ("check", check, checks)):
                for threads in (1, 2):
                    row[f"{name}_{threads}_thread_gb_s"] = round(rate(work, items, threads), 2)
            rows.append(row)
            print(f"block 2^{log2:<3d} bfloat16 -> float16 cast {row['cast_1_thread_gb_s']:6.2f} GB/s on one thread, "
                  f"{row['cast_2_thread_gb_s']:6.2f} on two;  NaN/Inf check {row['check_1_thread_gb_s']:6.2f}, "
                  f"{row['check_2_thread_gb_s']:6.2f}", flush=True)
    finally:
        dtypes._BLOCK, byte_moves._CHECK_BLOCK = saved
    return rows


if __name__ == "__main__":
    sys.exit(main())
