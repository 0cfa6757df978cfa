"""Every config value TensorRT-LLM turns into an enum, as upstream parses it (issue 75, 1).

The checkpoint's config.json is read by upstream's enum parsers when trtllm-build constructs the model: the stand-in
parses ``position_embedding_type`` and ``rotary_scaling`` as tensorrt_llm/functional.py does (a plain name lookup),
so a value the engine does not know fails here as it fails there. Every RoPE family x every scaling type a Hugging
Face config can carry either builds with the type parsed as upstream parses it, or is refused by check naming the
value; a checkpoint that carries an unparsable value is refused by every reader (verify, deploy, build) naming it.
"""

import json

import pytest
from conftest import convert_to, tiny_base
from standin_import import standin_installed
from test_engine import _checkpoint

from trtllm_medusa_ports.archs import adapter_for, registry
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.compat.base import check_base
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR

ROPE_FAMILIES = sorted({cls.hf_architectures[0] for cls in registry().values() if cls.position_embedding.is_rope})


def _scalings(half: int) -> dict[str, dict]:
    """Each scaling type as released Hugging Face configs spell it (``half``: the rotary dimension's half)."""
    factors = {"short_factor": [1.0 + i / 16 for i in range(half)], "long_factor": [2.0 + i / 16 for i in range(half)],
               "short_mscale": 1.0, "long_mscale": 1.1}
    return {
        "linear": {"type": "linear", "factor": 2.0},
        "dynamic": {"type": "dynamic", "factor": 2.0},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64},
        "longrope": {"type": "longrope", **factors},
        "su": {"type": "su", **factors},  # Phi-3's name before transformers renamed it
        "Linear": {"type": "Linear", "factor": 2.0},  # not a name upstream's plain lookup takes
    }


@pytest.fixture
def trtllm():
    with standin_installed() as tensorrt_llm:
        yield tensorrt_llm


def _base_config(store, arch: str, tmp_path, scaling: dict) -> HFConfig:
    cfg = json.loads((tiny_base(store, arch) / "config.json").read_text())
    cfg["rope_scaling"] = scaling
    cfg.setdefault("original_max_position_embeddings", 64)
    d = tmp_path / f"hf-{scaling['type' if 'type' in scaling else 'rope_type']}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return HFConfig.read(d)


@pytest.mark.parametrize("arch", ROPE_FAMILIES)
def test_every_scaling_type_builds_as_upstream_parses_it_or_is_refused_by_name(trtllm, store, tmp_path, arch):
    from tensorrt_llm.functional import RotaryScalingType
    from tensorrt_llm.models import MODEL_MAP

    from trtllm_medusa_ports.engine.build import model_config_and_class

    adapter = adapter_for(arch)
    written = json.loads((_checkpoint(store, tmp_path, arch) / "config.json").read_text())
    plain = HFConfig.read(tiny_base(store, arch))
    half = int(adapter.head_size(plain) * adapter.rotary_fraction(plain)) // 2
    plain_errors = {f.rule for f in check_base(plain, adapter) if f.severity == ERROR}  # the tiny base's own
    built, refused = [], []
    for name, scaling in _scalings(half).items():
        hf = _base_config(store, arch, tmp_path, scaling)
        errors = [f for f in check_base(hf, adapter) if f.severity == ERROR and f.rule not in plain_errors]
        if errors:  # refused: check says which value (the converter refuses the same findings)
            assert any(repr(name) in f.message or f"'type': {name!r}" in f.message for f in errors), (name, errors)
            refused.append(name)
            continue
        # what convert writes for this base (convert.build_config: the family's engine_config over the rest)
        cfg = {**written, **adapter.engine_config(hf)}
        model_config, cls = model_config_and_class(cfg)
        model = (cls or MODEL_MAP[cfg["architecture"]])(model_config)  # raises where upstream raises
        carried = cfg.get("rotary_scaling")
        expected = RotaryScalingType.none if carried is None else RotaryScalingType[name]
        assert model.rotary_tables["scale_type"] == expected, name
        if carried is not None:
            assert model.rotary_tables["scale"] == scaling.get("factor", 1.0)
        built.append(name)
    if "rotary_scaling" not in adapter.engine_config(plain):  # the family's engine class reads no scaling:
        # transformers ignores it too (GPT-J: built unscaled), or the family's engine limits refuse it (Cohere)
        assert set(built) == set(_scalings(half)) or set(refused) == set(_scalings(half)), (built, refused)
        return
    assert "Linear" in refused  # upstream's lookup does not fold case
    if adapter.family in ("phi3", "phimoe"):  # longrope, however spelled, is the long_rope position embedding
        assert {"longrope", "su"} <= set(built)
    else:  # the long_rope tables are Phi-3's classes' alone; "su" is no name of the engine's
        assert {"longrope", "su"} <= set(refused)


def test_phi3_su_is_written_as_upstreams_phi3_route_writes_it(store, tmp_path):
    """A Phi-3 128k config spelling longrope "su": the checkpoint carries long_rope and its tables, and no
    rotary_scaling (upstream's own Phi-3 converter writes none: "su" would not parse)."""
    half = 8
    su = {k: v for k, v in _scalings(half)["su"].items() if k in ("type", "short_factor", "long_factor")}  # Phi3Config's
    base = tiny_base(store, "Phi3ForCausalLM", rope_scaling=su, original_max_position_embeddings=64)
    ckpt = _checkpoint(store, tmp_path, "Phi3ForCausalLM", base=base)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["position_embedding_type"] == "long_rope" and cfg["rotary_scaling"] is None
    assert cfg["longrope_scaling_long_factors"] == _scalings(half)["su"]["long_factor"]


def test_a_checkpoint_carrying_an_unparsable_scaling_is_refused_naming_it(trtllm, store, tmp_path, capsys):
    """A checkpoint written by an older converter (Phi-3 with rotary_scaling.type "su") or by hand: verify and build
    refuse it naming the field and the value, where the engine would fail building the model."""
    from test_engine import _own_checkpoint

    ckpt = _own_checkpoint(store, tmp_path, "LlamaForCausalLM")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rotary_scaling"] = {"type": "su", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    base = tiny_base(store, "LlamaForCausalLM")
    for argv in (["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--prompt_ids", "5,9,13"],
                 ["build", "--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "eng")]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert 'rotary_scaling is {"type": "su"' in err and "RotaryScalingType" in err and "Traceback" not in err
    assert not (tmp_path / "eng").exists()


def test_convert_refuses_a_scaling_the_engine_cannot_parse(store, tmp_path, capsys):
    """A Llama config spelling a type the engine has no name for: convert refuses it (rule
    rope-scaling-unsupported), nothing written; --allow_unsupported writes it, and then every reader refuses it."""
    base = tiny_base(store, "LlamaForCausalLM")
    d = tmp_path / "base"
    d.mkdir()
    for f in base.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "su", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}
    (d / "config.json").write_text(json.dumps(cfg))
    heads = tmp_path / "heads"
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads

    save_heads(random_heads(64, cfg["vocab_size"], num_heads=2, seed=3), heads)
    with pytest.raises(Exception) as e:
        convert_to(tmp_path / "out", d, heads)
    assert "rope-scaling-unsupported" in str(e.value) or "'su'" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_every_quantization_the_project_writes_is_a_name_quantmode_takes(trtllm):
    """Each ``quant_algo`` / ``kv_cache_quant_algo`` the converter writes (its flags' formats and the prequantized
    checkpoints it keeps) is a name ``QuantMode.from_quant_algo`` accepts, and the checkpoint schema's lists are the
    stand-in's (both from tensorrt_llm/quantization/mode.py); a misspelled one fails the stand-in's build as
    upstream's assertion does."""
    from tensorrt_llm.quantization.mode import (
        KV_CACHE_QUANT_ALGO_LIST,
        QUANT_ALGO_LIST,
        from_quant_algo,
    )
    from tensorrt_llm.quantization.quantize import quantize

    from trtllm_medusa_ports.files.checkpoint_schema import KV_CACHE_QUANT_ALGOS, QUANT_ALGOS
    from trtllm_medusa_ports.quant.prequantized import KEPT_ALGOS, KEPT_KV
    from trtllm_medusa_ports.quant.spec import KV_CACHE_DTYPES, QFORMATS, WEIGHT_ONLY_PRECISIONS

    assert set(QUANT_ALGOS) == set(QUANT_ALGO_LIST) and set(KV_CACHE_QUANT_ALGOS) == set(KV_CACHE_QUANT_ALGO_LIST)
    written = {*QFORMATS.values(), *WEIGHT_ONLY_PRECISIONS.values(), *KEPT_ALGOS} - {None}
    assert written <= set(QUANT_ALGO_LIST), written - set(QUANT_ALGO_LIST)
    assert {*KV_CACHE_DTYPES.values(), *KEPT_KV} - {None} <= set(KV_CACHE_QUANT_ALGO_LIST)
    for algo in written:
        from_quant_algo(algo, "FP8")
    config = type("Q", (), {"quant_algo": "fp8", "kv_cache_quant_algo": None, "exclude_modules": None})()
    with pytest.raises(AssertionError):
        quantize(object(), config)


def test_every_activation_a_family_writes_is_an_act2fn_name(trtllm, store):
    """hidden_act is looked up in upstream's ACT2FN (tensorrt_llm/functional.py; the MLP refuses another name): the
    schema's list is the stand-in's table, and every family writes a name from it for its tiny base."""
    from tensorrt_llm.functional import ACT2FN

    from trtllm_medusa_ports.files.checkpoint_schema import ACTIVATIONS

    assert set(ACTIVATIONS) == set(ACT2FN)
    for arch in sorted({cls.hf_architectures[0] for cls in registry().values()}):
        written = adapter_for(arch).engine_config(HFConfig.read(tiny_base(store, arch)))["hidden_act"]
        assert written in ACT2FN, (arch, written)
