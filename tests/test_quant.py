"""Quantized ports: upstream's flags, the checkpoint TensorRT-LLM loads, the engine's arithmetic, and
verify failing on a wrong scale (trtllm_medusa_ports/quant)."""

import json
import re
import shutil

import pytest
import torch
from conftest import assert_proven, built_once, convert_to, run_store, tiny_base
from safetensors.torch import load_file, save_file
from test_engine import trtllm  # noqa: F401  (the stand-in fixture)

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import EXIT_FOUND, PortError
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config
from trtllm_medusa_ports.quant import (
    EXCLUDE_MODULES,
    QuantSpec,
    kv_quantized,
    resolve_spec,
    round_half_away,
    weight_only_quantize,
    weight_only_quantized,
)
from trtllm_medusa_ports.reference import ReferenceModel
from trtllm_medusa_ports.verify import verify

#: verify OK must mean the engine builds: each checkpoint proven here is built on the stand-in (conftest.py)
pytestmark = [pytest.mark.numerics]

TREE = "[[0],[1],[0,0],[0,1],[1,0]]"
#: widths that are multiples of 64 x tp for tp 1 and 2 (TensorRT-LLM's weight-only layers pad otherwise)
WIDE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def _calib(tmp_path, vocab, n=6):
    path = tmp_path / f"calib{n}.jsonl"
    path.write_text("\n".join(json.dumps({"input_ids": [(11 * i + 7 * j + 3) % vocab for i in range(10)]})
                              for j in range(n)) + "\n")
    return path


def _heads(tmp_path, arch, hidden):
    c = tiny_config(arch)
    return save_heads(random_heads(hidden, c.vocab_size, num_heads=2, seed=5), tmp_path / "heads")


def test_upstream_flag_spellings_and_contradictions():
    assert resolve_spec(qformat="fp8", kv_cache_dtype="fp8") == QuantSpec("FP8", "FP8")
    assert resolve_spec(use_weight_only=True) == QuantSpec("W8A16", None)  # upstream's default precision
    assert resolve_spec(use_weight_only=True, weight_only_precision="int4", int8_kv_cache=True) == \
        QuantSpec("W4A16", "INT8")
    assert resolve_spec(qformat="full_prec") == QuantSpec()
    for kw, needle in ((dict(qformat="fp8", use_weight_only=True), "two formats"),
                       (dict(weight_only_precision="int8"), "without --use_weight_only"),
                       (dict(kv_cache_dtype="fp8", int8_kv_cache=True), "contradict"),
                       (dict(qformat="int4_awq"), "NVIDIA's tools")):
        with pytest.raises(PortError, match=needle):
            resolve_spec(**kw)
    cfg = QuantSpec("W8A16", None).config()
    assert cfg["exclude_modules"] == EXCLUDE_MODULES and "*medusa_heads*" in cfg["exclude_modules"]
    # weight_only_quantize_dict's name rule: the base's linears, never a head, the lm_head or the embedding
    assert weight_only_quantized("transformer.layers.3.mlp.gate.weight", EXCLUDE_MODULES)
    for name in ("medusa_heads.0.medusa_layers.0.linear.weight", "lm_head.weight",
                 "transformer.vocab_embedding.weight", "transformer.layers.0.attention.qkv.bias"):
        assert not weight_only_quantized(name, EXCLUDE_MODULES), name


def test_weight_only_quantizer_is_upstreams_symmetric_quantize():
    """scale = amax / 128 (int8) or / 8 (int4) per output channel, C round (halves away from zero), clamp."""
    w = torch.tensor([[1.0, -0.5, 0.25, 2.0, 2.0 / 256], [0.0, 0.0, 0.0, 0.0, 0.0], [-2.0, 1.0, 0.0, 0.0, 0.0]])
    q, scale = weight_only_quantize(w, "W8A16")
    assert scale.tolist() == [2.0 / 128, 0.0, 2.0 / 128]
    assert q[0].tolist() == [64, -32, 16, 127, 1]  # +amax -> 128 -> clamped; 0.5 rounds away from zero
    assert q[1].tolist() == [0] * 5 and q[2].tolist() == [-128, 64, 0, 0, 0]
    q4, s4 = weight_only_quantize(w, "W4A16")
    assert s4[0] == 0.25 and q4[0].tolist() == [4, -2, 1, 7, 0] and q4[2].tolist() == [-8, 4, 0, 0, 0]
    h = torch.tensor([[1.0, 3.0]], dtype=torch.float16)
    assert weight_only_quantize(h, "W8A16")[1].dtype == torch.float16  # stored in the weight's dtype
    # C round(): just below a half stays down (floor(|x| + 0.5) gives 1 there: the sum rounds up in float32)
    below = 0.5 - 2.0 ** -25
    assert round_half_away(torch.tensor([below, -below, 0.5, -0.5, 2.5, -1.5])).tolist() == [0, 0, 1, -1, 3, -2]
    amax_row = torch.tensor([[128.0, below, 2.5]])  # scale 1: the row's values are the scaled weights
    assert weight_only_quantize(amax_row, "W8A16")[0][0].tolist() == [127, 0, 3]
    # the KV cache: x * (1 / scale), nearest even, saturated
    assert kv_quantized(torch.tensor([0.5, 1.5, 300.0]), 1.0, "INT8").tolist() == [0.0, 2.0, 127.0]


@pytest.mark.parametrize("arch, tp, flags", [
    ("LlamaForCausalLM", 2, dict(use_weight_only=True, weight_only_precision="int4", int8_kv_cache=True)),
    ("LlamaForCausalLM", 2, dict(qformat="fp8", kv_cache_dtype="fp8")),
    ("Qwen2ForCausalLM", 1, dict(qformat="int8_wo")),
    ("Phi3ForCausalLM", 2, dict(qformat="fp8")),  # fused gate_up
    ("FalconForCausalLM", 1, dict(qformat="fp8", kv_cache_dtype="int8")),  # fused query_key_value
])
def test_quantized_checkpoint_loads_as_upstream_and_verifies(tmp_path, store, arch, tp, flags):
    base = tiny_base(store, arch, **({k: v for k, v in WIDE.items() if arch != "FalconForCausalLM" or
                                     k not in ("num_key_value_heads", "head_dim")}))
    hidden = 128
    heads = _heads(tmp_path, arch, hidden)
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=tp, dtype="float16",
                      calib_dataset=_calib(tmp_path, tiny_config(arch).vocab_size), calib_size=6, **flags)
    cfg = json.loads((ckpt / "config.json").read_text())
    spec = QuantSpec.from_config(cfg)
    assert cfg["quantization"]["exclude_modules"] == EXCLUDE_MODULES
    for r in range(tp):
        t = load_file(str(ckpt / f"rank{r}.safetensors"))
        heads_and_float = [n for n in t if n.startswith(("medusa_heads", "lm_head", "transformer.vocab_embedding"))
                           or "layernorm" in n or n.endswith("ln_f.weight")]
        assert heads_and_float and all(t[n].dtype == torch.float16 for n in heads_and_float)
        for name, v in t.items():
            if name.endswith("_scaling_factor"):
                assert v.dtype == torch.float32 and v.shape == (1,), name
        fp8 = sorted(n for n, v in t.items() if v.dtype == torch.float8_e4m3fn)
        if spec.quant_algo == "FP8":
            assert fp8 and all(n.rsplit(".", 2)[-2] in ("qkv", "dense", "fc", "gate", "proj") for n in fp8)
            assert all(n[: -len("weight")] + "weights_scaling_factor" in t for n in fp8)
            assert all(n[: -len("weight")] + "activation_scaling_factor" in t for n in fp8)
        else:
            assert not fp8  # weight-only stays float: TensorRT-LLM quantizes at load
        if spec.kv_cache_quant_algo:
            assert "transformer.layers.0.attention.kv_cache_scaling_factor" in t
    assert ("calibration" in cfg["medusa_ports"]) == spec.needs_calibration  # weight-only alone needs none
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=10)
    assert rep.ok, rep.render()
    assert_proven(rep)
    assert rep.logits_max_abs_diff <= rep.tolerance
    assert rep.quantization and rep.quant_effect is not None
    assert rep.quant_scales_not_rederived is None
    if spec.needs_calibration:
        assert rep.quant_scales_checked > 0
    if spec.quant_algo:  # the quantization changes the model (information, not a verdict)
        assert rep.quant_effect["max_abs_diff"] > 1e-4
    d = rep.to_dict()
    assert d["quant_effect"]["top1_agreement"] == rep.quant_effect["top1_agreement"]


@pytest.fixture(scope="module")
def fp8_ckpt(store):
    """Converted once per run, read-only (a test that damages it damages a copy)."""
    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    inputs = built_once(run_store() / "quant-fp8-inputs", lambda d: (
        d.mkdir(), _heads(d, "LlamaForCausalLM", 128), _calib(d, tiny_config("LlamaForCausalLM").vocab_size)))
    ckpt = built_once(run_store() / "quant-fp8-int8-kv", lambda d: convert_to(
        d, base, inputs / "heads", dtype="float16", qformat="fp8", kv_cache_dtype="int8",
        calib_dataset=inputs / "calib6.jsonl", calib_size=6))
    return base, ckpt


@pytest.mark.parametrize("tensor, factor", [("transformer.layers.0.mlp.proj.activation_scaling_factor", 2.0),
                                            ("transformer.layers.1.attention.qkv.weights_scaling_factor", 0.5),
                                            ("transformer.layers.0.attention.kv_cache_scaling_factor", 1.5)])
def test_a_wrong_scale_fails_verify(tmp_path, fp8_ckpt, tensor, factor):
    import shutil

    base, good = fp8_ckpt
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    t = load_file(str(bad / "rank0.safetensors"))
    t[tensor] = t[tensor] * factor
    save_file(t, str(bad / "rank0.safetensors"), metadata={"format": "pt"})
    rep = verify(base, bad, medusa_choices=TREE, max_new_tokens=6)
    assert not rep.ok
    assert any(tensor in name for name, _, _ in rep.quant_scale_mismatches), rep.render()
    assert "differ from the re-derived ones" in rep.render()


def test_quantized_executor_differs_from_float_where_the_engine_does(fp8_ckpt):
    """An INT8 KV cache changes no context logit (context attention reads its own K/V) but changes
    generation (XQA reads the quantized cache)."""
    base, ckpt = fp8_ckpt
    ref = ReferenceModel(ckpt)
    cfg = dict(ref.config)
    cache = ref.new_cache()
    ctx, _ = ref.forward([3, 4, 5, 6], cache)
    gen, _ = ref.forward([7], cache)
    ref.quant = QuantSpec(cfg["quantization"]["quant_algo"], None)  # the same model without KV quantization
    cache = ref.new_cache()
    ctx2, _ = ref.forward([3, 4, 5, 6], cache)
    gen2, _ = ref.forward([7], cache)
    assert torch.equal(ctx, ctx2) and not torch.equal(gen, gen2)


def test_max_quant_error_turns_the_effect_into_a_threshold(fp8_ckpt, capsys):
    base, ckpt = fp8_ckpt
    assert main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--medusa_choices", TREE,
                 "--max_new_tokens", "4", "--quiet", "--max_quant_error", "1e-9"]) == EXIT_FOUND
    out = capsys.readouterr().out
    assert "--max_quant_error 1e-09: FAIL" in out and "top-1 agreement" in out
    assert main(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--medusa_choices", TREE,
                 "--max_new_tokens", "4", "--quiet", "--max_quant_error", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quant_effect"]["max_abs_diff"] < 100


def test_bad_quantization_input_writes_nothing(tmp_path, store, capsys):
    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    heads = _heads(tmp_path, "LlamaForCausalLM", 128)
    vocab = tiny_config("LlamaForCausalLM").vocab_size
    args = ["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--quiet", "--qformat", "fp8"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    cases = [(["--calib_dataset", str(tmp_path / "missing.jsonl")], "not a regular file"),
             (["--calib_dataset", str(empty)], "the calibration set has no non-empty sample\n  fix: pass a "
                                               "--calib_dataset with text"),  # not --calib_size 0, which is refused
             (["--calib_dataset", str(_calib(tmp_path, vocab, n=3)), "--calib_size", "5"],
              "has 3 non-empty sample(s), --calib_size asks for 5"),
             (["--calib_dataset", str(_calib(tmp_path, vocab)), "--calib_size", "2", "--dtype", "float32"],
              "from a float32 checkpoint")]
    for extra, needle in cases:
        rc = main(args + ["--output_dir", str(tmp_path / "out")] + extra)
        err = capsys.readouterr().err
        assert rc == 1 and needle in err and "Traceback" not in err, err
        assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(args + ["--output_dir", str(tmp_path / "out"), "--calib_size", "0"])
    assert "must be at least 1" in capsys.readouterr().err


def _tensor_bytes(path):
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())


@pytest.mark.parametrize("arch, tp, pp", [("LlamaForCausalLM", 2, 1), ("Qwen2ForCausalLM", 1, 2)])
def test_memory_plan_equals_the_written_rank_files_and_counts_quantized_weights(tmp_path, store, arch, tp, pp,
                                                                                capsys):
    from trtllm_medusa_ports.conversion.convert import ConvertOptions, plan_layout
    from trtllm_medusa_ports.gpu.memory import memory_plan

    base = tiny_base(store, arch, **WIDE)
    heads = _heads(tmp_path, arch, 128)
    ckpt = convert_to(tmp_path / "f", base, heads, tp_size=tp, pp_size=pp, dtype="float16")
    opts = ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "x", tp_size=tp,
                          pp_size=pp, dtype="float16")
    plan = memory_plan(*plan_layout(opts))
    for r in range(tp * pp):  # float: the engine holds what the rank file holds
        assert plan.weight_bytes(r) == _tensor_bytes(ckpt / f"rank{r}.safetensors")
    assert sum(plan.medusa_resblock_bytes) == tp * 2 * (128 // tp) * 129 * 2  # 2 heads x 1 layer, weight + bias
    cfg = json.loads((ckpt / "config.json").read_text())
    layers = cfg["num_hidden_layers"] // pp
    assert plan.kv_bytes_per_token[0] == 2 * layers * max(1, 2 // tp) * 32 * 2
    wo = memory_plan(*plan_layout(ConvertOptions(**{**opts.__dict__, "qformat": "int8_wo",
                                                    "kv_cache_dtype": "int8"})))
    for r in range(tp * pp):
        linears = [(n, s) for n, _, s in plan_layout(opts)[1][r] if weight_only_quantized(n, EXCLUDE_MODULES)]
        saved = sum(s[0] * s[1] * 2 - (s[0] * s[1] + s[0] * 2) for _, s in linears)
        assert linears and plan.base_bytes[r] - wo.base_bytes[r] == saved  # 1 byte a weight + a scale per row
        assert wo.medusa_resblock_bytes[r] == plan.medusa_resblock_bytes[r]  # heads stay float
        assert wo.kv_bytes_per_token[r] * 2 == plan.kv_bytes_per_token[r]
    # check answers "does it fit" before any build
    args = ["check", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--tp_size", str(tp),
            "--pp_size", str(pp), "--dtype", "float16", "--max_batch_size", "8", "--max_seq_len", "4096"]
    main(args + ["--gpu_memory_gb", "24", "--json"])
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert mem["fits"] is True and mem["weight_bytes"] == [plan.weight_bytes(r) for r in range(tp * pp)]
    assert mem["kv_cache_bytes"][0] == plan.kv_bytes_per_token[0] * 8 * (4096 + 63)
    main(args + ["--gpu_memory_gb", "0.001"])
    assert "DOES NOT FIT" in capsys.readouterr().out


@pytest.mark.parametrize("arch, qformat, extra", [
    ("MixtralForCausalLM", "int8_wo", dict(intermediate_size=128)),
    ("Qwen2MoeForCausalLM", "int4_wo", dict(moe_intermediate_size=64, shared_expert_intermediate_size=128)),
])
def test_memory_plan_of_weight_only_experts_is_what_the_load_makes_of_the_rank_files(tmp_path, store, arch, qformat,
                                                                                      extra):
    """The engine's weights of a weight-only MoE checkpoint: each rank file through the load-time quantizer (the
    stand-in of weight_only_quantize_dict, written apart from trtllm_medusa_ports.quant), byte for byte the plan."""
    from standin_import import standin_file

    from trtllm_medusa_ports.conversion.convert import ConvertOptions, plan_layout
    from trtllm_medusa_ports.gpu.memory import memory_plan

    quantizer = standin_file("tensorrt_llm/quantization/functional.py", "standin_weight_only")
    base = tiny_base(store, arch, **MOE_WIDE, **extra)
    heads = _heads(tmp_path, arch, 128)
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=2, dtype="float16", qformat=qformat)
    cfg = json.loads((ckpt / "config.json").read_text())
    opts = ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "x", tp_size=2,
                          dtype="float16", qformat=qformat)
    plan = memory_plan(*plan_layout(opts))
    for r in range(2):
        loaded = quantizer.weight_only_quantize_dict(load_file(str(ckpt / f"rank{r}.safetensors")),
                                                     cfg["quantization"]["quant_algo"],
                                                     cfg["quantization"]["exclude_modules"])
        assert loaded["transformer.layers.0.mlp.fc.weight"].dtype == torch.int8  # the experts were quantized
        assert plan.weight_bytes(r) == sum(t.numel() * t.element_size() for t in loaded.values())


# -- a base already quantized by NVIDIA's tools (convert --base_checkpoint_dir) -----------------------------
def _tool_checkpoint(src, out, *, store_weight_only=None):
    """A quantized TensorRT-LLM checkpoint as NVIDIA's tools write it, made from one of ours: no heads, the HF
    architecture, ModelOpt's ``exclude_modules`` (``["lm_head"]``) and k/v scales, or weight-only as a family's
    convert_checkpoint.py stores it: ``"processed"``, int8 bytes beside a ``per_channel_scale`` in a layout that is
    not the plain ``[in, out]`` matrix (what symmetric_quantize_last_axis_of_batched_matrix returns is permuted and
    interleaved for one SM's mixed GEMM; here rows are permuted and bytes interleaved as a stand-in for it, since
    the exact permutation is made on the GPU); ``"unplugged"``: ``--disable_weight_only_quant_plugin``'s transposed
    float weight ``[in, out]`` beside its ``per_channel_scale``."""
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    for k in ("num_medusa_heads", "num_medusa_layers", "max_draft_len", "medusa_hidden_act", "medusa_shared_lm_head",
              "trtllm_base_architecture", "medusa_ports"):
        cfg.pop(k, None)
    cfg["architecture"] = cfg.pop("base_architecture")
    cfg["quantization"]["exclude_modules"] = ["lm_head"]
    if store_weight_only == "unplugged":
        cfg["disable_weight_only_quant_plugin"] = True
    algo = cfg["quantization"]["quant_algo"]
    world = cfg["mapping"]["world_size"]
    for r in range(world):
        t = {n: v for n, v in load_file(str(src / f"rank{r}.safetensors")).items() if not n.startswith("medusa_heads")}
        for n in [n for n in t if n.endswith("kv_cache_scaling_factor")]:
            v = t.pop(n)
            t[n.replace("kv_cache", "k_cache")], t[n.replace("kv_cache", "v_cache")] = v, v * 0.5
        if store_weight_only:
            for n in [n for n in t if weight_only_quantized(n, EXCLUDE_MODULES)]:
                q, scale = weight_only_quantize(t[n], algo)
                if store_weight_only == "unplugged":
                    t[n] = t[n].T.contiguous()
                else:
                    q = q.T.contiguous()
                    if algo == "W4A16":
                        q = ((q[:, 0::2] & 0x0F) | ((q[:, 1::2] & 0x0F) << 4)).to(torch.int8)
                    rows = torch.arange(q.shape[0]).reshape(-1, 8).flip(-1).reshape(-1)  # permuted, interleaved
                    t[n] = q[rows].reshape(-1, 4, q.shape[1] // 4).transpose(1, 2).reshape(q.shape).contiguous()
                t[n[: -len("weight")] + "per_channel_scale"] = scale
        save_file(t, str(out / f"rank{r}.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("flags, stored", [(dict(qformat="fp8", kv_cache_dtype="fp8"), None),
                                           (dict(qformat="int8_wo"), "processed"),
                                           (dict(qformat="int4_wo", int8_kv_cache=True), "processed")])
def test_heads_added_to_a_tool_quantized_base_keep_its_bytes_and_verify(tmp_path, store, flags, stored):
    """The base's bytes are kept; verify reads them as their writer stored them: ModelOpt's FP8 with k/v scales, and
    refuses the GPU-specific int8 bytes a family's converter stores by default (reading them as a plain [in, out]
    matrix would be silently wrong)."""
    from trtllm_medusa_ports.errors import CheckpointError

    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    heads = _heads(tmp_path, "LlamaForCausalLM", 128)
    ours = convert_to(tmp_path / "ours", base, heads, tp_size=2, dtype="float16",
                      calib_dataset=_calib(tmp_path, tiny_config("LlamaForCausalLM").vocab_size), calib_size=6,
                      **flags)
    tool = _tool_checkpoint(ours, tmp_path / "tool", store_weight_only=stored)
    other = save_heads(random_heads(128, tiny_config("LlamaForCausalLM").vocab_size, num_heads=3, seed=9),
                       tmp_path / "other-heads")
    out = tmp_path / "ported"
    assert main(["convert", "--base_checkpoint_dir", str(tool), "--medusa_model_dir", str(other),
                 "--output_dir", str(out), "--medusa_choices", TREE, "--quiet"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "MedusaPortsLLaMAForCausalLM" and cfg["num_medusa_heads"] == 3
    assert cfg["medusa_ports"]["medusa_choices"] == json.loads(TREE)  # the tree it was given, for verify and deploy
    # combine_medusa_weight's list replaces the base's (tensorrt_llm/quantization/quantize_by_modelopt.py)
    assert cfg["quantization"]["exclude_modules"] == ["lm_head", "*router", "*vocab_embedding", "*position_embedding",
                                                      "*block_embedding", "*medusa_heads*"]
    for r in range(2):
        before, after = load_file(str(tool / f"rank{r}.safetensors")), load_file(str(out / f"rank{r}.safetensors"))
        for n, v in before.items():  # the base's bytes, untouched
            assert after[n].dtype == v.dtype and torch.equal(after[n].view(torch.uint8), v.view(torch.uint8)), n
        assert after["medusa_heads.2.medusa_layers.0.linear.weight"].shape == (64, 128)
        assert after["medusa_heads.2.medusa_layers.0.linear.weight"].dtype == torch.float16
    if stored == "processed":
        with pytest.raises(CheckpointError, match="cannot be read back here") as err:
            verify(base, out, medusa_choices=TREE, max_new_tokens=8)
        assert "--disable_weight_only_quant_plugin" in err.value.fix
        return
    rep = verify(base, out, medusa_choices=TREE, max_new_tokens=8, accept_unchecked_scales=True)
    assert_proven(rep)
    if QuantSpec.from_config(cfg).needs_calibration:  # a tool's scales with no calibration given: not re-derived
        assert "records no calibration" in rep.quant_scales_not_rederived and rep.ok
        assert not verify(base, out, medusa_choices=TREE, max_new_tokens=8).ok


def _unplugged(ckpt, out):
    """A copy of one of our W8A16 checkpoints with every decoder weight as a family's convert_checkpoint.py
    --disable_weight_only_quant_plugin stores it: the transposed float weight [in, out] beside its per_channel_scale."""
    out.mkdir()
    (out / "config.json").write_text((ckpt / "config.json").read_text())
    for f in sorted(ckpt.glob("rank*.safetensors")):
        t = load_file(str(f))
        for n in [n for n in t if weight_only_quantized(n, EXCLUDE_MODULES)]:
            t[n[: -len("weight")] + "per_channel_scale"] = weight_only_quantize(t[n], "W8A16")[1]
            t[n] = t[n].T.contiguous()
        save_file(t, str(out / f.name), metadata={"format": "pt"})
    return out


def test_a_float_weight_beside_its_per_channel_scale_is_refused_as_the_build_would_fail_on_it(
        tmp_path, store, capsys, trtllm, monkeypatch):  # noqa: F811
    """TensorRT-LLM 1.2's build re-quantizes every float weight under W8A16 at load, reading the stored [in, out] as
    [out, in] (tensorrt_llm/models/modeling_utils.py preprocess_weights): convert --base_checkpoint_dir, verify and
    build refuse such a base, naming the tensor, and the stand-in's build indeed fails on it."""
    from test_engine import _build

    from trtllm_medusa_ports.errors import CheckpointError

    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    ours = convert_to(tmp_path / "ours", base, _heads(tmp_path, "LlamaForCausalLM", 128), tp_size=2,
                      dtype="float16", qformat="int8_wo")
    tool = _tool_checkpoint(ours, tmp_path / "tool", store_weight_only="unplugged")
    assert main(["convert", "--base_checkpoint_dir", str(tool), "--medusa_model_dir",
                 str(_heads(tmp_path / "h", "LlamaForCausalLM", 128)), "--output_dir", str(tmp_path / "ported"),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"rank 0: transformer\.layers\.0\.(attention\.(qkv|dense)|mlp\.(fc|gate|proj))\.weight is a "
                     r"float16 weight \[\d+, \d+\] stored beside its per_channel_scale under W8A16", err), err
    assert "reading it as [out, in]" in err
    assert "--qformat int8_wo" in err and not (tmp_path / "ported").exists()
    unplugged = _unplugged(ours, tmp_path / "unplugged")
    with pytest.raises(CheckpointError, match="stored beside its per_channel_scale under W8A16") as e:
        verify(base, unplugged, medusa_choices=TREE, max_new_tokens=4)
    assert "preprocess_weights" in e.value.what and "--qformat int8_wo" in e.value.fix
    assert _build(unplugged, tmp_path / "eng") == 1
    assert "stored beside its per_channel_scale" in capsys.readouterr().err
    import trtllm_medusa_ports.engine.build as build_mod
    from trtllm_medusa_ports.files.jsonfile import read_json

    monkeypatch.setattr(build_mod, "read_checkpoint_config", lambda d: read_json(d / "config.json", ValueError, fix=""))
    assert _build(unplugged, tmp_path / "eng2") == 1  # past our rule, upstream's load (the stand-in's) fails too
    assert "not the same shape" in capsys.readouterr().err


def _with_exclude(ckpt, out, exclude):
    shutil.copytree(ckpt, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization"]["exclude_modules"] = exclude
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("extra, said", [
    (["transformer.layers.0.mlp.fc"], "keeps transformer.layers.0.mlp.fc a float layer (quantize_layers matches "
                                      "the module name) while weight_only_quantize_dict quantizes "
                                      "transformer.layers.0.mlp.fc.weight at load"),
    (["*layers.0.mlp.fc.weight"], "leaves transformer.layers.0.mlp.fc.weight float at load"),
])
def test_an_exclusion_only_one_of_the_builds_two_matchers_sees_is_refused(
        tmp_path, store, capsys, trtllm, extra, said):  # noqa: F811
    """Under W8A16 quantize_layers keeps a layer float by its module name, weight_only_quantize_dict a weight by its
    tensor name (tensorrt_llm/quantization/quantize.py, models/convert_utils.py): an exact module name kept the
    layer float while its weight was quantized (verify OK, the stand-in build failed). verify and build refuse
    both halves of such a pair, naming the tensor; named both ways, the layer stays float, verify proves it and
    the stand-in builds it."""
    from test_engine import _build

    from trtllm_medusa_ports.errors import CheckpointError

    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    ours = convert_to(tmp_path / "ours", base, _heads(tmp_path, "LlamaForCausalLM", 128), dtype="float16",
                      qformat="int8_wo")
    own = json.loads((ours / "config.json").read_text())["quantization"]["exclude_modules"]
    bad = _with_exclude(ours, tmp_path / "bad", own + extra)
    with pytest.raises(CheckpointError, match=re.escape(said)) as e:
        verify(base, bad, medusa_choices=TREE, max_new_tokens=4)
    assert "rank 0: under W8A16" in e.value.what and "name the module and its weight" in e.value.fix
    assert _build(bad, tmp_path / "eng") == 1 and said in capsys.readouterr().err
    both = _with_exclude(ours, tmp_path / "both",
                         own + ["transformer.layers.0.mlp.fc", "transformer.layers.0.mlp.fc.weight"])
    rep = verify(base, both, medusa_choices=TREE, max_new_tokens=4)
    assert rep.ok


def test_a_quantized_bases_kept_module_names_are_written_for_both_matchers():
    from trtllm_medusa_ports.quant.prequantized import (
        COMBINED_EXCLUDE_MODULES,
        output_exclude_modules,
    )

    own = ["transformer.layers.0.mlp.fc", "*layers.1.attention*", "lm_head"]
    assert output_exclude_modules({"quant_algo": "W8A16", "exclude_modules": own}) == [
        *COMBINED_EXCLUDE_MODULES, "transformer.layers.0.mlp.fc", "transformer.layers.0.mlp.fc.weight",
        "*layers.1.attention*"]
    assert output_exclude_modules({"quant_algo": "FP8", "exclude_modules": own}) == [
        *COMBINED_EXCLUDE_MODULES, "transformer.layers.0.mlp.fc", "*layers.1.attention*"]


def test_tool_quantized_base_refusals(tmp_path, store, capsys):
    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    heads = _heads(tmp_path, "LlamaForCausalLM", 128)
    ours = convert_to(tmp_path / "ours", base, heads, dtype="float16", qformat="int8_wo")
    tool = _tool_checkpoint(ours, tmp_path / "tool")
    args = ["convert", "--base_checkpoint_dir", str(tool), "--output_dir", str(tmp_path / "o"), "--quiet"]
    small = save_heads(random_heads(64, 100, num_heads=2), tmp_path / "small")
    assert main(args + ["--medusa_model_dir", str(small)]) == 1
    assert "do not fit the base (hidden_size 128" in capsys.readouterr().err
    assert main(args + ["--medusa_model_dir", str(heads), "--qformat", "fp8"]) == 2
    assert "keeps its own quantization" in capsys.readouterr().err
    assert main(args + ["--medusa_model_dir", str(heads), "--model_dir", str(base)]) == 2
    assert "one of them" in capsys.readouterr().err
    assert main(["convert", "--base_checkpoint_dir", str(ours), "--medusa_model_dir", str(heads),
                 "--output_dir", str(tmp_path / "o"), "--quiet"]) == 1
    assert "has Medusa heads already" in capsys.readouterr().err
    cfg = json.loads((tool / "config.json").read_text())
    cfg["quantization"]["quant_algo"] = "W4A16_AWQ"
    (tool / "config.json").write_text(json.dumps(cfg))
    # float weights under an AWQ quant_algo: not what the engine would load; refused before anything is written
    assert main(args + ["--medusa_model_dir", str(heads)]) == 1
    err = capsys.readouterr().err
    assert "dense.weight is float16 without weights_scaling_factor" in err and "taking int8 weights" in err
    assert not (tmp_path / "o").exists()
    cfg["moe"] = {"num_experts": 4, "top_k": 2}  # config.json's experts over rank files that hold none
    (tool / "config.json").write_text(json.dumps(cfg))
    assert main(args[:-2] + [str(tmp_path / "o-moe"), "--quiet", "--medusa_model_dir", str(heads)]) == 1
    err = capsys.readouterr().err
    assert "rank files must come from one conversion" in err and not (tmp_path / "o-moe").exists()


def test_a_tool_quantized_mixture_of_experts_base_is_refused(tmp_path, store, capsys):
    """A tool's quantized experts (a layout verify cannot read back yet) are refused, with the route that works."""
    base = tiny_base(store, "MixtralForCausalLM", **WIDE)
    heads = _heads(tmp_path, "MixtralForCausalLM", 128)
    tool = _tool_checkpoint(convert_to(tmp_path / "ours", base, heads, dtype="float16", qformat="int8_wo"),
                            tmp_path / "tool")
    out = tmp_path / "o-moe"
    assert main(["convert", "--base_checkpoint_dir", str(tool), "--medusa_model_dir", str(heads), "--output_dir",
                 str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "W8A16 experts of a mixture-of-experts base" in err and "--qformat int8_wo" in err, err
    assert not out.exists()


def test_a_calibration_run_once_serves_several_conversions(tmp_path, store):
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.quant.calibrate import calibrate, read_calibration_samples

    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    heads = _heads(tmp_path, "LlamaForCausalLM", 128)
    calib = _calib(tmp_path, tiny_config("LlamaForCausalLM").vocab_size)
    kw = dict(dtype="float16", qformat="fp8", kv_cache_dtype="int8", calib_dataset=calib, calib_size=6)
    fresh = convert_to(tmp_path / "fresh", base, heads, tp_size=2, **kw)
    samples, source = read_calibration_samples(calib, base, size=6, max_seq_length=512)
    cal = calibrate(base, adapter_for("LlamaForCausalLM"), "float16", samples, source=source)
    reused = convert_to(tmp_path / "reused", base, heads, tp_size=2, calibration=cal, **kw)
    for r in range(2):
        assert (fresh / f"rank{r}.safetensors").read_bytes() == (reused / f"rank{r}.safetensors").read_bytes()
    assert verify(base, reused, medusa_choices=TREE, max_new_tokens=4).ok


def test_a_weight_only_conversion_moves_the_float_bytes_without_torch(tmp_path, store):
    """TensorRT-LLM quantizes weight-only at load, so the checkpoint is the float one plus quant_algo: the same
    byte path, no torch, every rank file identical to the float conversion's."""
    from test_byte_moves import _cli_convert

    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base

    base = save_tiny_base("LlamaForCausalLM", tmp_path / "base", seed=4, dtype=torch.float16, **WIDE)
    heads = save_heads(random_heads(128, tiny_config("LlamaForCausalLM").vocab_size, num_heads=2, seed=5),
                       tmp_path / "heads", "fasterdecoding-safetensors", dtype=torch.float16)
    convert_to(tmp_path / "float", base, heads, tp_size=2, dtype="float16")  # also fills the shape cache
    rc, imported, err = _cli_convert(base, heads, tmp_path / "wo", "--dtype", "float16", "--qformat", "int4_wo")
    assert rc == 0 and imported == [], (imported, err)
    for r in range(2):
        assert (tmp_path / "wo" / f"rank{r}.safetensors").read_bytes() == \
            (tmp_path / "float" / f"rank{r}.safetensors").read_bytes()
    assert json.loads((tmp_path / "wo" / "config.json").read_text())["quantization"]["quant_algo"] == "W4A16"


def _non_alibi_dense_families():
    from trtllm_medusa_ports.archs import registry
    from trtllm_medusa_ports.archs.registry import family_test_cases
    from trtllm_medusa_ports.archs.semantics import PositionEmbedding

    return sorted({c.hf_architectures[0] for c in registry().values()
                   if c.position_embedding is not PositionEmbedding.ALIBI} - set(family_test_cases()["moe"]))


@pytest.mark.parametrize("arch", _non_alibi_dense_families())
def test_every_family_verifies_in_fp8_with_a_quantized_kv_cache_at_tp2(tmp_path, store, arch):
    # the tiny Qwen2's 7 query heads per KV head of size 64: no precompiled Medusa kernel (head 128 only) by default
    base = tiny_base(store, arch, **({"num_key_value_heads": 14} if arch == "Qwen2ForCausalLM" else {}))
    c = tiny_config(arch)
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=5), tmp_path / "h")
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=2, dtype="bfloat16", qformat="fp8", kv_cache_dtype="int8",
                      calib_dataset=_calib(tmp_path, c.vocab_size, n=3), calib_size=3,
                      allow_unsupported=bool(adapter_for(arch).expected_check_errors))
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=3, prompts=[[5, 9, 13, 17]])
    assert not rep.quant_scale_mismatches, rep.render()
    assert_proven(rep)
    assert rep.quant_scales_checked >= 2 * c.num_hidden_layers * 4  # weight + activation scales of every linear


def test_pipeline_parallel_fp8_verifies(tmp_path, store):
    base = tiny_base(store, "MistralForCausalLM")
    c = tiny_config("MistralForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=5), tmp_path / "h")
    ckpt = convert_to(tmp_path / "c", base, heads, tp_size=2, pp_size=2, dtype="float16", qformat="fp8",
                      kv_cache_dtype="fp8", calib_dataset=_calib(tmp_path, c.vocab_size, n=3), calib_size=3)
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6)
    assert rep.ok, rep.render()


def test_fp8_arithmetic_is_the_engines():
    """FP8Linear: x / s_a with s_a cast to the model dtype, saturated to +-448, rounded to float8_e4m3fn; weights
    (w / s_w) cast the same way (ModelOpt to_quantized_weight)."""
    from trtllm_medusa_ports.quant import fp8_activation, fp8_scale, fp8_weight

    assert fp8_scale(448.0) == 1.0 and fp8_scale(0.0) == 1.0  # an amax of 0 gives scale 1 (export_amax)
    x = torch.tensor([1000.0, -1000.0, 1.0625, 0.0, 3.0])
    assert fp8_activation(x, 1.0, torch.float16).tolist() == [448.0, -448.0, 1.0, 0.0, 3.0]  # saturated, RNE
    s = 1.0 / 3.0  # cast to bfloat16 first: 0.333984375, not 1/3
    got = fp8_activation(torch.tensor([1.0]), s, torch.bfloat16)
    assert got.item() == torch.tensor(1.0 / 0.333984375).to(torch.float8_e4m3fn).float().item()
    w = torch.tensor([[0.5, -2.0]], dtype=torch.float16)
    assert fp8_weight(w, 2.0 / 448).float().tolist() == [[112.0, -448.0]]


@pytest.fixture(scope="module")
def fp8_calibrations(tmp_path_factory, store):
    """One calibration per (family, checkpoint dtype), run once for the byte-path tests below."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.quant.calibrate import calibrate

    cache = {}

    def get(arch, base, dtype):
        if (arch, dtype) not in cache:
            vocab = tiny_config(arch).vocab_size
            samples = [[(11 * i + 7 * j + 3) % vocab for i in range(8)] for j in range(2)]
            cache[arch, dtype] = calibrate(base, adapter_for(arch), dtype, samples, source="test ids")
        return cache[arch, dtype]

    return get


@pytest.mark.parametrize("arch, source_dtype, dtype", [
    ("LlamaForCausalLM", torch.float16, "float16"),  # separate q/k/v: byte ranges, row splits strided
    ("Phi3ForCausalLM", torch.bfloat16, "float16"),  # fused qkv and gate_up sources, cast on the way
    ("GPTNeoXForCausalLM", torch.float32, "bfloat16"),  # per-head interleaved q/k/v rows
    ("FalconForCausalLM", torch.float16, "bfloat16"),
])
def test_fp8_weights_on_the_byte_path_equal_the_tensor_paths(tmp_path, store, fp8_calibrations, arch, source_dtype,
                                                             dtype):
    """Pass 1 (amax on the bits) and pass 2 (the chunked scaled cast) write every rank file byte for byte as the
    whole-tensor FP8 path does; the FP8 linears take the byte path."""
    from test_byte_moves import _both

    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base

    base = save_tiny_base(arch, tmp_path / "base", seed=4, dtype=source_dtype)
    c = tiny_config(arch)
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=5), tmp_path / "heads")
    res = _both(tmp_path, base, heads, tp_size=2, dtype=dtype, qformat="fp8", kv_cache_dtype="fp8",
                calibration=fp8_calibrations(arch, base, dtype))
    fp8 = {k for k, v in res.moves.items() if v == "fp8-cast"}
    assert {"layers.0.attention.qkv.weight", "layers.0.attention.dense.weight", "layers.0.mlp.fc.weight",
            "layers.0.mlp.proj.weight"} <= fp8, res.moves
    w = load_file(tmp_path / "fastTrue" / "rank1.safetensors")
    assert w["transformer.layers.0.mlp.fc.weight"].dtype == torch.float8_e4m3fn
    assert w["transformer.layers.0.mlp.fc.weights_scaling_factor"].dtype == torch.float32


def test_fp8_amax_pass_reads_each_element_once_and_finds_the_largest_magnitude(tmp_path):
    import numpy as np

    from trtllm_medusa_ports.files.byte_moves import (
        ByteMover,
        MoveKind,
        MovePlan,
        NonFinite,
        Piece,
        Source,
        amax_regions,
    )

    def plan(*pieces, rows=8, width=4):
        return MovePlan(MoveKind.FP8, [Source(tmp_path / "w.bin", 16, (rows, width), "float16")],
                        [Piece(0, *p, "t", 0) for p in pieces], dtype="float8_e4m3fn")

    # every rank's column slice of the same rows: one rectangle, whole rows
    assert amax_regions(plan((0, 8, 0, 2, 0), (0, 8, 2, 4, 1))) == [(0, 0, 8, 0, 4)]
    # q/k/v style row ranges of two ranks
    assert amax_regions(plan((0, 2, 0, 4, 0), (4, 6, 0, 4, 0), (2, 4, 0, 4, 1), (6, 8, 0, 4, 1))) == [(0, 0, 8, 0, 4)]
    # a replica is read once; a gap keeps the pieces apart; an L shape is not one rectangle
    assert amax_regions(plan((0, 8, 0, 4, 0), (0, 8, 0, 4, 1))) == [(0, 0, 8, 0, 4)]
    assert amax_regions(plan((0, 2, 0, 4, 0), (4, 6, 0, 4, 1))) == [(0, 0, 2, 0, 4), (0, 4, 6, 0, 4)]
    assert amax_regions(plan((0, 4, 0, 4, 0), (4, 8, 0, 2, 1))) == [(0, 0, 4, 0, 4), (0, 4, 8, 0, 2)]

    torch.manual_seed(0)
    for dtype, np_bits in ((torch.float16, np.uint16), (torch.bfloat16, np.uint16), (torch.float32, np.uint32)):
        w = torch.randn(8, 4).to(dtype) * 3
        w[5, 3] = -40.0  # the largest magnitude is negative, outside the first piece
        w[0, 0] = torch.finfo(dtype).tiny / 4  # a subnormal
        raw = w.view(torch.int16 if np_bits is np.uint16 else torch.int32).numpy().tobytes()
        (tmp_path / "w.bin").write_bytes(b"\0" * 16 + raw)
        name = str(dtype).removeprefix("torch.")
        mover = ByteMover(lambda r, n: 0, lambda r: -1)

        def amax(*pieces, name=name, mover=mover):
            p = plan(*pieces)
            p.sources[0] = Source(tmp_path / "w.bin", 16, (8, 4), name)
            return mover.amax(p)

        assert amax((0, 8, 0, 2, 0), (0, 8, 2, 4, 1)) == 40.0
        assert amax((0, 4, 0, 4, 0)) == float(w[:4].abs().max().float())  # only the rows the pieces take
        assert amax((0, 8, 0, 3, 0)) == float(w[:, :3].abs().max().float())
        for bad in (float("nan"), float("-inf")):
            w2 = w.clone()
            w2[7, 1] = bad
            raw = w2.view(torch.int16 if np_bits is np.uint16 else torch.int32).numpy().tobytes()
            (tmp_path / "w.bin").write_bytes(b"\0" * 16 + raw)
            with pytest.raises(NonFinite):
                amax((0, 8, 0, 4, 0))
            assert amax((0, 7, 0, 4, 0)) == 40.0  # the bad row is not taken
        mover.close()


def test_fp8_conversion_refuses_a_non_finite_or_overflowing_weight_and_writes_nothing(tmp_path, store,
                                                                                     fp8_calibrations):
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base

    base = save_tiny_base("LlamaForCausalLM", tmp_path / "base", seed=4, dtype=torch.float32)
    c = tiny_config("LlamaForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=5), tmp_path / "heads")
    cal = fp8_calibrations("LlamaForCausalLM", base, "float16")
    w = load_file(base / "model.safetensors")
    for value, needle in ((float("nan"), "NaN/Inf"), (1e6, "overflow float16")):
        bad = dict(w)
        bad["model.layers.1.mlp.down_proj.weight"] = bad["model.layers.1.mlp.down_proj.weight"].clone()
        bad["model.layers.1.mlp.down_proj.weight"][3, 2] = value
        save_file(bad, base / "model.safetensors")
        with pytest.raises(PortError, match=needle) as e:
            convert_to(tmp_path / "out", base, heads, tp_size=2, dtype="float16", qformat="fp8", calibration=cal)
        assert "layers.1.mlp.proj.weight" in str(e.value)
        assert not (tmp_path / "out").exists()


def test_a_mixture_of_experts_base_is_refused_fp8_but_takes_a_quantized_kv_cache(tmp_path, store):
    """FP8 experts (one scale per expert, one activation scale for all) are not written yet (rule port-limit); a
    KV-cache dtype alone changes no expert."""
    base = tiny_base(store, "MixtralForCausalLM")
    c = tiny_config("MixtralForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=5), tmp_path / "h")
    calib = _calib(tmp_path, c.vocab_size, n=3)
    with pytest.raises(PortError) as e:
        convert_to(tmp_path / "q", base, heads, dtype="bfloat16", calib_dataset=calib, calib_size=3, qformat="fp8")
    assert e.value.rule == "port-limit" and "FP8 of a mixture-of-experts base" in e.value.what
    assert "--qformat int8_wo" in str(e.value) and not (tmp_path / "q").exists()
    ckpt = convert_to(tmp_path / "kv", base, heads, tp_size=2, dtype="bfloat16", kv_cache_dtype="int8",
                      calib_dataset=calib, calib_size=3)
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4, prompts=[[5, 9, 13, 17]])
    assert not rep.quant_scale_mismatches, rep.render()
    assert_proven(rep)


#: MoE widths that are multiples of 64 x tp for tp 2 where a weight-only linear needs it (the shared expert)
MOE_WIDE = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


@pytest.mark.parametrize("arch, flags, tp, ep, extra", [
    ("MixtralForCausalLM", dict(qformat="int8_wo"), 2, 1, dict(intermediate_size=128)),
    ("Qwen2MoeForCausalLM", dict(use_weight_only=True, weight_only_precision="int4"), 2, 1,
     dict(moe_intermediate_size=64, shared_expert_intermediate_size=128)),
    ("GraniteMoeForCausalLM", dict(qformat="int4_wo"), 2, 2, dict(intermediate_size=96)),  # fused 3-D experts, EP
    ("Qwen3MoeForCausalLM", dict(qformat="int8_wo"), 1, 1, dict(moe_intermediate_size=64)),
])
def test_weight_only_experts_are_quantized_at_load_and_verify(tmp_path, store, arch, flags, tp, ep, extra):
    """Weight-only MoE: the experts stay float in the file (weight_only_quantize_dict quantizes the 3-D mlp.fc /
    mlp.proj per expert and output channel at load); the executor and the transformers side quantize them so, the
    router and the shared expert's gate stay float."""
    from trtllm_medusa_ports.quant import weight_only_dequantized

    base = tiny_base(store, arch, **MOE_WIDE, **extra)
    ckpt = convert_to(tmp_path / "c", base, _heads(tmp_path, arch, 128), tp_size=tp, moe_ep_size=ep,
                      dtype="float16", **flags)
    cfg = json.loads((ckpt / "config.json").read_text())
    spec = QuantSpec.from_config(cfg)
    assert spec.weight_only and "*shared_expert_gate.weight" in cfg["quantization"]["exclude_modules"]
    t = load_file(str(ckpt / "rank0.safetensors"))
    fc = t["transformer.layers.0.mlp.fc.weight"]
    assert fc.dtype == torch.float16 and fc.dim() == 3 and t["transformer.layers.0.mlp.router.weight"].dtype == torch.float32
    ref = ReferenceModel(ckpt)
    got = ref.weight(0, "transformer.layers.0.mlp.fc.weight")
    assert torch.equal(got, weight_only_dequantized(fc, spec.quant_algo)) and not torch.equal(got, fc.float())
    assert torch.equal(ref.weight(0, "transformer.layers.0.mlp.router.weight"),
                       t["transformer.layers.0.mlp.router.weight"].float())
    if "transformer.layers.0.mlp.shared_expert_gate.weight" in t:
        assert torch.equal(ref.weight(0, "transformer.layers.0.mlp.shared_expert_gate.weight"),
                           t["transformer.layers.0.mlp.shared_expert_gate.weight"].float())
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6, prompts=[[5, 9, 13, 17, 21]])
    assert rep.ok, rep.render()
    assert_proven(rep)
    assert rep.quant_effect["max_abs_diff"] > 1e-4  # the quantization changes the model


def test_weight_only_experts_left_float_on_the_transformers_side_fail_parity(tmp_path, store, monkeypatch):
    """The transformers side must quantize the experts as the engine does: without it, parity fails."""
    from trtllm_medusa_ports.quant import emulate

    base = tiny_base(store, "MixtralForCausalLM", **MOE_WIDE, intermediate_size=128)
    ckpt = convert_to(tmp_path / "c", base, _heads(tmp_path, "MixtralForCausalLM", 128), dtype="float16",
                      qformat="int4_wo")
    monkeypatch.setattr(emulate, "_weight_only_experts", lambda *a, **k: None)
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4, prompts=[[5, 9, 13, 17, 21]])
    assert not rep.parity and rep.logits_max_abs_diff > rep.tolerance, rep.render()


def test_kv_scales_are_measured_on_the_cached_keys_and_their_damage_is_seen(tmp_path, store):
    """The INT8 KV scale comes from the K the cache holds (after Qwen3's k_norm and RoPE), not from the k/v
    projection outputs (upstream's and ModelOpt's convention): with the pre-norm scale the cached K overflows
    INT8 and --max_quant_error, measured on generation steps that read the quantized cache, fails."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.quant import kv_scale
    from trtllm_medusa_ports.quant.calibrate import calibrate, read_calibration_samples

    arch = "Qwen3ForCausalLM"
    base = tiny_base(store, arch)
    calib = _calib(tmp_path, tiny_config(arch).vocab_size)
    ckpt = convert_to(tmp_path / "c", base, _heads(tmp_path, arch, tiny_config(arch).hidden_size), dtype="float16",
                      kv_cache_dtype="int8", calib_dataset=calib, calib_size=6)
    samples, _ = read_calibration_samples(calib, base, size=6, max_seq_length=512)
    cal = calibrate(base, adapter_for(arch), "float16", samples)
    layers = sorted(cal.kv_cached)
    assert layers == [0, 1] and all(cal.kv_cached[i] > 3 * cal.qkv_outputs[i] for i in layers)  # k_norm's range
    for r in range(1):
        t = load_file(str(ckpt / f"rank{r}.safetensors"))
        for i in layers:
            assert float(t[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"]) == pytest.approx(
                kv_scale(cal.kv_cached[i], "INT8"), rel=1e-5)
    good = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6)
    assert good.ok and not good.quant_scale_mismatches, good.render()
    limit = 3 * good.quant_effect["max_abs_diff"]
    # the same checkpoint with the scales of the projection outputs: clipped keys in every generation step
    t = load_file(str(ckpt / "rank0.safetensors"))
    for i in layers:
        t[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"] = torch.tensor(
            [kv_scale(cal.qkv_outputs[i], "INT8")], dtype=torch.float32)
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    bad = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6, max_quant_error=limit)
    assert bad.quant_effect["max_abs_diff"] > limit and bad.quant_error_exceeded and not bad.ok
    assert bad.quant_scale_mismatches  # and the scale itself is not the re-derived one


@pytest.mark.parametrize("tensor, shape", [("transformer.layers.0.attention.qkv.weights_scaling_factor", (2,)),
                                           ("transformer.layers.1.mlp.proj.activation_scaling_factor", (1, 1)),
                                           ("transformer.layers.0.attention.kv_cache_scaling_factor", (1, 1))])
def test_verify_refuses_a_per_tensor_scale_the_engine_would_not_load(tmp_path, store, tensor, shape):
    """FP8Linear and a quantized KV cache declare their scales float32 (1,), and the engine's load asserts the exact
    shape (tensorrt_llm/parameter.py): verify, which computed with the first value, said OK for a [2] scale."""
    from trtllm_medusa_ports.errors import CheckpointError

    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    ckpt = convert_to(tmp_path / "fp8", base, _heads(tmp_path, "LlamaForCausalLM", 128), dtype="float16",
                      qformat="fp8", kv_cache_dtype="fp8",
                      calib_dataset=_calib(tmp_path, tiny_config("LlamaForCausalLM").vocab_size), calib_size=6)
    t = load_file(str(ckpt / "rank0.safetensors"))
    t[tensor] = t[tensor].reshape(()).expand(shape).contiguous() if shape else t[tensor].reshape(())
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=re.escape(f"{tensor} is float32 {list(shape)}, but ")) as e:
        verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert "declares it float32 [1]" in e.value.what and "float32 [1]" in e.value.fix


def test_a_0d_per_tensor_scale_loads_as_upstream_reshapes_it(tmp_path, store):
    """Parameter.value reshapes a 0-D value to a declared shape of ones (tensorrt_llm/parameter.py, 1.x): a 0-D FP8
    or KV cache scale builds, so verify accepts it and reads its value (the module's verifies build on the
    stand-in, whose Parameter does the same)."""
    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    ckpt = convert_to(tmp_path / "fp8", base, _heads(tmp_path, "LlamaForCausalLM", 128), dtype="float16",
                      qformat="fp8", kv_cache_dtype="fp8",
                      calib_dataset=_calib(tmp_path, tiny_config("LlamaForCausalLM").vocab_size), calib_size=6)
    t = load_file(str(ckpt / "rank0.safetensors"))
    for name in ("transformer.layers.1.mlp.proj.activation_scaling_factor",
                 "transformer.layers.0.attention.kv_cache_scaling_factor"):
        t[name] = t[name].reshape(())
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert rep.ok and not rep.quant_scale_mismatches


def test_the_build_check_fails_a_test_whose_verify_says_ok_for_what_does_not_build(tmp_path, store, monkeypatch):
    """This module's verifies build what they prove on the stand-in (conftest.py): with verify's own load-path check
    taken out, the [2] scale above is proven OK, and the build of it fails the test."""
    import trtllm_medusa_ports.reference.load_checks as load_checks

    monkeypatch.setattr(load_checks, "load_problems", lambda ranks, config: [])
    base = tiny_base(store, "LlamaForCausalLM", **WIDE)
    ckpt = convert_to(tmp_path / "fp8", base, _heads(tmp_path, "LlamaForCausalLM", 128), dtype="float16",
                      qformat="fp8", calib_dataset=_calib(tmp_path, tiny_config("LlamaForCausalLM").vocab_size),
                      calib_size=6)
    t = load_file(str(ckpt / "rank0.safetensors"))
    name = "transformer.layers.0.attention.qkv.weights_scaling_factor"
    t[name] = t[name].expand(2).contiguous()
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="but its build on the stand-in fails") as e:
        verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4)
    assert f"{name} is float32 [2]" in str(e.value)  # build's own check (quant/engine_load.py) says why


def test_a_format_that_costs_most_of_the_greedy_text_fails_by_default(tmp_path, store, capsys):
    """INT4 weight-only (per channel) on a base whose norms put outliers in the hidden states: reading the float
    base's greedy text, the quantized model predicts too few of its tokens (about 0.4). verify, as users run it,
    fails it below MIN_QUANT_AGREEMENT, saying why and which flag accepts it; --min_quant_agreement 0 accepts it
    (nothing else is wrong)."""
    from trtllm_medusa_ports.verify import MIN_QUANT_AGREEMENT

    base = tiny_base(store, "Qwen2ForCausalLM", norm_offset=10.0, **WIDE)
    ckpt = convert_to(tmp_path / "int4wo", base, _heads(tmp_path, "Qwen2ForCausalLM", 128), dtype="float16",
                      qformat="int4_wo")
    args = ["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--quiet", "--json"]
    assert main(args) == EXIT_FOUND
    out = json.loads(capsys.readouterr().out)
    agreed = out["quant_effect"]["teacher_forced_agreement"]
    assert agreed < MIN_QUANT_AGREEMENT and out["min_quant_agreement"] == MIN_QUANT_AGREEMENT
    assert out["parity"] and out["greedy_equal"] and not out["ok"] and not out["proof_ok"]
    assert out["quant_effect"]["teacher_forced_positions"] > 0
    assert main(args[:-1]) == EXIT_FOUND
    text = capsys.readouterr().out
    lo, hi = out["quant_effect"]["teacher_forced_interval"]
    assert (f"greedy agreement: FAIL  {agreed:.3f} of the float base's greedy tokens predicted reading its text, 95 % "
            f"interval [{lo:.3f}, {hi:.3f}] over {out['quant_effect']['teacher_forced_positions']} counted positions "
            f"(32 new tokens a prompt; least: {MIN_QUANT_AGREEMENT:g}") in text
    assert f"changes the base's next token on {1 - agreed:.0%} of its text" in text
    assert out["quantization"] in text and "--min_quant_agreement 0 to accept it" in text
    assert main(args + ["--min_quant_agreement", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["min_quant_agreement"] is None
    # decided by the interval: a threshold its lower bound clears passes, one above its upper bound fails
    assert main(args + ["--min_quant_agreement", f"{int(lo * 1e6) / 1e6:.6f}"]) == 0
    capsys.readouterr()
    assert main(args + ["--min_quant_agreement", f"{hi + 0.01:.6f}"]) == EXIT_FOUND


def test_the_agreement_interval_is_wilsons():
    """Issue 76, 2: the verdict reads the agreement's 95 % interval, not its point: 21 of 28 positions (0.75 exactly,
    a damaged format's sample that passed) and 6 of 8 do not show a rate of 0.75 or more."""
    from trtllm_medusa_ports.verify.quantization import agreement_interval

    lo, hi = agreement_interval(21, 28)
    assert lo == pytest.approx(0.5660, abs=1e-3) and hi == pytest.approx(0.8732, abs=1e-3)
    lo, hi = agreement_interval(6, 8)
    assert lo == pytest.approx(0.4093, abs=1e-3) and hi == pytest.approx(0.9285, abs=1e-3)
    assert agreement_interval(0, 10)[0] == 0.0 and agreement_interval(10, 10)[1] == pytest.approx(1.0)
    assert agreement_interval(0, 0) == (0.0, 1.0)


def test_a_verdict_near_the_threshold_is_measured_until_decided_and_is_the_same_from_any_length(tmp_path, store,
                                                                                                monkeypatch):
    """Issue 76, 2: where the interval straddles the threshold, verify reads a longer float text (twice the new
    tokens, up to DAMAGE_MAX_NEW_TOKENS); undecided there, it fails, naming the interval. Started at 8 or at 16 new
    tokens, the checkpoint gets the same verdict on the same evidence."""
    import trtllm_medusa_ports.verify.run as run_mod
    from trtllm_medusa_ports.verify import MIN_QUANT_AGREEMENT

    DAMAGE_MAX_NEW_TOKENS = 64  # the cap, smaller for the test's time (verify/limits.py states verify's own)
    monkeypatch.setattr(run_mod, "DAMAGE_MAX_NEW_TOKENS", DAMAGE_MAX_NEW_TOKENS)
    base = tiny_base(store, "Qwen2ForCausalLM", norm_offset=10.0, **WIDE)
    ckpt = convert_to(tmp_path / "int4wo", base, _heads(tmp_path, "Qwen2ForCausalLM", 128), dtype="float16",
                      qformat="int4_wo")
    full = verify(base, ckpt, max_new_tokens=DAMAGE_MAX_NEW_TOKENS, quiet=True, skip_tree_proof=True,
                  min_quant_agreement=MIN_QUANT_AGREEMENT).quant_effect
    near = full["teacher_forced_agreement"]  # a threshold at the rate itself: no sample can show it is cleared
    reports = [verify(base, ckpt, max_new_tokens=n, quiet=True, skip_tree_proof=True, min_quant_agreement=near)
               for n in (8, 16)]
    for rep in reports:
        e = rep.quant_effect
        assert e["teacher_forced_new_tokens"] == DAMAGE_MAX_NEW_TOKENS, e  # measured more, to the cap
        assert (e["teacher_forced_hits"], e["teacher_forced_positions"]) == (full["teacher_forced_hits"],
                                                                          full["teacher_forced_positions"])
        assert rep.quant_agreement_verdict == "undecided" and not rep.ok
        assert "undecided, the interval straddles" in rep.render() and "--data or --prompt_ids" in rep.render()
    lo, _ = full["teacher_forced_interval"]
    clear = verify(base, ckpt, max_new_tokens=8, quiet=True, skip_tree_proof=True, min_quant_agreement=lo * 0.5)
    assert clear.quant_agreement_verdict == "pass" and clear.quant_effect["teacher_forced_new_tokens"] < 64


@pytest.mark.parametrize("qformat, passes", [("int8_wo", True), ("int4_wo", False)])
def test_the_damage_verdict_is_the_same_at_32_and_256_new_tokens(tmp_path, store, qformat, passes):
    """Issue 62, 4: the verdict rests on teacher-forced agreement (the quantized model reading the float base's greedy
    text predicts its next token), which weighs every generated position alike. The share of tokens before the
    first difference of two free-running texts, the verdict before, falls with the length: INT8 weight-only on
    this base kept 0.92 of 32 tokens and 0.12 of 256 (passed, then failed at 0.5)."""
    from trtllm_medusa_ports.verify import MIN_QUANT_AGREEMENT

    base = tiny_base(store, "Qwen2ForCausalLM", norm_offset=10.0, **WIDE)
    ckpt = convert_to(tmp_path / qformat, base, _heads(tmp_path, "Qwen2ForCausalLM", 128), dtype="float16",
                      qformat=qformat)
    forced, first, low = [], [], []
    for n in (32, 256):
        rep = verify(base, ckpt, max_new_tokens=n, quiet=True, skip_tree_proof=True,
                     min_quant_agreement=MIN_QUANT_AGREEMENT)
        forced.append(rep.quant_effect["teacher_forced_agreement"])
        first.append(rep.quant_effect["greedy_agreed_fraction"])
        low.append(rep.quant_agreement_too_low)
        assert rep.ok == passes, rep.render()
    assert low == [not passes, not passes] and abs(forced[0] - forced[1]) < 0.05, (forced, first)
    if passes:  # what the old measure said of the same checkpoint
        assert first[0] > 0.5 > first[1], first


@pytest.mark.parametrize("algo, moe_tp", [("W8A16", 1), ("W4A16", 2)])
def test_weight_only_emulation_of_transposed_fused_experts_quantizes_each_experts_output_channels(algo, moe_tp):
    """Issue 66, 1: a family storing its experts 2-D and its down-projection transposed (DBRX's ``w2``
    ``[experts x inter, hidden]``, used as ``x @ w2``) declares the leaves (``expert_weight_leaves``); the emulation
    quantizes each expert's ``[hidden, inter]`` as the engine's ``mlp.proj`` per output channel and per rank's
    slice of its input, and ``w1`` / ``v1`` per row, under the family's own layer prefix."""
    from types import SimpleNamespace

    from trtllm_medusa_ports.quant import weight_only_dequantized
    from trtllm_medusa_ports.quant.emulate import _weight_only_experts
    from trtllm_medusa_ports.weights.sharding import Mapping

    experts, inter, hidden = 3, 8, 6
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Module()
    store = {leaf: torch.nn.Parameter(torch.randn(experts * inter, hidden, generator=g), requires_grad=False)
             for leaf in ("w1", "v1", "w2")}
    mlp = torch.nn.Module()
    for leaf, p in store.items():
        mlp.register_parameter(leaf, p)
    model.transformer = torch.nn.Module()
    model.transformer.blocks = torch.nn.ModuleList([torch.nn.Module()])
    model.transformer.blocks[0].ffn = torch.nn.Module()
    model.transformer.blocks[0].ffn.experts = torch.nn.Module()
    model.transformer.blocks[0].ffn.experts.mlp = mlp
    before = {k: v.detach().clone() for k, v in store.items()}
    adapter = SimpleNamespace(hidden_size=lambda hf: hidden, num_experts=lambda hf: experts,
                              layer_prefix="transformer.blocks.{i}.",
                              expert_weight_leaves={"w1": ("fc", False), "v1": ("fc", False), "w2": ("proj", True)})
    _weight_only_experts(model, adapter, None, SimpleNamespace(quant_algo=algo), None, Mapping(2, 1),
                         {"mapping": {"moe_tp_size": moe_tp}}, 1, torch.float32, "base")
    for leaf in ("w1", "v1"):  # rows are output channels: per row
        assert torch.equal(store[leaf], weight_only_dequantized(before[leaf], algo)), leaf
    want = before["w2"].view(experts, inter, hidden).transpose(1, 2)  # [experts, hidden (out), inter (in)]
    want = torch.cat([weight_only_dequantized(c, algo) for c in want.chunk(moe_tp, dim=-1)], dim=-1)
    assert torch.equal(store["w2"], want.transpose(1, 2).reshape(experts * inter, hidden))
    # quantizing w2 per row (as if it were not transposed) gives other values: the declaration matters
    assert not torch.equal(store["w2"], weight_only_dequantized(before["w2"], algo))


#: a DBRX wide enough for weight-only at tp 2 (widths multiples of 64 x tp), its settings in nested objects
DBRX_WIDE = dict(d_model=128, n_heads=4, attn_config={"kv_n_heads": 2, "clip_qkv": 0.3, "rope_theta": 10000.0},
                 ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2})


@pytest.mark.parametrize("qformat, tp, ep", [("int8_wo", 2, 1), ("int4_wo", 2, 2), ("int4_wo", 1, 1)])
def test_weight_only_dbrx_experts_with_their_transposed_down_projection_verify(tmp_path, store, qformat, tp, ep):
    """Issue 66: DBRX's 2-D experts, w2 stored transposed, quantized by verify's transformers side as the engine
    quantizes mlp.proj (per expert and output channel, per rank's input slice): parity, greedy and the tree proof
    pass; with the experts left float on the transformers side, parity fails (the issue's 0.0016 at INT8, 0.026 at
    INT4 before the capability)."""
    from trtllm_medusa_ports.quant import emulate

    arch = "DbrxForCausalLM"
    base = tiny_base(store, arch, **DBRX_WIDE)
    ckpt = convert_to(tmp_path / "c", base, _heads(tmp_path, arch, 128), tp_size=tp, moe_ep_size=ep, dtype="float16",
                      qformat=qformat)
    rep = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=6, prompts=[[5, 9, 13, 17, 21]])
    assert rep.ok, rep.render()
    assert_proven(rep)
    assert rep.quant_effect["max_abs_diff"] > 1e-4
    if (qformat, tp) == ("int4_wo", 1):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(emulate, "_weight_only_experts", lambda *a, **k: None)
            bad = verify(base, ckpt, medusa_choices=TREE, max_new_tokens=4, prompts=[[5, 9, 13, 17, 21]])
        assert not bad.parity and bad.logits_max_abs_diff > bad.tolerance, bad.render()
