"""The stand-in's quantized load path is as strict as upstream's (tests/standin/LEDGER.md): a typed QuantConfig,
``exclude_modules`` taken as written, the embedding quantized under weight-only unless excluded, ModelOpt's k/v
cache scales merged, and weight-only bytes in a layout nothing may read as a plain matrix. Each test fails on the
stand-in's former behaviour."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_engine import _build, _engine_model, _quantized, trtllm  # noqa: F401  (trtllm: the stand-in fixture)


def _config(ckpt):
    return json.loads((ckpt / "config.json").read_text())


def _write(ckpt, cfg):
    (ckpt / "config.json").write_text(json.dumps(cfg))


def test_an_unknown_quantization_key_is_refused(trtllm, store, tmp_path):  # noqa: F811
    import pytest

    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, own=True, qformat="int8_wo")
    cfg = _config(ckpt)
    cfg["quantization"]["quant_algorithm"] = "W8A16"  # a misspelt key: QuantConfig(**d) raises
    _write(ckpt, cfg)
    with pytest.raises(TypeError, match="quant_algorithm"):
        _engine_model(ckpt)


def test_an_empty_exclude_list_stays_empty_and_the_embedding_is_then_quantized(trtllm, store, tmp_path, capsys):  # noqa: F811
    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, own=True, qformat="int8_wo")
    cfg = _config(ckpt)
    model = _engine_model(ckpt)
    assert type(model.transformer.vocab_embedding).__name__ == "Embedding"  # *vocab_embedding excluded
    cfg["quantization"]["exclude_modules"] = []
    _write(ckpt, cfg)
    assert _build(ckpt, tmp_path / "eng") != 0  # refused by our validation: the heads would be quantized layers
    assert "an empty exclude_modules (which excludes nothing)" in capsys.readouterr().err
    import trtllm_medusa_ports.engine.build as build_mod
    from trtllm_medusa_ports.files.jsonfile import read_json

    with pytest.MonkeyPatch.context() as mp:  # past it, the stand-in's load (as TensorRT-LLM's) fails too
        mp.setattr(build_mod, "read_checkpoint_config", lambda d: read_json(d / "config.json", ValueError, fix=""))
        assert _build(ckpt, tmp_path / "eng1") != 0  # nothing excluded: heads, lm_head and embedding quantized
    err = capsys.readouterr().err
    assert "vocab_embedding.per_token_scale" in err
    cfg["quantization"]["exclude_modules"] = ["*lm_head", "*medusa_heads*"]  # the embedding left out of the list
    _write(ckpt, cfg)
    assert _build(ckpt, tmp_path / "eng2") != 0  # refused by our validation: a quantized embedding, a float weight
    assert ("leaves transformer.vocab_embedding.weight float at load (weight_only_quantize_dict matches the tensor "
            "name) while quantize_layers makes transformer.vocab_embedding a weight-only layer") in capsys.readouterr().err
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build_mod, "read_checkpoint_config", lambda d: read_json(d / "config.json", ValueError, fix=""))
        assert _build(ckpt, tmp_path / "eng3") != 0
    assert "vocab_embedding.per_token_scale" in capsys.readouterr().err


def test_modelopt_k_and_v_cache_scales_are_merged_at_load(trtllm, store, tmp_path):  # noqa: F811
    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, own=True, qformat="fp8", kv_cache_dtype="fp8")
    t = load_file(str(ckpt / "rank0.safetensors"))
    name = "transformer.layers.0.attention.kv_cache_scaling_factor"
    k = t.pop(name)
    t[name.replace("kv_cache", "k_cache")], t[name.replace("kv_cache", "v_cache")] = k, k * 3
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    params = dict(_engine_model(ckpt).named_parameters())
    assert torch.equal(params[name].value, k * 3)
    assert torch.allclose(params[name.replace("kv_cache", "kv_cache_rcp")].value, 1 / (k * 3))


def test_stored_weight_only_bytes_are_not_a_plain_matrix():
    from standin_import import standin_file

    from trtllm_medusa_ports.quant import weight_only_quantize

    quantizer = standin_file("tensorrt_llm/quantization/functional.py", "standin_weight_only")
    w = torch.randn(64, 32, dtype=torch.float16)
    stored, scale = quantizer.symmetric_quantize(w.T.contiguous(), 8)
    plain, ours = weight_only_quantize(w, "W8A16")
    assert torch.equal(scale, ours)
    assert not torch.equal(stored, plain.T)  # a reader of the plain layout gets other numbers
    assert torch.equal(stored.flatten().sort().values, plain.T.flatten().sort().values)  # the same bytes, moved


def test_build_says_which_fp8_arithmetic_verify_must_prove(trtllm, store, tmp_path, capsys):  # noqa: F811
    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, qformat="fp8")
    assert _build(ckpt, tmp_path / "eng") == 0
    assert "verify ... --gemm_plugin auto" in capsys.readouterr().err
    assert _build(ckpt, tmp_path / "eng2", "--gemm_plugin", "fp8") == 0
    assert "verify ... --gemm_plugin fp8" in capsys.readouterr().err
    assert _build(ckpt, tmp_path / "eng3", "--use_fused_mlp", "disable") == 0
    assert "--use_fused_mlp disable keeps mlp.fc and mlp.gate" in capsys.readouterr().err


def test_build_refuses_an_install_without_the_engine_flow(trtllm, store, tmp_path, capsys, monkeypatch):  # noqa: F811
    """An incomplete or 1.3 install (no tensorrt_llm.commands): a clear error, not ModuleNotFoundError."""
    import sys

    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, qformat="int8_wo")
    monkeypatch.setitem(sys.modules, "tensorrt_llm.commands.build", None)  # import raises ImportError
    assert _build(ckpt, tmp_path / "eng") == 1
    err = capsys.readouterr().err
    assert "installed without tensorrt_llm.commands.build" in err and "Traceback" not in err


@pytest.mark.parametrize("shape", [(2,), (1, 1), ()])
def test_a_per_tensor_scale_of_another_shape_fails_the_load(trtllm, store, tmp_path, shape):  # noqa: F811
    """FP8Linear declares its scales (1,) and upstream's Parameter.value asserts the shape after reshaping a 0-D
    value to a declared shape of ones (tensorrt_llm/parameter.py): neither [2] nor [1, 1] loads; a 0-D scale does,
    with its value."""
    ckpt = _quantized(store, tmp_path, "LlamaForCausalLM", 1, own=True, qformat="fp8")
    t = load_file(str(ckpt / "rank0.safetensors"))
    name = "transformer.layers.0.attention.qkv.weights_scaling_factor"
    value = float(t[name].reshape(-1)[0])
    t[name] = t[name].reshape(()).expand(shape).contiguous() if shape else t[name].reshape(())
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    if not shape:
        model = _engine_model(ckpt)
        got = dict(model.named_parameters())[name].value
        assert tuple(got.shape) == (1,) and float(got[0]) == value
        return
    with pytest.raises(RuntimeError, match=r"Updated: \(" + ", ".join(str(s) for s in shape) + r",?\), original: \(1,\)"
                       + f".*'{name}'"):
        _engine_model(ckpt)


def test_shape_arithmetic_is_int64_and_a_slice_takes_one_type(trtllm):  # noqa: F811
    """TensorRT 10's shape tensors are int64 (tensorrt_llm/functional.py shape); an int constant is int32 unless an
    int64 input is beside it (constants_to_tensors_); a slice refuses an int32 start beside an int64 size."""
    import tensorrt_llm.functional as F

    x = F.Tensor("x", torch.arange(6, dtype=torch.int32))
    n = F.shape(x, 0)
    assert n.value.dtype == torch.int64 and n.value.dim() == 0
    assert F.concat([0]).value.dtype == torch.int32 and F.concat([0, n]).value.dtype == torch.int64
    assert F.slice(x, starts=[1], sizes=F.concat([n - 2])).value.tolist() == [1, 2, 3, 4]
    with pytest.raises(TypeError, match="starts int32, sizes int64"):
        F.slice(x, starts=F.concat([1]), sizes=F.concat([n - 2]))
    with pytest.raises(TypeError, match="different types"):
        F.concat([F.concat([1]), F.concat([n])])


def test_a_parallel_quantized_embedding_keeps_its_class(trtllm, store, tmp_path):  # noqa: F811
    """parallelize_embedding rebuilds an embedding as ``module.__class__(**get_init_params(module))``
    (tensorrt_llm/models/modeling_utils.py): a weight-only quantized embedding stays one, sharded, with its per-token
    scale over the whole vocabulary (a plain Embedding in its place would declare a float weight)."""
    from tensorrt_llm.models import MODEL_MAP

    from trtllm_medusa_ports.engine.build import model_config_and_class

    cfg = _config(_quantized(store, tmp_path, "LlamaForCausalLM", 2, qformat="int8_wo"))
    cfg["quantization"]["exclude_modules"] = ["*lm_head", "*medusa_heads*"]  # the embedding quantized
    cfg["use_parallel_embedding"], cfg["embedding_sharding_dim"] = True, 0
    model_config, cls = model_config_and_class(cfg)
    model_config.set_rank(1)
    emb = (cls or MODEL_MAP[cfg["architecture"]])(model_config).transformer.vocab_embedding
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    assert type(emb).__name__ == "WeightOnlyQuantEmbedding" and emb.tp_size == 2 and emb.tp_rank == 1
    assert emb.weight.shape == (-(-vocab // 2), hidden) and emb.weight.dtype == "int8"
    assert emb.per_token_scale.shape == (vocab,)
