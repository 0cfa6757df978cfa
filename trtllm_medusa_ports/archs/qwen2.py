"""Qwen2 / Qwen2.5: Llama, except qkv carries a bias, o_proj does not, and the
engine class is ``QWenForCausalLM`` with ``qwen_type`` (tensorrt_llm/models/qwen/config.py:
``attn_bias`` forced True for qwen2, ``dense_bias`` False; ``rotary_base`` from
``rope_theta``). Small sizes tie the embeddings (lm_head <- embed_tokens).
"""

from __future__ import annotations

from trtllm_medusa_ports.archs.base import register
from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.hf_model import HFConfig


@register
class Qwen2Adapter(LlamaAdapter):
    hf_architectures = ("Qwen2ForCausalLM",)
    family = "qwen2"
    model_types = ("qwen2",)
    trtllm_base_class = "QWenForCausalLM"
    trtllm_module = "qwen"
    upstream_medusa_base = True  # MedusaConfig picks QWenConfig when model_type contains "qwen"
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/qwen/model.py QWenDecoderLayer.forward

    def attn_bias(self, hf: HFConfig) -> bool:
        return True

    def dense_bias(self, hf: HFConfig) -> bool:
        return False

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["qwen_type"] = "qwen2"
        # QWenDecoderLayer reads config.seq_length (logn scaling length), which QWenConfig does not
        # declare; upstream's QWenConfig.from_hugging_face writes it, default 8192
        # (tensorrt_llm/models/qwen/{config,model}.py)
        cfg["seq_length"] = int(hf.get("seq_length") or 8192)
        window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
        if window:
            cfg["sliding_window"] = int(window)
        return cfg
