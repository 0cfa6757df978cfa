"""Engine adapters against the TensorRT-LLM stand-in (tests/standin): call structure, not numbers."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtllm_medusa_ports.archs import registry
from trtllm_medusa_ports.cli import main

STANDIN = Path(__file__).parent / "standin"


def _drop_trtllm():
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def trtllm(monkeypatch):
    _drop_trtllm()
    monkeypatch.syspath_prepend(str(STANDIN))
    import tensorrt_llm

    tensorrt_llm.CALLS.clear()
    yield tensorrt_llm
    _drop_trtllm()


def _config(adapter, **kw):
    mapping = SimpleNamespace(tp_group=None, tp_size=1, is_last_pp_rank=lambda: True)
    base = dict(hidden_size=64, vocab_size=100, num_hidden_layers=3, dtype="float16", logits_dtype="float32",
                mapping=mapping, num_medusa_heads=2, num_medusa_layers=1, max_draft_len=7,
                medusa_hidden_act="silu", hidden_act="gelu", medusa_shared_lm_head=False)
    base.update(kw)
    return SimpleNamespace(**base)


ADAPTERS = sorted({cls().ported_architecture(): cls() for cls in registry().values()}.items())


def test_tensorrt_llm_is_not_importable_in_ci():
    _drop_trtllm()
    with pytest.raises(ImportError):
        __import__("tensorrt_llm")


def test_names_resolve_only_after_registration(trtllm):
    from tensorrt_llm.models import MODEL_MAP

    from trtllm_medusa_ports.engine.registry import register_architectures

    names = {a.ported_architecture() for _, a in ADAPTERS}
    assert not names & set(MODEL_MAP)  # plain trtllm-build refuses them
    added = register_architectures(trtllm)
    assert set(added) == names
    assert all(MODEL_MAP[n] is added[n] for n in names)


@pytest.mark.parametrize("name, adapter", ADAPTERS, ids=[n for n, _ in ADAPTERS])
def test_every_attention_gets_the_same_spec_params(trtllm, name, adapter):
    from tensorrt_llm.layers import SpecDecodingParams

    from trtllm_medusa_ports.engine.registry import register_architectures

    cls = register_architectures(trtllm)[name]
    model = cls(_config(adapter))
    params = SpecDecodingParams(spec_decoding_position_offsets="offsets", spec_decoding_packed_mask="mask")
    trtllm.CALLS.clear()
    model.forward("input_ids", use_cache=True, spec_decoding_params=params)
    seen = [c for c in trtllm.CALLS if c[0] == "attention"]
    assert [c[1] for c in seen] == [0, 1, 2]  # every decoder layer
    assert all(c[2] is params for c in seen)  # the very object, offsets and mask untouched
    assert ("mark_output", "medusa_logits") in trtllm.CALLS


@pytest.mark.parametrize("name, adapter", [a for a in ADAPTERS if not a[1].upstream_spec_decoding_plumbing],
                         ids=[n for n, a in ADAPTERS if not a.upstream_spec_decoding_plumbing])
def test_upstream_class_alone_cannot_take_spec_params(trtllm, name, adapter):
    from importlib import import_module

    from trtllm_medusa_ports.engine.registry import TRTLLM_CLASS_MODULES

    base = getattr(import_module(TRTLLM_CLASS_MODULES[adapter.trtllm_base_class]), adapter.trtllm_base_class)
    with pytest.raises(TypeError, match="spec_decoding_params"):
        base(_config(adapter)).forward("ids", use_cache=True, spec_decoding_params=object())


def test_plumbing_is_reset_after_the_call_and_names_are_kept(trtllm):
    from trtllm_medusa_ports.engine.registry import register_architectures

    cls = register_architectures(trtllm)["MedusaPortsGemmaForCausalLM"]
    model = cls(_config(None))
    att = model.transformer.layers[0].attention
    assert type(att).__name__ == "SpecDecodingAttention" and hasattr(model.transformer.layers[0], "attention")
    model.forward("ids", use_cache=True, spec_decoding_params="P")
    trtllm.CALLS.clear()
    model.forward("ids", use_cache=True)  # context phase without spec params
    assert all(c[2] is None for c in trtllm.CALLS if c[0] == "attention")


def test_head_activation_and_lm_head_follow_config(trtllm):
    from trtllm_medusa_ports.engine.registry import register_architectures

    cls = register_architectures(trtllm)["MedusaPortsPhiForCausalLM"]
    own = cls(_config(None, hidden_act="gelu", medusa_hidden_act="silu", num_medusa_layers=2))
    trtllm.CALLS.clear()
    own.forward("ids", use_cache=True)
    assert [c[1] for c in trtllm.CALLS if c[0] == "act"] == ["silu"] * 4  # 2 heads x 2 layers, never gelu
    assert all(hasattr(h, "lm_head") for h in own.medusa_heads)

    shared = cls(_config(None, medusa_shared_lm_head=True))
    assert not any(hasattr(h, "lm_head") for h in shared.medusa_heads)
    trtllm.CALLS.clear()
    shared.forward("ids", use_cache=True)
    lm_calls = [c for c in trtllm.CALLS if c[0] == "linear" and c[1] == id(shared.lm_head)]
    assert len(lm_calls) == 1 + 2  # the base logits, then once per head


def test_prepare_inputs_forces_medusa_drafts(trtllm):
    from trtllm_medusa_ports.engine.registry import register_architectures

    cls = register_architectures(trtllm)["MedusaPortsFalconForCausalLM"]
    out = cls(_config(None, max_draft_len=11)).prepare_inputs(max_batch_size=1, max_draft_len=0,
                                                              speculative_decoding_draft_tokens_external=True)
    assert out["max_draft_len"] == 11 and out["speculative_decoding_draft_tokens_external"] is False


def _ckpt(tmp_path, **cfg):
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    base = {"architecture": "MedusaPortsGemmaForCausalLM", "dtype": "float16", "num_medusa_heads": 2,
            "position_embedding_type": "rope_gpt_neox", "model_type": "gemma"}
    base.update(cfg)
    (d / "config.json").write_text(json.dumps(base))
    return d


def test_build_without_tensorrt_llm_exits_1_with_hint(tmp_path, capsys):
    _drop_trtllm()
    rc = main(["build", "--checkpoint_dir", str(_ckpt(tmp_path)), "--output_dir", "x"])
    err = capsys.readouterr().err
    assert rc == 1 and "TensorRT-LLM is not installed" in err and "pip install" in err
    assert "Traceback" not in err


def test_build_registers_then_runs_trtllm_build(trtllm, tmp_path):
    rc = main(["build", "--checkpoint_dir", str(_ckpt(tmp_path)), "--output_dir", "eng", "--max_batch_size", "4",
               "--workers", "2"])
    assert rc == 0
    call = next(c for c in trtllm.CALLS if c[0] == "trtllm-build")
    args, registered = call[1], call[2]
    assert args[:2] == ["--checkpoint_dir", str(tmp_path / "ckpt")]
    assert "--speculative_decoding_mode" in args and args[args.index("--speculative_decoding_mode") + 1] == "medusa"
    assert "--workers" not in args and "MedusaPortsGemmaForCausalLM" in registered


@pytest.mark.parametrize("cfg, rule", [({"position_embedding_type": "alibi", "model_type": "bloom"},
                                        "alibi-position-embedding"),
                                       ({"dtype": "float32"}, "dtype-float32"),
                                       ({"num_medusa_heads": 0}, "not-medusa")])
def test_build_runs_the_checks_first(trtllm, tmp_path, capsys, cfg, rule):
    rc = main(["build", "--checkpoint_dir", str(_ckpt(tmp_path, **cfg))])
    assert rc == 1 and rule in capsys.readouterr().err
    assert not [c for c in trtllm.CALLS if c[0] == "trtllm-build"]


def test_family_config_sees_the_base_architecture(trtllm):
    from trtllm_medusa_ports.engine.registry import register_architectures

    cls = register_architectures(trtllm)["MedusaPortsGemmaForCausalLM"]
    cfg = cls.config_class(architecture="MedusaPortsGemmaForCausalLM", base_architecture="Gemma3ForCausalLM",
                           num_medusa_heads=4, max_draft_len=63)
    # GemmaConfig.is_gemma_2 / gemma3 logic compares `architecture` with the HF name
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.num_medusa_heads == 4 and cfg.max_draft_len == 63
