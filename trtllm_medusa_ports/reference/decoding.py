"""Medusa greedy decoding as TensorRT-LLM's runtime does it, on the reference executor.

Mirrors tensorrt_llm/runtime/generation.py (1.2.x): context step -> root token
and head logits; each generation step feeds root + tree tokens with the tree's
position offsets and packed mask; the longest path whose drafts equal the base
argmax of their parents is accepted (``find_best_medusa_path``); the emitted
tokens are the base argmax at the root and at every accepted node; accepted KV
entries are compacted behind the root (``update_kv_cache_draft_token_location``);
the heads' logits at the last accepted node give the next drafts.

One deliberate difference: padded path slots (-1) never match. Upstream (and
FasterDecoding's ``evaluate_posterior``) compare a pad against token id 0, so a
base argmax of 0 after a short path "accepts" the pad and takes KV and logits
from the wrong slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree


def greedy_accept(tokens: torch.Tensor, predicted: torch.Tensor, paths: list[list[int]]) -> tuple[int, int]:
    """``(best_path, accepted_drafts)``: the longest path whose drafts match their parents' argmax.

    ``tokens[i]`` is the token fed at tree slot i (slot 0 = root), ``predicted[i]``
    the base argmax there; each path row is ``[0, node, node, ..., -1, -1]``.
    Pads (-1) end a path and never match. Ties keep the first path (upstream's argmax).
    """
    best_path, best_len = 0, 0
    for p, row in enumerate(paths):
        n = 0
        for d in range(1, len(row)):
            node = row[d]
            if node < 0 or int(tokens[node]) != int(predicted[row[d - 1]]):
                break
            n += 1
        if n > best_len:
            best_path, best_len = p, n
    return best_path, best_len


@dataclass
class MedusaRun:
    tokens: list[int]
    steps: int  # generation steps after the context step
    accepted_per_step: list[int] = field(default_factory=list)  # tokens emitted per step (drafts + 1)

    @property
    def mean_accepted_tokens_per_step(self) -> float:
        return sum(self.accepted_per_step) / len(self.accepted_per_step) if self.accepted_per_step else 0.0

    def until_end(self, end_ids) -> tuple[int, int]:
        """(tokens, steps) of a generation that stops at the first of ``end_ids``, as TensorRT-LLM's
        runtime stops a sequence at its ``end_id``: the steps up to the one that emitted it, and the
        tokens those steps emitted up to it (the context step's token, ``tokens[0]``, is not a step's,
        as in :attr:`mean_accepted_tokens_per_step`). The loop is deterministic, so this is the prefix
        of this run. Without an end token: every step, and the tokens up to ``max_new_tokens`` (those a runtime
        returns: the last step's drafts past the limit are dropped, ``tokens`` holds the limit's).
        """
        end = next((i for i, t in enumerate(self.tokens) if t in end_ids), None)
        if end is None:
            return min(sum(self.accepted_per_step), len(self.tokens) - 1), len(self.accepted_per_step)
        if end == 0:  # the context step's token ends it: no generation step runs
            return 0, 0
        emitted = 1  # tokens[0] came from the context step
        for step, n in enumerate(self.accepted_per_step):
            if emitted + n > end:
                return end, step + 1
            emitted += n
        raise AssertionError("end token beyond the emitted tokens")


def draft_tokens(head_logits: torch.Tensor, root: int, tree: MedusaTree) -> torch.Tensor:
    """Tree tokens for one step: ``[root] + topk(head_d, k_d)`` indexed by the candidate indices."""
    cands = [torch.tensor([root])]
    for d, k in enumerate(tree.medusa_topks):
        cands.append(torch.topk(head_logits[d], k).indices)
    flat = torch.cat(cands)
    return flat[torch.tensor(tree.candidate_indices)]


def _tree_children(tree: MedusaTree) -> dict[int, list[int]]:
    """Tree slot -> its child slots (slot 0 = root), from the tree's own parent table."""
    children: dict[int, list[int]] = {}
    for slot, parent in enumerate(tree.parents):
        if parent >= 0:
            children.setdefault(parent, []).append(slot)
    return children


def reached_argmax(model: ReferenceModel, hidden: torch.Tensor, tokens: torch.Tensor,
                   children: dict[int, list[int]]) -> torch.Tensor:
    """The base argmax at every tree slot that acceptance can reach (-1 elsewhere).

    Acceptance reads the argmax of the root and of each node whose draft equals its parent's
    argmax, so only those rows go through the vocabulary projection, a tree level at a time:
    the same tokens as projecting all ``T`` rows, without ``T x vocab`` logits per step.
    """
    predicted = torch.full((tokens.shape[0],), -1, dtype=torch.long)
    level = [0]
    while level:
        predicted[level] = model.logits(hidden[level]).argmax(-1)
        level = [c for n in level for c in children.get(n, []) if int(tokens[c]) == int(predicted[n])]
    return predicted


@torch.inference_mode()
def medusa_generate(model: ReferenceModel, prompt: list[int], tree: MedusaTree, max_new_tokens: int) -> MedusaRun:
    if tree.depth > model.num_medusa_heads:
        raise ValueError(f"tree depth {tree.depth} > {model.num_medusa_heads} Medusa heads")
    cache = model.new_cache()
    _, hidden = model.forward(prompt, cache, compute_logits=False)
    root = int(model.logits(hidden[-1:]).argmax())
    out = [root]
    head_logits = model.medusa_logits(hidden[-1])
    offsets = tree.position_offsets
    packed = tree.packed_mask
    paths = tree.retrieve_paths(model.num_medusa_heads + 1)
    children = _tree_children(tree)
    run = MedusaRun(tokens=out, steps=0)
    while len(out) < max_new_tokens:
        tokens = draft_tokens(head_logits, root, tree)
        past = cache.length
        _, hidden = model.forward(
            tokens, cache, spec_decoding_position_offsets=offsets, spec_decoding_packed_mask=packed,
            compute_logits=False,
        )
        predicted = reached_argmax(model, hidden, tokens, children)
        best_path, n = greedy_accept(tokens, predicted, paths)
        nodes = paths[best_path][: n + 1]
        emitted = [int(predicted[i]) for i in nodes]
        cache.keep(past, nodes)
        out.extend(emitted)
        run.steps += 1
        run.accepted_per_step.append(len(emitted))
        root = emitted[-1]
        head_logits = model.medusa_logits(hidden[nodes[-1]])
    del out[max_new_tokens:]
    return run


@torch.inference_mode()
def plain_decode(model: ReferenceModel, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Token-by-token greedy decoding on the reference executor (no speculation): the tokens, and the logits each
    was the argmax of (``[max_new_tokens, vocab]``; row j predicts token j)."""
    cache = model.new_cache()
    _, hidden = model.forward(prompt, cache, compute_logits=False)
    rows = [model.logits(hidden[-1:])[-1]]
    out = [int(rows[-1].argmax())]
    while len(out) < max_new_tokens:
        logits, _ = model.forward([out[-1]], cache)
        rows.append(logits[-1])
        out.append(int(logits[-1].argmax()))
    return out, torch.stack(rows)


def plain_generate(model: ReferenceModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Token-by-token greedy decoding on the reference executor (no speculation)."""
    return plain_decode(model, prompt, max_new_tokens)[0]
