#!/usr/bin/env python3
"""Conversion time and peak memory of a mixture-of-experts base (synthetic Mixtral or DBRX), beside `cp -r`.

The base: a random ``MixtralForCausalLM`` (``--family mixtral``) or ``DbrxForCausalLM`` (``--family dbrx``) of
about --size_gb in float16 (hidden 1024, 8 experts of 3584, as many layers as the size asks), saved by
transformers - Mixtral's per-expert ``w1/w2/w3`` tensors, DBRX's 2-D ``w1/v1/w2`` with the down-projection stored
transposed - and 3 Medusa heads sharing its lm_head. Contenders, each a fresh subprocess, fastest of --repeat,
side by side:

* cp: ``cp -r BASE HEADS DST/``;
* convert: ``convert --dtype float16 --tp_size 2``; the stacked experts (``[experts, 2 x inter, hidden]``) are
  a pure layout of the per-expert tensors, so they take the byte path like dense linears; DBRX's transposed
  down-projection takes the byte path's transposed blocks (files/byte_moves.py TRANSPOSED).

Peak RSS is the child's ``ru_maxrss``. Run: python benchmarks/moe_convert.py [--family mixtral] [--size_gb 4]
[--repeat 2] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def paths(work: Path, size_gb: float, family: str = "mixtral") -> tuple[Path, Path]:
    return work / f"{family}-{size_gb:g}gb", work / f"{family}-{size_gb:g}gb-heads"


def build(work: Path, size_gb: float, family: str = "mixtral") -> tuple[Path, Path]:
    import torch

    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, save_tiny_base

    hidden, inter, experts, vocab = 1024, 3584, 8, 32000
    per_layer = 4 * hidden * hidden + experts * 3 * hidden * inter
    layers = max(1, round((size_gb * 1e9 / 2 - 2 * vocab * hidden) / per_layer))
    base, heads = paths(work, size_gb, family)
    if not (base / "config.json").exists() and family == "dbrx":
        save_tiny_base("DbrxForCausalLM", base, seed=0, dtype=torch.float16, d_model=hidden, n_layers=layers,
                       n_heads=16, vocab_size=vocab, max_seq_len=1024,
                       attn_config={"kv_n_heads": 8, "clip_qkv": 8.0, "rope_theta": 10000.0},
                       ffn_config={"ffn_hidden_size": inter, "moe_num_experts": experts, "moe_top_k": 2})
    elif not (base / "config.json").exists():
        save_tiny_base("MixtralForCausalLM", base, seed=0, dtype=torch.float16, hidden_size=hidden,
                       intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=64, num_local_experts=experts, num_experts_per_tok=2, vocab_size=vocab,
                       max_position_embeddings=1024)
    if not heads.exists():
        save_heads(random_heads(hidden, vocab, num_heads=3, seed=1, own_lm_head=False), heads, "fasterdecoding-v2",
                   dtype=torch.float16)
    return base, heads


def run(cmd: list[str]) -> dict:
    subprocess.run(["sync"], check=False)
    time.sleep(1.0)
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    if rc:
        sys.exit(f"{cmd[:3]} failed ({rc}): {err[-2000:]}")
    return {"wall_s": round(time.time() - start, 3), "peak_rss_mb": round(usage.ru_maxrss * 1024 / 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["mixtral", "dbrx"], default="mixtral")
    ap.add_argument("--size_gb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/medusa-moe-bench"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--_build", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args._build:
        build(args.workdir, args.size_gb, args.family)
        return 0
    # built in a child: a parent holding the model would count in every contender's peak RSS (fork)
    subprocess.run([sys.executable, __file__, "--_build", "--size_gb", str(args.size_gb), "--workdir",
                    str(args.workdir), "--family", args.family], check=True, stderr=subprocess.DEVNULL)
    base, heads = paths(args.workdir, args.size_gb, args.family)  # this process imports no torch: its image is tiny
    size = sum(f.stat().st_size for f in base.rglob("*") if f.is_file())
    dst = args.workdir / "out"
    runs: dict[str, list] = {"cp": [], "convert": []}
    for _ in range(args.repeat):
        for kind in runs:
            shutil.rmtree(dst, ignore_errors=True)
            if kind == "cp":
                dst.mkdir()
                cmd = ["cp", "-r", str(base), str(heads), str(dst) + "/"]
            else:
                cmd = [sys.executable, "-m", "trtllm_medusa_ports", "convert", "--model_dir", str(base),
                       "--medusa_model_dir", str(heads), "--output_dir", str(dst), "--dtype", "float16",
                       "--tp_size", "2", "--quiet"]
            runs[kind].append(run(cmd))
            print(kind, runs[kind][-1], flush=True)
    shutil.rmtree(dst, ignore_errors=True)
    best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in runs.items()}
    result = {"base_bytes": size, "runs": runs, "over_cp": round(best["convert"]["wall_s"] / best["cp"]["wall_s"], 2),
              "convert_peak_rss_mb": best["convert"]["peak_rss_mb"],
              "setup": f"synthetic {args.family}, float16 -> float16, tp 2, 8 experts of 3584, hidden 1024"}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
