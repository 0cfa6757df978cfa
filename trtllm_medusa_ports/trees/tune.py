"""Pick a ``medusa_choices`` tree from the heads' measured accuracy (``trtllm-medusa tune-tree``).

The Medusa paper (Cai et al. 2024, section 3.3.1 "Optimized tree construction") estimates a tree's
expected acceptance length from each head's top-k accuracy: if ``acc[d][k]`` is how often the k-th
candidate of head d is the token the base goes on to emit, a node whose path picks candidates
``(k_0, ..., k_d)`` is accepted with probability ``prod acc[i][k_i]`` (heads treated as
independent), and one generation step emits ``1 + sum over nodes of that product`` tokens on
average (the 1 is the base's own token at the root). The tree is grown greedily, adding the node
with the largest product until the node budget is spent.

Two details matter for a tree TensorRT-LLM accepts:
* every node's prefix must be in the tree (tree.py ``validate_choices``): a child's product never
  exceeds its parent's, so the greedy choice keeps prefixes;
* depth-1 indices must run 0..k-1 without gaps (tree.py ``upstream_quirks``): candidates of one
  parent are added in rank order, so a node's next sibling only becomes a candidate once it is in.
With accuracies that fall with the rank (``acc[d][k] >= acc[d][k+1]``, as measured accuracies do),
the greedy tree is the best tree of its size; the tests check that against brute force.

``estimate="joint"`` replaces the independence assumption by counts: a node's value is the
fraction of measured positions at which every head on its path had the true token at exactly the
path's rank. That is the exact mean acceptance on the measured text, so it also gives the tree's
predicted tokens per step without the independence assumption.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import PortError, TreeError
from trtllm_medusa_ports.files.checkpoint import hidden_stem
from trtllm_medusa_ports.machine import log
from trtllm_medusa_ports.trees.acceptance import (  # noqa: F401  (tune's measures, also read from here)
    Path_,
    accepted_length,
    accuracy_table,
    expected_tokens_per_step,
    joint_values,
    loop_until_end,
    measured_acceptance,
    path_value,
    rank_of_targets,
    rank_path,
    reference_ranks,
)
from trtllm_medusa_ports.trees.tree import (
    DEFAULT_TOP_K,
    MedusaTree,
    upstream_quirks,
    validate_choices,
)

LOG = log.get("tune")


def build_tree(acc: list[list[float]] | None = None, max_nodes: int = 63, *, max_depth: int | None = None,
               top_k: int = DEFAULT_TOP_K, joint: dict[Path_, float] | None = None) -> list[list[int]]:
    """The greedy tree of at most ``max_nodes`` nodes (see the module docstring); fewer when every
    further node has value 0. Values come from ``acc`` (product) or ``joint`` (counts)."""
    if acc is None and joint is None:
        raise ValueError("give acc or joint")
    depth = max_depth if max_depth is not None else (len(acc) if acc is not None else max(map(len, joint), default=0))
    if acc is not None:
        depth = min(depth, len(acc))

    def value(p: Path_) -> float:
        return joint.get(p, 0.0) if joint is not None else path_value(p, acc)

    chosen: list[Path_] = []
    heap: list[tuple[float, int, Path_]] = []  # (-value, length, path): ties go to shorter, then smaller paths

    def push(p: Path_) -> None:
        if len(p) <= depth and p[-1] < top_k:
            heapq.heappush(heap, (-value(p), len(p), p))

    if depth >= 1:
        push((0,))
    while heap and len(chosen) < max_nodes:
        neg, _, p = heapq.heappop(heap)
        if -neg <= 0.0:
            break
        chosen.append(p)
        push(p + (0,))  # its first child
        push(p[:-1] + (p[-1] + 1,))  # its next sibling
    return [list(p) for p in sorted(chosen, key=lambda p: (len(p), p))]


# -- measuring on a base + heads --------------------------------------------------------------
@torch.no_grad()
def measure_ranks(model, heads, seqs: list[list[int]], starts: list[int], top_k: int = DEFAULT_TOP_K, *,
                  quiet: bool = True) -> torch.Tensor:
    """``[N, heads]``: rank of the base's next tokens among each head's top-k at every continuation position.

    ``model`` is the HF base (float32), ``heads`` a :class:`~trtllm_medusa_ports.heads.MedusaHeads`;
    head d at position t is scored against the token at t + d + 2 (-1 where the text ends)."""
    from tqdm import tqdm

    from trtllm_medusa_ports.heads.logits import source_heads_logits
    from trtllm_medusa_ports.huggingface.model import final_hidden

    vocab = model.get_output_embeddings().weight.shape[0]
    rows = []
    for seq, start in zip(tqdm(seqs, desc="measure heads", unit="sequence", disable=quiet, file=sys.stderr), starts,
                          strict=True):
        if len(seq) - start < 2:
            continue
        hidden = final_hidden(model, torch.tensor([seq]))[0, start:].float()
        logits = source_heads_logits(heads, hidden, torch.float32, model.get_output_embeddings(),
                                     heads.shares_base_lm_head, vocab)
        ranks = torch.full((hidden.shape[0], heads.num_heads), -1, dtype=torch.long)
        for d in range(heads.num_heads):
            n = len(seq) - start - d - 2  # positions with a target for this head
            if n <= 0:
                continue
            targets = torch.tensor(seq[start + d + 2:])
            ranks[:n, d] = rank_of_targets(logits[d, :n], targets, top_k)
        rows.append(ranks)
    if not rows:
        raise PortError("the prompts gave no text to measure the heads on", fix="pass longer or more prompts")
    return torch.cat(rows)




@dataclass
class TuneResult:
    paths: list[list[int]]
    accuracy: list[list[float]]
    #: mean accepted tokens per step (every position alike) from the heads' accuracy, by ``estimate``
    predicted_mean_accepted_tokens_per_step: float
    measured_on_text: float  # the tree's mean acceptance at the measured positions (no independence assumption)
    positions: int
    estimate: str
    baseline: dict | None = None
    #: what was done with the tokenizer's chat template (files/tokenizer.py CHAT_*)
    chat_template: str = ""
    #: tokens per step until the end token - the figure a server sees - of the Medusa loop replayed on the measured
    #: answers (acceptance.loop_until_end: joint along the tree, each answer cut after the base's end token)
    predicted_tokens_per_step_until_end: float = 0.0

    def to_dict(self) -> dict:
        return {"paths": self.paths, "num_nodes": len(self.paths), "depth": max(map(len, self.paths), default=0),
                "predicted_tokens_per_step_until_end": round(self.predicted_tokens_per_step_until_end, 4),
                "predicted_mean_accepted_tokens_per_step": round(self.predicted_mean_accepted_tokens_per_step, 4),
                "acceptance_on_measured_text": round(self.measured_on_text, 4), "estimate": self.estimate,
                "positions": self.positions, "head_topk_accuracy": [[round(a, 4) for a in row] for row in self.accuracy],
                "baseline": self.baseline, "chat_template": self.chat_template}


def _tune_prompt_ids(prompt_ids, prompts, vocab: int, tokenizer_dir, chat_template: str, chat_status):
    """The prompts as token ids (the packaged held-out prompts where none are given), each checked against the
    vocabulary, and what was done with the chat template."""
    from trtllm_medusa_ports.files.prompts import check_ids, heldout_prompts, lazy_tokenizer

    if prompt_ids is not None:
        check_ids(prompt_ids, vocab, "--prompt_ids prompt", fix="pass ids of the base's tokenizer, e.g. --prompt_ids 1,2,3;4,5")
        return prompt_ids, chat_status
    tokenize = lazy_tokenizer(Path(tokenizer_dir), chat_template)
    texts = prompts if prompts is not None else heldout_prompts()
    prompt_ids = [tokenize.prompt(t) for t in texts]
    # a tokenizer that turns a text into no ids (or into ids past the base's vocabulary) is named here, not met as an
    # IndexError inside transformers' generate
    check_ids(prompt_ids, vocab, "prompt" if prompts is not None else "packaged held-out prompt",
              where=str(tokenizer_dir), fix="pass the base's own tokenizer (--tokenizer_dir), or token ids (--prompt_ids)")
    return prompt_ids, tokenize.chat


def tune(model_dir: str | Path, medusa_model_dir: str | Path, *, prompts: list[str] | None = None,
         tokenizer_dir: str | Path | None = None, prompt_ids: list[list[int]] | None = None, max_nodes: int = 63,
         max_draft_len: int | None = None, top_k: int = DEFAULT_TOP_K, new_tokens: int = 64,
         estimate: str = "product", baseline: str | None = "mc_sim_7b_63", quiet: bool = True,
         chat_template: str = "none", chat_status: str | None = None) -> TuneResult:
    """Measure the heads on held-out text (the base's greedy continuations of ``prompts``) and build the tree."""
    from trtllm_medusa_ports.heads import load_heads
    from trtllm_medusa_ports.huggingface.model import load_base
    if estimate not in ("product", "joint"):
        raise PortError(f"--estimate {estimate!r} is not one of product, joint", fix="pass --estimate product", usage=True)
    if max_nodes < 1:
        raise PortError(f"--max_nodes {max_nodes} must be at least 1", fix="e.g. --max_nodes 63", usage=True)
    if max_draft_len is not None and max_nodes > max_draft_len:
        raise PortError(f"--max_nodes {max_nodes} is above --max_draft_len {max_draft_len}: TensorRT-LLM could not "
                        "run the tree", fix=f"pass --max_nodes {max_draft_len} or less")
    heads = load_heads(medusa_model_dir)
    baseline_paths = baseline_tree(baseline, heads.num_heads) if baseline else None  # refused before measuring
    if not quiet:
        LOG.info(f"tune-tree: loading the base from {model_dir}")
    model = load_base(model_dir)
    hidden, vocab = int(model.config.hidden_size), int(model.config.vocab_size)
    if heads.hidden_size != hidden or (heads.vocab_size is not None and heads.vocab_size != vocab
                                       and heads.token_map is None):
        raise PortError(f"the heads (hidden size {heads.hidden_size}, vocabulary {heads.vocab_size}) do not fit the "
                        f"base (hidden_size {hidden}, vocab_size {vocab}): a tree tuned on them would mean nothing",
                        where=str(medusa_model_dir), fix="pass the heads trained for this base")
    prompt_ids, chat_status = _tune_prompt_ids(prompt_ids, prompts, vocab, tokenizer_dir or model_dir, chat_template,
                                               chat_status)
    ranks, answers = _measured_answers(model, heads, prompt_ids, new_tokens, top_k, quiet)
    acc = accuracy_table(ranks, top_k)
    joint = joint_values(ranks, top_k) if estimate == "joint" else None
    paths = build_tree(acc, max_nodes, max_depth=heads.num_heads, top_k=top_k, joint=joint)
    if not paths:
        raise PortError("no head ever ranked the right token in its top-k on this text: there is no useful tree",
                        fix="train the heads longer (trtllm-medusa train-heads) or measure on more text")
    problems = validate_choices(paths, top_k=top_k, num_heads=heads.num_heads, max_draft_len=max_draft_len)
    problems += upstream_quirks(paths)
    if problems:  # cannot happen by construction; refuse rather than write a tree check would reject
        raise TreeError("the tuned tree is invalid:\n  - " + "\n  - ".join(problems))
    base = None
    if baseline_paths is not None:
        bpaths = baseline_paths
        base = {"name": baseline, "num_nodes": len(bpaths),
                "predicted_tokens_per_step_until_end": round(until_end(bpaths, answers), 4),
                "predicted_mean_accepted_tokens_per_step": round(expected_tokens_per_step(bpaths, acc, joint), 4),
                "acceptance_on_measured_text": round(measured_acceptance(bpaths, ranks), 4)}
    return TuneResult(paths, acc, expected_tokens_per_step(paths, acc, joint), measured_acceptance(paths, ranks),
                      ranks.shape[0], estimate, base, chat_template=chat_status or "",
                      predicted_tokens_per_step_until_end=until_end(paths, answers))


def _measured_answers(model, heads, prompt_ids: list[list[int]], new_tokens: int, top_k: int,
                      quiet: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The heads' ranks at every measured position (the base's greedy answers to the prompts, cut after its end
    token), and the same rows per answer for :func:`until_end` (measure_ranks leaves out an answer with no token;
    each answer's last row guesses past it)."""
    from trtllm_medusa_ports.huggingface.model import continue_greedily

    conts = continue_greedily(model, prompt_ids, new_tokens, quiet=quiet)
    seqs = [p + c for p, c in zip(prompt_ids, conts, strict=True)]
    ranks = measure_ranks(model, heads, seqs, [len(p) - 1 for p in prompt_ids], top_k, quiet=quiet)
    lengths = [len(c) + 1 for c in conts if len(c) + 1 >= 2]
    return ranks, [r[:-1] for r in ranks.split(lengths)]


def until_end(paths, answers: list[torch.Tensor]) -> float:
    """Tokens per step until the end token of the loop replayed on ``answers`` (acceptance.loop_until_end); 1.0
    where no answer has a second token (every step then emits one)."""
    tokens, steps = loop_until_end(paths, answers)
    return tokens / steps if steps else 1.0


def baseline_tree(baseline: str, num_heads: int) -> list[list[int]]:
    """The ``--baseline`` tree's paths (pruned to the heads' depth, as verify prunes a preset); a tree that cannot
    be read is refused under ``--baseline``'s own name, before anything is measured."""
    from trtllm_medusa_ports.trees.tree import resolve_choices

    try:
        paths, _ = resolve_choices(baseline, num_heads)
    except TreeError as exc:
        where = "--baseline" if exc.where in (None, "--medusa_choices") else f"--baseline {exc.where}"
        raise TreeError(exc.what, where=where,
                        fix=(exc.fix or "") + "; or --baseline '' to compare with no tree") from None
    problems = validate_choices(paths, num_heads=num_heads)
    if problems:
        raise TreeError("the baseline tree is invalid:\n  - " + "\n  - ".join(problems), where="--baseline",
                        fix="pass a tree for these heads, or --baseline '' to compare with no tree")
    return paths


def write_choices(paths: list[list[int]], output: str | Path, *, overwrite: bool = False) -> Path:
    """One line of JSON (a list of paths): ``--medusa_choices @FILE`` here, and as text TensorRT-LLM's
    ``examples/run.py --medusa_choices`` reads it (a Python literal)."""
    out = Path(output)
    if out.exists() and not overwrite:
        raise PortError("the output file exists", where=str(out), fix="pass --overwrite or choose another --output")
    if out.exists() and not out.is_file():
        raise PortError("exists and is not a file", where=str(out), fix="choose another --output")
    tmp = out.with_name(f".{hidden_stem(out.name)}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(paths, separators=(", ", ": ")) + "\n")
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PortError(f"cannot write the tree ({exc.strerror})", where=str(out), fix="choose a writable --output") from None
    return out


# -- drawing ----------------------------------------------------------------------------------
def draw(tree: MedusaTree) -> str:
    """The tree as text: one line per node, ``k`` = the head's k-th candidate (0 = its top-1)."""
    children: dict[Path_, list[Path_]] = {(): []}
    for p in tree.paths:
        children.setdefault(p, [])
        children.setdefault(p[:-1], []).append(p)
    lines = [f"root (the base's token; {tree.num_nodes} nodes, depth {tree.depth})"]

    def walk(p: Path_, indent: str) -> None:
        kids = sorted(children.get(p, []))
        for i, c in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(f"{indent}{'└── ' if last else '├── '}{c[-1]}  (head {len(c) - 1}, top-{c[-1] + 1})")
            walk(c, indent + ("    " if last else "│   "))

    walk((), "")
    return "\n".join(lines)


def print_table(acc: list[list[float]], file=sys.stdout, shown: int = 5) -> None:
    for d, row in enumerate(acc):
        cum = 0.0
        cells = []
        for k in range(min(shown, len(row))):
            cum += row[k]
            cells.append(f"top-{k + 1} {cum:.2f}")
        print(f"head {d}: " + ", ".join(cells), file=file)
