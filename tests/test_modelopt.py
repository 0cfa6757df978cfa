"""Checkpoints NVIDIA ModelOpt 0.21.1 wrote (tests/fixtures/modelopt, made by scripts/make_modelopt_fixtures.py with
its own ``export_tensorrt_llm_checkpoint`` on a tiny Qwen2): heads added by ``convert --base_checkpoint_dir`` and
verified as they are written, scales and layout read from the base."""

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_proven
from safetensors.torch import load_file, save_file
from test_engine import trtllm  # noqa: F401  (the stand-in fixture)

from trtllm_medusa_ports.api import AddHeadsOptions, VerifyOptions, add_heads, verify
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads

#: verify OK must mean the engine builds: each checkpoint proven here is built on the stand-in (conftest.py); the
#: results are floating-point (CI runs them on every ATen CPU path)
pytestmark = [pytest.mark.numerics]

FIXTURES = Path(__file__).parent / "fixtures" / "modelopt"
BASE = FIXTURES / "hf_qwen2"
CALIB = FIXTURES / "calib_ids.jsonl"
TREE = "[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]"


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> Path:
    return save_heads(random_heads(128, 250, num_heads=3, seed=4), tmp_path_factory.mktemp("mo") / "heads")


def _ported(tmp_path: Path, heads: Path, name: str) -> Path:
    out = tmp_path / f"ported-{name}"
    add_heads(AddHeadsOptions(FIXTURES / name, heads, out))
    return out


def _verify(ckpt: Path, **kw):
    kw.setdefault("calib_dataset", CALIB)
    # the fixtures' tiny random base has near-tie logits everywhere: its quantized text is not judged (conftest.py)
    kw.setdefault("min_quant_agreement", 0.0)
    return verify(VerifyOptions(BASE, ckpt, medusa_choices=TREE, max_new_tokens=8, quiet=True, **kw))


def test_the_fixtures_are_what_modelopt_writes():
    """The facts the port depends on, read off ModelOpt's own files (a regenerated fixture that changed them
    would fail here first): its producer block, separate FP8 scales for mlp.fc and mlp.gate, one for q/k/v."""
    cfg = json.loads((FIXTURES / "fp8" / "config.json").read_text())
    assert cfg["producer"] == {"name": "modelopt", "version": "0.21.1"} and cfg["quantization"]["quant_algo"] == "FP8"
    t = load_file(str(FIXTURES / "fp8" / "rank0.safetensors"))
    for i in (0, 1):
        fc, gate = (float(t[f"transformer.layers.{i}.mlp.{m}.weights_scaling_factor"]) for m in ("fc", "gate"))
        assert fc != gate
        assert t[f"transformer.layers.{i}.attention.qkv.weights_scaling_factor"].shape == (1,)
    assert json.loads((FIXTURES / "int4_awq" / "config.json").read_text())["vocab_size"] == 256  # padded


@pytest.mark.parametrize("name, scales", [("fp8", 20), ("fp8_kv", 22), ("fp8_tp2", 20)])
def test_modelopt_fp8_bases_verify_as_written(tmp_path, heads, name, scales):
    ckpt = _ported(tmp_path, heads, name)
    rep = _verify(ckpt)
    assert rep.ok, rep.render()
    assert_proven(rep)
    # every weight, activation (and KV) scale re-derived from the HF weights and the calibration samples
    assert rep.quant_scales_checked == scales and not rep.quant_scale_mismatches
    assert any("fuse" in n for n in rep.notes)
    # combine_medusa_weight's patterns, then ModelOpt's own names that none of them covers (issue 57, m7)
    own = json.loads((FIXTURES / name / "config.json").read_text())["quantization"]["exclude_modules"]
    assert json.loads((ckpt / "config.json").read_text())["quantization"]["exclude_modules"] == [
        "lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding", "*medusa_heads*",
        *[e for e in own if e not in ("lm_head", "transformer.vocab_embedding")]]


def test_a_tool_checkpoint_without_its_calibration_fails_unless_accepted(tmp_path, heads):
    ckpt = _ported(tmp_path, heads, "fp8_kv")
    rep = _verify(ckpt, calib_dataset=None)
    assert rep.parity and not rep.ok and "records no calibration" in rep.quant_scales_not_rederived
    assert "scales          : FAIL" in rep.render() and "--calib_dataset" in rep.render()
    accepted = _verify(ckpt, calib_dataset=None, accept_unchecked_scales=True)
    assert accepted.ok and "accepted by --accept_unchecked_scales" in accepted.render()


@pytest.mark.parametrize("tensor, factor", [("mlp.gate.activation_scaling_factor", 4.0),
                                            ("mlp.fc.weights_scaling_factor", 0.5),
                                            ("attention.kv_cache_scaling_factor", 2.0)])
def test_a_wrong_scale_in_a_modelopt_base_fails(tmp_path, heads, tensor, factor):
    ckpt = _ported(tmp_path, heads, "fp8_kv")
    t = load_file(str(ckpt / "rank0.safetensors"))
    name = f"transformer.layers.1.{tensor}"
    t[name] = t[name] * factor
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    rep = _verify(ckpt)
    assert not rep.ok and any(name in n for n, _, _ in rep.quant_scale_mismatches), rep.render()


@pytest.mark.parametrize("name", ["int4_awq", "int4_awq_g64", "int8_sq"])
def test_tool_format_parity_is_float_noise_on_every_cpu_path(tmp_path, heads, name):
    """Issue 62: the engine rounds ``x * pre_quant_scale`` to the model dtype; with that rounding in parity, float32
    order noise between transformers' SDPA kernel and the executor's softmax (which differs between CPU paths:
    ``ATEN_CPU_CAPABILITY=avx2``, another CPU) crossed float16 rounding boundaries and failed a correct AWQ export
    by 2-4x the tolerance. Parity now leaves that rounding out on both sides and measures its effect apart, so what
    parity sees is float32 noise alone, far under the tolerance on any path."""
    rep = _verify(_ported(tmp_path, heads, name))
    assert rep.parity and rep.logits_max_abs_diff < rep.tolerance / 20, rep.render()
    assert any("smoothed input in the model dtype" in n for n in rep.notes), rep.notes
    # the rounding is still the engine's: measured with it on, Medusa against plain decoding included
    assert rep.quant_effect is not None and "medusa_vs_plain_with_rounding" in rep.quant_effect


@pytest.mark.parametrize("name", ["int4_awq", "int8_sq"])
def test_a_wrong_rotary_base_in_a_tool_checkpoint_fails_parity(tmp_path, heads, name):
    """The sabotage parity caught with the rounding on is caught without it, on every CPU path (1 % off the rotary
    base moves the logits ~15x the tolerance; float32 noise is ~1/100 of it)."""
    ckpt = _ported(tmp_path, heads, name)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rotary_base"] *= 1.01
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rep = _verify(ckpt)
    assert not rep.parity and not rep.ok and rep.logits_max_abs_diff > 5 * rep.tolerance, rep.render()
    assert "logits parity     : FAIL" in rep.render()


@pytest.mark.parametrize("name, scales", [("int4_awq", 20), ("int4_awq_g64", 20), ("int8_sq", 30)])
def test_modelopt_awq_and_smoothquant_bases_verify_as_written(tmp_path, heads, name, scales):
    """INT4 AWQ (pre-quant scales, per-group scales, ModelOpt's int4 packing, a vocabulary padded to 256) and INT8
    SmoothQuant: every stored code within rounding of the weight it stands for, every scale re-derived."""
    ckpt = _ported(tmp_path, heads, name)
    rep = _verify(ckpt)
    assert rep.ok, rep.render()
    assert_proven(rep)
    assert rep.quant_scales_checked == scales and not rep.quant_scale_mismatches
    if name.startswith("int4_awq"):
        cfg = json.loads((ckpt / "config.json").read_text())
        assert cfg["vocab_size"] == 256 and any("padded from 250 to 256" in w for w in cfg["medusa_ports"]["warnings"])
        t = load_file(str(ckpt / "rank0.safetensors"))
        lm = t["medusa_heads.0.lm_head.weight"]
        assert lm.shape == (256, 128) and not lm[250:].any() and lm[:250].any()
        assert any("padded from 250 to 256" in n for n in rep.notes)


@pytest.mark.parametrize("name, damage", [("int4_awq", "nibbles"), ("int4_awq", "group scale"),
                                          ("int8_sq", "row scale"), ("int8_sq", "activation scale")])
def test_a_misread_awq_or_smoothquant_base_fails(tmp_path, heads, name, damage):
    ckpt = _ported(tmp_path, heads, name)
    t = load_file(str(ckpt / "rank0.safetensors"))
    base = "transformer.layers.0.attention.qkv."
    if damage == "nibbles":  # the other packing order: each byte's two codes swapped
        w = t[base + "weight"].to(torch.int16)
        t[base + "weight"] = (((w & 0x0F) << 4) | ((w >> 4) & 0x0F)).to(torch.uint8).view(torch.int8)
    elif damage == "group scale":
        t[base + "weights_scaling_factor"][3, 0] *= 1.5
    elif damage == "row scale":
        t[base + "weights_scaling_factor"][5] *= 1.5
    else:
        t[base + "activation_scaling_factor"] *= 4
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    rep = _verify(ckpt)
    assert not rep.ok and any(base in n for n, _, _ in rep.quant_scale_mismatches), rep.render()


def test_heads_that_do_not_fit_a_padded_vocabulary_are_refused(tmp_path):
    from trtllm_medusa_ports.errors import HeadsError

    other = save_heads(random_heads(128, 240, num_heads=2, seed=4), tmp_path / "h240")
    with pytest.raises(HeadsError, match="not all zero, so they are not padding"):
        add_heads(AddHeadsOptions(FIXTURES / "int4_awq", other, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_layer_quant_algo_quantizes_must_hold_quantized_weights(tmp_path, heads):
    """An FP8 checkpoint whose mlp.fc weight is float16: TensorRT-LLM's FP8Linear would not load it, and computing it
    in float would prove another model."""
    from trtllm_medusa_ports.errors import CheckpointError

    ckpt = _ported(tmp_path, heads, "fp8")
    t = load_file(str(ckpt / "rank0.safetensors"))
    name = "transformer.layers.1.mlp.fc."
    t[name + "weight"] = (t[name + "weight"].float() * t[name + "weights_scaling_factor"]).half()
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="mlp.fc.weight is float16, but quant_algo FP8 makes"):
        _verify(ckpt)


def test_verify_shares_add_heads_validation_of_the_checkpoint_config(tmp_path, heads):
    """A config.json that says tp 1 over tp-2 rank files: refused by verify as by add-heads, naming the files,
    not a failure inside the executor."""
    from trtllm_medusa_ports.errors import PortError

    ckpt = _ported(tmp_path, heads, "fp8_tp2")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["mapping"] = {"world_size": 1, "tp_size": 1, "pp_size": 1}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PortError, match="rank1"):
        _verify(ckpt)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_smoothed_input_is_rounded_to_the_model_dtype_as_the_engine_multiplies(dtype):
    """m6: Int8SmoothQuantLinear multiplies x by pre_quant_scale in the model dtype (tensorrt_llm/quantization/
    layers.py), so the product is a model-dtype value, the correctly rounded product of the two."""
    from trtllm_medusa_ports.quant.tool_formats import smoothed_input

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g).to(dtype).float()
    pqs = (torch.rand(96, generator=g) * 3 + 0.1)
    out = smoothed_input(x, pqs, dtype)
    assert torch.equal(out, out.to(dtype).float())
    assert torch.equal(out, (x.to(dtype) * pqs.to(dtype)).float())
    # float32 would keep bits the engine drops: the values differ somewhere
    assert not torch.equal(out, x * pqs.to(dtype).float())


def test_a_linear_the_tool_kept_in_float_stays_excluded_and_builds(tmp_path, heads):
    """m7: ModelOpt names a linear it kept in float in its exclude_modules; combine_medusa_weight's list alone would
    make it an FP8Linear the engine cannot load. The output keeps the base's names, verify proves it (and conftest
    builds it on the stand-in)."""
    import shutil

    base = tmp_path / "fp8-dense-float"
    shutil.copytree(FIXTURES / "fp8", base)
    t = load_file(str(base / "rank0.safetensors"))
    dense = "transformer.layers.1.attention.dense"
    # the tool's float linear holds the base's own weight ([out, in], as transformers stores it)
    t[dense + ".weight"] = load_file(str(BASE / "model.safetensors"))["model.layers.1.self_attn.o_proj.weight"]
    t.pop(dense + ".weights_scaling_factor"), t.pop(dense + ".activation_scaling_factor")
    save_file(t, str(base / "rank0.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((base / "config.json").read_text())
    cfg["quantization"]["exclude_modules"].append(dense)
    (base / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "ported"
    res = add_heads(AddHeadsOptions(base, heads, out))
    assert dense in res.config["quantization"]["exclude_modules"]
    assert not any(dense in w for w in res.warnings), res.warnings
    rep = _verify(out)
    assert rep.ok, rep.render()
    assert_proven(rep)


def test_verify_refuses_awq_tensors_of_disagreeing_shapes_by_name(tmp_path, heads):
    """A group scale transposed after add-heads: verify names it (quant/base_checks.py) instead of failing inside
    the arithmetic (issue 57, 1)."""
    from trtllm_medusa_ports.errors import CheckpointError

    ckpt = _ported(tmp_path, heads, "int4_awq_g64")
    t = load_file(str(ckpt / "rank0.safetensors"))
    name = "transformer.layers.1.mlp.fc.weights_scaling_factor"
    t[name] = t[name].t().contiguous()
    save_file(t, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"mlp\.fc\.weights_scaling_factor is \[2, 256\], but .* makes it "
                                              r"\[256, 2\] \(group_size 64\)"):
        _verify(ckpt)


@pytest.mark.parametrize("name, edit, said, standin", [
    ("int4_awq", {"group_size": 64}, "transformer.layers.0.attention.dense.weights_scaling_factor is [128, 1], but "
                                     "transformer.layers.0.attention.dense.weight [64, 128] (stored [out / 2, in] (two"
                                     " int4 codes a byte along the output rows)) makes it [128, 2] (group_size 64)",
     "not the same shape"),
    ("int4_awq", {"pre_quant_scale": False}, "quantization.pre_quant_scale is not true",
     "QWenForCausalLM in this TensorRT-LLM does not declare"),
    ("int4_awq", {"has_zero_point": True}, "requires transformer.layers.0.attention.dense.zero",
     "Required but not provided tensors"),
])
def test_what_the_awq_layers_declare_is_what_verify_and_build_hold_the_checkpoint_to(
        tmp_path, heads, capsys, monkeypatch, trtllm, name, edit, said, standin):  # noqa: F811
    """WeightOnlyGroupwiseQuant*Linear declares its scales by config.json's group_size, a pre-quant scale only with
    pre_quant_scale and a zero point with has_zero_point (tensorrt_llm/quantization/layers.py): verify and build
    refuse a config.json that says otherwise than the rank files, naming the tensor; past that check the stand-in's
    load (as TensorRT-LLM's) fails on it, or - pre_quant_scale false, where upstream's load only warns of the
    unused scale and the engine would skip the smoothing - build's check of the tensors the model declares does."""
    from trtllm_medusa_ports.cli import main
    from trtllm_medusa_ports.errors import CheckpointError

    ckpt = _ported(tmp_path, heads, name)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization"].update(edit)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="rank 0: ") as e:
        _verify(ckpt)
    assert said in e.value.what
    assert main(["build", "--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "engine")]) == 1
    assert said in capsys.readouterr().err
    from test_engine import _build

    import trtllm_medusa_ports.engine.build as build_mod

    monkeypatch.setattr(build_mod, "load_problems", lambda ranks, config: [])  # past our checks, the stand-in's load
    monkeypatch.setattr(build_mod, "tool_layer_problems", lambda ranks, quant, hidden: [])
    rc = _build(ckpt, tmp_path / "eng2")
    out = capsys.readouterr()
    assert standin in out.err + out.out
    assert rc == 1


def test_the_awq_and_smoothquant_layers_pad_and_split_as_the_stand_in_declares():
    """The load model's shapes (quant/engine_load.py) against the stand-in's layers, built independently from
    tensorrt_llm/quantization/layers.py: AWQ pads in and out features to max(64, group_size) x tp_size, so a
    ModelOpt export whose split widths are not multiples of it does not load."""
    from types import SimpleNamespace

    from standin_import import standin_installed

    from trtllm_medusa_ports.quant.engine_load import declared_groupwise, load_problems

    with standin_installed():
        from tensorrt_llm.quantization.layers import (
            Int8SmoothQuantLinear,
            WeightOnlyGroupwiseQuantLinear,
        )

        for tp, group, in_f, out_f, row in [(1, 128, 128, 256, False), (2, 128, 128, 256, False),
                                            (2, 64, 256, 128, True), (4, 128, 320, 128, True)]:
            layer = WeightOnlyGroupwiseQuantLinear(in_f, out_f, group_size=group, pre_quant_scale=True,
                                                   dtype="float16", tp_size=tp, row=row)
            linear = "transformer.layers.0.mlp.proj" if row else "transformer.layers.0.attention.qkv"
            local_in, local_out = (in_f // tp, out_f) if row else (in_f, out_f // tp)
            want = declared_groupwise(linear, local_out, local_in, tp, group, True, "float16")
            for part, h in want.items():
                assert getattr(layer, part).shape == h.shape, (tp, group, in_f, out_f, part)
        sq = Int8SmoothQuantLinear(256, 128, dtype="float16", tp_size=2, row=True)
        assert (sq.weight.shape, sq.weights_scaling_factor.shape, sq.prequant_scaling_factor.shape) == (
            (128, 128), (128,), (128,))

    def h(*shape, dtype="int8"):
        return SimpleNamespace(shape=shape, dtype_name=dtype)

    qkv = "transformer.layers.0.attention.qkv"
    rank = {f"{qkv}.weight": h(64, 128), f"{qkv}.weights_scaling_factor": h(128, 1, dtype="float32"),
            f"{qkv}.prequant_scaling_factor": h(128, dtype="float16")}
    cfg = {"dtype": "float16", "mapping": {"tp_size": 2},
           "quantization": {"quant_algo": "W4A16_AWQ", "group_size": 128, "pre_quant_scale": True}}
    problems = load_problems([rank, rank], cfg)
    assert [p.name for p in problems[:3]] == [f"{qkv}.weight", f"{qkv}.weights_scaling_factor",
                                             f"{qkv}.prequant_scaling_factor"]
    assert "loads as [128, 32], but the engine's WeightOnlyGroupwiseQuantColumnLinear (features padded to a " \
           "multiple of max(64, group_size 128) x tp_size = 256" in problems[0].message
    assert "declares [256, 32]" in problems[0].message and "--awq_block_size" in problems[0].fix
    cfg["mapping"]["tp_size"] = 1
    assert load_problems([rank], cfg) == []
    sq = {f"{qkv}.weight": h(128, 128), f"{qkv}.weights_scaling_factor": h(128, dtype="float32"),
          f"{qkv}.prequant_scaling_factor": h(1, 128, dtype="float16"),
          f"{qkv}.activation_scaling_factor": h(dtype="float32")}
    problems = load_problems([sq], {"dtype": "float16", "quantization": {"quant_algo": "W8A8_SQ_PER_CHANNEL"}})
    assert [p.name for p in problems] == [f"{qkv}.prequant_scaling_factor"]  # a 0-D activation scale loads
    assert "Int8SmoothQuantColumnLinear" in problems[0].message and "declares [128]" in problems[0].message
