"""Every tensor of the converted checkpoint against the HF weights, computed independently here."""

import json
from pathlib import Path

import pytest
import torch
from conftest import convert_to, tiny_base
from safetensors.torch import load_file

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
from trtllm_medusa_ports.errors import ConversionError, ModelError
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config


def hf_weights(base):
    sd = {}
    for f in sorted(base.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return sd


def rank_files(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    return cfg, [load_file(str(ckpt / f"rank{r}.safetensors")) for r in range(cfg["mapping"]["world_size"])]


def expected_rank(sd, cfg, heads, tp, pp, rank, dtype, shared=False):
    """What rank ``rank`` must hold, derived from the HF state dict by hand."""
    t_rank, p_rank = rank % tp, rank // tp
    L, nkv = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    hd = cfg["head_size"]
    V = cfg["vocab_size"]
    per = [L // pp + (1 if s < L % pp else 0) for s in range(pp)]
    first = sum(per[:p_rank])
    out = {}

    def cut(t, dim):
        n = t.shape[dim] // tp
        return t.narrow(dim, t_rank * n, n)

    def padded(t):
        rows = -(-t.shape[0] // tp) * tp
        return torch.cat([t, torch.zeros(rows - t.shape[0], t.shape[1], dtype=t.dtype)]) if rows > t.shape[0] else t

    def kv_part(t):
        if nkv >= tp:
            return cut(t, 0)
        head = t_rank * nkv // tp
        return t[head * hd:(head + 1) * hd]

    for local in range(per[p_rank]):
        i = first + local
        p = f"model.layers.{i}."
        o = f"transformer.layers.{local}."
        q, k, v = (sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        out[o + "attention.qkv.weight"] = torch.cat([cut(q, 0), kv_part(k), kv_part(v)])
        if cfg.get("attn_bias"):
            qb, kb, vb = (sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv")
            out[o + "attention.qkv.bias"] = torch.cat([cut(qb, 0), kv_part(kb), kv_part(vb)])
            if p + "self_attn.o_proj.bias" in sd:  # Llama's attention_bias covers o_proj; Qwen2 has none
                out[o + "attention.dense.bias"] = sd[p + "self_attn.o_proj.bias"]
        out[o + "attention.dense.weight"] = cut(sd[p + "self_attn.o_proj.weight"], 1)
        out[o + "mlp.fc.weight"] = cut(sd[p + "mlp.gate_proj.weight"], 0)
        out[o + "mlp.gate.weight"] = cut(sd[p + "mlp.up_proj.weight"], 0)
        out[o + "mlp.proj.weight"] = cut(sd[p + "mlp.down_proj.weight"], 1)
        out[o + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[o + "post_layernorm.weight"] = sd[p + "post_attention_layernorm.weight"]
    if p_rank == 0:
        out["transformer.vocab_embedding.weight"] = sd["model.embed_tokens.weight"]
    if p_rank == pp - 1:
        out["transformer.ln_f.weight"] = sd["model.norm.weight"]
        lm = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        out["lm_head.weight"] = cut(padded(lm), 0)
        for h, row in enumerate(heads.blocks):
            for layer, (w, b) in enumerate(row):
                out[f"medusa_heads.{h}.medusa_layers.{layer}.linear.weight"] = cut(w, 0)
                out[f"medusa_heads.{h}.medusa_layers.{layer}.linear.bias"] = cut(b, 0)
            if not shared:
                out[f"medusa_heads.{h}.lm_head.weight"] = cut(padded(heads.lm_heads[h]), 0)
    assert V == lm.shape[0] if p_rank == pp - 1 else True
    return {k: v.to(dtype) for k, v in out.items()}


CASES = [
    # (architecture, overrides, tp, pp, dtype)
    ("LlamaForCausalLM", {}, 1, 1, "float32"),
    ("LlamaForCausalLM", {}, 2, 1, "float16"),
    ("LlamaForCausalLM", {}, 4, 1, "float32"),  # 2 KV heads < tp 4: replicated
    ("LlamaForCausalLM", {"num_hidden_layers": 3}, 2, 2, "bfloat16"),  # uneven PP split
    ("LlamaForCausalLM", {"attention_bias": True, "tie_word_embeddings": True}, 2, 1, "float32"),
    ("Qwen2ForCausalLM", {}, 2, 1, "float32"),  # qkv bias, tied, group 7, vocab 263 % 2
    ("Qwen2ForCausalLM", {"tie_word_embeddings": False}, 1, 2, "bfloat16"),
    ("MistralForCausalLM", {}, 4, 1, "float16"),  # 1 KV head, tp 4
]


@pytest.mark.parametrize("arch, overrides, tp, pp, dtype", CASES)
def test_every_tensor_matches_hf(tmp_path, store, arch, overrides, tp, pp, dtype):
    base = tiny_base(store, arch, **overrides)
    c = tiny_config(arch, **overrides)
    heads = random_heads(c.hidden_size, c.vocab_size, num_heads=3, num_layers=2, seed=5)
    hdir = save_heads(heads, tmp_path / "heads")
    ckpt = convert_to(tmp_path / "ckpt", base, hdir, tp_size=tp, pp_size=pp, dtype=dtype)
    cfg, ranks = rank_files(ckpt)
    assert cfg["mapping"] == {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    assert cfg["dtype"] == dtype and cfg["num_medusa_heads"] == 3 and cfg["num_medusa_layers"] == 2
    assert cfg["medusa_hidden_act"] == "silu" and cfg["max_draft_len"] == 63
    sd = hf_weights(base)
    tdtype = getattr(torch, dtype)
    for r, got in enumerate(ranks):
        want = expected_rank(sd, cfg, heads, tp, pp, r, tdtype)
        assert sorted(got) == sorted(want), f"rank {r}"
        for name in want:
            assert got[name].dtype == tdtype, name
            assert torch.equal(got[name], want[name]), f"rank {r} {name}"


def test_qwen2_config_fields(tmp_path, qwen2_base, qwen2_heads):
    ckpt = convert_to(tmp_path / "c", qwen2_base, qwen2_heads)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architecture"] == "MedusaForCausalLM"
    assert cfg["qwen_type"] == "qwen2" and cfg["model_type"] == "qwen2"
    assert cfg["attn_bias"] is True and cfg["rotary_base"] == 1000000.0
    assert cfg["num_attention_heads"] == 14 and cfg["num_key_value_heads"] == 2 and cfg["head_size"] == 64
    assert cfg["position_embedding_type"] == "rope_gpt_neox" and cfg["logits_dtype"] == "float32"
    assert cfg["base_architecture"] == "Qwen2ForCausalLM"


def test_rope_scaling_is_kept_whole(tmp_path, store):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    base = tiny_base(store, "LlamaForCausalLM", rope_scaling=scaling)
    c = tiny_config("LlamaForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    cfg = json.loads((convert_to(tmp_path / "c", base, hdir) / "config.json").read_text())
    assert cfg["rotary_scaling"]["type"] == "llama3" and cfg["rotary_scaling"]["factor"] == 8.0
    assert cfg["rotary_scaling"]["original_max_position_embeddings"] == 64


@pytest.mark.parametrize("layout", ["fasterdecoding-v2", "vllm-shared", "share-flag"])
def test_shared_lm_head_written_once(tmp_path, llama_base, layout):
    c = tiny_config("LlamaForCausalLM")
    heads = random_heads(c.hidden_size, c.vocab_size, num_heads=4, seed=2)
    if layout == "fasterdecoding-v2":
        hdir = save_heads(heads, tmp_path / "h", "fasterdecoding-v2")
        extra = {}
    elif layout == "vllm-shared":
        heads.lm_heads = None
        hdir = save_heads(heads, tmp_path / "h", "vllm")
        extra = {}
    else:
        hdir = save_heads(heads, tmp_path / "h")
        extra = {"share_lm_head": True}
    res = convert(ConvertOptions(model_dir=llama_base, medusa_model_dir=hdir, output_dir=tmp_path / "c",
                                 tp_size=2, quiet=True, **extra))
    cfg, ranks = rank_files(tmp_path / "c")
    assert cfg["medusa_shared_lm_head"] is True
    assert cfg["architecture"] == "MedusaPortsLLaMAForCausalLM"  # upstream cannot share: refuse loudly
    for got in ranks:
        assert not [k for k in got if k.startswith("medusa_heads.") and "lm_head" in k]
        assert "lm_head.weight" in got
    per_head = 4 * 252 * c.hidden_size * 4  # heads x padded vocab x hidden x fp32 bytes
    assert res.shared_lm_head_bytes_saved == per_head
    assert "saved against one copy per head" in res.summary()
    if layout == "share-flag":
        assert any("--share_lm_head" in w for w in res.warnings)


def test_truncated_vocab_heads_expand_to_full_vocab(tmp_path, llama_base):
    from safetensors.torch import save_file

    c = tiny_config("LlamaForCausalLM")
    H, V = c.hidden_size, c.vocab_size
    token_map = torch.tensor([3, 10, 50, 250])
    sd = {"blocks.0.layers.0.weight": torch.randn(H, H), "blocks.0.layers.0.bias": torch.randn(H),
          "lm_heads.0.weight": torch.randn(4, H), "token_map": token_map}
    hdir = tmp_path / "h"
    hdir.mkdir()
    save_file(sd, str(hdir / "model.safetensors"))
    (hdir / "config.json").write_text(json.dumps({"model_type": "medusa", "num_heads": 1, "num_hidden_layers": 1,
                                                  "vocab_size": V, "truncated_vocab_size": 4}))
    convert_to(tmp_path / "c", llama_base, hdir)
    lm = load_file(str(tmp_path / "c" / "rank0.safetensors"))["medusa_heads.0.lm_head.weight"]
    assert lm.shape == (V, H)
    assert torch.equal(lm[token_map], sd["lm_heads.0.weight"])
    rest = torch.ones(V, dtype=torch.bool)
    rest[token_map] = False
    assert torch.count_nonzero(lm[rest]) == 0


def test_workers_give_identical_files(tmp_path, llama_base):
    c = tiny_config("LlamaForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    a = convert_to(tmp_path / "a", llama_base, hdir, tp_size=2)
    b = convert_to(tmp_path / "b", llama_base, hdir, tp_size=2, workers=3)
    for r in range(2):
        assert (a / f"rank{r}.safetensors").read_bytes() == (b / f"rank{r}.safetensors").read_bytes()


# -- failure paths ------------------------------------------------------------------------
def _no_leftovers(parent, name):
    return not [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]


def test_non_empty_output_refused_unless_overwrite(tmp_path, qwen2_base, qwen2_heads):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(ConversionError, match="not empty"):
        convert_to(out, qwen2_base, qwen2_heads)
    assert (out / "keep.txt").read_text() == "precious"
    convert_to(out, qwen2_base, qwen2_heads, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "rank0.safetensors").exists()
    assert _no_leftovers(tmp_path, "out")


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failure_mid_write_leaves_nothing(tmp_path, qwen2_base, qwen2_heads, monkeypatch, exc):
    from trtllm_medusa_ports.files import checkpoint

    calls = {"n": 0}
    real = checkpoint.StreamingSafetensorsFile.written

    def flaky(self, name):  # every tensor, whichever path wrote it (tensor or byte moves)
        calls["n"] += 1
        if calls["n"] == 5:
            raise exc
        return real(self, name)

    monkeypatch.setattr(checkpoint.StreamingSafetensorsFile, "written", flaky)
    with pytest.raises(type(exc)):
        convert_to(tmp_path / "out", qwen2_base, qwen2_heads, tp_size=2)
    assert not (tmp_path / "out").exists()
    assert _no_leftovers(tmp_path, "out")


def test_existing_output_survives_a_failed_overwrite(tmp_path, qwen2_base, qwen2_heads, monkeypatch):
    out = convert_to(tmp_path / "out", qwen2_base, qwen2_heads)
    before = (out / "rank0.safetensors").read_bytes()
    from trtllm_medusa_ports.files import checkpoint

    def boom(self, name):
        raise RuntimeError("boom")

    monkeypatch.setattr(checkpoint.StreamingSafetensorsFile, "written", boom)
    with pytest.raises(RuntimeError):
        convert_to(out, qwen2_base, qwen2_heads, overwrite=True, dtype="float16")
    assert (out / "rank0.safetensors").read_bytes() == before


def test_data_is_made_durable_when_an_existing_checkpoint_is_replaced(tmp_path, qwen2_base, qwen2_heads, monkeypatch):
    """fsync before the swap where a power loss could take the old checkpoint; a new directory
    is left to the system's writeback (as cp and save_pretrained) unless --fsync asks for it."""
    import os

    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    out = tmp_path / "ckpt"
    convert_to(out, qwen2_base, qwen2_heads, tp_size=2)
    assert synced == []
    convert_to(out, qwen2_base, qwen2_heads, tp_size=2, overwrite=True)
    names = sorted(Path(p).name for p in synced)
    assert len(names) == 4 and names[0].startswith(".ckpt.partial-")  # the directory itself, and
    assert names[1:] == ["config.json", "rank0.safetensors", "rank1.safetensors"]
    synced.clear()
    convert_to(tmp_path / "new", qwen2_base, qwen2_heads, fsync=True)
    assert sorted(Path(p).name for p in synced)[1:] == ["config.json", "rank0.safetensors"]
    synced.clear()
    assert main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads),
                 "--output_dir", str(tmp_path / "cli"), "--fsync", "--quiet"]) == 0
    assert len(synced) == 3


def test_nan_in_base_weights_is_refused(tmp_path, store):
    from safetensors.torch import save_file

    base = tiny_base(store, "LlamaForCausalLM", num_hidden_layers=1)
    bad = tmp_path / "bad"
    bad.mkdir()
    sd = hf_weights(base)
    sd["model.layers.0.mlp.up_proj.weight"][0, 0] = float("inf")
    save_file(sd, str(bad / "model.safetensors"))
    (bad / "config.json").write_text((base / "config.json").read_text())
    c = tiny_config("LlamaForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    with pytest.raises(ModelError, match="layers.0.mlp.gate.weight holds NaN/Inf"):
        convert_to(tmp_path / "out", bad, hdir)
    assert not (tmp_path / "out").exists()


def test_missing_and_extra_tensors(tmp_path, store):
    from safetensors.torch import save_file

    base = tiny_base(store, "LlamaForCausalLM", num_hidden_layers=1)
    c = tiny_config("LlamaForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    for mutate, msg in [
        (lambda sd: sd.pop("model.layers.0.self_attn.k_proj.weight"),
         "model.layers.0.self_attn.k_proj.weight not found (needed for attention.qkv.weight)"),
        (lambda sd: sd.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}),
         "have no place in the llama checkpoint, e.g. model.layers.0.self_attn.o_proj.bias"),
    ]:
        d = tmp_path / f"m{len(msg)}"
        d.mkdir()
        sd = hf_weights(base)
        mutate(sd)
        save_file(sd, str(d / "model.safetensors"))
        (d / "config.json").write_text((base / "config.json").read_text())
        with pytest.raises(ModelError) as e:
            convert_to(tmp_path / "out", d, hdir)
        assert msg in str(e.value)
        assert not (tmp_path / "out").exists()


def test_explicit_head_counts_must_agree(tmp_path, qwen2_base, qwen2_heads):
    with pytest.raises(ConversionError, match="--num_medusa_heads 4 but the heads checkpoint holds 3"):
        convert_to(tmp_path / "o", qwen2_base, qwen2_heads, num_medusa_heads=4)
    with pytest.raises(ConversionError, match="--num_medusa_layers 2 but the heads have 1"):
        convert_to(tmp_path / "o", qwen2_base, qwen2_heads, num_medusa_layers=2)
    convert_to(tmp_path / "o", qwen2_base, qwen2_heads, num_medusa_heads=3, num_medusa_layers=1)


def test_heads_for_another_base_are_refused(tmp_path, qwen2_base, llama_base):
    c = tiny_config("LlamaForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    with pytest.raises(ConversionError) as e:
        convert_to(tmp_path / "o", qwen2_base, hdir)
    assert "heads-hidden-size" in str(e.value) and "heads-vocab-size" in str(e.value)
    assert not (tmp_path / "o").exists()


def test_cli_convert_and_flags(tmp_path, qwen2_base, qwen2_heads, capsys):
    out = tmp_path / "cli"
    rc = main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads),
               "--output_dir", str(out), "--tp_size", "2", "--dtype", "bfloat16", "--quiet"])
    assert rc == 0
    assert "2 rank file(s)" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    rc = main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads),
               "--output_dir", str(tmp_path / "q"), "--use_weight_only", "--weight_only_precision", "int8"])
    err = capsys.readouterr().err  # hidden size 224: TensorRT-LLM's weight-only layers would pad it
    assert rc == 1 and "[quant-weight-only-shape]" in err and "multiple of 64 x tp_size = 64" in err
    rc = main(["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads),
               "--output_dir", str(tmp_path / "q"), "--rotary_base", "5"])
    assert rc == 2 and "read from" in capsys.readouterr().err
    rc = main(["convert", "--model_dir", str(tmp_path / "nope"), "--medusa_model_dir", str(qwen2_heads),
               "--output_dir", str(tmp_path / "q")])
    assert rc == 1 and "no such directory" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_one_spelling_per_concept_and_upstreams_extra_flags(tmp_path, qwen2_base, qwen2_heads, capsys):
    args = ["convert", "--model_dir", str(qwen2_base), "--medusa_model_dir", str(qwen2_heads), "--quiet"]
    assert main(args + ["--output_dir", str(tmp_path / "a"), "--max_draft_len", "17", "--convert-model-on-cpu"]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["max_draft_len"] == 17 and cfg["dtype"] == "float16"  # upstream's default dtype
    capsys.readouterr()  # that conversion's own warnings (the XQA route of its head size)
    for flag, reason in (("--use_embedding_sharding", "sharing the embedding table with lm_head"),
                         ("--storage-type", "a storage dtype other than --dtype"),
                         ("--dataset-cache-dir", "calibration")):
        assert main(args + ["--output_dir", str(tmp_path / "b"), flag, "x"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag}: {reason} is not supported yet" in err
    assert not (tmp_path / "b").exists()
    # tree takes check's spellings too
    assert main(["tree", "--medusa_choices", "[[0],[1]]", "--num_medusa_heads", "1", "--max_draft_len", "2"]) == 0


def test_dropin_script(tmp_path, qwen2_base, qwen2_heads, monkeypatch, capsys):
    """upstream's file name and flags, run as __main__ in this process (a fresh interpreter running it is
    tests/test_byte_moves.py's _cli_convert)."""
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "convert" / "convert_checkpoint.py"

    def run(*argv: str) -> int:
        monkeypatch.setattr(sys, "argv", [str(script), "--model_dir", str(qwen2_base), "--medusa_model_dir",
                                          str(qwen2_heads), *argv])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(script), run_name="__main__")
        return done.value.code

    assert run("--output_dir", str(tmp_path / "d"), "--model_type", "qwen2", "--max_medusa_token_len", "20",
               "--quiet") == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "d" / "config.json").read_text())["max_draft_len"] == 20
    capsys.readouterr()
    assert run("--output_dir", str(tmp_path / "e"), "--model_type", "gpt9") == 1
    err = capsys.readouterr().err
    assert "not a supported family" in err and "Traceback" not in err


@pytest.mark.parametrize("same", [True, False])
def test_vllm_original_lm_head_is_shared_only_when_it_is_the_base_one(tmp_path, llama_base, same):
    from safetensors.torch import save_file

    c = tiny_config("LlamaForCausalLM")
    H, V = c.hidden_size, c.vocab_size
    base_lm = hf_weights(llama_base)["lm_head.weight"]
    sd = {f"blocks.{h}.layers.0.weight": torch.randn(H, H) for h in range(2)}
    sd.update({f"blocks.{h}.layers.0.bias": torch.randn(H) for h in range(2)})
    sd["lm_head.weight"] = base_lm.clone() if same else torch.randn(V, H)
    hdir = tmp_path / "h"
    hdir.mkdir()
    save_file(sd, str(hdir / "model.safetensors"))
    (hdir / "config.json").write_text(json.dumps({"model_type": "medusa", "num_heads": 2, "num_hidden_layers": 1,
                                                  "hidden_size": H, "vocab_size": V, "original_lm_head": True}))
    res = convert(ConvertOptions(model_dir=llama_base, medusa_model_dir=hdir, output_dir=tmp_path / "c", quiet=True))
    cfg, (rank0,) = rank_files(tmp_path / "c")
    assert cfg["medusa_shared_lm_head"] is same
    if same:
        assert "medusa_heads.0.lm_head.weight" not in rank0
    else:
        assert torch.equal(rank0["medusa_heads.1.lm_head.weight"], sd["lm_head.weight"])
        assert any("differs from the base model's lm_head" in w for w in res.warnings)


def test_non_silu_llama_class_base_gets_our_architecture(tmp_path, store):
    base = tiny_base(store, "LlamaForCausalLM", hidden_act="gelu")
    c = tiny_config("LlamaForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    cfg = json.loads((convert_to(tmp_path / "c", base, hdir) / "config.json").read_text())
    # upstream MedusaForCausalLM would give the heads GELU (the base's hidden_act)
    assert cfg["architecture"] == "MedusaPortsLLaMAForCausalLM" and cfg["medusa_hidden_act"] == "silu"


def test_the_engines_name_for_a_base_is_recorded_as_base_architecture(tmp_path, qwen2_base, qwen2_heads, monkeypatch):
    """``engine_architecture``: a family whose TensorRT-LLM class keys a variant on another name than the HF one
    records that name (the engine's config hands it to the class); without one, the HF name."""
    from trtllm_medusa_ports.archs.qwen2 import Qwen2Adapter

    monkeypatch.setattr(Qwen2Adapter, "engine_architecture", "QWenForCausalLM")
    cfg = json.loads((convert_to(tmp_path / "c", qwen2_base, qwen2_heads) / "config.json").read_text())
    assert cfg["base_architecture"] == "QWenForCausalLM"
    assert Qwen2Adapter().base_architecture("Qwen2ForCausalLM") == "QWenForCausalLM"
    monkeypatch.setattr(Qwen2Adapter, "engine_architecture", None)
    assert Qwen2Adapter().base_architecture("Qwen2ForCausalLM") == "Qwen2ForCausalLM"


def test_pytorch_bin_base_converts_like_safetensors(tmp_path, store):
    base = tiny_base(store, "Qwen2ForCausalLM")
    binary = tmp_path / "bin-base"
    binary.mkdir()
    torch.save(hf_weights(base), binary / "pytorch_model.bin")  # the pre-safetensors format
    (binary / "config.json").write_text((base / "config.json").read_text())
    assert (binary / "pytorch_model.bin").is_file() and not list(binary.glob("*.safetensors"))
    c = tiny_config("Qwen2ForCausalLM")
    hdir = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h")
    a = convert_to(tmp_path / "a", base, hdir, tp_size=2)
    b = convert_to(tmp_path / "b", binary, hdir, tp_size=2)
    for r in range(2):
        ta, tb = load_file(str(a / f"rank{r}.safetensors")), load_file(str(b / f"rank{r}.safetensors"))
        assert sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
