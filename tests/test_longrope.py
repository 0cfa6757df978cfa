"""long_rope (Phi-3 / Phi-3.5 128k, Phi-3.5-MoE): the reference executor computes the engine's two RoPE tables and
picks one per step as the attention plugin does (a context step by the tokens it computes, a generation step by the
prompt plus the checkpoint's max_draft_len); verify proves a longrope base where every step of the engine and of
transformers stays on the short table, and refuses past it, where the two compute different models."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_proven, convert_to, heads_once, tiny_base

from trtllm_medusa_ports.compat import check
from trtllm_medusa_ports.errors import CheckpointError, ModelError
from trtllm_medusa_ports.reference import ReferenceModel
from trtllm_medusa_ports.reference.rope import longrope_mscale
from trtllm_medusa_ports.verify import verify

pytestmark = pytest.mark.numerics  # parity and the tree proof: again on every ATen CPU path (.ci/run)

ORIGINAL = 64  # the tiny bases' original_max_position_embeddings (their table: 256 positions)
DRAFT = 15  # the checkpoints' max_draft_len: every generation step compares the prompt + 15 with ORIGINAL
WINDOW = ORIGINAL - DRAFT  # the longest prompt that keeps every step on the short table
TREE = ("[[0],[1],[2],[3],[0,0],[0,1],[0,2],[1,0],[1,1],[2,0],[0,0,0],[0,0,1],[0,1,0],[1,0,0],[0,0,2]]")  # 15 nodes


def _scaling(arch: str) -> dict:
    """Factors unlike each other and unlike 1 (a table read as the other, or not at all, changes every rotation);
    PhiMoE's config gives its own scales."""
    g = torch.Generator().manual_seed(3)
    half = 8  # the tiny Phi-3 / PhiMoE heads: 16 features, all rotated
    out = {"type": "longrope", "short_factor": [round(1 + float(x), 4) for x in torch.rand(half, generator=g)],
           "long_factor": [round(2 + 3 * float(x), 4) for x in torch.rand(half, generator=g)]}
    if arch == "PhimoeForCausalLM":  # transformers 5's PhimoeConfig reads the original length from here only
        out.update(short_mscale=1.1, long_mscale=1.3, original_max_position_embeddings=ORIGINAL)
    return out


def _base(store, arch: str):
    return tiny_base(store, arch, rope_scaling=_scaling(arch), original_max_position_embeddings=ORIGINAL)


def test_the_default_scale_is_upstreams():
    """sqrt(1 + ln(s) / ln(original)) for s = max / original above 1 (Phi-3.5-mini: 131072 / 4096 -> 1.19024),
    1 where the table is no longer than the original."""
    assert longrope_mscale(131072, 4096) == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert longrope_mscale(131072, 4096) == pytest.approx(1.1902380714)
    assert longrope_mscale(4096, 4096) == 1.0 == longrope_mscale(2048, 4096)


@pytest.mark.parametrize("arch", ["Phi3ForCausalLM", "PhimoeForCausalLM"])
def test_a_longrope_base_verifies_with_every_tree_node_proven(store, tmp_path, arch):
    base = _base(store, arch)
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, dtype="float16", max_draft_len=DRAFT, medusa_choices=TREE)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["position_embedding_type"] == "long_rope" and cfg["original_max_position_embeddings"] == ORIGINAL
    rep = verify(base, ckpt, quiet=True)  # and the stand-in of upstream's build builds it (conftest)
    assert_proven(rep, arch)
    assert rep.ok, rep.render()


@pytest.mark.parametrize("arch, key, value", [
    ("Phi3ForCausalLM", "longrope_scaling_short_factors", "long"),  # the tables swapped
    ("PhimoeForCausalLM", "longrope_short_mscale", 1.0),  # the config's own scale dropped
])
def test_a_wrong_table_or_scale_fails_parity(store, tmp_path, arch, key, value):
    base = _base(store, arch)
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1, max_draft_len=DRAFT, medusa_choices=TREE)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[key] = cfg["longrope_scaling_long_factors"] if value == "long" else value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rep = verify(base, ckpt, quiet=True)
    assert not rep.ok and not rep.parity and rep.logits_max_abs_diff > rep.tolerance, rep.render()


def test_the_context_step_takes_the_table_by_the_tokens_it_computes(store, tmp_path):
    """A context step computing more than original_max_position_embeddings runs on the long table: the executor's
    logits are transformers' (which takes the long factors once the sequence is past it). One of exactly that many
    tokens stays short; so do the chunks of a longer prompt computed chunk by chunk (chunked context, or KV cache
    block reuse computing the rest of a prompt: runtimeBuffers.cpp gives the plugin the chunk's length)."""
    from transformers import AutoModelForCausalLM

    base = _base(store, "Phi3ForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, dtype="float32", max_draft_len=DRAFT, medusa_choices=TREE)
    ref = ReferenceModel(ckpt)
    tokens = [(11 * i + 5) % 256 for i in range(ORIGINAL + 16)]
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
        want_short = hf(torch.tensor([tokens[:ORIGINAL]])).logits[0]
    scale = max(1.0, float(want.abs().max()))
    cache = ref.new_cache()
    assert ref.long_table(cache, ORIGINAL + 1) and not ref.long_table(cache, ORIGINAL)
    long_pass, _ = ref.forward(tokens, ref.new_cache())
    assert float((long_pass - want).abs().max()) < 1e-4 * scale
    at_original, _ = ref.forward(tokens[:ORIGINAL], ref.new_cache())  # the boundary: still short
    assert float((at_original - want_short).abs().max()) < 1e-4 * scale
    assert float((at_original - long_pass[:ORIGINAL]).abs().max()) > 1e-3  # the tables differ (parity: 1e-4)
    chunked = ref.new_cache()  # the same prompt in two chunks within the original length: short keys
    first, _ = ref.forward(tokens[:ORIGINAL], chunked)
    second, _ = ref.forward(tokens[ORIGINAL:], chunked, context_chunk=True)
    assert chunked.context_length == len(tokens) and not ref.long_table(chunked, len(tokens) - ORIGINAL)
    assert float((first - want_short).abs().max()) < 1e-4 * scale
    assert float((second - long_pass[ORIGINAL:]).abs().max()) > 1e-3


def test_generation_steps_take_the_table_by_the_prompt_plus_the_max_draft_length(store, tmp_path):
    """Every generation step compares the prompt plus the checkpoint's max_draft_len with the original length: a
    prompt of WINDOW tokens keeps the short table (its steps are rows of one short causal pass, and transformers'),
    one token more runs its steps on the long table over keys written short (no causal pass computes that)."""
    base = _base(store, "Phi3ForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1, dtype="float32", max_draft_len=DRAFT, medusa_choices=TREE)
    ref = ReferenceModel(ckpt)
    assert ref.engine_draft_tokens == DRAFT
    tokens = [(7 * i + 3) % 256 for i in range(ORIGINAL)]
    causal, _ = ref.forward(tokens, ref.new_cache())  # 64 tokens: short
    scale = max(1.0, float(causal.abs().max()))
    for prompt, long in ((WINDOW, False), (WINDOW + 1, True)):
        cache = ref.new_cache()
        ref.forward(tokens[:prompt], cache)
        assert ref.long_table(cache) is long, prompt
        steps = torch.cat([ref.forward([t], cache)[0] for t in tokens[prompt:]])
        diff = float((steps - causal[prompt:]).abs().max())
        assert (diff > 1e-3) if long else (diff < 1e-4 * scale), (prompt, diff)
    from trtllm_medusa_ports.reference.tree_proof import tree_proof
    from trtllm_medusa_ports.trees.tree import MedusaTree

    with pytest.raises(ModelError, match=f"prove with a prompt of at most {WINDOW} tokens"):  # no causal pass is that
        tree_proof(ref, tokens[:WINDOW + 1], MedusaTree.from_spec(TREE), rtol=1e-4)


def test_verify_runs_within_the_short_window_and_names_the_largest_run_that_fits(store, tmp_path):
    from trtllm_medusa_ports.verify.inputs import check_position_table

    base = _base(store, "Phi3ForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1, max_draft_len=DRAFT, medusa_choices=TREE)
    ref = ReferenceModel(ckpt)
    prompts = [[5] * 9, [7] * 4]
    check_position_table(prompts, ORIGINAL + 1 - 9, ref, "here")  # transformers' last step reads 64 tokens
    with pytest.raises(ModelError) as err:
        check_position_table(prompts, ORIGINAL + 2 - 9, ref, "here")
    assert "original_max_position_embeddings (64)" in err.value.what and "reads 65 tokens" in err.value.what
    assert f"--max_new_tokens {ORIGINAL + 1 - 9} or less" in err.value.fix
    check_position_table([[5] * WINDOW], 1, ref, "here")  # the generation steps' boundary, both sides
    with pytest.raises(ModelError) as err:
        check_position_table([[5] * (WINDOW + 1)], 1, ref, "here")
    assert f"{WINDOW + 1} + {DRAFT} > {ORIGINAL}" in err.value.what and "short table" in err.value.what
    assert f"prompts of at most {WINDOW} tokens" in err.value.fix
    with pytest.raises(ModelError, match="past original_max_position_embeddings"):
        verify(base, ckpt, quiet=True, max_new_tokens=ORIGINAL)
    with pytest.raises(ModelError, match=f"prompts of at most {WINDOW} tokens"):
        verify(base, ckpt, quiet=True, prompts=[[5] * (WINDOW + 1)], max_new_tokens=2)


@pytest.mark.parametrize("change, message", [
    ({"longrope_scaling_long_factors": None}, "longrope_scaling_long_factors"),
    ({"longrope_scaling_short_factors": ["1", 2.0]}, "lists of numbers"),
    ({"original_max_position_embeddings": 64.5}, "original_max_position_embeddings"),
    ({"original_max_position_embeddings": 0}, "a positive int"),
    ({"longrope_short_mscale": "1.1"}, "numbers, where given"),
    ({"longrope_scaling_short_factors": [1.0, 2.0]}, "2 factors per table, the rotary dimension 16 needs 8"),
    ({"longrope_scaling_long_factors": [1.0] * 7 + [0.0]}, "finite and positive"),
])
def test_a_longrope_config_without_usable_tables_is_named(store, tmp_path, change, message):
    base = _base(store, "Phi3ForCausalLM")
    ckpt = tmp_path / "c"
    shutil.copytree(convert_to(tmp_path / "orig", base, heads_once(base), tp_size=1, max_draft_len=DRAFT, medusa_choices=TREE), ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(change)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message) as err:
        ReferenceModel(ckpt)
    assert str(ckpt / "config.json") in str(err.value)


def test_check_says_how_the_engine_picks_the_table(tmp_path):
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
           "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
           "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
           "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _, findings = check(tmp_path)
    rules = {f.rule: f for f in findings}
    assert "rope-scaling-unverified" not in rules
    f = rules["longrope-table-per-request"]
    assert f.severity == "warning" and "(4096)" in f.message and "useLongRoPECache" in f.message
    assert "the prompt plus the engine's max draft length" in f.message and "chunk computed" in f.message
    assert "--max_seq_len 4096" in f.fix and "(4033 at the default max_draft_len 63)" in f.fix


@pytest.mark.parametrize("change, named", [
    ({"short_factor": [1.0] * 3}, "short_factor has 3 factors per table, the rotary dimension 16 needs 8"),
    ({"long_factor": [float("nan")] * 8}, "long_factor: long_rope's factors must be finite and positive"),
    ({"original_max_position_embeddings": 0}, "original_max_position_embeddings is 0, not a positive int"),
])
def test_junk_longrope_is_refused_where_it_is_read(store, tmp_path, capsys, change, named):
    """Issue 76, 3: one judge of the long_rope tables (files/checkpoint_schema.py longrope_problems) for convert,
    check and every reader of a checkpoint: a factor list of the wrong length, a NaN, an original length of 0 are
    named by convert (exit 1, nothing written) and by check (invalid-config), not first by verify."""
    from trtllm_medusa_ports.cli import main

    base = Path(shutil.copytree(_base(store, "Phi3ForCausalLM"), tmp_path / "base"))
    cfg = json.loads((base / "config.json").read_text())
    scaling = cfg.get("rope_scaling") or cfg["rope_parameters"]  # as transformers 4 / 5 save it
    for k, v in change.items():
        scaling[k] = v
        if k in cfg:
            cfg[k] = v
    (base / "config.json").write_text(json.dumps(cfg))
    heads = heads_once(_base(store, "Phi3ForCausalLM"))
    out = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir", str(out),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and not out.exists()
    _, findings = check(base)
    f = next(f for f in findings if f.rule == "invalid-config")
    assert f.severity == "error" and named in f.message
