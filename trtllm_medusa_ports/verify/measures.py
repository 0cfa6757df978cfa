"""The tree / acceptance measures: the heads' top-1 / top-k hit rates and the tree's predicted tokens per step.

May import: ``acceptance`` (the measures tune shares), ``reference``, ``tree``, ``verify.limits``.
"""

from __future__ import annotations

import torch

from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.tree import MedusaTree
from trtllm_medusa_ports.verify.limits import HIT_TOP_K


@torch.no_grad()
def head_hit_rates(ref: ReferenceModel, seqs: list[list[int]], prompt_lens: list[int]) -> tuple[list[float], list[float]]:
    """Per head k: how often its top-1 / top-k at position t holds the token at t + k + 2."""
    H = ref.num_medusa_heads
    hits1 = [0] * H
    hitsk = [0] * H
    counts = [0] * H
    for seq, plen in zip(seqs, prompt_lens, strict=True):
        _, hidden = ref.forward(seq, ref.new_cache(), compute_logits=False)
        logits = ref.medusa_logits(hidden)  # [H, S, V]
        top = logits.topk(HIT_TOP_K, dim=-1).indices
        for k in range(H):
            for t in range(plen - 1, len(seq) - k - 2):
                target = seq[t + k + 2]
                counts[k] += 1
                hits1[k] += int(top[k, t, 0] == target)
                hitsk[k] += int((top[k, t] == target).any())
    return ([h / c if c else 0.0 for h, c in zip(hits1, counts, strict=True)],
            [h / c if c else 0.0 for h, c in zip(hitsk, counts, strict=True)])


def predicted_tokens_per_step(ref: ReferenceModel, tree: MedusaTree, seqs: list[list[int]],
                              prompt_lens: list[int]) -> tuple[float | None, float | None]:
    """What the tree should give on these sequences, from the checkpoint heads' ranks (tune.py)."""
    from trtllm_medusa_ports.acceptance import (
        accuracy_table,
        expected_tokens_per_step,
        joint_values,
        reference_ranks,
    )

    if not ref.num_medusa_heads:
        return None, None
    ranks = reference_ranks(ref, seqs, prompt_lens, tree.top_k)
    if ranks.shape[0] == 0:
        return None, None
    return (expected_tokens_per_step(tree.paths, accuracy_table(ranks, tree.top_k)),
            expected_tokens_per_step(tree.paths, joint=joint_values(ranks, tree.top_k)))
