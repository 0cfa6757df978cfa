#!/usr/bin/env python3
"""How good can a tuned tree be? Tree constructions side by side on the heads `benchmarks/real_model.py`
trained for SmolLM2-135M, scored by replaying the Medusa loop from the heads' measured ranks.

    python benchmarks/trees.py --workdir DIR [--out benchmarks/results/trees.json]

DIR is real_model.py's --workdir (its base in smollm2-hf/, heads in heads/). The script measures,
once, the rank of the base's next tokens among each head's top-10 at every position of the base's
greedy continuations (64 tokens) of
* the EVAL + EVAL_MORE prompts of real_model.py (in neither the training nor the tuning prompts), and
* the 300 tuning prompts `tune-tree` measures on by default.
A tree's tokens per step on a prompt is then replayed exactly: from the first position, accept the
longest path of ranks the tree holds, move past the accepted tokens and the base's own, and repeat
until 64 tokens (the loop `verify` runs, replayed from the ranks; on real_model.py's heads this was
within 0.013 of the loop itself). It scores, all on the EVAL prompts:
* `mc_sim_7b_63` (pruned to the heads' depth) - the reference;
* tune-tree's trees (product and joint estimates) built on the tuning prompts, as a user gets them;
* the same constructions built on two-fold splits of the EVAL prompts and scored on the other half
  (tuning text from the serving distribution), against `mc_sim_7b_63` on the same halves;
* the same constructions built on the EVAL prompts themselves (in-sample: the construction given the
  very text it is scored on, which no user has).
Figures are tokens per step; differences are what matters, so they are printed against
`mc_sim_7b_63` on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NEW_TOKENS = 64
TOP_K = 10


def rank_paths(ranks: torch.Tensor) -> list[tuple[int, ...]]:
    """Per position: the longest tree path it can accept (trees/tune.py ``rank_path``)."""
    from trtllm_medusa_ports.trees.tune import rank_path

    return [rank_path(row, TOP_K) for row in ranks.tolist()]


def replay(prompts: list[list[tuple[int, ...]]], tree: set) -> float:
    """Tokens per step of the loop over these prompts' positions (see the module docstring)."""
    from trtllm_medusa_ports.trees.tune import accepted_length

    tokens = steps = 0
    for rows in prompts:
        i = 0
        while i + 1 < NEW_TOKENS and i < len(rows):
            a = accepted_length(rows[i], tree)
            steps += 1
            tokens += a + 1
            i += a + 1
    return tokens / max(1, steps)


def main() -> int:
    from real_model import EVAL, EVAL_MORE

    from trtllm_medusa_ports.files.prompts import heldout_prompts, tokenizer_for
    from trtllm_medusa_ports.heads import load_heads
    from trtllm_medusa_ports.huggingface.model import continue_greedily, load_base
    from trtllm_medusa_ports.trees.tree import resolve_choices
    from trtllm_medusa_ports.trees.tune import (
        accuracy_table,
        build_tree,
        joint_values,
        measure_ranks,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True, help="benchmarks/real_model.py's --workdir")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args()
    base, hdir = args.workdir / "smollm2-hf", args.workdir / "heads"
    for p in (base / "config.json", hdir):
        if not p.exists():
            sys.exit(f"{p} is missing: run benchmarks/real_model.py --workdir {args.workdir} first")
    torch.set_num_threads(2)
    if args.quiet:
        from transformers.utils import logging

        logging.disable_progress_bar()
    t0 = time.time()
    heads, model, tok = load_heads(hdir), load_base(base), tokenizer_for(base)
    ranks = {}
    for name, texts in (("eval", EVAL + EVAL_MORE), ("tune", heldout_prompts())):
        ids = [tok(t)["input_ids"] for t in texts]
        conts = continue_greedily(model, ids, NEW_TOKENS, quiet=args.quiet)
        ranks[name] = [measure_ranks(model, heads, [p + c], [len(p) - 1], TOP_K) for p, c in zip(ids, conts)]
    measured_s = time.time() - t0
    ev = [rank_paths(r) for r in ranks["eval"]]
    mc, _ = resolve_choices("mc_sim_7b_63", heads.num_heads)
    budget, depth = len(mc), heads.num_heads
    mc_set = {tuple(p) for p in mc}

    def trees_from(rs: list[torch.Tensor]) -> dict[str, set]:
        cat = torch.cat(rs)
        return {"product": {tuple(p) for p in build_tree(accuracy_table(cat, TOP_K), budget, max_depth=depth)},
                "joint": {tuple(p) for p in build_tree(None, budget, max_depth=depth,
                                                       joint=joint_values(cat, TOP_K))}}

    res: dict = {"num_nodes": budget, "eval_prompts": len(ev), "tune_prompts": len(ranks["tune"]),
                 "mc_sim_7b_63": round(replay(ev, mc_set), 4)}
    res["tuned_on_tuning_prompts"] = {k: round(replay(ev, t), 4) for k, t in trees_from(ranks["tune"]).items()}
    res["tuned_on_eval_in_sample"] = {k: round(replay(ev, t), 4) for k, t in trees_from(ranks["eval"]).items()}
    diffs: dict[str, list[float]] = {"product": [], "joint": []}
    idx = list(range(len(ev)))
    for seed in range(4):
        random.Random(seed).shuffle(idx)
        for fold in range(2):
            test = [i for k, i in enumerate(idx) if k % 2 == fold]
            train = [i for k, i in enumerate(idx) if k % 2 != fold]
            held = [ev[i] for i in test]
            for k, t in trees_from([ranks["eval"][i] for i in train]).items():
                diffs[k].append(replay(held, t) - replay(held, mc_set))
    res["tuned_on_eval_halves_minus_mc_sim"] = {
        k: {"mean": round(sum(v) / len(v), 4), "folds_won": sum(x > 0 for x in v), "folds": len(v)}
        for k, v in diffs.items()}
    res["measure_s"] = round(measured_s, 1)
    print(f"tokens per step, replayed on the {len(ev)} EVAL prompts ({NEW_TOKENS} tokens, {budget} nodes):")
    print(f"  mc_sim_7b_63                          {res['mc_sim_7b_63']:.3f}")
    for where, key in (("tuning prompts (tune-tree)", "tuned_on_tuning_prompts"),
                       ("EVAL prompts themselves (in-sample)", "tuned_on_eval_in_sample")):
        for k, v in res[key].items():
            print(f"  {k:8s} tree tuned on {where:34s} {v:.3f}  ({v - res['mc_sim_7b_63']:+.3f})")
    for k, v in res["tuned_on_eval_halves_minus_mc_sim"].items():
        print(f"  {k:8s} tree tuned on one half of EVAL, scored on the other: {v['mean']:+.3f} against "
              f"mc_sim_7b_63, better in {v['folds_won']} of {v['folds']} halves")
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
