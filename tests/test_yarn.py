"""YaRN (Qwen2.5 / Qwen3 long-context configs): the reference executor computes the engine's YaRN table and scale
(tensorrt_llm/layers/attention.py ``create_attention_const_params`` with ``RopeEmbeddingUtils.
create_sinusoidal_positions_yarn``), verify proves a YaRN base with every tree node, and check refuses, naming the
option, what transformers computes otherwise than the engine (issue 75, 3)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import assert_proven, convert_to, heads_once, tiny_base

from trtllm_medusa_ports.archs.semantics import yarn_engine_mscale
from trtllm_medusa_ports.compat import check
from trtllm_medusa_ports.reference.rope import yarn_inv_freq
from trtllm_medusa_ports.verify import verify

pytestmark = pytest.mark.numerics  # parity and the tree proof: again on every ATen CPU path (.ci/run)

#: Qwen2.5's model-card setting, at the tiny bases' scale: a factor 4 past an original 64 positions (the ramp then
#: spans the tiny heads' frequencies: some kept, some divided by 4, some between)
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def _base(store, arch: str, **scaling):
    return tiny_base(store, arch, rope_scaling={**YARN, **scaling})


def test_the_engines_yarn_is_transformers_where_their_options_agree():
    """The frequencies and the cos / sin scale against transformers' own YaRN (modeling_rope_utils.py), at a
    Qwen2.5 size and at the tiny one."""
    from transformers import Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for head, theta, scaling in ((128, 1e6, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
                                 (16, 1e4, YARN),
                                 (64, 1e4, {**YARN, "beta_fast": 16, "beta_slow": 2, "mscale": 0.7,
                                            "mscale_all_dim": 0.7})):
        cfg = Qwen2Config(hidden_size=head * 2, num_attention_heads=2, rope_theta=theta, rope_scaling=dict(scaling),
                          max_position_embeddings=4 * int(scaling["original_max_position_embeddings"]))
        want, want_scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        got, scale = yarn_inv_freq(head, theta, scaling)
        assert torch.equal(got.float(), want.float()), (head, (got.float() - want).abs().max())
        assert scale == pytest.approx(want_scale, rel=1e-12)
    assert yarn_engine_mscale(YARN) == pytest.approx(0.1 * math.log(4.0) + 1)


@pytest.mark.parametrize("arch, tp", [("Qwen2ForCausalLM", 1), ("Qwen2ForCausalLM", 2), ("Qwen3ForCausalLM", 2),
                                      ("LlamaForCausalLM", 1)])
def test_a_yarn_base_verifies_with_every_tree_node_proven(store, tmp_path, arch, tp):
    base = _base(store, arch)
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=tp, dtype="float16")
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["rotary_scaling"] == {**YARN}
    _, findings = check(base)
    assert not {"rope-scaling-unverified", "rope-scaling-yarn-option"} & {f.rule for f in findings}
    rep = verify(base, ckpt, quiet=True)
    assert_proven(rep, arch)
    assert rep.ok, rep.render()


@pytest.mark.parametrize("change", [{"factor": 2.0}, {"mscale_all_dim": 1.0}, {"beta_slow": 4.0}])
def test_a_yarn_option_changed_in_the_checkpoint_fails_parity(store, tmp_path, change):
    """The executor computes the checkpoint's YaRN as the engine would: a factor, a scale or a ramp other than the
    base's is a parity failure, not a pass."""
    base = _base(store, "Qwen2ForCausalLM")
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1, dtype="float32")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rotary_scaling"].update(change)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rep = verify(base, ckpt, quiet=True, skip_tree_proof=True)
    assert not rep.ok and not rep.parity and rep.logits_max_abs_diff > rep.tolerance, rep.render()


QWEN25 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
          "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
          "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}


@pytest.mark.parametrize("scaling, named", [
    ({"attention_factor": 1.0}, "attention_factor 1.0"),
    ({"mscale": 0.707}, "mscale and mscale_all_dim unused unless both are given"),
    ({"mscale_all_dim": 1.0}, "mscale and mscale_all_dim unused unless both are given"),
    ({"truncate": False}, "truncate is false"),
    ({"factor": None}, "factor is not given"),
    ({"original_max_position_embeddings": None}, "original_max_position_embeddings is not given"),
    ({"beta_fast": 0}, "beta_fast is 0"),
    ({"mscale": 0.707, "mscale_all_dim": 0.707}, None),  # both given: both compute a scale of 1
    ({"attention_factor": 0.1 * math.log(4.0) + 1}, None),  # the scale the engine computes
    ({}, None),
])
def test_check_names_a_yarn_option_the_engine_computes_otherwise(tmp_path, scaling, named):
    cfg = dict(QWEN25, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                     **scaling})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _, findings = check(tmp_path)
    rules = {f.rule: f for f in findings}
    assert "rope-scaling-unverified" not in rules
    if named is None:
        assert "rope-scaling-yarn-option" not in rules
    else:
        f = rules["rope-scaling-yarn-option"]
        assert f.severity == "error" and named in f.message and f.overridable, f.message


def test_the_original_length_written_at_the_top_level_reaches_the_engine(store, tmp_path):
    """A config writing original_max_position_embeddings beside rope_scaling (as transformers also reads it): the
    checkpoint's rotary_scaling carries it, where the engine reads it (4096 otherwise)."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.files.hf_model import HFConfig

    cfg = dict(QWEN25, original_max_position_embeddings=32768, rope_scaling={"type": "yarn", "factor": 4.0})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    written = adapter_for("Qwen2ForCausalLM").engine_config(HFConfig.read(tmp_path))["rotary_scaling"]
    assert written == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def test_dynamic_scaling_is_refused_by_verify_naming_the_reason(store, tmp_path):
    """dynamic NTK is computed inside the engine's kernels as they run: check warns (rope-scaling-unverified) and
    the executor refuses the checkpoint naming the type and why, before any comparison."""
    from trtllm_medusa_ports.errors import ModelError
    from trtllm_medusa_ports.reference import ReferenceModel

    base = tiny_base(store, "Qwen2ForCausalLM", rope_scaling={"type": "dynamic", "factor": 2.0})
    _, findings = check(base)
    f = next(f for f in findings if f.rule == "rope-scaling-unverified")
    assert "dynamic NTK" in f.message and "update_rotary_base_n_scale" in f.message
    ckpt = convert_to(tmp_path / "c", base, heads_once(base), tp_size=1)
    with pytest.raises(ModelError) as err:
        ReferenceModel(ckpt)
    assert "'dynamic'" in err.value.what and "rescale RoPE's base by the sequence length" in err.value.what
    assert "rope-scaling-unverified" in err.value.fix
