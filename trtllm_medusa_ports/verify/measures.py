"""The tree / acceptance measures: the heads' top-1 / top-k hit rates and the tree's predicted tokens per step.

May import: ``acceptance`` (the measures tune shares), ``reference``, ``tree``, ``verify.limits``.
"""

from __future__ import annotations

import torch

from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree
from trtllm_medusa_ports.verify.limits import HIT_TOP_K


@torch.inference_mode()
def final_hidden_states(ref: ReferenceModel, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Each sequence's final hidden states ``[S, H]``, one causal pass from an empty cache: what both measures
    below read (computed once for the two)."""
    return [ref.forward(seq, ref.new_cache(), compute_logits=False)[1] for seq in seqs]


@torch.inference_mode()
def head_hit_rates(ref: ReferenceModel, seqs: list[list[int]], prompt_lens: list[int],
                   hiddens: list[torch.Tensor] | None = None) -> tuple[list[float], list[float]]:
    """Per head k: how often its top-1 / top-k at position t holds the token at t + k + 2 (``hiddens``:
    :func:`final_hidden_states` of ``seqs``, where the caller has them)."""
    H = ref.num_medusa_heads
    hits1 = [0] * H
    hitsk = [0] * H
    counts = [0] * H
    hiddens = hiddens if hiddens is not None else final_hidden_states(ref, seqs)
    for seq, plen, hidden in zip(seqs, prompt_lens, hiddens, strict=True):
        logits = ref.medusa_logits(hidden)  # [H, S, V]
        top = logits.topk(HIT_TOP_K, dim=-1).indices
        for k in range(H):
            first, end = plen - 1, len(seq) - k - 2  # positions t with a target at t + k + 2
            if end <= first:
                continue
            targets = torch.tensor(seq[first + k + 2:end + k + 2])
            found = top[k, first:end] == targets[:, None]  # [n, top-k]
            counts[k] += end - first
            hits1[k] += int(found[:, 0].sum())
            hitsk[k] += int(found.any(dim=-1).sum())
    return ([h / c if c else 0.0 for h, c in zip(hits1, counts, strict=True)],
            [h / c if c else 0.0 for h, c in zip(hitsk, counts, strict=True)])


def predicted_mean_accepted_tokens_per_step(ref: ReferenceModel, tree: MedusaTree, seqs: list[list[int]],
                              prompt_lens: list[int], hiddens: list[torch.Tensor] | None = None,
                              ) -> tuple[float | None, float | None]:
    """What the tree should give on these sequences, from the checkpoint heads' ranks (trees/tune.py; ``hiddens``:
    :func:`final_hidden_states` of ``seqs``, where the caller has them)."""
    from trtllm_medusa_ports.trees.acceptance import (
        accuracy_table,
        expected_tokens_per_step,
        joint_values,
        reference_ranks,
    )

    if not ref.num_medusa_heads:
        return None, None
    ranks = reference_ranks(ref, seqs, prompt_lens, tree.top_k, hiddens)
    if ranks.shape[0] == 0:
        return None, None
    return (expected_tokens_per_step(tree.paths, accuracy_table(ranks, tree.top_k)),
            expected_tokens_per_step(tree.paths, joint=joint_values(ranks, tree.top_k)))
