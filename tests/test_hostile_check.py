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
