"""Shared fixtures: tiny bases and heads are built by the tests (no model hub)."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import pytest
import torch

from trtllm_medusa_ports.convert import ConvertOptions, convert
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_base,
    tiny_config,
    train_heads,
)

torch.set_num_threads(1)  # tiny models: a second thread only waits (and, on a busy machine, stalls every op)
# shapes built by transformers are cached per config (files/hf_model.py): one cache per test session
os.environ["TRTLLM_MEDUSA_CACHE"] = tempfile.mkdtemp(prefix="trtllm-medusa-test-cache-")
atexit.register(shutil.rmtree, os.environ["TRTLLM_MEDUSA_CACHE"], True)  # ours: gone with the session


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("store")


_BASES: dict = {}


def tiny_base(root: Path, architecture: str, **overrides) -> Path:
    """A saved tiny base (cached per session by its parameters)."""
    key = (architecture, json.dumps(overrides, sort_keys=True))
    if key not in _BASES:
        d = root / f"base-{architecture}-{len(_BASES)}"
        # seeded by the parameters as first spelled (norm_offset was norm_scale), so that every base - and
        # the half-precision margins it was checked at - stays the same
        spelled = {("norm_scale" if k == "norm_offset" else k): v for k, v in overrides.items()}
        seed = zlib.crc32(json.dumps(spelled, sort_keys=True).encode()) % 997
        save_tiny_base(architecture, d, seed=seed, **overrides)
        _BASES[key] = d
    return _BASES[key]


@pytest.fixture(scope="session")
def qwen2_base(store) -> Path:
    return tiny_base(store, "Qwen2ForCausalLM")


@pytest.fixture(scope="session")
def llama_base(store) -> Path:
    return tiny_base(store, "LlamaForCausalLM")


@pytest.fixture(scope="session")
def qwen2_heads(store, qwen2_base) -> Path:
    cfg = tiny_config("Qwen2ForCausalLM")
    return save_heads(random_heads(cfg.hidden_size, cfg.vocab_size, num_heads=3, seed=1), store / "qwen2-heads")


@pytest.fixture(scope="session")
def llama_trained(store) -> tuple[Path, Path]:
    """A Llama base with heads trained to predict it (multi-token acceptance happens)."""
    base = tiny_base(store, "LlamaForCausalLM", embedding_gain=4.0)
    heads = train_heads(base, num_heads=3)
    return base, save_heads(heads, store / "llama-trained-heads")


def convert_to(out: Path, base: Path, heads: Path, **kw) -> Path:
    kw.setdefault("quiet", True)
    convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=out, **kw))
    return out


def assert_proven(rep, context: str = "") -> None:
    """Logits parity, greedy equivalence, and the tree proof reaching every node of the tree (untrained heads accept
    no draft, so only the proof checks the nodes below the root)."""
    proof = rep.tree_proof
    assert rep.parity and rep.greedy_equal, f"{context}\n{rep.render()}"
    assert proof is not None and proof["ok"] and proof["nodes_accepted"] == rep.tree_nodes > 0, f"{context}\n{rep.render()}"


def assert_tree_step_matches_sequential(ref, prompt, tokens, tree):
    """One spec-decoding step over ``tokens`` gives, at every node, the logits of decoding its path.

    This is what makes Medusa's greedy output equal the base model's.
    """
    cache = ref.new_cache()
    ref.forward(prompt, cache)
    logits, _ = ref.forward(tokens, cache, spec_decoding_position_offsets=tree.position_offsets,
                            spec_decoding_packed_mask=tree.packed_mask)
    for node in range(tree.num_tokens):
        chain, j = [], node
        while j >= 0:
            chain.append(int(tokens[j]))
            j = tree.parents[j]
        seq, _ = ref.forward(prompt + chain[::-1], ref.new_cache())
        assert torch.allclose(logits[node], seq[-1], atol=1e-5), node
    return logits
