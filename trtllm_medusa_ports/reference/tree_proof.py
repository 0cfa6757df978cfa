"""The tree proof: Medusa steps whose drafts are the base's own greedy tokens, so that every tree node is accepted.

Greedy equivalence with the heads' own drafts proves only the nodes those heads get right: untrained heads get
none, so a wrong position offset, mask bit or KV slot below the root passes it. This proof does not depend on the
heads. Each step takes one branch of the tree (a root-to-leaf path, every leaf in turn) and feeds, on that
branch, the token plain greedy decoding emits at each depth, and on every other node a token that cannot match
its parent's argmax. Then, on the reference executor, exactly as the engine's runtime would:

* acceptance (:func:`~trtllm_medusa_ports.reference.decoding.greedy_accept`) must take that branch to its leaf,
  and the emitted tokens must be plain greedy decoding's;
* the logits at the root and at every node of the branch must equal those of one causal pass over the prompt and
  the greedy tokens from an empty cache (which shares no tree buffer, no compaction and no cache with the steps):
  this is where a node's position offset, its mask row and every earlier step's compacted KV entries show;
* the accepted entries are compacted behind the root (``KVCache.keep``), as the runtime does, and the next step
  reads them.

Every node lies on some leaf's branch, so over ``leaves`` steps every node is accepted once and its logits
checked. A sequence that would pass the base's positions or sliding window is ended and the remaining leaves
start again from the prompt on an empty cache (reported as ``sequences``).

The tolerance. A tree step and the causal pass multiply matrices of other shapes (5 rows, 10 rows), and CPU
kernels sum in an order that depends on the shape: at real magnitudes (hidden states of 1e3 and more, norms
that cancel most of them) two correct computations of the same logits differ by up to ~1e-4 of their scale,
by how much depending on the machine's kernels. So the proof measures that floor on the same tokens: plain
greedy decoding, token by token through the cache (the second correct computation it already runs), against
the causal pass (``rounding_noise``). The tolerance is ``rtol`` times the logits' scale or
:data:`NOISE_FACTOR` times that noise, whichever is larger; tiny models' noise (~1e-7) leaves ``rtol`` in
charge. Noise beyond :data:`NOISE_RTOL_CAP` of the scale is not rounding: the proof fails there, before it
trusts any tree step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.reference.decoding import greedy_accept, plain_decode
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree

#: how many times the rounding noise between two correct decodings (module doc) a tree step may differ by
NOISE_FACTOR = 8.0
#: the most noise, relative to the logits' scale, taken as rounding: ten times verify's parity rtol
NOISE_RTOL_CAP = 1e-3


@dataclass
class DepthProof:
    depth: int
    nodes: int  # tree nodes at this depth
    accepted: int  # of them, accepted in some step and their logits checked
    max_abs_diff: float = 0.0


@dataclass
class TreeProof:
    steps: int
    sequences: int
    tree_nodes: int
    nodes_accepted: int
    tokens: int
    tolerance: float
    max_abs_diff: float
    #: max |logit difference| between plain decoding through the cache and the causal pass (module doc)
    rounding_noise: float = 0.0
    per_depth: list[DepthProof] = field(default_factory=list)
    #: the first thing that went wrong, in words (None: nothing)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.nodes_accepted == self.tree_nodes and self.max_abs_diff <= self.tolerance

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d

    def summary(self) -> str:
        depths = ", ".join(f"depth {p.depth}: {p.accepted}/{p.nodes}" for p in self.per_depth)
        return (f"{self.nodes_accepted} of {self.tree_nodes} nodes accepted in {self.steps} steps "
                f"({self.sequences} sequence(s), {self.tokens} tokens; {depths}), max |diff| = {self.max_abs_diff:.3g} "
                f"(tolerance {self.tolerance:.3g}; rounding noise {self.rounding_noise:.3g})")


def _branches(tree: MedusaTree, width: int) -> list[list[int]]:
    """The node slots (root excluded) of each root-to-leaf path, one per leaf."""
    return [[n for n in row[1:] if n >= 0] for row in tree.retrieve_paths(width)]


def _sequences(branches: list[list[int]], prompt_len: int, limit: int) -> list[list[list[int]]]:
    """Branches grouped so that each group's sequence (prompt, root, then depth + 1 tokens a step) fits ``limit``."""
    groups: list[list[list[int]]] = []
    used = limit + 1
    for b in branches:
        need = len(b) + 1
        if prompt_len + 1 + need + 1 > limit:
            raise ValueError(f"a prompt of {prompt_len} tokens leaves no room for a tree step of depth {len(b)} within "
                             f"{limit} positions")
        if used + need > limit:
            groups.append([])
            used = prompt_len + 1 + 1
        groups[-1].append(b)
        used += need
    return groups


def step_tokens(tree: MedusaTree, branch: list[int], greedy: list[int], vocab: int) -> torch.Tensor:
    """The tokens of one proof step: ``greedy[0]`` at the root, ``greedy[d]`` at the branch's node of depth d, and
    at every other node a token unequal to the greedy one at its depth (its parent on the branch then rejects it;
    a node whose parent is off the branch is never reached)."""
    on = set(branch)
    tokens = [greedy[0]]
    for slot, path in enumerate(tree.paths, start=1):  # the tree's own depths, not its (checked) buffers
        depth = len(path)
        if slot in on:
            tokens.append(greedy[depth])
        else:
            right = greedy[min(depth, len(greedy) - 1)]
            tokens.append((right + 1 + slot) % vocab)
    return torch.tensor(tokens, dtype=torch.long)


def _longrope_limit(model: ReferenceModel, prompt: list[int], limit: int) -> int:
    """The proof's sequence limit on a long_rope base. The reference is one causal context pass over the prompt and
    the greedy tokens; the steps it checks are the engine's generation steps, whose table the prompt plus the max
    draft length picks (archs/semantics.py LongRope): the two passes must run on one table."""
    longrope = model.semantics.longrope
    if longrope is None:
        return limit
    if not longrope.generation_long(len(prompt), model.engine_draft_tokens):
        return min(limit, longrope.original_max_positions)  # short: the reference must not grow into the long one
    if not longrope.context_long(len(prompt)):
        raise ModelError(
            f"a prompt of {len(prompt)} tokens with max_draft_len {model.engine_draft_tokens}: the engine writes "
            f"its keys with long_rope's short table (context step: {len(prompt)} tokens, within "
            f"original_max_position_embeddings {longrope.original_max_positions}) and runs every generation step "
            f"on the long one ({len(prompt)} + {model.engine_draft_tokens} > {longrope.original_max_positions}): "
            "no single causal pass computes that, so the tree proof cannot check it",
            fix=f"prove with a prompt of at most {longrope.short_window(model.engine_draft_tokens)} tokens (or "
                f"more than {longrope.original_max_positions})")
    return limit


@torch.inference_mode()
def tree_proof(model: ReferenceModel, prompt: list[int], tree: MedusaTree, *, rtol: float,
               max_positions: int | None = None) -> TreeProof:
    """Run the proof (module doc) from ``prompt``; the tolerance is ``rtol`` times ``max(1, max |logit|)`` or
    :data:`NOISE_FACTOR` times the rounding noise, whichever is larger."""
    width = model.num_medusa_heads + 1
    branches = _branches(tree, max(width, tree.depth + 1))
    limit = max_positions or 10**9
    window = model.semantics.sliding_window
    if window:
        limit = min(limit, int(window))
    limit = _longrope_limit(model, prompt, limit)
    depth_of = [0] + [len(p) for p in tree.paths]
    per_depth = {d: DepthProof(d, sum(1 for x in depth_of[1:] if x == d), 0) for d in range(1, tree.depth + 1)}
    accepted_nodes: set[int] = set()
    paths = tree.retrieve_paths(max(width, tree.depth + 1))
    proof = TreeProof(steps=0, sequences=0, tree_nodes=tree.num_nodes, nodes_accepted=0, tokens=0, tolerance=0.0,
                      max_abs_diff=0.0)
    scale = 1.0
    diffs: list[tuple[int, int, float]] = []  # (step, depth, |diff|) of every checked row
    for group in _sequences(branches, len(prompt), limit):
        proof.sequences += 1
        total = 1 + sum(len(b) + 1 for b in group)
        greedy, decoded = plain_decode(model, prompt, total)
        # the independent reference: one causal pass over the prompt and the greedy tokens, from an empty cache
        expected, _ = model.forward(prompt + greedy[:-1], model.new_cache())
        expected = expected[len(prompt) - 1:]  # row j predicts greedy[j]
        scale = max(scale, float(expected.abs().max()))
        proof.rounding_noise = max(proof.rounding_noise, float((decoded - expected).abs().max()))
        cache = model.new_cache()
        model.forward(prompt, cache, compute_logits=False)
        pos = 0  # index in greedy of the current root
        for branch in group:
            tokens = step_tokens(tree, branch, greedy[pos:pos + len(branch) + 1], model.vocab)
            past = cache.length
            logits, _ = model.forward(tokens, cache, spec_decoding_position_offsets=tree.position_offsets,
                                      spec_decoding_packed_mask=tree.packed_mask)
            predicted = logits.argmax(-1)
            best, n = greedy_accept(tokens, predicted, paths)
            slots = [0] + branch
            got = [int(predicted[s]) for s in slots]
            want = greedy[pos + 1:pos + len(branch) + 2]
            if proof.failure is None and (n != len(branch) or paths[best][1:n + 1] != branch or got != want):
                proof.failure = (f"step {proof.steps + 1}: the branch to node {branch[-1]} (depth {len(branch)}) "
                                 f"accepted {n} draft(s) and emitted {got}, plain greedy decoding {want}")
            for d, s in enumerate(slots):
                diff = float((logits[s] - expected[pos + 1 + d]).abs().max())
                diffs.append((proof.steps + 1, d, diff))
                if d:
                    per_depth[d].max_abs_diff = max(per_depth[d].max_abs_diff, diff)
            accepted_nodes.update(branch)
            cache.keep(past, slots)
            pos += len(branch) + 1
            proof.steps += 1
        proof.tokens += total
    return _concluded(proof, rtol, scale, diffs, per_depth, accepted_nodes, depth_of)


def _concluded(proof: TreeProof, rtol: float, scale: float, diffs: list[tuple[int, int, float]],
               per_depth: dict[int, DepthProof], accepted_nodes: set[int], depth_of: list[int]) -> TreeProof:
    """The proof's tolerance, counts and verdict from what the steps measured: the cache's own rounding noise
    against one causal pass first, then the first row past the tolerance, named by step and depth."""
    proof.tolerance = max(rtol * scale, NOISE_FACTOR * proof.rounding_noise)
    if proof.rounding_noise > NOISE_RTOL_CAP * scale:
        proof.failure = (f"plain decoding through the KV cache differs from one causal pass over the same tokens by "
                         f"{proof.rounding_noise:.3g}, more than rounding ({NOISE_RTOL_CAP:g} of the logits' scale "
                         f"{scale:.3g}): the cache's entries or positions are wrong before any tree step")
    proof.max_abs_diff = max((d for _, _, d in diffs), default=0.0)
    for d, p in per_depth.items():
        p.accepted = sum(1 for s in accepted_nodes if depth_of[s] == d)
    proof.per_depth = list(per_depth.values())
    proof.nodes_accepted = len(accepted_nodes)
    if proof.failure is None and proof.max_abs_diff > proof.tolerance:
        step, depth, diff = next(r for r in diffs if r[2] > proof.tolerance)
        where = ("at its root, which reads the KV entries earlier steps compacted" if depth == 0 else
                 f"at depth {depth}: that node's position offset or mask row, or a KV entry it reads, is wrong")
        proof.failure = (f"step {step}: the logits differ from plain decoding's by {diff:.3g} (tolerance "
                         f"{proof.tolerance:.3g}) {where}")
    return proof
