"""Qwen2 / Qwen2.5: Llama, except qkv carries a bias, o_proj does not, and the
engine class is ``QWenForCausalLM`` with ``qwen_type`` (tensorrt_llm/models/qwen/config.py:
``attn_bias`` forced True for qwen2, ``dense_bias`` False; ``rotary_base`` from
``rope_theta``). Small sizes tie the embeddings (lm_head <- embed_tokens).
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, two_model
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class Qwen2Adapter(LlamaAdapter):
    hf_architectures = ("Qwen2ForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Qwen2ForCausalLM": two_model("modeling_qwen.py")}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': False, 'hidden_act': 'silu'}
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06, 'seq_length': 777}
    family = "qwen2"
    upstream_converter = "tensorrt_llm/models/qwen/convert.py"
    model_types = ("qwen2",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = (
        "as Llama (qkv bias, `qwen_type`, group sizes like 7 handled)"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="qwen2", hidden_size=224, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=263, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, head_dim=64,
        # group size 7 with head size 64, as in Qwen2-0.5B (Qwen2-7B: 28 / 4 heads of 128); a group
        # size that does not divide 64 falls on the precompiled XQA kernels, head size 128 only (xqa.py route)
    )
    trtllm_base_class = "QWenForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['attn_bias', 'mlp_bias', 'qk_layernorm', 'qwen_type', 'seq_length'])
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
