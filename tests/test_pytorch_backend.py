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
            assert model.upstream == AUTO_MODEL_FILE and not model.cls
        else:  # the file that registers the class and shows its decoder layers
            assert model.upstream.startswith("tensorrt_llm/_torch/models/modeling_"), (name, model.upstream)
            assert model.cls == name


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


def test_a_declaration_names_a_class_exactly_when_there_is_one():
    with pytest.raises(ValueError, match="a path in NVIDIA/TensorRT-LLM"):
        PyTorchModel(Eagle3Support.ONE_MODEL, "modeling_llama.py", "LlamaForCausalLM")
    with pytest.raises(ValueError, match="a registered class name"):
        PyTorchModel(Eagle3Support.NO_CAPTURE, "tensorrt_llm/_torch/models/modeling_phi3.py")
    with pytest.raises(ValueError, match="a registered class name"):
        PyTorchModel(Eagle3Support.NO_CLASS, AUTO_MODEL_FILE, "FalconForCausalLM")
