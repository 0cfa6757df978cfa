"""`check` says COMPATIBLE only for what it judged compatible: the memory plan's verdict and impossible serving sizes
are findings, a tree read from a file is named in its findings, and a fix never suggests a tp size that cannot
exist."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_base

from trtllm_medusa_ports.api import CheckOptions, check
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import EXIT_FOUND


def _rules(result, severity="error"):
    return {f.rule: f for f in result.findings if f.severity == severity}


@pytest.mark.parametrize("sizes, rule, needle", [
    (dict(max_batch_size=1, max_seq_len=10**30, gpu_memory_gb=80), "serving-size", "past the int32 sequence lengths"),
    (dict(max_batch_size=4, max_seq_len=10**8, gpu_memory_gb=0.5), "memory-does-not-fit",
     "more than the 0.5 GB of --gpu_memory_gb"),
], ids=["max-seq-len-past-int32", "plan-does-not-fit"])
def test_serving_sizes_are_part_of_the_verdict(qwen2_base, qwen2_heads, sizes, rule, needle):
    fits = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, max_batch_size=1, max_seq_len=1024,
                              gpu_memory_gb=80))
    assert fits.compatible and not {"serving-size", "memory-does-not-fit"} & set(_rules(fits))
    r = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, **sizes))
    assert not r.compatible and rule in _rules(r) and needle in _rules(r)[rule].message, r.render()
    assert r.to_dict()["memory"]["fits"] is False and r.render().endswith("NOT COMPATIBLE")


@pytest.mark.parametrize("sizes", [{}, dict(max_batch_size=4), dict(max_seq_len=128)], ids=["none", "batch", "len"])
def test_gpu_memory_without_both_serving_sizes_judges_the_weights_and_says_so(qwen2_base, qwen2_heads, capsys, sizes):
    """Issue 78, 2: --gpu_memory_gb without --max_batch_size and --max_seq_len said COMPATIBLE for any memory (3.47 MB
    of weights on 0.001 GB); the weights alone are judged now, and a fit says the KV cache was not judged."""
    small = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, gpu_memory_gb=0.0001, **sizes))
    assert not small.compatible and small.render().endswith("NOT COMPATIBLE")
    finding = _rules(small)["memory-does-not-fit"]
    assert "for its weights alone, more than the 0.0001 GB of --gpu_memory_gb" in finding.message
    memory = small.to_dict()["memory"]
    assert memory["fits"] is False and memory["judged"] == "weights alone"
    big = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, gpu_memory_gb=80, **sizes))
    assert big.compatible and "memory-kv-not-judged" in _rules(big, "warning")
    assert "weights alone of 80 GB: fit (the KV cache was not judged" in big.render()
    flags = [f"--{k}={v}" for k, v in sizes.items()]
    assert main(["check", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads),
                 "--gpu_memory_gb", "0.0001", *flags]) == EXIT_FOUND
    assert "DO NOT FIT" in capsys.readouterr().out
    both = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, gpu_memory_gb=80, max_batch_size=1,
                              max_seq_len=64))
    assert both.to_dict()["memory"]["judged"] == "weights and KV cache" and "memory-kv-not-judged" not in \
        _rules(both, "warning")


def test_a_max_seq_len_past_a_rotary_bases_context_is_a_warning_naming_the_context(qwen2_base, qwen2_heads):
    """Issue 78, 2: check --max_seq_len 4096 on a RoPE base of 256 positions said nothing."""
    from trtllm_medusa_ports.files.hf_model import HFConfig

    context = HFConfig.read(qwen2_base).get("max_position_embeddings")
    far = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, max_seq_len=context * 16))
    finding = _rules(far, "warning")["rope-context-range"]
    assert far.compatible and f"past the base's context (max_position_embeddings {context} in config.json)" in \
        finding.message and "--max_seq_len" in finding.fix
    depth = int(finding.message.split("a tree ")[1].split(" deep")[0])
    within = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, max_seq_len=context - depth))
    assert "rope-context-range" not in _rules(within, "warning")
    edge = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, max_seq_len=context - depth + 1))
    assert "rope-context-range" in _rules(edge, "warning")
    assert "rope-context-range" not in _rules(check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads)),
                                              "warning")


def test_a_tree_file_is_named_in_its_findings(tmp_path, capsys, qwen2_base, qwen2_heads):
    tree = tmp_path / "tree.json"
    tree.write_text("[[0], [0, 0], [5, 5, 5, 5, 5]]")
    rc = main(["check", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads), "--medusa_choices",
               f"@{tree}", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == EXIT_FOUND and not out["compatible"]
    tree_findings = [f for f in out["findings"] if f["rule"].startswith("tree-")]
    assert {f["rule"] for f in tree_findings} >= {"tree-invalid", "tree-deeper-than-heads"}
    assert all(f["message"].startswith(f"{tree}: ") for f in tree_findings), tree_findings
    (tmp_path / "bad.json").write_text("[[0],")
    r = check(CheckOptions(model_dir=qwen2_base, medusa_model_dir=qwen2_heads, medusa_choices=f"@{tmp_path}/bad.json"))
    bad = _rules(r)["tree-invalid"]
    assert bad.message.startswith(f"{tmp_path}/bad.json: "), bad.message


@pytest.mark.parametrize("overrides, tp, fix", [
    (dict(), 1, "no tp_size makes every width a multiple of 64 x tp_size"),  # the tiny base's widths: 160
    (dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2), 4,
     "use --tp_size 1 or 2 (every width is then a multiple of 64 x tp_size)"),
], ids=["no-tp-can-help", "smaller-tp-helps"])
def test_the_weight_only_width_fix_names_tp_sizes_that_exist(store, overrides, tp, fix):
    base = tiny_base(store, "LlamaForCausalLM", **overrides)
    r = check(CheckOptions(model_dir=base, qformat="int8_wo", tp_size=tp))
    f = _rules(r)["quant-weight-only-shape"]
    assert fix in f.fix, f.fix
    assert "use a tp_size for which" not in f.fix


@pytest.mark.parametrize("damage", ["header", "dangling-link"])
def test_an_unreadable_weight_file_is_an_input_error_not_a_finding(store, tmp_path, capsys, damage):
    """One exit rule for unreadable inputs (issue 76, D): a weight file check cannot read - a damaged header, a link
    into a Hub cache whose blob is missing - exits 1 naming the file, as convert and verify do, where it was a
    'contradict config.json' finding (exit 3)."""
    import os
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_base(store, "Qwen2ForCausalLM"), base)
    weights = next(base.glob("*.safetensors"))
    if damage == "header":
        data = weights.read_bytes()
        weights.write_bytes(data[:8] + b"{not json" + data[17:])
    else:
        weights.unlink()
        os.symlink(tmp_path / "blobs" / "gone", weights)
    assert main(["check", "--model_dir", str(base), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["where"] == str(weights) and "contradict" not in captured.err
    assert "Traceback" not in captured.err


# -- issue 78, 2: a heads path or tree file that is not there is exit 1 in every command ----------------------------
def _missing_cases(base, heads, ckpt, tok, tmp):
    nope, tree = str(tmp / "no-heads"), f"@{tmp}/no-tree.json"
    return {
        "check": ([["check", "--model_dir", base, "--medusa_model_dir", nope]],
                  [["check", "--model_dir", base, "--medusa_model_dir", heads, "--medusa_choices", tree]]),
        "convert": ([["convert", "--model_dir", base, "--medusa_model_dir", nope, "--output_dir", str(tmp / "o")]],
                    [["convert", "--model_dir", base, "--medusa_model_dir", heads, "--medusa_choices", tree,
                      "--output_dir", str(tmp / "o")]]),
        "verify": ([["verify", "--model_dir", base, "--checkpoint_dir", ckpt, "--medusa_model_dir", nope]],
                   [["verify", "--model_dir", base, "--checkpoint_dir", ckpt, "--medusa_choices", tree,
                     "--override_medusa_choices"]]),
        "tune-tree": ([["tune-tree", "--model_dir", base, "--medusa_model_dir", nope, "--output", str(tmp / "t")]],
                      []),
        "deploy": ([], [["deploy", "--checkpoint_dir", ckpt, "--tokenizer_dir", tok, "--output_dir", str(tmp / "d"),
                         "--medusa_choices", tree, "--override_medusa_choices"]]),
        "tree": ([], [["tree", "--medusa_choices", tree]]),
        "inspect-heads": ([["inspect-heads", nope]], []),
        "port": ([["port", base, "--medusa_model_dir", nope, "--output_dir", str(tmp / "p")]],
                 [["port", base, "--medusa_model_dir", heads, "--medusa_choices", tree, "--output_dir", str(tmp / "p")]]),
    }


def test_a_heads_path_or_tree_file_not_there_is_exit_1_in_every_command(qwen2_base, qwen2_heads, tmp_path, capsys):
    """check said NOT COMPATIBLE (exit 3) where every other command said it could not run (exit 1); the table of
    commands covers every command that reads heads or a tree file (declared.py)."""
    from conftest import built_once, convert_to, run_store

    from trtllm_medusa_ports.declared import COMMANDS
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    ckpt = built_once(run_store() / "reference-qwen2-tp2-fp16",
                      lambda d: convert_to(d, qwen2_base, qwen2_heads, tp_size=2, dtype="float16"))
    tok = tmp_path / "tok"
    save_tiny_tokenizer(tok, tiny_config("Qwen2ForCausalLM").vocab_size)
    cases = _missing_cases(str(qwen2_base), str(qwen2_heads), str(ckpt), str(tok), tmp_path)
    reading = {c for c, (_, _, opts) in COMMANDS.items()
               if {o.name for o in opts} & {"medusa_model_dir", "medusa_choices"}} | {"tree", "inspect-heads"}
    assert reading <= set(cases), reading - set(cases)
    for no_heads, no_tree in cases.values():
        for argv, needle in [*((a, "no-heads") for a in no_heads), *((a, "no-tree.json") for a in no_tree)]:
            assert main(argv) == 1, argv
            err = capsys.readouterr().err
            assert needle in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "p").exists()  # port refuses before it writes anything


def test_the_alibi_refusal_recommends_only_families_check_passes(store):
    """Issue 78, 4: the ALiBi refusal recommended Gemma-2, which check then refuses (attention-softcapping)."""
    import re

    r = check(CheckOptions(model_dir=tiny_base(store, "BloomForCausalLM")))
    fix = _rules(r)["alibi-position-embedding"].fix
    named = re.findall(r"\b(\w+ForCausalLM)\b", fix)
    assert len(named) >= 10 and "Gemma2ForCausalLM" not in named and "LlamaForCausalLM" in named
    for arch in named:
        assert check(CheckOptions(model_dir=tiny_base(store, arch))).compatible, arch
    assert not check(CheckOptions(model_dir=tiny_base(store, "Gemma2ForCausalLM"))).compatible
