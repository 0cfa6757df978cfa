"""Register our architectures with TensorRT-LLM's model map.

The converter writes ``architecture: MedusaPorts<TRT class>`` for checkpoints that
upstream ``trtllm-build`` would not build correctly; that name is absent from
``tensorrt_llm.models.MODEL_MAP``, so plain ``trtllm-build`` stops with an
"unsupported architecture" error rather than building a wrong engine. Registering
maps each such name to a :func:`medusa_class` over the family's own TensorRT-LLM
class (tensorrt_llm/models/__init__.py MODEL_MAP, 1.2.x names).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from trtllm_medusa_ports.archs import registry as arch_registry
from trtllm_medusa_ports.engine import require_tensorrt_llm
from trtllm_medusa_ports.engine.medusa import medusa_class

#: TensorRT-LLM 1.2.x module of each base class named by an adapter's ``trtllm_base_class``
TRTLLM_CLASS_MODULES = {
    "LLaMAForCausalLM": "tensorrt_llm.models.llama.model",
    "QWenForCausalLM": "tensorrt_llm.models.qwen.model",
    "GemmaForCausalLM": "tensorrt_llm.models.gemma.model",
    "Phi3ForCausalLM": "tensorrt_llm.models.phi3.model",
    "PhiForCausalLM": "tensorrt_llm.models.phi.model",
    "GPTNeoXForCausalLM": "tensorrt_llm.models.gptneox.model",
    "FalconForCausalLM": "tensorrt_llm.models.falcon.model",
    "GPTForCausalLM": "tensorrt_llm.models.gpt.model",
    "BloomForCausalLM": "tensorrt_llm.models.bloom.model",
    "MPTForCausalLM": "tensorrt_llm.models.mpt.model",
}


def register_architectures(trtllm: ModuleType | None = None) -> dict[str, type]:
    """Add every ``MedusaPorts*`` architecture to ``MODEL_MAP``; returns name -> class."""
    trtllm = trtllm or require_tensorrt_llm()
    models = import_module("tensorrt_llm.models")
    added: dict[str, type] = {}
    seen: set[str] = set()
    for adapter_cls in arch_registry().values():
        adapter = adapter_cls()
        name = adapter.ported_architecture()
        if name in seen:
            continue
        seen.add(name)
        base_module = import_module(TRTLLM_CLASS_MODULES[adapter.trtllm_base_class])
        base_cls = getattr(base_module, adapter.trtllm_base_class)
        cls = medusa_class(trtllm, base_cls, plumbing_needed=not adapter.upstream_spec_decoding_plumbing, name=name)
        models.MODEL_MAP[name] = cls
        added[name] = cls
    return added
