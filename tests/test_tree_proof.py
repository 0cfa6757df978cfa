"""The tree proof (reference/tree_proof.py) on every family: it reaches every node, and a wrong position offset,
mask row or KV slot at depth 2 fails it."""

from functools import cached_property

import pytest
from conftest import convert_to, tiny_base

from trtllm_medusa_ports.archs import adapter_for, registry
from trtllm_medusa_ports.files.checkpoint import read_checkpoint
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads
from trtllm_medusa_ports.reference import ReferenceModel
from trtllm_medusa_ports.reference.executor import KVCache
from trtllm_medusa_ports.reference.tree_proof import step_tokens, tree_proof
from trtllm_medusa_ports.trees.tree import MedusaTree, pack_mask

#: floating-point results: CI runs these on every ATen CPU path (.ci/run)
pytestmark = pytest.mark.numerics

FAMILIES = sorted({cls.hf_architectures[0] for cls in registry().values()})
#: depth 3, two nodes at depth 1, three at depth 2
TREE = MedusaTree.from_spec("[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]", num_heads=3)
PROMPT = [1, 5, 9, 3]
#: weights a few times larger than transformers' default 0.02, so that attention is far from uniform in every
#: family's tiny base (Granite's attention_multiplier makes its scores 4x smaller: with the default weights a
#: position one too far moved its logits by 2e-6, below any tolerance)
INIT_STD = 0.1
_MODELS: dict = {}


def _model(store, arch) -> ReferenceModel:
    if arch not in _MODELS:
        base = tiny_base(store, arch, init_std=INIT_STD)
        hf = HFConfig.read(base)
        heads = save_heads(random_heads(adapter_for(arch).hidden_size(hf), hf.get("vocab_size"), num_heads=3, seed=3),
                           store / f"proof-heads-{arch}")
        ckpt = convert_to(store / f"proof-{arch}", base, heads, allow_unsupported=True)
        _MODELS[arch] = ReferenceModel(read_checkpoint(ckpt))
    return _MODELS[arch]


class _OffsetOneTooFar(MedusaTree):
    @cached_property
    def position_offsets(self):
        return [o + 1 if o == 2 else o for o in super().position_offsets]


class _DepthTwoMissesItsParent(MedusaTree):
    @cached_property
    def packed_mask(self):
        mask = self.attention_mask.clone()
        for slot, path in enumerate(self.paths, start=1):
            if len(path) == 2:
                mask[slot, self.parents[slot]] = False
        return pack_mask(mask)


def _faulty(cls) -> MedusaTree:
    return cls(paths=TREE.paths, top_k=TREE.top_k, _index=TREE._index)


def test_step_tokens_put_greedy_on_the_branch_and_misses_beside_it():
    branch = [1, 3]  # (0,), (0, 0)
    tokens = step_tokens(TREE, branch, [7, 8, 9], vocab=256).tolist()
    assert tokens[0] == 7 and tokens[1] == 8 and tokens[3] == 9
    assert tokens[2] != 8 and tokens[4] != 9  # the siblings of the branch's nodes cannot match


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_proof_reaches_every_node(store, arch):
    proof = tree_proof(_model(store, arch), PROMPT, TREE, rtol=1e-4)
    assert proof.ok, proof.failure
    assert proof.nodes_accepted == TREE.num_nodes == 6 and proof.steps == 3
    assert [(d.depth, d.nodes, d.accepted) for d in proof.per_depth] == [(1, 2, 2), (2, 3, 3), (3, 1, 1)]
    assert proof.max_abs_diff <= proof.tolerance


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("fault", ["position offset", "mask", "kv slot"])
def test_a_fault_at_depth_two_fails_the_proof(store, monkeypatch, arch, fault):
    model = _model(store, arch)
    tree = TREE
    if fault == "position offset":
        tree = _faulty(_OffsetOneTooFar)
    elif fault == "mask":
        tree = _faulty(_DepthTwoMissesItsParent)
    else:
        keep = KVCache.keep

        def wrong_slot(self, start, slots):  # the depth-2 node's entry taken from its sibling's slot
            slots = list(slots)
            if len(slots) > 2:
                slots[2] = 4 if slots[2] != 4 else 5
            keep(self, start, slots)
        monkeypatch.setattr(KVCache, "keep", wrong_slot)
    proof = tree_proof(model, PROMPT, tree, rtol=1e-4)
    assert not proof.ok and proof.failure
    where = "at its root" if fault == "kv slot" else "at depth 2"
    assert where in proof.failure or "accepted" in proof.failure, proof.failure


def _noisy(model, monkeypatch, rel: float, only_single: bool = False):
    """Logits moved by ``rel`` of their scale in a pattern that depends on the number of tokens in the call, as
    kernels whose summation order follows the matrix shape round them (``only_single``: the token-by-token calls
    alone, a cache path that is wrong)."""
    import torch

    forward = type(model).forward

    def shaped(self, tokens, cache, *args, **kwargs):
        logits, hidden = forward(self, tokens, cache, *args, **kwargs)
        n = len(tokens)
        if logits is not None and (n == 1 or not only_single):
            pattern = torch.cos(torch.arange(logits.shape[-1], dtype=torch.float32) * (n + 0.5))
            logits = logits + rel * float(logits.abs().max()) * pattern
        return logits, hidden
    monkeypatch.setattr(type(model), "forward", shaped)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "GPTJForCausalLM", "BloomForCausalLM"])
def test_shape_dependent_rounding_sets_the_tolerance_and_a_fault_still_fails(store, monkeypatch, arch):
    """Two correct computations of other shapes differ by the machine's rounding: the proof measures it and
    allows NOISE_FACTOR times it (the rtol alone fails a correct tree here), and still fails a wrong offset."""
    from trtllm_medusa_ports.reference.tree_proof import NOISE_FACTOR

    model = _model(store, arch)
    clean = tree_proof(model, PROMPT, TREE, rtol=1e-4)
    assert clean.ok and clean.rounding_noise * NOISE_FACTOR < clean.tolerance  # tiny models: the rtol decides
    _noisy(model, monkeypatch, 2e-4)
    proof = tree_proof(model, PROMPT, TREE, rtol=1e-4)
    assert proof.ok, proof.failure
    assert proof.max_abs_diff > clean.tolerance  # the rtol alone (the clean run's tolerance) would fail it
    assert proof.tolerance == pytest.approx(NOISE_FACTOR * proof.rounding_noise)
    faulty = tree_proof(model, PROMPT, _faulty(_OffsetOneTooFar), rtol=1e-4)
    assert not faulty.ok and ("at depth 2" in faulty.failure or "accepted" in faulty.failure), faulty.failure


def test_cache_noise_beyond_rounding_fails_before_any_tree_step(store, monkeypatch):
    model = _model(store, "LlamaForCausalLM")
    _noisy(model, monkeypatch, 3e-3, only_single=True)
    proof = tree_proof(model, PROMPT, TREE, rtol=1e-4)
    assert not proof.ok and proof.nodes_accepted == TREE.num_nodes
    assert proof.failure.startswith("plain decoding through the KV cache differs from one causal pass"), proof.failure
    assert "before any tree step" in proof.failure and proof.rounding_noise > 1e-3
