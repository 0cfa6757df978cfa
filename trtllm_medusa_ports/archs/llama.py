"""Llama and Mistral: TensorRT-LLM ``LLaMAForCausalLM`` (tensorrt_llm/models/llama/).

The reference family: RMSNorm, GatedMLP with SiLU, GPT-NeoX style RoPE, fused
qkv. Upstream facts (tensorrt_llm/models/llama/config.py, convert.py):
``mlp.fc`` <- ``gate_proj`` (the activated branch), ``mlp.gate`` <- ``up_proj``,
``attn_bias`` from HF ``attention_bias``, ``mlp_bias`` written but never read
from HF (we read it), tied embeddings -> lm_head copied from embed_tokens.
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, one_model, two_model
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.weights import Role, Source
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class LlamaAdapter(ArchAdapter):
    hf_architectures = ("LlamaForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"LlamaForCausalLM": one_model("modeling_llama.py")}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': False, 'hidden_act': 'silu'}
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06}
    family = "llama"
    upstream_converter = "tensorrt_llm/models/llama/convert.py"
    model_types = ("llama",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = (
        "upstream `MedusaForCausalLM` (SiLU base, per-head lm_heads, pp 1); otherwise `trtllm-medusa build`"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="llama", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=251, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    trtllm_base_class = "LLaMAForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['attention_multiplier', 'attn_bias', 'embedding_multiplier', 'mlp_bias', 'output_multiplier_scale', 'residual_multiplier', 'sliding_window'])
    trtllm_module = "llama"
    names: ClassVar[dict[Role, Source | None]] = {}  # Llama's own names (LLAMA_NAMES)
    upstream_medusa_base = True
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/llama/model.py LLaMADecoderLayer.forward

    def attn_bias(self, hf: HFConfig) -> bool:
        return bool(hf.get("attention_bias", False) or hf.get("bias", False))

    def mlp_bias(self, hf: HFConfig) -> bool:
        return bool(hf.get("mlp_bias", False))

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["attn_bias"] = self.attn_bias(hf)
        cfg["mlp_bias"] = self.mlp_bias(hf)
        return cfg

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        roles = set()
        if self.attn_bias(hf):
            roles |= {Role.QKV, Role.DENSE} if self.dense_bias(hf) else {Role.QKV}
        if self.mlp_bias(hf):
            roles |= {Role.FC, Role.GATE, Role.PROJ}
        return frozenset(roles)

    def dense_bias(self, hf: HFConfig) -> bool:
        """Llama's ``attention_bias`` covers o_proj too; Qwen2 has qkv bias only."""
        return True


@register
class MistralAdapter(LlamaAdapter):
    """Mistral = Llama + (optional) sliding-window attention; same tensors and engine class."""

    hf_architectures = ("MistralForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"MistralForCausalLM": two_model("modeling_mistral.py")}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': False, 'hidden_act': 'silu'}
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06}
    family = "mistral"
    upstream_converter = "tensorrt_llm/models/llama/convert.py"
    model_types = ("mistral",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX), sliding window"
    medusa_status = (
        "as Llama; keep `max_seq_len <= sliding_window`"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="mistral", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, vocab_size=256, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
    )

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        window = hf.get("sliding_window")
        if window:
            cfg["sliding_window"] = int(window)
        return cfg
