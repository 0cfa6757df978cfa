"""train-heads in bounded memory: streaming the base (one decoder layer at a time, huggingface/streaming.py) for the
corpus pass gives the corpus, the training and the heads of the in-memory mode, bit for bit, in float32 and in
bfloat16, for families with untied, tied and biased lm_heads; the mode is chosen by the rule verify follows
(memory_mode.select) and reported; two torchrun ranks each stream their own copy and merge the corpus one process
writes. That a base four times a memory allowance trains within it is measured in tests/test_memory_bounds.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.fixtures.synthetic import tiny_config
from trtllm_medusa_ports.heads import train
from trtllm_medusa_ports.huggingface import memory_mode
from trtllm_medusa_ports.huggingface.model import (
    base_float32_bytes,
    final_hidden,
    load_base,
    release,
)
from trtllm_medusa_ports.huggingface.streaming import streamed_weights, to_dtype


def _data(root: Path, vocab: int, n: int = 8, length: int = 5) -> Path:
    g = torch.Generator().manual_seed(3)
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": torch.randint(1, vocab, (length,), generator=g).tolist()})
                            + "\n" for _ in range(n)))
    return path


def _train(base: Path, root: Path, name: str, data: Path, **kw) -> tuple[api.TrainResult, dict, bytes]:
    """One run in its own output and work directory: its result, its corpus file and its heads file's bytes."""
    opts = api.TrainOptions(model_dir=base, output_dir=root / name, work_dir=root / f"{name}.work",
                            prompts=api.PromptInputs(data=data), new_tokens=6, threads=1,
                            fit=api.FitOptions(num_heads=2, steps=4, batch_size=16, matmul_dtype="float32",
                                               quiet=True), **{"dtype": "float32", **kw})
    result = api.train_heads(opts)
    corpus = torch.load(root / f"{name}.work" / "corpus.pt", weights_only=True)
    return result, corpus, (root / name / "medusa_lm_head.safetensors").read_bytes()


# -- the same corpus and heads -------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, dtypes", [("LlamaForCausalLM", ("float32", "bfloat16")),  # untied lm_head
                                          ("GemmaForCausalLM", ("float32",)),  # tied to the embedding
                                          ("PhiForCausalLM", ("bfloat16",))])  # an lm_head with a bias
def test_streaming_trains_the_in_memory_heads_bit_for_bit(tmp_path, store, arch, dtypes):
    base = tiny_base(store, arch)
    data = _data(tmp_path, tiny_config(arch).vocab_size)
    hidden = {}
    for dtype in dtypes:
        a, ca, ha = _train(base, tmp_path, f"mem-{dtype}", data, dtype=dtype, streaming=False)
        b, cb, hb = _train(base, tmp_path, f"str-{dtype}", data, dtype=dtype, streaming=True)
        assert (a.memory_mode["mode"], b.memory_mode["mode"]) == ("in-memory", "streaming")
        assert (a.memory_mode["reason"], b.memory_mode["reason"]) == ("--no_streaming", "--streaming")
        assert ca["seqs"] == cb["seqs"] and any(len(s) > 5 for s in ca["seqs"])  # the same continuations
        assert torch.equal(ca["index"], cb["index"]) and torch.equal(ca["hidden"], cb["hidden"])
        assert ca["hidden"].shape[0] > 0 and ca["hidden"].abs().sum() > 0
        assert a.history == b.history and len(a.history) >= 1
        assert ha == hb  # the written heads, byte for byte
        hidden[dtype] = cb["hidden"]
    if len(hidden) == 2:  # the streamed base computed in bfloat16 (its weights cast as they are read), not float32
        assert not torch.equal(hidden["float32"], hidden["bfloat16"])


@pytest.mark.parametrize("streaming", [False, True])
def test_max_memory_beside_a_chosen_mode_is_said_unused(tmp_path, store, streaming):
    """--max_memory with --no_streaming / --streaming judges nothing: the result says so (as verify's report)
    instead of dropping it without a word, and the flags' mode stands."""
    base = tiny_base(store, "LlamaForCausalLM")
    data = _data(tmp_path, tiny_config("LlamaForCausalLM").vocab_size, n=2)
    res, _, _ = _train(base, tmp_path, "mm", data, streaming=streaming, max_memory=0.001)
    flag = "--streaming" if streaming else "--no_streaming"
    assert res.memory_mode["reason"] == flag
    assert f"--max_memory ignored: {flag} chose the memory mode" in res.warnings
    plain, _, _ = _train(base, tmp_path, "plain", data, streaming=streaming)
    assert not any("--max_memory" in w for w in plain.warnings)


def test_every_base_load_runs_transformers_own_modules_not_hub_kernels(store):
    """transformers 5.25 kernelizes every from_pretrained by default (the kernels package, which refuses a streamed
    base's meta weights and may swap in Hub kernels): each of our loads turns it off where transformers has it."""
    from transformers import PreTrainedModel

    from trtllm_medusa_ports.fixtures.synthetic import greedy_corpus
    from trtllm_medusa_ports.huggingface.model import load_hf_model

    if not hasattr(PreTrainedModel, "use_kernels"):
        pytest.skip("this transformers predates the kernels integration")
    base = tiny_base(store, "LlamaForCausalLM")
    models = {"in memory": load_base(base), "streamed": load_base(base, streaming=True),
              "rounded": load_hf_model(base, torch.bfloat16)}
    assert {name: m.use_kernels for name, m in models.items()} == dict.fromkeys(models, False)
    release(models["streamed"])
    seqs, _, _ = greedy_corpus(base, num_prompts=2, prompt_len=3, new_tokens=2)
    assert seqs.shape == (2, 5)


def test_a_streamed_base_cast_to_bfloat16_computes_as_the_base_cast_in_memory(store):
    """base_streaming.to_dtype: the buffers and each unit's weights as they are read; no weight stays in memory."""
    base = tiny_base(store, "Qwen2ForCausalLM")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    whole = load_base(base).to(torch.bfloat16)
    streamed = to_dtype(load_base(base, streaming=True), torch.bfloat16)
    a, b = final_hidden(whole, ids), final_hidden(streamed, ids)
    assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in streamed.parameters())
    units = streamed_weights(streamed).units
    assert streamed_weights(streamed).loads == len(units) - 1 and units[-1].name == "lm_head"  # all it ran, once
    release(streamed)


# -- the mode: chosen and reported ---------------------------------------------------------------------------------
def test_the_mode_is_chosen_by_max_memory_and_reported_in_the_json(tmp_path, store, capsys):
    base = tiny_base(store, "LlamaForCausalLM")
    data = _data(tmp_path, tiny_config("LlamaForCausalLM").vocab_size, n=4)
    args = ["train-heads", "--model_dir", str(base), "--data", str(data), "--num_heads", "2", "--steps", "2",
            "--new_tokens", "4", "--dtype", "float32", "--fit_dtype", "float32", "--threads", "1", "--quiet", "--json"]
    assert main([*args, "--output_dir", str(tmp_path / "small"), "--max_memory", "0.001"]) == 0
    small = json.loads(capsys.readouterr().out)["memory_mode"]
    assert small["mode"] == "streaming" and small["reason"] == "the in-memory estimate exceeds --max_memory 0.001 GB"
    assert small["max_memory_bytes"] == 10**6 < small["estimated_in_memory_bytes"]
    assert 0 < small["largest_unit_bytes"] < small["float32_bytes"] == base_float32_bytes(base)
    assert small["estimated_in_memory_bytes"] - small["estimated_streaming_bytes"] == \
        int(memory_mode.TRAIN_PER_FLOAT32 * small["float32_bytes"]) - int(memory_mode.STREAMING_PER_UNIT *
                                                                        small["largest_unit_bytes"])
    assert small["estimated_streaming_bytes"] > memory_mode.LIBRARIES_BYTES + train.fit_bytes(
        api.TrainOptions(model_dir=base, output_dir=tmp_path, fit=api.FitOptions(num_heads=2)))
    assert small["device"] == "cpu"
    assert main([*args, "--output_dir", str(tmp_path / "large"), "--max_memory", "1000"]) == 0
    large = json.loads(capsys.readouterr().out)["memory_mode"]
    assert large["mode"] == "in-memory" and large["reason"] == "the in-memory estimate fits --max_memory 1000 GB"
    with pytest.raises(SystemExit):  # one or the other
        main([*args, "--output_dir", str(tmp_path / "x"), "--streaming", "--no_streaming"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kw, needle", [
    (dict(max_memory=0.0), "--max_memory 0.0 (float) is not a number above 0"),
    (dict(max_memory=-1.0), "--max_memory -1.0"),
    (dict(streaming=True, device_map="auto"), "--device_map auto holds the base in memory across the GPUs; "
                                              "--streaming streams it"),
    (dict(max_memory=4.0, device_map="auto"), "--device_map auto holds the base in memory across the GPUs; "
                                              "--max_memory streams it"),
    (dict(streaming="yes"), "TrainOptions.streaming")])
def test_bad_memory_options_are_refused_before_anything_is_loaded(tmp_path, store, kw, needle):
    base = tiny_base(store, "LlamaForCausalLM")
    opts = api.TrainOptions(model_dir=base, output_dir=tmp_path / "h", **kw)
    with pytest.raises(PortError) as e:
        api.train_heads(opts)
    assert needle in f"{e.value} {e.value.where}" and e.value.fix
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.train").exists()


def test_the_available_memory_is_shared_by_this_nodes_ranks(monkeypatch):
    """Without flags: in memory where one process's estimate fits its share of the available memory."""
    monkeypatch.setattr(memory_mode, "available_bytes", lambda: 10 * 10**9)
    assert memory_mode.select(None, None, 3 * 10**9) == ("in-memory", "the in-memory estimate fits the available "
                                                                      "memory")
    assert memory_mode.select(None, None, 3 * 10**9, ranks_here=4) == (
        "streaming", "the in-memory estimate exceeds the 10.0 GB available among 4 ranks on this node (2.5 GB each)")
    assert memory_mode.select(False, None, 30 * 10**9, ranks_here=4) == ("in-memory", "--no_streaming")
    assert memory_mode.select(None, 2.0, 3 * 10**9)[0] == "streaming"
    monkeypatch.setattr(memory_mode, "available_bytes", lambda: None)  # unknown: in memory, as before
    assert memory_mode.select(None, None, 10**15)[0] == "in-memory"


# -- torchrun: each rank streams its own copy ----------------------------------------------------------------------
def test_two_ranks_each_streaming_write_the_one_process_corpus(tmp_path, store):
    from tests.test_train_distributed import _ranks

    arch = "LlamaForCausalLM"
    base = tiny_base(store, arch)
    data = _data(tmp_path, tiny_config(arch).vocab_size)
    _, ref, _ = _train(base, tmp_path, "one", data, streaming=False)
    argv = ["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "two"), "--data", str(data),
            "--num_heads", "2", "--steps", "4", "--batch_size", "16", "--new_tokens", "6", "--dtype", "float32",
            "--fit_dtype", "float32", "--threads", "1", "--quiet", "--json", "--streaming"]
    codes, outs, errs = _ranks(2, argv, tmp_path / "logs")
    assert codes == [0, 0], errs
    report = json.loads(outs[0])
    assert report["world_size"] == 2 and report["memory_mode"]["mode"] == "streaming"
    two = torch.load(tmp_path / "two.train" / "corpus.pt", weights_only=True)
    assert two["seqs"] == ref["seqs"] and torch.equal(two["hidden"], ref["hidden"])  # row for row
    assert (tmp_path / "two" / "medusa_lm_head.safetensors").is_file()
