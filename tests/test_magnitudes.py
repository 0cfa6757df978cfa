"""Real-model magnitudes in the dtype models are served in.

Real checkpoints carry norm weights in the hundreds to thousands and hidden states of 1e4 and
more; tiny random models carry ~1. Rounding order (Gemma's ``w + 1`` norms) and float16's range
only show at real magnitudes, so these tests give every family such weights and verify its
bfloat16 and float16 checkpoints.
"""

import json

import pytest
import torch
from conftest import convert_to, tiny_base

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.errors import EXIT_FOUND
from trtllm_medusa_ports.files.checkpoint import read_checkpoint
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.fixtures.synthetic import TINY_CONFIGS, random_heads, save_heads
from trtllm_medusa_ports.reference import ReferenceModel
from trtllm_medusa_ports.verify import FLOAT16_MAX, load_hf_model, value_transforms, verify

#: verify OK must mean the engine builds: each checkpoint proven here is built on the stand-in (conftest.py)
pytestmark = [pytest.mark.numerics]

TREE = "[[0],[1],[0,0],[0,1]]"
PROMPTS = [[11, 18, 25, 32, 39, 46], [101, 114, 127]]
ALLOW = set(family_test_cases()["unsupported"])  # converted for the reference only


def _ckpt(store, tmp_path, arch, dtype, tp=1, name="c", **base_kw):
    base = tiny_base(store, arch, **base_kw)
    hf = HFConfig.read(base)
    heads = save_heads(random_heads(adapter_for(arch).hidden_size(hf), hf.get("vocab_size"), num_heads=2, seed=5),
                       tmp_path / f"{name}-h")
    return base, convert_to(tmp_path / name, base, heads, dtype=dtype, tp_size=tp, allow_unsupported=arch in ALLOW)


#: each dtype and each tp size once per family (pairwise, not their product): casting to a dtype rounds each
#: value on its own, so the ranks of a split hold the values the whole would; the real magnitudes meet each dtype's
#: rounding and range, and tp 2's partial sums (the all-reduce, a row bias added once), in one of the two
PAIRS = (("bfloat16", 1), ("float16", 2))


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_every_family_verifies_at_real_magnitudes_in_bf16_and_fp16(store, tmp_path, arch):
    for dtype, tp in PAIRS:
        base, ckpt = _ckpt(store, tmp_path, arch, dtype, tp, name=f"{dtype}-tp{tp}",
                           norm_offset=adapter_for(arch).magnitude_test_norm_offset)
        rep = verify(base, ckpt, medusa_choices=TREE, prompts=PROMPTS, max_new_tokens=6, quiet=True)
        assert rep.proof_ok, f"{dtype} tp {tp}\n{rep.render()}"
        # an ALiBi base computes right, and no engine is built from it: not OK
        alibi = adapter_for(arch).position_embedding is PositionEmbedding.ALIBI
        assert rep.ok is not alibi and all("[alibi-position-embedding]" in r for r in rep.build_refusals)
        assert 100 < rep.max_activation < FLOAT16_MAX and not rep.float16_overflow


@pytest.mark.parametrize("arch", ["GemmaForCausalLM", "Gemma3ForCausalLM"])
def test_gemma_norms_are_compared_as_stored(store, tmp_path, arch):
    """The checkpoint holds round(w + 1): the transformers side must multiply by that, not by
    1 + round(w), which differs by a bfloat16 step at weights of 1e3 (the bug this guards)."""
    base, ckpt = _ckpt(store, tmp_path, arch, "bfloat16", norm_offset=1500.0)
    ref = ReferenceModel(read_checkpoint(ckpt))
    ref_logits, _ = ref.forward(PROMPTS[0], ref.new_cache())
    ids = torch.tensor([PROMPTS[0]])
    transforms = value_transforms(base, arch)
    assert transforms and all(n.endswith("norm.weight") for n in transforms)
    with torch.no_grad():
        as_stored = load_hf_model(base, torch.bfloat16, transforms)(input_ids=ids).logits[0]
        naive = load_hf_model(base, torch.bfloat16)(input_ids=ids).logits[0]
    tolerance = 1e-4 * float(as_stored.abs().max())
    assert float((as_stored - ref_logits).abs().max()) <= tolerance
    assert float((naive - ref_logits).abs().max()) > 10 * tolerance


def test_gemma_plus_one_is_added_in_float32_before_the_cast(store, tmp_path):
    """upstream gemma/convert.py adds 1 to the float32 weight, then casts: round(w + 1), never
    round(round(w) + 1)."""
    from safetensors.torch import load_file

    base, ckpt = _ckpt(store, tmp_path, "GemmaForCausalLM", "bfloat16", norm_offset=1500.0)
    src = load_file(str(base / "model.safetensors"))["model.layers.0.input_layernorm.weight"]
    stored = read_checkpoint(ckpt).tensor(0, "transformer.layers.0.input_layernorm.weight")
    assert torch.equal(stored, (src.float() + 1).to(torch.bfloat16).float())
    double = (src.to(torch.bfloat16) + 1).to(torch.bfloat16).float()
    assert not torch.equal(double, (src.float() + 1).to(torch.bfloat16).float())  # the two can differ


def test_float16_is_refused_when_activations_exceed_its_range(store, tmp_path):
    base, ckpt = _ckpt(store, tmp_path, "Qwen2ForCausalLM", "float16", name="f16", norm_offset=4000.0)
    rep = verify(base, ckpt, medusa_choices=TREE, prompts=PROMPTS, max_new_tokens=4, quiet=True)
    assert rep.parity and rep.greedy_equal  # the float32 reference cannot see it...
    assert rep.max_activation > FLOAT16_MAX and rep.float16_overflow and not rep.ok  # ...the range check does
    text = rep.render()
    assert "float16 range     : FAIL" in text and "--dtype bfloat16" in text and rep.max_activation_at in text
    assert json.loads(json.dumps(rep.to_dict()))["float16_overflow"] is True
    _, ckpt = _ckpt(store, tmp_path, "Qwen2ForCausalLM", "bfloat16", name="bf16", norm_offset=4000.0)
    assert verify(base, ckpt, medusa_choices=TREE, prompts=PROMPTS, max_new_tokens=4, quiet=True).ok


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Gemma3ForCausalLM"])
def test_qk_norms_use_the_engines_epsilon(store, tmp_path, arch):
    base, ckpt = _ckpt(store, tmp_path, arch, "float32", rms_norm_eps=1e-6)
    ref = ReferenceModel(read_checkpoint(ckpt))
    assert ref.semantics.qk_norm and ref.semantics.qk_norm_epsilon == 1e-5 and ref.semantics.norm_epsilon == 1e-6
    rep = verify(base, ckpt, medusa_choices=TREE, prompts=PROMPTS, max_new_tokens=4, quiet=True)
    assert rep.proof_ok, rep.render()  # float32: exact, and not servable (rule dtype-float32)
    assert any("q/k norm(s) with the engine's epsilon 1e-05 (transformers: 1e-06)" in a for a in rep.adjustments)
    assert rep.engine_arithmetic_effect_max_abs_diff is not None


def test_check_measures_the_activation_range_on_prompts(store, tmp_path, capsys):
    from trtllm_medusa_ports.cli import main

    hot = tiny_base(store, "Qwen2ForCausalLM", norm_offset=4000.0)
    cold = tiny_base(store, "Qwen2ForCausalLM")
    args = ["check", "--model_dir", str(hot), "--prompt_ids", "11,18,25,32;101,114,127", "--json"]
    assert main(args + ["--dtype", "float16"]) == EXIT_FOUND
    found = {f["rule"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["float16-range"]["severity"] == "error" and "beyond float16's 65504" in found["float16-range"]["message"]
    assert main(args + ["--dtype", "bfloat16"]) == 0
    found = {f["rule"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["float16-range"]["severity"] == "info"
    assert main(["check", "--model_dir", str(cold), "--prompt_ids", "11,18,25", "--dtype", "float16", "--json"]) == 0
    found = {f["rule"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "within float16's range" in found["float16-range"]["message"]


def test_gemma3_in_float16_is_warned(store):
    from trtllm_medusa_ports.compat import check

    base = tiny_base(store, "Gemma3ForCausalLM")
    _, findings = check(base, dtype="float16")
    assert [f.severity for f in findings if f.rule == "float16-range"] == ["warning"]
    _, findings = check(base, dtype="bfloat16")
    assert not [f for f in findings if f.rule == "float16-range"]
