"""A child process measured: its exit code, peak RSS (``wait4``'s own usage), sampled peak RssAnon, wall and CPU
time, and its stdout. Shared by ``verify_memory.py``, ``train_memory.py`` and ``suite.py`` (run from this folder:
they put it on ``sys.path``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def run_measured(cmd: list[str], ok_codes: tuple[int, ...] | None = (0,), *, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` (OMP_NUM_THREADS=1, plus ``env``, in ``cwd``); exit with its stderr's tail unless its code is one
    of ``ok_codes`` (None: any code, reported as ``rc``)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    peak_anon = [0]

    def poll() -> None:
        while proc.returncode is None:
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        peak_anon[0] = max(peak_anon[0], int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                pass
            time.sleep(0.01)

    chunks: dict[str, bytes] = {}

    def drain(name: str, pipe) -> None:
        chunks[name] = pipe.read()

    readers = [threading.Thread(target=drain, args=(n, p)) for n, p in (("out", proc.stdout), ("err", proc.stderr))]
    watcher = threading.Thread(target=poll, daemon=True)
    t0 = time.monotonic()
    for t in [*readers, watcher]:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    if ok_codes is not None and proc.returncode not in ok_codes:
        sys.exit(f"{cmd[:4]} failed ({proc.returncode}):\n{chunks['err'].decode(errors='replace')[-2000:]}")
    return {"rc": proc.returncode, "peak_rss_mb": usage.ru_maxrss * 1024 / 1e6, "peak_anon_mb": peak_anon[0] / 1e6,
            "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "stdout": chunks["out"].decode(errors="replace")}
