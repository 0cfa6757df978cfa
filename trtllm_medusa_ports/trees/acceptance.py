"""How many tokens a Medusa tree accepts: the heads' ranks of the base's own tokens and what a tree makes of them.

Below both ``tune-tree`` (tune.py, which builds a tree from these measures) and ``verify`` (which reports
them for a checkpoint): the Medusa paper's estimate (Cai et al. 2024, section 3.3.1) of a tree's expected
acceptance length from each head's top-k accuracy - a node whose path picks candidates ``(k_0, ..., k_d)``
is accepted with probability ``prod acc[i][k_i]``, a step emits ``1 + sum over nodes`` tokens - and the
same from joint counts (no independence assumption) - both **mean accepted tokens per step**, over every position
alike - and the loop replayed on measured answers until the end token (:func:`loop_until_end`): **tokens per step
until the end token**, the figure a server sees.
"""

from __future__ import annotations

from collections import Counter

import torch

from trtllm_medusa_ports.trees.tree import DEFAULT_TOP_K

Path_ = tuple[int, ...]


# -- accuracy -------------------------------------------------------------------------------
def rank_of_targets(head_logits: torch.Tensor, targets: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[N]`` rank (0-based) of each target among a head's top-k logits ``[N, V]``; ``top_k`` if absent."""
    top = head_logits.topk(top_k, dim=-1).indices
    hit = top == targets.unsqueeze(-1)
    return torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(targets, top_k))


def accuracy_table(ranks: torch.Tensor, top_k: int) -> list[list[float]]:
    """``acc[d][k]``: how often head d's k-th candidate is right (``ranks [N, heads]``, -1 = no target)."""
    out = []
    for d in range(ranks.shape[1]):
        r = ranks[:, d]
        r = r[r >= 0]
        n = max(1, r.numel())
        out.append([float((r == k).sum()) / n for k in range(top_k)])
    return out


def joint_values(ranks: torch.Tensor, top_k: int) -> dict[Path_, float]:
    """Fraction of positions at which the heads' ranks start with each path (paths of ranks < top_k).

    Positions where a head has no target (the text ended) are counted only up to that head."""
    counts: Counter = Counter()
    n = ranks.shape[0]
    for row in ranks.tolist():
        path = rank_path(row, top_k)
        for k in range(1, len(path) + 1):
            counts[path[:k]] += 1
    return {p: c / max(1, n) for p, c in counts.items()}


def rank_path(row: list[int], top_k: int) -> Path_:
    """One position's ranks of heads 1, 2, ... up to the first head whose top-k misses the true
    token (or that has no target, rank -1): the longest tree path that position can accept."""
    path: list[int] = []
    for r in row:
        if r < 0 or r >= top_k:
            break
        path.append(r)
    return tuple(path)


# -- expected acceptance --------------------------------------------------------------------
def path_value(path: Path_, acc: list[list[float]]) -> float:
    v = 1.0
    for d, k in enumerate(path):
        v *= acc[d][k] if d < len(acc) and k < len(acc[d]) else 0.0
    return v


def expected_tokens_per_step(paths, acc: list[list[float]] | None = None,
                             joint: dict[Path_, float] | None = None) -> float:
    """Tokens one step emits on average: 1 (the base's token) + the sum of the nodes' acceptance."""
    if joint is not None:
        return 1.0 + sum(joint.get(tuple(p), 0.0) for p in paths)
    return 1.0 + sum(path_value(tuple(p), acc) for p in paths)


def measured_acceptance(paths, ranks: torch.Tensor) -> float:
    """Mean tokens per step the tree would emit at the measured positions (longest accepted path + 1)."""
    tree = {tuple(p) for p in paths}
    # ranks at or past top-k are in no tree, so the path need not be cut there
    total = sum(accepted_length(rank_path(row, 1 << 62), tree) + 1 for row in ranks.tolist())
    return total / max(1, ranks.shape[0])


def loop_until_end(paths, answers: list[torch.Tensor]) -> tuple[int, int]:
    """``(tokens, steps)`` of the Medusa loop replayed on measured answers: **tokens per step until the end token** is
    their ratio, the figure a server sees. ``answers``: per answer of the base (its greedy continuation, cut after
    its end token, as TensorRT-LLM's runtime ends a sequence at its ``end_id``) the ranks ``[L, heads]`` at its L
    positions, row j scoring the heads on the state before the answer's token j (head d against token j + d + 1; -1
    past the answer). The context step emits token 0 (not a step's, as reference/decoding.py ``until_end`` counts);
    the generation step at row j emits the drafts the tree accepts along the row's rank path (the same positions'
    heads together: joint acceptance along the tree, not independent heads) and the base's own token after them, and
    the next step is at the row after those. Exact for the loop on that text: greedy decoding emits the same
    answer whatever the tree accepts."""
    tree = {tuple(p) for p in paths}
    tokens = steps = 0
    for ranks in answers:
        rows = ranks.tolist()
        j = 0
        while j + 1 < len(rows):
            j += accepted_length(rank_path(rows[j], 1 << 62), tree) + 1
            steps += 1
        tokens += max(0, len(rows) - 1)
    return tokens, steps


def accepted_length(path: Path_, tree: set) -> int:
    """How many draft tokens a position with this rank path accepts: the longest prefix in the tree."""
    n = 0
    while n < len(path) and path[: n + 1] in tree:
        n += 1
    return n


@torch.no_grad()
def reference_ranks(ref, seqs: list[list[int]], prompt_lens: list[int], top_k: int = DEFAULT_TOP_K,
                    hiddens: list[torch.Tensor] | None = None) -> torch.Tensor:
    """:func:`measure_ranks` on a converted checkpoint (the reference executor's heads), from each
    prompt's last token on. ``hiddens``: each sequence's final hidden states where the caller has them
    (``ref.forward(seq, ref.new_cache(), compute_logits=False)[1]``), else computed here."""
    rows = []
    for i, (seq, plen) in enumerate(zip(seqs, prompt_lens, strict=True)):
        start = plen - 1
        if len(seq) - start < 2:
            continue
        hidden = hiddens[i] if hiddens is not None else ref.forward(seq, ref.new_cache(), compute_logits=False)[1]
        logits = ref.medusa_logits(hidden[start:])
        ranks = torch.full((hidden.shape[0] - start, ref.num_medusa_heads), -1, dtype=torch.long)
        for d in range(ref.num_medusa_heads):
            n = len(seq) - start - d - 2
            if n > 0:
                ranks[:n, d] = rank_of_targets(logits[d, :n], torch.tensor(seq[start + d + 2:]), top_k)
        rows.append(ranks)
    return torch.cat(rows) if rows else torch.zeros((0, ref.num_medusa_heads), dtype=torch.long)
