"""Each compatibility rule firing and not firing, on config.json files written here."""

import json

import pytest

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.compat import check
from trtllm_medusa_ports.errors import EXIT_FOUND
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
         "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
         "rope_theta": 500000.0, "hidden_act": "silu"}
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
            "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
            "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False}
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
           "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
           "sliding_window": 4096}
BLOOM = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 1024, "n_head": 16,
         "n_layer": 24, "vocab_size": 250880}
MPT = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32,
       "n_layers": 32, "vocab_size": 50432, "attn_config": {"alibi": True}}
FALCON_7B = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544,
             "num_attention_heads": 71, "num_hidden_layers": 32, "vocab_size": 65024, "alibi": False,
             "multi_query": True, "parallel_attn": True}
BAICHUAN_7B = {"architectures": ["BaiChuanForCausalLM"], "model_type": "baichuan", "hidden_size": 4096,
               "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 64000}
BAICHUAN_13B = {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_size": 5120,
                "num_attention_heads": 40, "num_hidden_layers": 40, "vocab_size": 64000}


def write(tmp_path, cfg, name="m"):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def rules(findings, severity=None):
    return {f.rule for f in findings if severity is None or f.severity == severity}


@pytest.mark.parametrize("cfg", [BLOOM, MPT, dict(FALCON_7B, alibi=True), BAICHUAN_13B,
                                 dict(LLAMA, position_embedding_type="alibi")])
def test_alibi_bases_are_rejected(tmp_path, cfg):
    arch, findings = check(write(tmp_path, cfg))
    f = next(f for f in findings if f.rule == "alibi-position-embedding")
    assert f.severity == "error"
    assert "XQA" in f.message and "ALiBi" in f.message
    assert "RoPE" in f.fix
    assert "unsupported-architecture" not in rules(findings)  # ALiBi is the reason that matters


@pytest.mark.parametrize("cfg", [dict(MPT, attn_config={"alibi": False}), FALCON_7B, BAICHUAN_7B])
def test_non_alibi_variants_are_not_flagged_as_alibi(tmp_path, cfg):
    _, findings = check(write(tmp_path, cfg))
    assert "alibi-position-embedding" not in rules(findings)


def test_unsupported_architecture(tmp_path):
    arch, findings = check(write(tmp_path, {"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    f = next(f for f in findings if f.rule == "unsupported-architecture")
    assert arch == "FooForCausalLM" and f.severity == "error"
    assert "Qwen2ForCausalLM" in f.fix and "porting-guide" in f.fix


@pytest.mark.parametrize("cfg", [LLAMA, QWEN2_7B])
def test_supported_bases_pass(tmp_path, cfg):
    _, findings = check(write(tmp_path, cfg))
    assert not rules(findings, "error"), findings
    assert "decoding-greedy-only" in rules(findings, "info")


def test_qwen2_7b_group_size_7(tmp_path):
    _, findings = check(write(tmp_path, QWEN2_7B))
    f = next(f for f in findings if f.rule == "gqa-group-size")
    assert f.severity == "info" and "7 query heads per KV head" in f.message
    _, findings = check(write(tmp_path, LLAMA))
    assert "gqa-group-size" not in rules(findings)


@pytest.mark.parametrize("head_size, rule, severity", [
    # the precompiled Medusa cubins are for head size 128 only (xqa_kernel_cubin.h): 64 needs the JIT kernels too
    (64, "xqa-head-size-jit", "warning"), (128, None, None), (80, "xqa-head-size-jit", "warning"),
    (96, "xqa-head-size-jit", "warning"), (256, "xqa-head-size-jit", "warning"),
    (72, "xqa-head-size", "error"), (320, "xqa-head-size", "error"),
])
def test_head_sizes(tmp_path, head_size, rule, severity):
    cfg = dict(LLAMA, num_attention_heads=8, num_key_value_heads=8, hidden_size=8 * head_size)
    _, findings = check(write(tmp_path, cfg))
    got = {f.rule: f.severity for f in findings if f.rule.startswith("xqa-head-size")}
    assert got == ({} if rule is None else {rule: severity})


def test_sliding_window(tmp_path):
    _, findings = check(write(tmp_path, MISTRAL))
    f = next(f for f in findings if f.rule == "sliding-window")
    assert f.severity == "warning" and "4096" in f.fix
    _, findings = check(write(tmp_path, QWEN2_7B))  # use_sliding_window false
    assert "sliding-window" not in rules(findings)


def test_rope_scaling_types(tmp_path):
    _, f1 = check(write(tmp_path, dict(LLAMA, rope_scaling={"rope_type": "llama3", "factor": 8.0}), "a"))
    assert not {"rope-scaling-unsupported", "rope-scaling-unverified"} & rules(f1)
    _, f2 = check(write(tmp_path, dict(LLAMA, rope_scaling={"type": "dynamic", "factor": 4.0}), "b"))
    assert "rope-scaling-unverified" in rules(f2, "warning")
    _, f3 = check(write(tmp_path, dict(LLAMA, rope_scaling={"type": "magic", "factor": 4.0}), "c"))
    assert "rope-scaling-unsupported" in rules(f3, "error")
    _, f4 = check(write(tmp_path, dict(LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 1e4}), "d"))
    assert not {"rope-scaling-unsupported", "rope-scaling-unverified"} & rules(f4)


def test_attention_scale_and_softcapping(tmp_path):
    cfg = dict(LLAMA, query_pre_attn_scalar=256, head_dim=128, attn_logit_softcapping=50.0)
    _, findings = check(write(tmp_path, cfg))
    assert "attention-scale" in rules(findings, "warning")
    soft = next(f for f in findings if f.rule == "attention-softcapping")
    assert soft.severity == "error" and "XQA" in soft.message


@pytest.mark.parametrize("tp, pp, expected", [
    (3, 1, {"tp-attention-heads", "tp-hidden-size", "tp-kv-heads", "tp-intermediate-size"}),
    (16, 1, {"tp-kv-replication"}),
    (2, 5, {"pp-layers"}),
    (1, 64, {"pp-layers"}),
])
def test_parallelism(tmp_path, tp, pp, expected):
    _, findings = check(write(tmp_path, LLAMA), tp_size=tp, pp_size=pp)
    par = {f.rule for f in findings if f.rule.startswith(("tp-", "pp-"))}
    assert par == expected
    if pp == 64:
        assert next(f for f in findings if f.rule == "pp-layers").severity == "error"
    if pp == 5:
        assert next(f for f in findings if f.rule == "pp-layers").severity == "warning"


def test_kv_heads_not_dividing_tp(tmp_path):
    _, findings = check(write(tmp_path, dict(LLAMA, num_key_value_heads=3, num_attention_heads=24)), tp_size=2)
    assert "tp-kv-heads" in rules(findings, "error")


def test_vocab_padding_info(tmp_path):
    _, findings = check(write(tmp_path, dict(LLAMA, vocab_size=32001)), tp_size=2)
    f = next(f for f in findings if f.rule == "vocab-padding")
    assert f.severity == "info" and "32002" in f.message


def _base_dir(tmp_path, hidden=64, vocab=100):
    return write(tmp_path, dict(LLAMA, hidden_size=hidden, num_attention_heads=4, num_key_value_heads=4,
                                intermediate_size=128, vocab_size=vocab), "tiny")


def test_heads_vs_base(tmp_path):
    base = _base_dir(tmp_path)
    good = save_heads(random_heads(64, 100, num_heads=2), tmp_path / "good")
    _, findings = check(base, good, num_medusa_heads=2)
    assert not rules(findings, "error")
    bad = save_heads(random_heads(32, 90, num_heads=2), tmp_path / "bad")
    _, findings = check(base, bad, num_medusa_heads=3)
    assert {"heads-hidden-size", "heads-vocab-size", "heads-count"} <= rules(findings, "error")
    _, findings = check(base, tmp_path / "nowhere")
    assert "heads-unreadable" in rules(findings, "error")


def test_trees_vs_heads_and_draft_len(tmp_path):
    base = _base_dir(tmp_path)
    heads = save_heads(random_heads(64, 100, num_heads=3), tmp_path / "h")
    _, f = check(base, heads, medusa_choices="mc_sim_7b_63")  # a preset: pruned to the heads, said so
    pruned = next(x for x in f if x.rule == "tree-pruned")
    assert pruned.severity == "warning" and "pruned to the depth of 3 Medusa head(s)" in pruned.message
    # the fix gives run.py a literal list (it runs ast.literal_eval): the command it names works
    assert "jq -c .paths" in pruned.fix and "ast.literal_eval" in pruned.fix
    assert "trtllm-medusa tree --choices mc_sim_7b_63 --num_medusa_heads 3 --json" in pruned.fix
    assert not {r for r in rules(f, "error") if r.startswith("tree")}
    _, f = check(base, medusa_choices="mc_sim_7b_63", num_medusa_heads=3)  # no heads dir: the flag
    assert "tree-pruned" in rules(f, "warning")
    _, f = check(base, heads, medusa_choices="[[0],[0,0],[0,0,0],[0,0,0,0]]")  # written out: never cut
    deep = next(x for x in f if x.rule == "tree-deeper-than-heads")
    assert "[0, 0, 0, 0]" in deep.message and "3 Medusa heads" in deep.message
    _, f = check(base, heads, medusa_choices="[[0],[1],[2]]", max_draft_len=2)
    assert "tree-too-many-nodes" in rules(f, "error")
    _, f = check(base, heads, medusa_choices="[[0],[1,0]]")
    assert "tree-invalid" in rules(f, "error")
    _, f = check(base, heads, medusa_choices="[[0],[12]]")
    assert "tree-index-range" in rules(f, "error")
    _, f = check(base, heads, medusa_choices="[[0],[2]]")
    assert "tree-depth1-gaps" in rules(f, "warning")
    _, f = check(base, heads, medusa_choices="[[0],[1],[0,0]]")
    assert not {r for r in rules(f, "error") if r.startswith("tree")}


def test_float32_serving_warning(tmp_path):
    _, f = check(_base_dir(tmp_path), dtype="float32")
    assert "dtype-float32" in rules(f, "warning")
    _, f = check(_base_dir(tmp_path), dtype="float16")
    assert "dtype-float32" not in rules(f)


def test_check_cli_json_and_exit_codes(tmp_path, capsys):
    assert main(["check", "--model_dir", str(write(tmp_path, QWEN2_7B, "q")), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compatible"] is True and out["architecture"] == "Qwen2ForCausalLM"
    assert all(set(f) == {"rule", "severity", "message", "fix"} for f in out["findings"])

    assert main(["check", "--model_dir", str(write(tmp_path, BLOOM, "b")), "--json"]) == EXIT_FOUND
    out = json.loads(capsys.readouterr().out)
    assert out["compatible"] is False
    assert out["findings"][0]["rule"] == "alibi-position-embedding"

    assert main(["check", "--model_dir", str(write(tmp_path, BLOOM, "b"))]) == EXIT_FOUND
    text = capsys.readouterr().out
    assert "ERROR" in text and "alibi-position-embedding" in text and "NOT COMPATIBLE" in text

    with pytest.raises(SystemExit) as e:
        main(["check"])
    assert e.value.code == 2
    assert main(["check", "--model_dir", str(tmp_path / "missing")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_convert_stops_on_errors_before_writing(tmp_path, qwen2_base, qwen2_heads):
    from conftest import convert_to

    from trtllm_medusa_ports.errors import ConversionError

    with pytest.raises(ConversionError) as e:
        convert_to(tmp_path / "out", qwen2_base, qwen2_heads, tp_size=4)
    assert "tp-attention-heads" in str(e.value) and "nothing was written" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_every_rule_is_documented():
    """The ids come from the registry; a Finding with an id outside it cannot be made."""
    from pathlib import Path

    from trtllm_medusa_ports.compat import RULES, Finding

    assert {"alibi-position-embedding", "xqa-head-size", "engine-class-limit", "tree-deeper-than-heads"} <= RULES
    doc = (Path(__file__).resolve().parents[1] / "docs" / "compatibility-rules.md").read_text()
    missing = sorted(r for r in RULES if f"`{r}`" not in doc)
    assert not missing, missing
    with pytest.raises(AssertionError, match="unregistered rule id"):
        Finding("no-such-rule", "error", "m", "f")


def test_gpt_neox_mlp_width_and_epsilon(tmp_path):
    neox = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 512,
            "intermediate_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000}
    _, findings = check(write(tmp_path, neox, "ok"))
    assert "engine-class-limit" not in rules(findings)
    _, findings = check(write(tmp_path, dict(neox, intermediate_size=1536, layer_norm_eps=1e-6), "bad"))
    msgs = [f.message for f in findings if f.rule == "engine-class-limit"]
    assert len(msgs) == 2 and "4 x hidden_size" in msgs[0] and "layer_norm_eps" in msgs[1]


PHI2 = {"architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
        "num_hidden_layers": 32, "intermediate_size": 10240, "vocab_size": 51200, "layer_norm_eps": 1e-5,
        "partial_rotary_factor": 0.4}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "head_dim": 128,
         "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 28, "intermediate_size": 3072,
         "vocab_size": 151936, "attention_bias": False}
NEOX = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 512,
        "intermediate_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000}


@pytest.mark.parametrize("cfg, change, expected", [
    (NEOX, {"use_parallel_residual": False}, "always computes the parallel residual"),
    (dict(MPT, attn_config={"alibi": True}), {"expansion_ratio": 2}, "expansion_ratio 2"),
    (MPT, {"layer_norm_epsilon": 1e-6}, "uses for ln_f"),
    (PHI2, {"layer_norm_eps": 1e-6}, "input_layernorm and ln_f"),
    (PHI2, {"num_key_value_heads": 8}, "multi-head attention only"),
    (FALCON_7B, {"layer_norm_epsilon": 1e-6}, "uses for ln_f (tensorrt_llm/models/falcon/model.py"),
    (dict(FALCON_7B, parallel_attn=False), {"layer_norm_epsilon": 1e-6}, "ln_f and post_layernorm"),
    (BLOOM, {"layer_norm_epsilon": 1e-6}, "every LayerNorm"),
    (QWEN3, {"attention_bias": True}, "o_proj"),
])
def test_engine_class_limits_of_each_family(tmp_path, cfg, change, expected):
    """What each family's TensorRT-LLM class hard-codes (read from its model.py): off by default,
    an error naming the field once the config asks for something else."""
    _, findings = check(write(tmp_path, cfg, "ok"))
    assert not [f for f in findings if f.rule == "engine-class-limit"], findings
    _, findings = check(write(tmp_path, {**cfg, **change}, "bad"))
    limits = [f for f in findings if f.rule == "engine-class-limit"]
    assert len(limits) == 1 and limits[0].severity == "error" and expected in limits[0].message, limits


def test_mpt_without_alibi_is_an_engine_class_limit(tmp_path):
    _, findings = check(write(tmp_path, dict(MPT, attn_config={"alibi": False})))
    limit = next(f for f in findings if f.rule == "engine-class-limit")
    assert "always applies ALiBi" in limit.message


@pytest.mark.parametrize("heads, kv, head_dim, severity, text", [
    (28, 4, 128, "info", "runs on the precompiled XQA kernels"),  # Qwen2-7B
    # no precompiled kernel for head 80; TRTLLM_ENABLE_XQA_JIT=1 takes the JIT HMMA kernels (group <= 32)
    (28, 4, 80, "warning", "TRTLLM_ENABLE_XQA_JIT=1"),
    # 64 % 64 == 0: JIT, which takes at most 32; TRTLLM_ENABLE_XQA_JIT=0 gives the head-128 cubins (issue 57, m5)
    (64, 1, 128, "warning", "take at most 32 query heads per KV head"),
    (32, 1, 128, None, None),  # group 32 on the JIT path
    (40, 1, 64, "error", "does not help either"),  # neither route: no head-64 cubin, JIT takes at most 32
])
def test_xqa_kernel_for_the_group_size(tmp_path, heads, kv, head_dim, severity, text):
    cfg = dict(LLAMA, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
               hidden_size=heads * head_dim)
    _, findings = check(write(tmp_path, cfg))
    group = [f for f in findings if f.rule == "gqa-group-size"]
    if severity is None:
        assert not group
    else:
        assert len(group) == 1 and group[0].severity == severity and text in group[0].message


def test_q_scaling_needs_the_jit_kernels(tmp_path):
    precompiled = dict(QWEN2_7B, attention_multiplier=0.5)  # group 7: precompiled XQA by default
    _, findings = check(write(tmp_path, precompiled, "p"))
    f = next(f for f in findings if f.rule == "attention-scale")
    # the precompiled kernels require q_scaling == 1; TRTLLM_ENABLE_XQA_JIT=1 takes the JIT kernels, which do not
    assert f.severity == "warning" and "require q_scaling == 1" in f.message and "attention_multiplier" in f.message
    assert "TRTLLM_ENABLE_XQA_JIT=1" in f.message and "TRTLLM_ENABLE_XQA_JIT=1" in f.fix
    # a group neither route serves with q_scaling != 1 (does not divide 64, above the JIT kernels' 32)
    wide = dict(QWEN2_7B, num_attention_heads=40, num_key_value_heads=1, hidden_size=5120, attention_multiplier=0.5)
    _, findings = check(write(tmp_path, wide, "w"))
    f = next(f for f in findings if f.rule == "attention-scale")
    assert f.severity == "error" and "at most 32" in f.message
    _, findings = check(write(tmp_path, dict(LLAMA, attention_multiplier=0.5), "j"))  # group 4: JIT
    assert next(f for f in findings if f.rule == "attention-scale").severity == "warning"
    # the engine's q_scaling is 1 / (m * sqrt(head_size)): 1 exactly for the usual 1/sqrt(head_size) ...
    head = LLAMA.get("head_dim") or LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
    _, findings = check(write(tmp_path, dict(LLAMA, attention_multiplier=head ** -0.5), "usual"))
    assert "attention-scale" not in rules(findings)
    # ... and not for a multiplier of 1, which is a softmax scale of 1 (Granite's meaning)
    _, findings = check(write(tmp_path, dict(LLAMA, attention_multiplier=1.0), "one"))
    f = next(f for f in findings if f.rule == "attention-scale")
    assert f"q_scaling = 1 / (m * sqrt({head})) = {1 / head ** 0.5:.4g}" in f.message


def test_check_reads_weight_headers_against_config(tmp_path):
    import shutil

    from conftest import tiny_base

    base = tmp_path / "b"
    shutil.copytree(tiny_base(tmp_path, "LlamaForCausalLM"), base)
    _, findings = check(base)
    assert "weights-config-mismatch" not in rules(findings)
    cfg = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(dict(cfg, vocab_size=300)))
    _, findings = check(base)
    f = next(f for f in findings if f.rule == "weights-config-mismatch")
    assert f.severity == "error" and "implies [300, 64]" in f.message


def test_falcon_biases_at_tp2_are_flagged_as_unconfirmed(tmp_path):
    from conftest import tiny_base

    base = tiny_base(tmp_path, "FalconForCausalLM", bias=True)
    _, two = check(base, tp_size=2)
    f = next(f for f in two if f.rule == "engine-tp-unconfirmed")
    assert f.severity == "warning" and "tp_size times" in f.message and "validate on GPU" in f.fix
    _, one = check(base, tp_size=1)
    assert "engine-tp-unconfirmed" not in rules(one)
    _, nobias = check(tiny_base(tmp_path, "FalconForCausalLM"), tp_size=2)
    assert "engine-tp-unconfirmed" not in rules(nobias)


SMOLLM2_135M = dict(LLAMA, hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)


def _finding(findings, rule):
    found = [f for f in findings if f.rule == rule]
    assert len(found) == 1, findings
    return found[0]


def test_group_not_dividing_64_with_head_64_needs_the_jit_env(tmp_path):
    """SmolLM2-135M: 3 query heads per KV head, head size 64 - no precompiled Medusa cubin (head 128 only), so the
    default route fails at run time; TRTLLM_ENABLE_XQA_JIT=1 takes the JIT HMMA kernels."""
    _, findings = check(write(tmp_path, SMOLLM2_135M))
    f = _finding(findings, "gqa-group-size")
    assert f.severity == "warning"
    assert "TRTLLM_ENABLE_XQA_JIT=1" in f.message and "TRTLLM_ENABLE_XQA_JIT=1" in f.fix
    assert "head size 128 only" in f.message and "checks the variable first" in f.message
    assert "validate on GPU" in f.fix
    jit = _finding(findings, "xqa-head-size-jit")
    assert jit.severity == "warning" and "TRTLLM_ENABLE_XQA_JIT=1" in jit.message
    assert not rules(findings, "error")


def test_group_not_dividing_64_with_head_128_is_info(tmp_path):
    _, findings = check(write(tmp_path, dict(SMOLLM2_135M, head_dim=128, hidden_size=1152)))
    f = _finding(findings, "gqa-group-size")
    assert f.severity == "info" and "precompiled" in f.message and "TRTLLM_ENABLE_XQA_JIT" not in f.message
    assert "xqa-head-size-jit" not in rules(findings)


def _kv_check(tmp_path, cfg, kv_cache_dtype, name):
    from trtllm_medusa_ports.quant import resolve_spec

    _, findings = check(write(tmp_path, cfg, name), quantization=resolve_spec(kv_cache_dtype=kv_cache_dtype))
    return _finding(findings, "quant-kv-cache")


def test_fp8_kv_group_3_head_64_is_served_by_hopper_jit(tmp_path):
    """On SM 9.0 an E4M3 cache sends group sizes up to 64 to JIT, whose QGMMA kernels take group 3; SM 8.9
    picks the precompiled kernels (no head 64): a warning per GPU, not an error."""
    f = _kv_check(tmp_path, SMOLLM2_135M, "fp8", "fp8")
    assert f.severity == "warning"
    assert "on SM 9.0 the runner picks the JIT XQA kernels" in f.message and "QGMMA" in f.message
    assert "on SM 8.9 the runner picks the precompiled XQA kernels" in f.message
    assert "serve on SM 9.0" in f.fix and "on SM 8.9 run the engine with TRTLLM_ENABLE_XQA_JIT=1" in f.fix


def test_int8_kv_group_3_head_64_needs_the_jit_env(tmp_path):
    f = _kv_check(tmp_path, SMOLLM2_135M, "int8", "int8")
    assert f.severity == "warning" and "SM 8.0/8.6/8.9/9.0" in f.message
    assert "TRTLLM_ENABLE_XQA_JIT=1" in f.message and "TRTLLM_ENABLE_XQA_JIT=1" in f.fix


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_quantized_kv_group_3_head_128_is_info(tmp_path, kv_cache_dtype):
    f = _kv_check(tmp_path, dict(SMOLLM2_135M, head_dim=128, hidden_size=1152), kv_cache_dtype, kv_cache_dtype)
    assert f.severity == "info", f.message


def test_fp8_kv_group_40_head_128_differs_per_gpu(tmp_path):
    """Group 40 (64 % 40 != 0, above 32) with an E4M3 cache: SM 9.0 picks JIT (group <= 64), which has no kernel
    for it; SM 8.9 picks the precompiled head-128 E4M3 cubins."""
    cfg = dict(LLAMA, num_attention_heads=40, num_key_value_heads=1, head_dim=128, hidden_size=5120)
    f = _kv_check(tmp_path, cfg, "fp8", "g40")
    assert f.severity == "warning"
    assert "on SM 9.0 the runner picks the JIT XQA kernels" in f.message and "none takes it" in f.message
    assert "on SM 8.9 the runner picks the precompiled XQA kernels" in f.message
    assert "serve on SM 8.9" in f.fix and "on SM 9.0 run the engine with TRTLLM_ENABLE_XQA_JIT=0" in f.fix


def test_int8_kv_group_64_head_128_is_served_with_the_jit_switch_off(tmp_path):
    """Group 64 divides 64, so the runner picks JIT kernels, which take at most 32; TRTLLM_ENABLE_XQA_JIT=0 sends it
    to the precompiled head-128 cubins, which take any group (issue 57, m5). Head size 64 has no such cubin."""
    cfg = dict(LLAMA, num_attention_heads=64, num_key_value_heads=1, head_dim=128, hidden_size=8192)
    f = _kv_check(tmp_path, cfg, "int8", "g64")
    assert f.severity == "warning" and "with TRTLLM_ENABLE_XQA_JIT=0 the precompiled head-size-128 kernels would" \
        in f.message
    assert "on SM 8.0/8.6/8.9/9.0 run the engine with TRTLLM_ENABLE_XQA_JIT=0" in f.fix
    cfg64 = dict(LLAMA, num_attention_heads=64, num_key_value_heads=1, head_dim=64, hidden_size=4096)
    assert _kv_check(tmp_path, cfg64, "int8", "g64h64").severity == "error"


@pytest.mark.parametrize("head_dim, severity", [(128, "warning"), (64, "error")])
def test_a_float_cache_group_of_64_needs_the_jit_switch_off_or_has_no_kernel(tmp_path, head_dim, severity):
    cfg = dict(LLAMA, num_attention_heads=64, num_key_value_heads=1, head_dim=head_dim, hidden_size=64 * head_dim)
    _, findings = check(write(tmp_path, cfg, f"g64-{head_dim}"))
    f = _finding(findings, "gqa-group-size")
    assert f.severity == severity, f.message
    if severity == "warning":
        assert "TRTLLM_ENABLE_XQA_JIT=0" in f.message and "run the engine with TRTLLM_ENABLE_XQA_JIT=0" in f.fix
    else:
        assert "TRTLLM_ENABLE_XQA_JIT=0 does not help either" in f.message


def test_starcoder_15b_with_an_fp8_cache_is_served_on_hopper_with_the_jit_switch_off(tmp_path):
    """StarCoder-15B (48 query heads, one KV head, head size 128) with an E4M3 cache: SM 9.0 picks JIT (group <= 64),
    which has no kernel for 48; SM 8.9 picks the precompiled cubins. With the switch off both are served."""
    from trtllm_medusa_ports.compat import XQA_JIT_ENV, xqa_environment, xqa_serving_routes

    routes = xqa_serving_routes(48, 128, "FP8")
    assert sorted(routes) == [89, 90] and routes[89].env_needed == "" and routes[90].env_needed == "0"
    assert xqa_environment(routes) == {XQA_JIT_ENV: "0"}
    # a float cache: precompiled by default and served, but by them alone (48 > 32): the switch pins them, should a
    # runner's default move to JIT (issue 64, 5); group 3 the JIT kernels take too: nothing to pin
    assert xqa_environment(xqa_serving_routes(48, 128)) == xqa_environment(xqa_serving_routes(40, 128)) == {
        XQA_JIT_ENV: "0"}
    assert xqa_environment(xqa_serving_routes(3, 128)) == {}
    assert xqa_environment(xqa_serving_routes(7, 64)) == {XQA_JIT_ENV: "1"}
    assert xqa_environment(xqa_serving_routes(64, 64)) == {}  # nothing serves it: no setting helps


def test_the_route_per_gpu():
    from trtllm_medusa_ports.compat import xqa_medusa_route

    # a float cache: the same on every GPU read; group 4 -> JIT HMMA, group 7 -> precompiled (head 128 only)
    assert {r.impl for r in xqa_medusa_route(4, 64).values()} == {"JIT"}
    assert all(r.served for r in xqa_medusa_route(4, 64).values())
    seven = xqa_medusa_route(7, 64)
    assert {r.impl for r in seven.values()} == {"precompiled"}
    assert not any(r.served for r in seven.values()) and all(r.served_with_jit_env for r in seven.values())
    # E4M3 on Hopper: JIT up to group 64 (QGMMA takes 8 tokens per block); elsewhere the 64 % group rule
    hopper = xqa_medusa_route(7, 128, "FP8", sm=90)[90]
    assert hopper.impl == "JIT" and hopper.jit.names[0] == "QGMMA" and 8 in hopper.picked.tokens_per_block
    ada = xqa_medusa_route(7, 128, "FP8", sm=89)[89]
    assert ada.impl == "precompiled" and ada.served and 16 not in ada.picked.tokens_per_block
    # no E4M3 precompiled cubins on SM 8.0/8.6
    assert not xqa_medusa_route(7, 128, "FP8", sm=80)[80].served
    # q_scaling != 1: the precompiled kernels refuse it
    assert not xqa_medusa_route(7, 128, q_scaling_one=False, sm=89)[89].served


def test_check_refuses_a_quantized_float32_checkpoint_as_convert_does(tmp_path, store):
    from conftest import tiny_base

    from trtllm_medusa_ports.api import CheckOptions
    from trtllm_medusa_ports.api import check as api_check

    base = tiny_base(store, "LlamaForCausalLM")
    res = api_check(CheckOptions(model_dir=base, dtype="float32", kv_cache_dtype="fp8"))
    assert not res.compatible
    assert any(f.rule == "dtype-float32" and f.severity == "error" and "convert refuses it" in f.message
               for f in res.findings)


def test_a_group_only_the_precompiled_kernels_take_says_what_a_jit_only_runner_means(tmp_path):
    """Issue 64, 5: 40 query heads per KV head with head size 128 and a float cache run on 1.2's precompiled kernels
    alone; check warns that a JIT-only runner (PR #10335's default, later the only one) has no kernel for it."""
    cfg = dict(LLAMA, num_attention_heads=40, num_key_value_heads=1, hidden_size=5120)
    _, findings = check(write(tmp_path, cfg))
    (f,) = [f for f in findings if f.rule == "gqa-group-size"]
    assert f.severity == "warning" and "takes at most 32 query heads per KV head" in f.message
    assert "PR #10335" in f.message and "TRTLLM_ENABLE_XQA_JIT=0" in f.fix
    _, findings = check(write(tmp_path, dict(LLAMA, num_attention_heads=28, num_key_value_heads=4, hidden_size=3584),
                              "seven"))
    assert [f.severity for f in findings if f.rule == "gqa-group-size"] == ["info"]  # group 7: JIT takes it too


#: DBRX-132B's config.json as published (transformers 4 wrote it: no rope_parameters), its fields DBRX reads
DBRX_132B = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144, "n_heads": 48,
             "n_layers": 40, "max_seq_len": 32768, "vocab_size": 100352, "tie_word_embeddings": False,
             "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
             "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4,
                            "moe_normalize_expert_weights": 1, "ffn_act_fn": {"name": "silu"}}}


def test_dbrx_reads_its_nested_config_as_upstreams_converter_does(tmp_path):
    """Issue 66: DBRX-132B's sizes, RoPE base, clip and experts from attn_config / ffn_config (upstream's
    convert_hf_dbrx: examples/models/contrib/dbrx/convert_checkpoint.py), LayerNorm epsilon 1e-5 with no key."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.files.hf_model import HFConfig

    hf = HFConfig.read(write(tmp_path, DBRX_132B))
    cfg = adapter_for("DbrxForCausalLM").engine_config(hf)
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]) == (
        6144, 48, 8, 128)
    assert (cfg["intermediate_size"], cfg["max_position_embeddings"], cfg["num_hidden_layers"]) == (10752, 32768, 40)
    assert (cfg["rotary_base"], cfg["norm_epsilon"], cfg["clip_qkv"], cfg["hidden_act"]) == (500000, 1e-5, 8, "swiglu")
    assert (cfg["moe"]["num_experts"], cfg["moe"]["top_k"], cfg["moe"]["normalization_mode"]) == (16, 4, 1)
    assert cfg["bias"] is False and cfg["position_embedding_type"] == "rope_gpt_neox"


@pytest.mark.parametrize("p, mode, limit", [(None, 0, False), (1.0, 1, False), (2.0, None, True)])
def test_dbrx_expert_weight_normalization_is_the_engines_or_refused(tmp_path, p, mode, limit):
    """moe_normalize_expert_weights 1 is RENORMALIZE, null is NONE (upstream's converter writes RENORMALIZE
    whatever it says), another p-norm is no routing TensorRT-LLM's MOE computes (rule engine-class-limit)."""
    cfg = json.loads(json.dumps(DBRX_132B))
    cfg["ffn_config"]["moe_normalize_expert_weights"] = p
    _, findings = check(write(tmp_path, cfg))
    assert ("engine-class-limit" in rules(findings, "error")) == limit
    if not limit:
        from trtllm_medusa_ports.archs import adapter_for
        from trtllm_medusa_ports.files.hf_model import HFConfig

        written = adapter_for("DbrxForCausalLM").engine_config(HFConfig.read(tmp_path / "m"))
        assert written["moe"]["normalization_mode"] == mode
    else:
        msg = next(f.message for f in findings if f.rule == "engine-class-limit")
        assert "moe_normalize_expert_weights 2.0" in msg and "2.0-norm" in msg


@pytest.mark.parametrize("key, value", [("attn_config", None), ("ffn_config", None), ("attn_config", "absent")])
def test_dbrx_settings_objects_left_null_are_refused_by_check_and_convert(tmp_path, store, key, value):
    """Issue 76 (D): attn_config / ffn_config null (or left out) read every setting at its default (1 KV head, no
    clamp, base 10000, 4 experts routed to 1) - no released DBRX - and transformers 5 fails on it; convert wrote a
    checkpoint all the same. Now one invalid-config finding in check, and convert exits 1 writing nothing."""
    from conftest import tiny_base

    cfg = json.loads(json.dumps(DBRX_132B))
    if value == "absent":
        del cfg[key]
    else:
        cfg[key] = value
    _, findings = check(write(tmp_path, cfg))
    msg = next(f.message for f in findings if f.rule == "invalid-config")
    assert msg.startswith(f"{key} is null: DBRX keeps its"), msg
    assert "read at its default" in msg
    base = tmp_path / "tiny"
    import shutil

    shutil.copytree(tiny_base(store, "DbrxForCausalLM"), base)
    tiny = json.loads((base / "config.json").read_text())
    tiny[key] = None
    (base / "config.json").write_text(json.dumps(tiny))
    heads = save_heads(random_heads(tiny["d_model"], tiny["vocab_size"], 2), tmp_path / "heads", base_dir=base)
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                 str(tmp_path / "out"), "--quiet"]) == 1
    assert not (tmp_path / "out").exists()


def test_transformers_5_dbrx_traps_are_warnings_naming_the_workaround(tmp_path):
    """transformers 5 (5.25 read) takes DBRX's RoPE base from rope_parameters (its default 10000 where config.json
    has none) and fails on clip_qkv null: warnings with the workaround (rule transformers-divergence), never an
    error to override - the engine computes the model; transformers 4 reads attn_config and needs none."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.files.hf_model import HFConfig

    adapter = adapter_for("DbrxForCausalLM")
    hf = HFConfig.read(write(tmp_path, DBRX_132B))
    said = adapter.transformers_divergences(hf, "5.25.0")
    assert len(said) == 1 and "ignores attn_config.rope_theta (500000)" in said[0][0]
    assert '"rope_parameters": {"rope_type": "default", "rope_theta": 500000}' in said[0][1]
    assert adapter.transformers_divergences(hf, "4.57.1") == []
    fixed = json.loads(json.dumps(DBRX_132B))
    fixed["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000}
    fixed["attn_config"]["clip_qkv"] = None
    said = adapter.transformers_divergences(HFConfig.read(write(tmp_path, fixed, "fixed")), "5.25.0")
    assert len(said) == 1 and "clip_qkv null" in said[0][0] and "transformers 4.x" in said[0][1]
    # check says it as a warning under the installed transformers (5.x here, 4.57 in TensorRT-LLM's environment)
    import transformers

    _, findings = check(tmp_path / "m")
    assert ("transformers-divergence" in rules(findings, "warning")) == transformers.__version__.startswith("5.")
    assert "transformers-divergence" not in rules(findings, "error")


def test_only_the_listed_rules_may_be_overridden():
    """Issue 79, 2: the --allow_unsupported list of docs/compatibility-rules.md was written by hand and had fallen
    behind the rules (two of four); it is rendered from findings.OVERRIDABLE, and a finding marked overridable
    with a rule outside it cannot be made."""
    from trtllm_medusa_ports.findings import ERROR as E
    from trtllm_medusa_ports.findings import OVERRIDABLE, Finding

    assert {"alibi-position-embedding", "attention-softcapping", "engine-divergence",
            "rope-scaling-yarn-option"} == set(OVERRIDABLE)
    with pytest.raises(AssertionError, match="does not list"):
        Finding("port-limit", E, "x", "y", overridable=True)
    Finding("alibi-position-embedding", E, "x", "y")  # build refuses ALiBi whatever the flag: not overridable there
