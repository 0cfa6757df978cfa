"""``convert --base_checkpoint_dir`` (heads added to a base NVIDIA's tools quantized) under hostile inputs: every
check plain ``convert`` makes on the heads and the flags, one validation of the base checkpoint before anything is
written, and a full disk. Each case changes one thing of a good input (ModelOpt 0.21.1's own exports in
tests/fixtures/modelopt, or a tool-style base made from one of our conversions); the inputs are hashed before and
after, and a refused run leaves nothing beside its output."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import built_once, convert_to, run_store, tiny_base
from safetensors.torch import load_file, save_file

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.fixtures.synthetic import TINY_CONFIGS, random_heads, save_heads

FIXTURES = Path(__file__).parent / "fixtures" / "modelopt"
#: the tiny Qwen2's numbers as its family declares them (no transformers config at collection)
QWEN2 = SimpleNamespace(**TINY_CONFIGS["Qwen2ForCausalLM"])


def _digest(path: Path) -> dict[str, str]:
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> Path:
    return save_heads(random_heads(128, 250, num_heads=3, seed=4), tmp_path_factory.mktemp("hh") / "heads")


def _fixture(tmp_path: Path, name: str = "fp8", *, config=None, tensors=None, rank: int = 0) -> Path:
    """A copy of a ModelOpt fixture with one change: ``config(cfg)`` edits config.json, ``tensors(t)`` rank
    ``rank``'s tensors (in place)."""
    d = tmp_path / "in" / name
    shutil.copytree(FIXTURES / name, d)
    if config is not None:
        cfg = json.loads((d / "config.json").read_text())
        config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(d / f"rank{rank}.safetensors"))
        tensors(t)
        save_file(t, str(d / f"rank{rank}.safetensors"), metadata={"format": "pt"})
    return d


def _tool_base(store: Path, tmp_path: Path, dtype: str, *, config=None, tensors=None) -> Path:
    """A float base as a tool writes it (no heads, the HF architecture), made from our conversion of a tiny Qwen2."""
    name = f"add-heads-hostile-{dtype}"

    def build(made: Path) -> None:  # our heads and conversion, and the tool-style base from them, in made/
        made.mkdir()
        key = made / name
        base = tiny_base(store, "Qwen2ForCausalLM")
        h = save_heads(random_heads(QWEN2.hidden_size, QWEN2.vocab_size, num_heads=2, seed=3), made / "h")
        ours = convert_to(made / "ours", base, h, dtype=dtype)
        key.mkdir()
        cfg = json.loads((ours / "config.json").read_text())
        for k in ("num_medusa_heads", "num_medusa_layers", "max_draft_len", "medusa_hidden_act",
                  "medusa_shared_lm_head", "trtllm_base_architecture", "medusa_ports"):
            cfg.pop(k, None)
        cfg["architecture"] = cfg.pop("base_architecture")
        t = {n: v for n, v in load_file(str(ours / "rank0.safetensors")).items() if not n.startswith("medusa_heads")}
        save_file(t, str(key / "rank0.safetensors"), metadata={"format": "pt"})
        (key / "config.json").write_text(json.dumps(cfg))

    key = built_once(run_store() / f"{name}-inputs", build) / name
    d = tmp_path / "in" / key.name
    shutil.copytree(key, d)
    if config is not None:
        cfg = json.loads((d / "config.json").read_text())
        config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(d / "rank0.safetensors"))
        tensors(t)
        save_file(t, str(d / "rank0.safetensors"), metadata={"format": "pt"})
    return d


def _add(tmp_path: Path, capsys, base: Path, heads: Path, *flags: str, out: Path | None = None) -> tuple[int, str]:
    """``convert --base_checkpoint_dir`` into ``outs/ckpt``: its exit code and stderr; the inputs unchanged, and
    nothing but the output (on success) left in ``outs``."""
    out = out or tmp_path / "outs" / "ckpt"
    out.parent.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out.parent.iterdir()}
    inputs = {p: _digest(p) for p in (base, heads)}
    capsys.readouterr()
    rc = main(["convert", "--base_checkpoint_dir", str(base), "--medusa_model_dir", str(heads),
               "--output_dir", str(out), "--quiet", *flags])
    err = capsys.readouterr().err
    assert {p: _digest(p) for p in inputs} == inputs, "an input was modified"
    left = {p.name for p in out.parent.iterdir()}
    assert left == (before | {out.name} if rc == 0 else before), (rc, err, left)
    assert "Traceback" not in err
    return rc, err


def _heads_with(tmp_path: Path, change, vocab: int = 250, hidden: int = 128) -> Path:
    h = random_heads(hidden, vocab, num_heads=3, seed=4)
    change(h)
    return save_heads(h, tmp_path / "in" / "heads")


# -- the heads: every tensor finite in the checkpoint dtype ------------------------------------------------------
def _set(where, value):
    def change(h):
        kind, head = where
        t = {"weight": lambda: h.blocks[head][0][0], "bias": lambda: h.blocks[head][0][1],
             "lm_head": lambda: h.lm_heads[head]}[kind]()
        t.view(-1)[7] = value
    return change


@pytest.mark.parametrize("where, value, name", [
    (("weight", 0), float("nan"), "medusa_heads.0.medusa_layers.0.linear.weight"),
    (("bias", 1), float("inf"), "medusa_heads.1.medusa_layers.0.linear.bias"),
    (("lm_head", 2), float("-inf"), "medusa_heads.2.lm_head.weight"),
    (("lm_head", 0), float("nan"), "medusa_heads.0.lm_head.weight"),
])
def test_non_finite_head_tensors_are_refused_by_name(tmp_path, capsys, where, value, name):
    h = _heads_with(tmp_path, _set(where, value))
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), h)
    assert rc == 1 and f"head tensor {name}" in err and "holds NaN/Inf" in err, err


@pytest.mark.parametrize("where, value, name", [
    (("weight", 1), 1e6, "medusa_heads.1.medusa_layers.0.linear.weight"),
    (("bias", 0), -7e4, "medusa_heads.0.medusa_layers.0.linear.bias"),
    (("lm_head", 2), 65520.0, "medusa_heads.2.lm_head.weight"),  # rounds to inf in float16
])
def test_head_values_overflowing_a_float16_base_are_refused_with_the_value(tmp_path, capsys, where, value, name):
    h = _heads_with(tmp_path, _set(where, value))
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), h)
    assert rc == 1 and f"head tensor {name}" in err and f"holds {abs(value):g}, beyond float16's" in err, err
    assert "65504" in err


def test_head_values_beyond_float16_are_kept_on_a_bfloat16_base(tmp_path, capsys, store):
    h = random_heads(QWEN2.hidden_size, QWEN2.vocab_size, num_heads=3, seed=4)
    h.blocks[1][0][0][0, 0] = 1e6
    rc, err = _add(tmp_path, capsys, _tool_base(store, tmp_path, "bfloat16"), save_heads(h, tmp_path / "in" / "h"),
                   "--dtype", "bfloat16")
    assert rc == 0, err
    t = load_file(str(tmp_path / "outs" / "ckpt" / "rank0.safetensors"))
    assert t["medusa_heads.1.medusa_layers.0.linear.weight"].dtype == torch.bfloat16
    assert t["medusa_heads.1.medusa_layers.0.linear.weight"][0, 0] == torch.tensor(1e6).bfloat16()


# -- the flags: checked as plain convert checks them, or refused (exit 2) where the base keeps its own or the flag
# alone is wrong (docs/user-guide.md, "Exit codes") ----------------
@pytest.mark.parametrize("flags, code, needles", [
    (["--num_medusa_heads", "5"], 1, ["--num_medusa_heads 5 but the heads checkpoint holds 3"]),
    (["--num_medusa_layers", "2"], 1, ["--num_medusa_layers 2 but the heads have 1 layer(s)"]),
    (["--max_draft_len", "0"], 2, ["must be positive, got 0"]),
    (["--max_medusa_token_len", "-5"], 2, ["must be positive, got -5"]),
    (["--medusa_choices", "[[0],[0,0],[0,0,0],[0,0,0,0]]"], 1,
     ["[tree-deeper-than-heads]", "path [0, 0, 0, 0] has depth 4 but there are 3 Medusa heads"]),
    (["--medusa_choices", "[[0],[1],[2]]", "--max_draft_len", "2"], 1,
     ["[tree-too-many-nodes]", "the tree has 3 nodes but max_draft_len is 2"]),
    (["--medusa_choices", "[[0],[1,0]]"], 1, ["[tree-invalid]", "has no parent"]),
    (["--medusa_choices", "[[0],[10]]"], 1, ["[tree-index-range]"]),
    (["--medusa_choices", "not a tree"], 2, ["--medusa_choices: not a preset name, @file, JSON or Python list"]),
    (["--medusa_hidden_act", "gelu"], 2, ["only silu"]),
    (["--dtype", "bfloat16"], 2, ["--dtype bfloat16 with --base_checkpoint_dir: the base is float16 and keeps its own"]),
    (["--dtype", "float32"], 2, ["--dtype float32", "keeps its own dtype"]),
])
def test_flags_are_checked_against_the_heads_and_the_base(tmp_path, capsys, heads, flags, code, needles):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), heads, *flags)
    assert rc == code and all(n in err for n in needles), err


@pytest.mark.parametrize("flags, why", [
    (["--tp_size", "2"], "keeps its own mapping"), (["--pp_size", "2"], "keeps its own mapping"),
    (["--moe_ep_size", "2"], "keeps its own mapping"), (["--moe_tp_size", "1"], "keeps its own mapping"),
    (["--qformat", "fp8"], "keeps its own quantization"), (["--use_weight_only"], "keeps its own quantization"),
    (["--weight_only_precision", "int4"], "keeps its own quantization"),
    (["--kv_cache_dtype", "int8"], "keeps its own quantization"), (["--int8_kv_cache"], "keeps its own quantization"),
    (["--calib_size", "8"], "nothing is calibrated"), (["--calib_max_seq_length", "8"], "nothing is calibrated"),
    (["--tokenizer_dir", "/nonexistent"], "nothing is calibrated"), (["--device", "cuda"], "nothing is calibrated"),
    (["--threads", "2"], "nothing is calibrated"),
    (["--use_parallel_embedding"], "embedding and lm_head layout"),
    (["--embedding_sharding_dim", "1"], "embedding and lm_head layout"),
    (["--share_lm_head"], "embedding and lm_head layout"),
    (["--model_type", "qwen2"], "read from the base checkpoint's config.json"),
    (["--allow_unsupported"], "no check that --allow_unsupported overrides"),
    (["--workers", "0"], "must be at least 1"),
])
def test_flags_add_heads_cannot_honour_are_refused(tmp_path, capsys, heads, flags, why):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), heads, *flags)
    assert rc == 2 and flags[0] in err and why in err, err


@pytest.mark.parametrize("flags", [[], ["--dtype", "auto"], ["--dtype", "float16"], ["--num_medusa_heads", "3"],
                                   ["--num_medusa_layers", "1"], ["--medusa_choices", "[[0],[1],[0,0],[0,0,0]]"],
                                   ["--medusa_hidden_act", "silu"], ["--workers", "4"]])
def test_flags_that_agree_with_the_base_and_the_heads_are_accepted(tmp_path, capsys, heads, flags):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), heads, *flags)
    assert rc == 0 and "warning" not in err, err


def test_a_preset_tree_is_pruned_to_the_heads_with_a_warning(tmp_path, capsys, heads):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), heads, "--medusa_choices", "mc_sim_7b_63")
    assert rc == 0 and "[tree-pruned]" in err, err
    cfg = json.loads((tmp_path / "outs" / "ckpt" / "config.json").read_text())
    assert any("tree-pruned" in w for w in cfg["medusa_ports"]["warnings"])


def test_the_api_refuses_another_dtype_and_honours_fsync(tmp_path, heads, monkeypatch):
    from trtllm_medusa_ports.api import AddHeadsOptions, add_heads
    from trtllm_medusa_ports.errors import ConversionError
    from trtllm_medusa_ports.quant.prequantized import FlagConflict

    base = _fixture(tmp_path)
    with pytest.raises(FlagConflict, match="keeps its own dtype") as err:
        add_heads(AddHeadsOptions(base, heads, tmp_path / "o", dtype="bfloat16"))
    assert isinstance(err.value, ConversionError) and not (tmp_path / "o").exists()
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    add_heads(AddHeadsOptions(base, heads, tmp_path / "o", fsync=True))
    assert len(synced) >= 3  # the rank file, config.json and the directory
    synced.clear()
    add_heads(AddHeadsOptions(base, heads, tmp_path / "o2"))
    assert not synced


# -- the base's config.json: typed and in range, its mapping the rank files' -------------------------------------
def _set_config(**kv):
    def edit(cfg):
        for k, v in kv.items():
            if "." in k:
                a, b = k.split(".")
                cfg[a][b] = v
            else:
                cfg[k] = v
    return edit


@pytest.mark.parametrize("field, value", [
    ("vocab_size", None), ("vocab_size", "250"), ("vocab_size", 0), ("vocab_size", -250), ("vocab_size", True),
    ("vocab_size", 250.5), ("hidden_size", None), ("hidden_size", 128.0), ("num_hidden_layers", "2"),
    ("num_hidden_layers", 0), ("num_attention_heads", None), ("num_key_value_heads", "2"),
    ("mapping.tp_size", "1"), ("mapping.tp_size", 1.0), ("mapping.world_size", True), ("mapping.pp_size", 1.5),
])
def test_config_fields_must_be_positive_integers(tmp_path, capsys, heads, field, value):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, config=_set_config(**{field: value})), heads)
    assert rc == 1 and f"{field} is {json.dumps(value)}, not a positive integer" in err, err
    assert "config.json" in err


@pytest.mark.parametrize("value", ["float8", None, "int8", 16])
def test_config_dtype_must_be_a_float_dtype(tmp_path, capsys, heads, value):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, config=_set_config(dtype=value)), heads)
    assert rc == 1 and "is not float16, bfloat16 or float32" in err, err


def test_a_mapping_of_fewer_ranks_than_the_rank_files_is_refused(tmp_path, capsys, heads):
    base = _fixture(tmp_path, "fp8_tp2", config=_set_config(mapping={"world_size": 1, "tp_size": 1, "pp_size": 1}))
    rc, err = _add(tmp_path, capsys, base, heads)
    assert rc == 1 and "mapping says world_size 1" in err and "also holds rank1.safetensors" in err, err


@pytest.mark.parametrize("field, value", [("vocab_size", 300), ("vocab_size", 256), ("hidden_size", 256)])
def test_sizes_lm_head_contradicts_are_refused(tmp_path, capsys, heads, field, value):
    """A vocab_size above lm_head's rows would have the heads' lm_heads "padded" past the base's (it passed the
    padding check: no rows there to be non-zero)."""
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, config=_set_config(**{field: value})), heads)
    assert rc == 1 and "lm_head.weight is [250, 128]" in err and f"{field} {value}" in err, err


# -- the base's rank files: present, non-empty, in config.json's dtype, scales finite and present -------------------
def test_a_rank_file_without_tensors_is_refused_by_name(tmp_path, capsys, heads):
    base = _fixture(tmp_path, "fp8_tp2", tensors=lambda t: t.clear(), rank=1)
    rc, err = _add(tmp_path, capsys, base, heads)
    assert rc == 1 and "rank1.safetensors: the rank file holds no tensors" in err, err


@pytest.mark.parametrize("keep", [0, 8, 0.5])
def test_an_empty_or_truncated_rank_file_is_refused_by_name(tmp_path, capsys, heads, keep):
    base = _fixture(tmp_path)
    data = (base / "rank0.safetensors").read_bytes()
    (base / "rank0.safetensors").write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    rc, err = _add(tmp_path, capsys, base, heads)
    assert rc == 1 and "rank0.safetensors" in err and ("truncated" in err or "shorter than" in err), err


def test_config_dtype_must_be_the_rank_files(tmp_path, capsys, heads):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, config=_set_config(dtype="bfloat16")), heads)
    assert rc == 1 and "config.json says dtype bfloat16, but" in err and "is float16" in err, err


def _scale(name, value):
    def edit(t):
        t[name].reshape(-1)[0] = value
    return edit


@pytest.mark.parametrize("fixture, tensor, value", [
    ("fp8", "transformer.layers.1.mlp.fc.weights_scaling_factor", float("nan")),
    ("fp8", "transformer.layers.0.attention.qkv.activation_scaling_factor", float("inf")),
    ("fp8_kv", "transformer.layers.1.attention.kv_cache_scaling_factor", float("nan")),
    ("int4_awq", "transformer.layers.0.mlp.proj.prequant_scaling_factor", float("nan")),
    ("int4_awq", "transformer.layers.1.attention.dense.weights_scaling_factor", float("-inf")),
    ("int8_sq", "transformer.layers.0.mlp.gate.weights_scaling_factor", float("nan")),
    ("int8_sq", "transformer.layers.1.attention.qkv.activation_scaling_factor", float("inf")),
])
def test_a_non_finite_scale_is_refused_by_name(tmp_path, capsys, heads, fixture, tensor, value):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, fixture, tensors=_scale(tensor, value)), heads)
    assert rc == 1 and f"scale {tensor} holds {value}" in err and "rank0.safetensors" in err, err


@pytest.mark.parametrize("fixture, tensor", [
    ("fp8", "transformer.layers.1.mlp.fc.activation_scaling_factor"),
    ("fp8", "transformer.layers.0.attention.qkv.weights_scaling_factor"),
    ("int4_awq", "transformer.layers.0.mlp.gate.prequant_scaling_factor"),
    ("int4_awq", "transformer.layers.1.mlp.proj.weights_scaling_factor"),
    ("int8_sq", "transformer.layers.1.attention.dense.activation_scaling_factor"),
])
def test_a_quantized_linear_without_its_scales_is_refused(tmp_path, capsys, heads, fixture, tensor):
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, fixture, tensors=lambda t: t.pop(tensor)), heads)
    linear, scale = tensor.rsplit(".", 1)
    assert rc == 1 and f"{linear}.weight is" in err and f"without {scale}" in err, err


def test_a_quantized_kv_cache_without_a_layers_scale_is_refused(tmp_path, capsys, heads):
    name = "transformer.layers.1.attention.kv_cache_scaling_factor"
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, "fp8_kv", tensors=lambda t: t.pop(name)), heads)
    assert rc == 1 and "transformer.layers.1.attention has no KV cache scale" in err, err


def test_stored_weight_only_bytes_need_their_per_channel_scale(tmp_path, capsys, store):
    name = "transformer.layers.0.mlp.fc.weight"
    h = save_heads(random_heads(QWEN2.hidden_size, QWEN2.vocab_size, num_heads=2), tmp_path / "in" / "h")

    def stored(t):
        t[name] = torch.zeros(t[name].shape, dtype=torch.int8)

    w8 = _set_config(quantization={"quant_algo": "W8A16", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]})
    rc, err = _add(tmp_path, capsys, _tool_base(store, tmp_path, "float16", config=w8, tensors=stored), h)
    assert rc == 1 and f"{name} is int8 without per_channel_scale" in err, err


def test_a_float_weight_where_the_layer_takes_a_quantized_one_is_refused(tmp_path, capsys, heads):
    """The engine's FP8Linear would not load it (issue 57, 1): refused naming the tensor, unless the base's own
    exclude_modules names the linear (test_modelopt: the output keeps that list)."""
    name = "transformer.layers.1.mlp.fc."

    def dequantized(t):
        t[name + "weight"] = (t[name + "weight"].float() * t[name + "weights_scaling_factor"]).half()

    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, tensors=dequantized), heads)
    assert rc == 1 and f"rank 0: {name}weight is float16, but quant_algo FP8" in err, err
    assert "exclude_modules" in err  # the fix: name it there if the tool kept it in float


# -- scale values and tool-format shapes (issue 57, 1): what plain convert's own scales never need -----------------
@pytest.mark.parametrize("fixture, tensor, value, needle", [
    ("fp8", "transformer.layers.0.attention.qkv.weights_scaling_factor", 0.0, "holds 0; it must be above 0"),
    ("fp8", "transformer.layers.1.mlp.fc.activation_scaling_factor", -0.5, "holds -0.5; it must be above 0"),
    ("fp8_kv", "transformer.layers.0.attention.kv_cache_scaling_factor", 0.0, "holds 0; it must be above 0"),
    ("int8_sq", "transformer.layers.1.attention.qkv.weights_scaling_factor", "negate", "is never negative"),
    ("int8_sq", "transformer.layers.0.mlp.proj.prequant_scaling_factor", 0.0, "holds 0; it must be above 0"),
    ("int4_awq", "transformer.layers.0.attention.dense.weights_scaling_factor", "zero", "whose codes are not 0"),
    ("int8_sq", "transformer.layers.0.mlp.fc.weights_scaling_factor", "zero", "whose codes are not 0"),
])
def test_a_scale_the_engine_cannot_use_is_refused_by_name(tmp_path, capsys, heads, fixture, tensor, value, needle):
    def edit(t):
        if value == "negate":  # a SmoothQuant row scale negated: its row's weights flip sign
            t[tensor].reshape(-1)[3] *= -1
        elif value == "zero":  # a row's scale zeroed over its non-zero codes
            t[tensor][3] = 0
        else:
            t[tensor].reshape(-1)[0] = value
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, fixture, tensors=edit), heads)
    assert rc == 1 and f"scale {tensor}" in err and needle in err and "rank0.safetensors" in err, err


@pytest.mark.parametrize("fixture, tensor", [("fp8", "transformer.layers.1.attention.dense.weights_scaling_factor"),
                                             ("int4_awq", "transformer.layers.0.mlp.fc.weights_scaling_factor")])
def test_an_integer_scale_is_refused(tmp_path, capsys, heads, fixture, tensor):
    def edit(t):
        t[tensor] = t[tensor].round().to(torch.int32)
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, fixture, tensors=edit), heads)
    assert rc == 1 and f"scale {tensor} is int32: a scale is a floating-point tensor" in err, err


def test_a_zero_row_scale_over_zero_codes_is_kept(tmp_path, capsys, heads):
    """A zero row is quantized to scale 0 and codes 0 by ModelOpt and upstream: nothing is lost, so it is written."""
    lin = "transformer.layers.1.attention.dense"

    def zero_row(t):
        t[lin + ".weights_scaling_factor"][5] = 0
        t[lin + ".weight"][5] = 0

    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, "int8_sq", tensors=zero_row), heads)
    assert rc == 0, err


@pytest.mark.parametrize("fixture, tensor, shape, needle", [
    # an AWQ group scale transposed, of another group size, and a packed weight of the wrong width
    ("int4_awq", "transformer.layers.0.mlp.fc.weights_scaling_factor", "transpose",
     "mlp.fc.weights_scaling_factor is [1, 256], but transformer.layers.0.mlp.fc.weight [128, 128]"),
    ("int4_awq_g64", "transformer.layers.1.mlp.proj.weights_scaling_factor", "halve groups",
     "is [128, 2], but transformer.layers.1.mlp.proj.weight [64, 256] (stored [out / 2, in]"),
    ("int4_awq", "transformer.layers.0.attention.qkv.weight", "unpacked",
     "qkv.weights_scaling_factor is [256, 1], but transformer.layers.0.attention.qkv.weight [256, 128]"),
    ("int4_awq", "transformer.layers.1.attention.dense.weight", "drop half the inputs",
     "has 64 inputs, not a multiple of config.json's group_size 128"),
    ("int8_sq", "transformer.layers.1.mlp.proj.weight", "transpose",
     "proj.prequant_scaling_factor is [256], but transformer.layers.1.mlp.proj.weight [256, 128] (stored [out, in]"),
    ("int8_sq", "transformer.layers.1.attention.dense.weight", "drop rows with their scales",
     "writes 64 outputs, but dense writes the hidden state: config.json's hidden_size is 128"),
    ("int8_sq", "transformer.layers.0.mlp.gate.prequant_scaling_factor", "drop half",
     "gate.prequant_scaling_factor is [64], but transformer.layers.0.mlp.gate.weight [256, 128]"),
])
def test_a_tool_format_layer_of_inconsistent_shapes_is_refused(tmp_path, capsys, heads, fixture, tensor, shape,
                                                               needle):
    def edit(t):
        v = t[tensor]
        t[tensor] = {"transpose": lambda: v.t().contiguous(),
                     "halve groups": lambda: v[:, ::2].contiguous(),
                     "unpacked": lambda: torch.cat([v, v]),
                     "drop half the inputs": lambda: v[:, :64].contiguous(),
                     "drop half": lambda: v[:64].contiguous(),
                     "drop rows with their scales": lambda: v[:64].contiguous()}[shape]()
        if shape == "drop rows with their scales":
            scale = tensor.replace(".weight", ".weights_scaling_factor")
            t[scale] = t[scale][:64].contiguous()
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, fixture, tensors=edit), heads)
    assert rc == 1 and needle in err and "rank0.safetensors" in err, err


# -- the disk: a full (or over-quota) disk is an error naming the output and errno, nothing left behind ---------------
def _fail_nth_pwrite(monkeypatch, n: int, code: int):
    real, calls = os.pwrite, [0]

    def pwrite(fd, data, offset):
        calls[0] += 1
        if calls[0] == n:
            raise OSError(code, os.strerror(code))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)


def _fail_heads_write(monkeypatch, code: int):
    from trtllm_medusa_ports.files.checkpoint import StreamingSafetensorsFile

    def write(self, name, tensor):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(StreamingSafetensorsFile, "write", write)


def _fail_config(monkeypatch, code: int):
    real = Path.write_text

    def write_text(self, *a, **kw):
        if self.name == "config.json" and ".partial-" in str(self.parent):
            raise OSError(code, os.strerror(code))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
@pytest.mark.parametrize("when", ["header", "base copy", "second rank", "heads", "config"])
def test_a_full_disk_is_an_error_and_leaves_nothing(tmp_path, capsys, heads, monkeypatch, when, code):
    base = _fixture(tmp_path, "fp8_tp2")
    if when in ("header", "base copy", "second rank"):
        # rank0: its header (1), its tensors (2...), its 9 head pieces; then rank1's header
        n = {"header": 1, "base copy": 2}.get(when) or 2 + len(load_file(str(base / "rank0.safetensors"))) + 9
        _fail_nth_pwrite(monkeypatch, n, code)
    elif when == "heads":
        _fail_heads_write(monkeypatch, code)
    else:
        _fail_config(monkeypatch, code)
    out = tmp_path / "outs" / "ckpt"
    rc, err = _add(tmp_path, capsys, base, heads, out=out)
    assert rc == 1 and str(out) in err and f"errno {code}, {errno.errorcode[code]}" in err, err
    assert "nothing was left behind" in err and not out.exists()


def test_a_full_disk_while_replacing_keeps_the_old_output(tmp_path, capsys, heads, monkeypatch):
    out = tmp_path / "outs" / "ckpt"
    out.mkdir(parents=True)
    (out / "keep.txt").write_text("the old output")
    _fail_nth_pwrite(monkeypatch, 3, errno.ENOSPC)
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path), heads, "--overwrite", out=out)
    assert rc == 1 and "ENOSPC" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and (out / "keep.txt").read_text() == "the old output"


@pytest.mark.parametrize("flags, code, needle", [
    ((), 0, None),  # no --dtype: the base's own, without a word
    (("--dtype", "auto"), 0, None),
    (("--dtype", "bfloat16"), 0, None),
    (("--dtype", "float16"), 2, "--dtype float16 with --base_checkpoint_dir: the base is bfloat16"),  # typed: refused
])
def test_a_typed_dtype_is_told_from_the_default_on_a_bfloat16_base(tmp_path, capsys, store, flags, code, needle):
    h = save_heads(random_heads(QWEN2.hidden_size, QWEN2.vocab_size, num_heads=3, seed=4), tmp_path / "in" / "h")
    rc, err = _add(tmp_path, capsys, _tool_base(store, tmp_path, "bfloat16"), h, *flags)
    assert rc == code, err
    if needle is None:
        assert "warning: the heads are written" not in err and "dtype" not in err, err
        assert json.loads((tmp_path / "outs" / "ckpt" / "config.json").read_text())["dtype"] == "bfloat16"
    else:
        assert needle in err and not (tmp_path / "outs" / "ckpt").exists(), err


def test_a_float_base_is_said_unquantized_and_a_quantized_one_is_not(store, tmp_path, capsys, heads):
    """mq_float_ckpt (issue 76, D): --base_checkpoint_dir given a float checkpoint adds the heads, saying the base
    is not quantized and what the float route is; a base NVIDIA's tools quantized gets no such word."""
    h = save_heads(random_heads(QWEN2.hidden_size, QWEN2.vocab_size, num_heads=2, seed=3), tmp_path / "h")
    rc, err = _add(tmp_path, capsys, _tool_base(store, tmp_path, "float16"), h)
    assert rc == 0 and "warning: the base checkpoint is not quantized" in err and "convert --model_dir" in err, err
    cfg = json.loads((tmp_path / "outs" / "ckpt" / "config.json").read_text())
    assert any("not quantized" in w for w in cfg["medusa_ports"]["warnings"])
    rc, err = _add(tmp_path, capsys, _fixture(tmp_path, "fp8"), heads, out=tmp_path / "outs" / "fp8")
    assert rc == 0 and "not quantized" not in err, err
