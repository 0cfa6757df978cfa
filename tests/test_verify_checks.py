"""verify never says OK for what it did not check: every base tensor is compared with the converted Hugging Face
weights whether or not parity passed (a changed row that no prompt reads passes parity and greedy equivalence)."""

from __future__ import annotations

import json

import pytest
from conftest import built_once, convert_to, run_store
from safetensors.torch import load_file, save_file

from trtllm_medusa_ports.verify import verify

#: floating-point results: CI runs these on every ATen CPU path (.ci/run)
pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def written(store, qwen2_base, qwen2_heads):
    # once per test run (pytest-xdist may set a module's fixture up twice on one worker when its tests are handed
    # out apart: a fixed directory of the worker's store was then "not empty" the second time)
    return built_once(run_store() / "verify-checks-ckpt",
                      lambda d: convert_to(d, qwen2_base, qwen2_heads, dtype="float32"))


def _changed(tmp_path, ckpt, name, change):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").write_text((ckpt / "config.json").read_text())
    t = load_file(str(ckpt / "rank0.safetensors"))
    change(t[name])
    save_file(t, str(out / "rank0.safetensors"), metadata={"format": "pt"})
    return out


PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]


def test_every_base_tensor_is_compared_when_parity_passes(written, qwen2_base):
    rep = verify(qwen2_base, written, prompts=PROMPTS, max_new_tokens=4, quiet=True)
    b = rep.base_tensors
    assert rep.proof_ok and b["first_differing"] is None and b["skipped"] == 0, rep.render()
    n = len([k for k in load_file(str(written / "rank0.safetensors")) if not k.startswith("medusa_heads")])
    assert b["compared"] == n and f"base tensors      : PASS  {n} equal" in rep.render()
    assert json.loads(json.dumps(rep.to_dict()))["base_tensors"]["compared"] == n


@pytest.mark.parametrize("name, rows", [("transformer.vocab_embedding.weight", slice(-11, None)),
                                        ("transformer.vocab_embedding.weight", slice(100, 101))],
                         ids=["last-11-rows", "one-row"])
def test_rows_no_prompt_reads_fail_verify(tmp_path, written, qwen2_base, name, rows):
    def change(t):
        t[rows] += 0.5

    ckpt = _changed(tmp_path, written, name, change)
    rep = verify(qwen2_base, ckpt, prompts=PROMPTS, max_new_tokens=4, quiet=True)
    t = rep.base_tensors["first_differing"]
    assert t is not None and t["tensor"] == name and t["rank"] == 0 and "values differ by up to 0.5" in t["why"]
    assert rep.parity and rep.greedy_equal  # what parity and greedy equivalence alone would have called OK
    assert not rep.ok and f"base tensors      : FAIL  {name} (rank 0" in rep.render()
    assert rep.render().rstrip().endswith("RESULT: FAILED")


# -- the Medusa heads excluded from a quant_algo: checked by read_checkpoint, for every reader ----------------------
@pytest.mark.parametrize("quantization, refused", [
    ({"quant_algo": "FP8"}, "no exclude_modules (so quantize_layers' defaults"),
    ({"quant_algo": "FP8", "exclude_modules": []}, "an empty exclude_modules (which excludes nothing)"),
    ({"quant_algo": "W8A16", "exclude_modules": ["*lm_head", "*router"]}, 'exclude_modules ["*lm_head", "*router"]'),
    ({"quant_algo": "FP8", "exclude_modules": "*medusa_heads*"}, "not a list of module patterns"),
    ({"quant_algo": "FP8", "exclude_modules": ["*lm_head", "*medusa_heads*"]}, None),
    ({"quant_algo": None, "kv_cache_quant_algo": "FP8"}, None),  # no weight quantized: nothing to exclude
], ids=["fp8-none", "fp8-empty", "wo-without-medusa", "not-a-list", "excluded", "kv-only"])
def test_the_heads_must_be_excluded_from_a_quant_algo(tmp_path, written, quantization, refused):
    from trtllm_medusa_ports.errors import CheckpointError
    from trtllm_medusa_ports.files.checkpoint import read_checkpoint

    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "rank0.safetensors").write_bytes((written / "rank0.safetensors").read_bytes())
    cfg = json.loads((written / "config.json").read_text())
    cfg["quantization"] = quantization
    (out / "config.json").write_text(json.dumps(cfg))
    if refused is None:
        assert read_checkpoint(out).config["quantization"] == quantization
        return
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(out)
    assert refused in e.value.what and e.value.where == str(out / "config.json"), str(e.value)
    if "not a list" not in refused:
        assert "medusa_heads.0.medusa_layers.0.linear" in e.value.what and "*medusa_heads*" in e.value.fix


# -- a text calibration is re-derived with the tokenizer it went through -------------------------------------------
def test_verify_rederives_a_text_calibration_with_the_recorded_tokenizer(tmp_path, qwen2_base, qwen2_heads):
    import shutil

    from trtllm_medusa_ports.cli import main
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    vocab = tiny_config("Qwen2ForCausalLM").vocab_size
    tok = save_tiny_tokenizer(tmp_path / "tok", vocab)  # the base's folder holds no tokenizer
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(" ".join(f"t{vocab - 1 - (7 * i + j) % 20}" for j in range(12)) for i in range(4)) + "\n")
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads), "--output_dir",
                 str(ckpt), "--qformat", "fp8", "--calib_dataset", str(calib), "--calib_size", "4",
                 "--tokenizer_dir", str(tok), "--quiet"]) == 0
    rep = verify(qwen2_base, ckpt, prompts=PROMPTS, max_new_tokens=4, quiet=True)
    assert rep.quant_scales_not_rederived is None and rep.quant_scales_checked > 0 and rep.ok, rep.render()
    shutil.rmtree(tok)
    save_tiny_tokenizer(tok, vocab - 30)  # another tokenizer where the recorded one was: the top ids are unknown
    rep = verify(qwen2_base, ckpt, prompts=PROMPTS, max_new_tokens=4, quiet=True)
    why = rep.quant_scales_not_rederived
    assert not rep.ok and why and "tokenized again with another tokenizer" in why and str(tok.resolve()) in why, why


def test_verify_reads_the_base_weight_headers_before_transformers_loads(tmp_path, written, qwen2_base):
    import shutil

    from trtllm_medusa_ports.errors import ModelError

    base = shutil.copytree(qwen2_base, tmp_path / "base")
    t = load_file(str(base / "model.safetensors"))
    t["model.norm.weight"] = t["model.norm.weight"][:-3].clone()
    save_file(t, str(base / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelError) as e:
        verify(base, written, prompts=PROMPTS, max_new_tokens=2, quiet=True)
    what = e.value.what
    assert "contradict config.json" in what and "model.norm.weight" in what and "model.safetensors" in what, what
    assert e.value.where == str(base)


def test_options_verify_does_not_use_are_said_in_the_report(written, qwen2_base):
    """--gemm_plugin on a float checkpoint, --max_quant_error on an unquantized one, --max_memory beside an explicit
    memory mode: each was dropped without a word (issue 57, 6)."""
    rep = verify(qwen2_base, written, prompts=PROMPTS, max_new_tokens=2, quiet=True, gemm_plugin="fp8",
                 max_quant_error=1.0, streaming=False, max_memory=64.0)
    assert rep.notes[-3:] == [
        "--gemm_plugin fp8 ignored: it chooses FP8Linear's GEMM, and the checkpoint is not FP8",
        "--max_quant_error ignored: the checkpoint is not quantized",
        "--max_memory ignored: --no_streaming chose the memory mode"]
    assert "note: --max_quant_error ignored" in rep.render()
    assert not any("ignored" in n for n in verify(qwen2_base, written, prompts=PROMPTS, max_new_tokens=2,
                                                   quiet=True).notes)


def test_verify_bounds_its_run_by_a_learned_position_table(tmp_path, store):
    """GPT-2's positions come from a table: a prompt plus --max_new_tokens past it was an IndexError from
    transformers' embedding (issue 57, 5); verify refuses it first, naming the table and the tokens that fit."""
    from conftest import convert_to, tiny_base
    from test_quant import _heads

    from trtllm_medusa_ports.errors import ModelError
    from trtllm_medusa_ports.fixtures.synthetic import tiny_config

    base = tiny_base(store, "GPT2LMHeadModel")
    ckpt = convert_to(tmp_path / "ck", base, _heads(tmp_path, "GPT2LMHeadModel", tiny_config("GPT2LMHeadModel").n_embd),
                      dtype="float16")
    table = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(ModelError, match=rf"a prompt of 4 tokens and --max_new_tokens {table} reach position "
                                         rf"{table + 3}, past this base's learned position table \({table} positions\)") as e:
        verify(base, ckpt, prompts=[[1, 2, 3, 4]], max_new_tokens=table, quiet=True)
    assert f"--max_new_tokens {table - 4}" in e.value.fix


@pytest.mark.parametrize("which", ["--model_dir", "--checkpoint_dir"])
def test_a_base_or_checkpoint_that_changes_while_verify_reads_it_has_no_verdict(written, qwen2_base, tmp_path,
                                                                                monkeypatch, which):
    """Issue 63, 4: a download still being written, a copy overwriting the base mid-run: the results would mix two
    versions, so verify names the changed files instead of a verdict."""
    import os
    import shutil

    import trtllm_medusa_ports.verify.run as run
    from trtllm_medusa_ports.errors import ModelError

    base, ckpt = shutil.copytree(qwen2_base, tmp_path / "base"), shutil.copytree(written, tmp_path / "ckpt")
    target = (base if which == "--model_dir" else ckpt) / "config.json"
    real = run.parity_pass

    def parity_while_a_file_changes(*a, **kw):
        os.utime(target, ns=(1, 1))  # a writer replaces the file: its mtime moves
        return real(*a, **kw)

    monkeypatch.setattr(run, "parity_pass", parity_while_a_file_changes)
    with pytest.raises(ModelError, match=f"1 file\\(s\\) of the {which} changed while verify read them \\(config.json\\)"):
        verify(base, ckpt, prompts=PROMPTS, max_new_tokens=2, quiet=True, skip_tree_proof=True)
    monkeypatch.setattr(run, "parity_pass", real)
    rep = verify(base, ckpt, prompts=PROMPTS, max_new_tokens=2, quiet=True, skip_tree_proof=True)  # unchanged now
    assert rep.parity and rep.greedy_equal


def test_a_linear_weight_of_the_wrong_shape_is_named_not_a_traceback(written, qwen2_base, tmp_path):
    """Issue 63: a stored weight whose input features are not the layer's fails naming the tensor and both sizes
    (it was torch's "mat1 and mat2 shapes cannot be multiplied")."""
    from trtllm_medusa_ports.errors import CheckpointError

    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").write_text((written / "config.json").read_text())
    t = load_file(str(written / "rank0.safetensors"))
    name = "transformer.layers.1.mlp.proj.weight"
    t[name] = t[name][:, :-1].contiguous()
    save_file(t, str(out / "rank0.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"rank0.safetensors: {name} multiplies as .* but the layer's input has"):
        verify(qwen2_base, out, prompts=PROMPTS, max_new_tokens=2, quiet=True)


def test_a_missing_kv_cache_scale_is_named_missing(tmp_path, qwen2_base, qwen2_heads):
    """el_kv_scale_missing (issue 76, D): an FP8 KV cache checkpoint without one attention layer's scale - verify
    names that scale missing (quant/stored.py's message, as deploy and add-heads give it), where it named the k / v
    split scale it looked for next."""
    from trtllm_medusa_ports.errors import CheckpointError

    calib = tmp_path / "calib.jsonl"
    calib.write_text("\n".join(json.dumps({"input_ids": [5 + i, 6, 7, 8, 9]}) for i in range(4)) + "\n")
    ckpt = convert_to(tmp_path / "kv", qwen2_base, qwen2_heads, dtype="float16", kv_cache_dtype="fp8",
                      calib_dataset=calib, calib_size=4)
    name = "transformer.layers.1.attention.kv_cache_scaling_factor"
    t = load_file(str(ckpt / "rank0.safetensors"))
    del t[name]
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as err:
        verify(qwen2_base, ckpt, prompts=PROMPTS, max_new_tokens=2, quiet=True)
    assert err.value.what.startswith("transformer.layers.1.attention has no KV cache scale")
    assert err.value.where == str(ckpt / "rank0.safetensors")
