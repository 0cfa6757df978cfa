"""Each family's declaration of TensorRT-LLM's PyTorch backend (archs/pytorch_backend.py): what EAGLE-3 can serve."""

from __future__ import annotations

import pytest

from trtllm_medusa_ports.archs import registry
from trtllm_medusa_ports.archs.pytorch_backend import AUTO_MODEL_FILE, Eagle3Support, PyTorchModel


def test_every_architecture_declares_its_pytorch_class_in_its_own_family():
    """A family that subclasses another declares its own table: an inherited one would name another architecture."""
    for name, cls in registry().items():
        own = cls.__dict__.get("pytorch_models")
        assert own is not None, f"{cls.__name__} declares no pytorch_models of its own"
        assert set(own) == set(cls.hf_architectures), (cls.__name__, sorted(own), cls.hf_architectures)
        model = own[name]
        if model.support is Eagle3Support.NO_CLASS:
            assert model.upstream == AUTO_MODEL_FILE
        else:  # the file that registers the class and shows its decoder layers
            assert model.upstream.startswith("tensorrt_llm/_torch/models/modeling_"), (name, model.upstream)
            assert model.upstream != AUTO_MODEL_FILE


@pytest.mark.parametrize(("arch", "support"), [
    ("LlamaForCausalLM", Eagle3Support.ONE_MODEL),  # SpecDecOneEngineForCausalLM
    ("Qwen3ForCausalLM", Eagle3Support.ONE_MODEL),
    ("Qwen3MoeForCausalLM", Eagle3Support.ONE_MODEL),
    ("Qwen2ForCausalLM", Eagle3Support.TWO_MODEL),  # its layers capture, its class is a plain DecoderModelForCausalLM
    ("MistralForCausalLM", Eagle3Support.TWO_MODEL),
    ("Starcoder2ForCausalLM", Eagle3Support.TWO_MODEL),
    ("Gemma3ForCausalLM", Eagle3Support.NO_CAPTURE),  # upstream issue #7488
    ("Gemma2ForCausalLM", Eagle3Support.NO_CAPTURE),  # modeling_gemma2.py has a class, without the hook
    ("Qwen2MoeForCausalLM", Eagle3Support.NO_CAPTURE),
    ("Phi3ForCausalLM", Eagle3Support.NO_CAPTURE),
    ("MixtralForCausalLM", Eagle3Support.NO_CAPTURE),
    ("NemotronForCausalLM", Eagle3Support.NO_CAPTURE),
    ("GemmaForCausalLM", Eagle3Support.NO_CLASS),
    ("FalconForCausalLM", Eagle3Support.NO_CLASS),
    ("GPTNeoXForCausalLM", Eagle3Support.NO_CLASS),
    ("GraniteForCausalLM", Eagle3Support.NO_CLASS),
    ("CohereForCausalLM", Eagle3Support.NO_CLASS),  # Cohere2 has one, Cohere 1 none
    ("OPTForCausalLM", Eagle3Support.NO_CLASS),  # only upstream's out-of-tree example registers one
])
def test_the_declared_support_is_upstream_s(arch, support):
    model = registry()[arch].pytorch_models[arch]
    assert model.support is support
    assert model.support.serves == (support in (Eagle3Support.ONE_MODEL, Eagle3Support.TWO_MODEL))


def test_a_declaration_cites_the_module_registering_the_class_exactly_when_there_is_one():
    with pytest.raises(ValueError, match="a path in NVIDIA/TensorRT-LLM"):
        PyTorchModel(Eagle3Support.ONE_MODEL, "modeling_llama.py")
    with pytest.raises(ValueError, match="cite the module registering the class"):
        PyTorchModel(Eagle3Support.NO_CAPTURE)  # modeling_auto.py registers nothing
    with pytest.raises(ValueError, match="cite the module registering the class"):
        PyTorchModel(Eagle3Support.NO_CLASS, "tensorrt_llm/_torch/models/modeling_falcon.py")


# -- check --backend pytorch ---------------------------------------------------------------------------------------
def _base(tmp_path, arch: str, layers: int = 8):
    import json

    from trtllm_medusa_ports.fixtures.synthetic import TINY_CONFIGS

    d = tmp_path / f"{arch}-{layers}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**TINY_CONFIGS[arch], "architectures": [arch],
                                               "num_hidden_layers": layers}))
    return d


def _check(tmp_path, capsys, arch: str, *extra: str, layers: int = 8):
    import json

    from trtllm_medusa_ports.cli import main

    rc = main(["check", "--model_dir", str(_base(tmp_path, arch, layers)), "--backend", "pytorch", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("arch", "rc", "rule", "severity"), [
    ("Qwen3ForCausalLM", 0, "pytorch-eagle3-one-model", "info"),
    ("Qwen2ForCausalLM", 0, "pytorch-two-model-only", "warning"),
    ("Gemma3ForCausalLM", 3, "pytorch-no-capture-hook", "error"),
    ("FalconForCausalLM", 3, "pytorch-no-model-class", "error"),
])
def test_check_for_the_pytorch_backend_judges_the_base_s_class(tmp_path, capsys, arch, rc, rule, severity):
    code, out = _check(tmp_path, capsys, arch)
    assert code == rc and out["compatible"] is (rc == 0)
    found = [f for f in out["findings"] if f["rule"] == rule]
    assert len(found) == 1 and found[0]["severity"] == severity, out["findings"]
    if severity == "error":  # the refusal names the upstream file and the way to stay on 1.2
        assert "tensorrt_llm/_torch/models/" in found[0]["message"] and "1.2.x" in found[0]["fix"]
    if rule == "pytorch-two-model-only":
        assert "removed in release 1.4" in found[0]["message"]


def test_check_for_the_pytorch_backend_refuses_too_few_layers_and_medusa_heads(tmp_path, capsys):
    code, out = _check(tmp_path, capsys, "Qwen3ForCausalLM", layers=5)
    assert code == 3 and [f["rule"] for f in out["findings"] if f["severity"] == "error"] == ["pytorch-capture-layers"]
    assert "Not enough hidden layers for default EAGLE3 capture" in out["findings"][-1]["message"]
    code, out = _check(tmp_path, capsys, "Qwen3ForCausalLM", layers=6)
    assert code == 0
    code, out = _check(tmp_path, capsys, "Qwen3ForCausalLM", "--medusa_choices", "mc_sim_7b_63")
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert code == 3 and [f["rule"] for f in errors] == ["pytorch-no-medusa"]
    assert "--medusa_choices" in errors[0]["message"] and "supports_backend" in errors[0]["message"]


def test_default_capture_layers_are_upstream_s():
    from trtllm_medusa_ports.compat.pytorch_backend import default_capture_layers

    assert default_capture_layers(30) == (1, 14, 26)  # SmolLM2-135M: 30 layers
    assert default_capture_layers(6) == (1, 2, 2)
    assert default_capture_layers(5) is None


def test_the_backend_table_has_every_architecture_once_with_its_declared_drafter():
    from trtllm_medusa_ports.families import backend_table

    rows = [line for line in backend_table().splitlines() if line.startswith("| `")]
    names = [row.split("`")[1] for row in rows]
    assert sorted(names) == sorted(registry()) and len(set(names)) == len(names)
    row = dict(zip(names, rows, strict=True))
    assert "EAGLE-3, one-model" in row["Qwen3ForCausalLM"] and "two-model only" in row["Qwen2ForCausalLM"]
    assert "refused: `alibi-position-embedding`" in row["BloomForCausalLM"] and "no PyTorch class" in row["BloomForCausalLM"]
    assert "refused: `alibi-position-embedding`" in row["MPTForCausalLM"]  # an alias is judged as itself
    assert "| Medusa |" in row["LlamaForCausalLM"] and "modeling_gemma3.py" in row["Gemma3ForCausalLM"]
