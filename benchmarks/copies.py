#!/usr/bin/env python3
"""How the byte-copy path should move bytes: ``os.copy_file_range`` (no check), ``copy_file_range``
plus a NaN/Inf check through memory-mapped windows (the byte path's way: files/byte_moves.py
``ByteMover._copy`` and ``_check_bytes``), and rounds of ``pread``, check and ``pwrite`` through one
reused buffer at several round sizes; on one thread, and on two threads each filling its own file
(the conversion's two rank lanes). The byte path's choice comes from this script's output.

Run: python benchmarks/copies.py [--mb 512] [--repeat 5] [--out benchmarks/results/copies.json]
The source is float16 weights-like data in a temporary file, read once first so it is in the page
cache, as a conversion's inputs usually are. By default each run rewrites the same output files,
whose pages stay cached: that measures what each way costs the CPU and memory. With --fresh each
run writes new files, as a conversion does; then the kernel's cost of new page-cache pages comes
on top, the same for every way, and on a virtual machine it varies several-fold from run to run.
Figures are GB/s of source (best of --repeat, the ways interleaved) and the ratio to
``copy_file_range`` alone.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import numpy as np

    from trtllm_medusa_ports.files.byte_moves import _non_finite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512, help="MB of source")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "trtllm-medusa-copies")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fresh", action="store_true",
                    help="write new files each run (as a conversion does) instead of rewriting cached ones")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds after the sync before each run")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    src = args.workdir / "source.bin"
    n = args.mb << 20
    if not src.exists() or src.stat().st_size != n:
        rng = np.random.default_rng(0)
        with open(src, "wb") as f:
            for _ in range(0, n, 64 << 20):
                f.write((rng.standard_normal(32 << 20, dtype=np.float32) * 0.02).astype(np.float16).tobytes())
    with open(src, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    fd = os.open(src, os.O_RDONLY)
    mask = np.uint16(0x7C00)

    def cfr(dst: int, lo: int, hi: int) -> None:
        while lo < hi:
            lo += os.copy_file_range(fd, dst, min(hi - lo, 16 << 20), lo, lo)

    def mmap_check_then_cfr(dst: int, lo: int, hi: int) -> None:
        for a in range(lo, hi, 4 << 20):
            length = min(4 << 20, hi - a)
            with mmap.mmap(fd, length, offset=a, access=mmap.ACCESS_READ) as m:
                bits = np.frombuffer(m, dtype=np.uint16)
                assert not _non_finite(bits, int(mask))
                del bits
        cfr(dst, lo, hi)

    def rounds(size: int):
        def run(dst: int, lo: int, hi: int) -> None:
            buf = bytearray(size)
            bits = np.frombuffer(buf, dtype=np.uint16)
            for a in range(lo, hi, size):
                k = min(size, hi - a)
                view = memoryview(buf)[:k]
                os.preadv(fd, [view], a)
                assert not _non_finite(bits[: k // 2], int(mask))
                os.pwrite(dst, view, a)
        return run

    ways = {"copy_file_range": cfr, "copy_file_range + mmap check": mmap_check_then_cfr,
            **{f"pread/check/pwrite {s >> 10} KB": rounds(s) for s in (256 << 10, 1 << 20, 4 << 20)}}

    def once(way, threads: int) -> float:
        outs = [args.workdir / f"out{i}.bin" for i in range(threads)]
        if args.fresh:
            for o in outs:
                o.unlink(missing_ok=True)
        os.sync()
        time.sleep(args.pause)
        t = time.perf_counter()
        fds = [os.open(o, os.O_WRONLY | os.O_CREAT, 0o644) for o in outs]
        for d in fds:
            os.ftruncate(d, n // threads)
        # each thread copies its half of the source into its own file, as each rank lane fills its rank file
        half = n // threads
        th = [threading.Thread(target=lambda d=d, i=i: way(d, i * half, (i + 1) * half)) for i, d in enumerate(fds)]
        for x in th:
            x.start()
        for x in th:
            x.join()
        dt = time.perf_counter() - t
        for d in fds:
            os.close(d)
        return n / dt / 1e9

    rows = []
    for threads in (1, 2):
        best = {name: 0.0 for name in ways}
        for _ in range(args.repeat):  # interleaved, so drifts in the machine hit every way alike
            for name, way in ways.items():
                best[name] = max(best[name], once(way, threads))
        for name, rate in best.items():
            rows.append({"way": name, "threads": threads, "gb_s": round(rate, 2),
                         "over_copy_file_range": round(rate / best["copy_file_range"], 2)})
            print(f"{threads} thread(s)  {name:30s} {rate:6.2f} GB/s  {rate / best['copy_file_range']:5.2f}x "
                  "copy_file_range", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"mb": args.mb, "repeat": args.repeat, "cpu_count": os.cpu_count(),
                                        "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
