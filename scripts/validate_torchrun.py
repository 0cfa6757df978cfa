#!/usr/bin/env python3
"""train-heads under real torchrun: N ranks train the heads one process trains.

``tests/test_train_distributed.py`` forks its ranks from the test process with the environment torchrun gives and
hosts the store torchrun's agent hosts (a second, where torchrun itself takes 7-14 s); this script runs the launcher
itself, ``python -m torch.distributed.run --nproc_per_node N --master_port P -m trtllm_medusa_ports train-heads``,
each rank a fresh interpreter, and checks what that test checks, on a tiny synthetic Llama (no model hub, CPU,
gloo):

* torchrun exits 0 and prints one JSON document (rank 0 alone prints): world_size N, the 8 steps, the
  output_dir, float32 dtypes;
* the heads equal a one-process run's within 2e-5 (float32), the same steps recorded, the losses within 2e-4 and
  the top-1s within 2e-3;
* the ranks' corpus shares are merged into the one ``corpus.pt`` a one-process run writes (same sequences, key and
  rows; hidden states within 1e-5), no share left behind.

    python3 scripts/validate_torchrun.py                   # 2 ranks, in a temporary directory; exit 1 on a failure
    python3 scripts/validate_torchrun.py --nproc 3 --keep DIR

About 30 s on 2 CPU cores. Not part of the test suite (the fork in the test proves the same code path); run it
after changing heads/distributed.py or upgrading torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from torchrun_checks import (  # this folder (on sys.path as the script's own), the one module the test shares
    ARCH,
    FIT,
    FLAGS,
    HEADS_ATOL,
    LOSS_ATOL,
    TOP1_ATOL,
    TRAIN,
    corpus_differences,
    heads_file,
    heads_max_diff,
    history_differences,
    write_prompts,
)


def _inputs(root: Path) -> tuple[Path, Path]:
    """A tiny base and the shared prompts."""
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base, tiny_config

    return save_tiny_base(ARCH, root / "base", seed=0), write_prompts(root / "data.jsonl", tiny_config(ARCH).vocab_size)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checks(printed: dict, nproc: int, history: list[dict], out: Path, ref: Path) -> list[tuple[str, bool, str]]:
    """(what, passed, detail) for each property the test asserts."""
    rows = [("one JSON document, rank 0's", True, ""),
            (f"world_size {nproc}, 8 steps, the output_dir, float32",
             printed["world_size"] == nproc and printed["steps"] == 8 and printed["output_dir"] == str(out)
             and printed["dtype"] == printed["fit_dtype"] == "float32",
             f"{printed['world_size']} ranks, {printed['steps']} steps, {printed['dtype']}/{printed['fit_dtype']}")]
    diff = heads_max_diff(heads_file(out), heads_file(ref))
    rows.append((f"the heads within {HEADS_ATOL:g} of one process's", diff < HEADS_ATOL, f"max |diff| {diff:.2e}"))
    wrong = history_differences(printed["history"], history)
    rows.append((f"the same history (loss {LOSS_ATOL:g}, top-1 {TOP1_ATOL:g})", not wrong,
                 "; ".join(wrong) or f"{len(history)} records"))
    wrong = corpus_differences(out.with_name(out.name + ".train"), ref.with_name(ref.name + ".train"))
    rows.append(("the shares merged into the one-process corpus", not wrong, "; ".join(wrong)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--keep", type=Path, help="a new directory to keep the inputs and outputs in")
    args = ap.parse_args(argv)
    if args.nproc < 2:
        ap.error("--nproc must be at least 2")
    if args.keep is not None and args.keep.exists():
        ap.error(f"--keep {args.keep} exists: give a new directory")
    root = args.keep or Path(tempfile.mkdtemp(prefix="validate-torchrun-"))
    root.mkdir(parents=True, exist_ok=args.keep is None)
    try:
        return _run(root, args.nproc, kept=args.keep is not None)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, nproc: int, kept: bool) -> int:
    from trtllm_medusa_ports import api

    base, data = _inputs(root)
    ref, out = root / "one", root / "heads"
    one = api.train_heads(api.TrainOptions(model_dir=base, output_dir=ref, prompts=api.PromptInputs(data=data),
                                           fit=api.FitOptions(**FIT), **TRAIN))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_free_port()), "-m", "trtllm_medusa_ports", "train-heads", "--model_dir", str(base), "--output_dir",
           str(out), "--data", str(data), *FLAGS, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    if r.returncode != 0:
        print(f"FAIL  torchrun exited {r.returncode}\n{r.stderr[-3000:]}")
        return 1
    try:
        printed = json.loads(r.stdout)
    except json.JSONDecodeError:
        print(f"FAIL  one JSON document, rank 0's: torchrun printed\n{r.stdout[-3000:]}")
        return 1
    rows = _checks(printed, nproc, one.history, out, ref)
    for what, ok, detail in rows:
        print(f"{'PASS' if ok else 'FAIL'}  {what}" + (f" ({detail})" if detail else ""))
    if kept:
        print(f"outputs in {root}")
    return 0 if all(ok for _, ok, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
