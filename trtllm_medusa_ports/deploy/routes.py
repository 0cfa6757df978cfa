"""Which serving routes resolve an engine's ``architecture``.

An engine built by ``trtllm-medusa build`` names the base's Hugging Face architecture in its ``config.json``
(engine/medusa.py ``_ported_config``), with the Medusa fields beside it; upstream's own Medusa class names
``MedusaForCausalLM``. The Python routes - ``examples/run.py`` (``ModelRunnerCpp.from_dir``), the LLM API
(``_load_config_from_engine``) and ``trtllm-serve --backend tensorrt`` - parse that file with
``PretrainedConfig.from_dict``, which looks the name up in ``MODEL_MAP`` (tensorrt_llm/models/modeling_utils.py;
a KeyError for any other name). Triton's C++ backend (``tensorrtllm``) reads the engine through the C++ runtime
(cpp/tensorrt_llm/runtime/gptJsonConfig.cpp), which looks at the name only for GLM and the recurrent models.

May import: nothing of the package.
"""

from __future__ import annotations

#: the keys of ``MODEL_MAP`` (tensorrt_llm/models/__init__.py, 1.2 line), all of them - not only the families this
#: project has - so that a family added later resolves here without an edit (``GEMMA*_ARCHITECTURE`` spelt out)
MODEL_MAP_NAMES = frozenset({
    "GPT2LMHeadModel", "GPT2LMHeadCustomModel", "GPTBigCodeForCausalLM", "Starcoder2ForCausalLM", "FuyuForCausalLM",
    "Kosmos2ForConditionalGeneration", "JAISLMHeadModel", "GPTForCausalLM", "NemotronForCausalLM", "OPTForCausalLM",
    "BloomForCausalLM", "RWForCausalLM", "FalconForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM", "Phi3VForCausalLM",
    "Phi3SmallForCausalLM", "PhiMoEForCausalLM", "Phi4MMForCausalLM", "MambaForCausalLM", "GPTNeoXForCausalLM",
    "GPTJForCausalLM", "MptForCausalLM", "MPTForCausalLM", "GLMModel", "ChatGLMModel", "ChatGLMForCausalLM",
    "ChatGLMForConditionalGeneration", "LlamaForCausalLM", "LlavaLlamaModel", "LlavaNextForConditionalGeneration",
    "ExaoneForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "ArcticForCausalLM", "Grok1ModelForCausalLM",
    "InternLMForCausalLM", "InternLM2ForCausalLM", "InternLMXComposer2ForCausalLM", "GraniteForCausalLM",
    "GraniteMoeForCausalLM", "MedusaForCausalLM", "MedusaLlamaForCausalLM", "ReDrafterForLLaMALM",
    "ReDrafterForQWenLM", "BaichuanForCausalLM", "BaiChuanForCausalLM", "SkyworkForCausalLM", "GemmaForCausalLM",
    "Gemma2ForCausalLM", "Gemma3ForCausalLM", "QWenLMHeadModel", "QWenForCausalLM", "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen2ForSequenceClassification", "Qwen2VLForConditionalGeneration", "Qwen2VLModel",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "WhisperEncoder", "EncoderModel", "DecoderModel", "DbrxForCausalLM",
    "RecurrentGemmaForCausalLM", "CogVLMForCausalLM", "DiT", "SD3Transformer2DModel", "STDiT3",
    "DeepseekForCausalLM", "DeciLMForCausalLM", "DeepseekV2ForCausalLM", "EagleForCausalLM", "CohereForCausalLM",
    "MLLaMAModel", "MllamaForConditionalGeneration", "BertForQuestionAnswering", "BertForSequenceClassification",
    "BertModel", "RobertaModel", "RobertaForQuestionAnswering", "RobertaForSequenceClassification", "VoRAForCausalLM",
})
#: names one stored copy of that file lists and another does not: to be checked on the installed 1.2
UNCONFIRMED = {"Qwen3MoeForCausalLM": "one of two stored copies of tensorrt_llm/models/__init__.py lists it"}
PYTHON_ROUTES = ("run.py", "llm_api", "trtllm-serve")


def engine_architecture(cfg: dict) -> str:
    """The ``architecture`` the engine's config.json carries (see the module doc)."""
    arch = str(cfg.get("architecture"))
    return str(cfg.get("base_architecture") or arch) if arch.startswith("MedusaPorts") else arch


def routes(cfg: dict) -> dict[str, dict]:
    """Per route: whether the engine's architecture resolves there, and why."""
    arch = engine_architecture(cfg)
    known = arch in MODEL_MAP_NAMES
    why = (f"{arch} is a MODEL_MAP key (tensorrt_llm/models/__init__.py)" if known else
           f"{arch} is not a MODEL_MAP key: PretrainedConfig.from_dict raises KeyError")
    if arch in UNCONFIRMED:
        why += f" - not confirmed: {UNCONFIRMED[arch]}"
    out = {route: {"resolves": known, "why": why} for route in PYTHON_ROUTES}
    rnn = arch in ("MambaForCausalLM", "RecurrentGemmaForCausalLM") or "GLM" in arch
    out["triton"] = {"resolves": not rnn, "why": "the C++ runtime reads no model class (gptJsonConfig.cpp)"
                     + ("; but it special-cases this name" if rnn else "")}
    return out
