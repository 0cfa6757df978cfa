"""long_rope (Phi-3 / Phi-3.5 128k, Phi-3.5-MoE): the reference executor computes the engine's two RoPE tables and
picks one per request by its prompt's length, as the attention plugin does; verify proves a longrope base within
original_max_position_embeddings and refuses past it, where transformers and the engine compute different models."""

from __future__ import annotations

import json
import math
import shutil

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
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, dtype="float16")
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
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[key] = cfg["longrope_scaling_long_factors"] if value == "long" else value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rep = verify(base, ckpt, quiet=True)
    assert not rep.ok and not rep.parity and rep.logits_max_abs_diff > rep.tolerance, rep.render()


def test_the_table_is_chosen_by_the_prompt_and_the_long_one_is_transformers(store, tmp_path):
    """A prompt longer than original_max_position_embeddings runs on the long table: the executor's logits are
    transformers' (which takes the long factors once the sequence is past it). The same tokens after a prompt
    within it stay on the short table to the end, as the engine's request does: other logits."""
    from transformers import AutoModelForCausalLM

    base = _base(store, "Phi3ForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=2, dtype="float32")
    ref = ReferenceModel(ckpt)
    tokens = [(11 * i + 5) % 256 for i in range(ORIGINAL + 16)]
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
    long_pass, _ = ref.forward(tokens, ref.new_cache())
    assert float((long_pass - want).abs().max()) < 1e-4 * max(1.0, float(want.abs().max()))
    cache = ref.new_cache()
    ref.forward(tokens[:ORIGINAL], cache)  # a prompt within the original length: the short table, kept
    short_steps, _ = ref.forward(tokens[ORIGINAL:], cache)
    assert cache.context_length == ORIGINAL and not ref.long_table(cache)
    assert float((short_steps - long_pass[ORIGINAL:]).abs().max()) > 1e-3  # parity: 1e-4 of the scale


def test_verify_runs_within_the_original_length_and_names_the_largest_run_that_fits(store, tmp_path):
    from trtllm_medusa_ports.verify.inputs import check_position_table

    base = _base(store, "Phi3ForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1)
    ref = ReferenceModel(ckpt)
    prompts = [[5] * 9, [7] * 4]
    check_position_table(prompts, ORIGINAL + 1 - 9, ref, "here")  # transformers' last step reads 64 tokens
    with pytest.raises(ModelError) as err:
        check_position_table(prompts, ORIGINAL + 2 - 9, ref, "here")
    assert "original_max_position_embeddings (64)" in err.value.what and "reads 65 tokens" in err.value.what
    assert f"--max_new_tokens {ORIGINAL + 1 - 9} or less" in err.value.fix
    with pytest.raises(ModelError, match="past original_max_position_embeddings"):
        verify(base, ckpt, quiet=True, max_new_tokens=ORIGINAL)


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
    shutil.copytree(convert_to(tmp_path / "orig", base, heads_once(base), tp_size=1), ckpt)
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
    assert "--max_seq_len 4096" in f.fix
