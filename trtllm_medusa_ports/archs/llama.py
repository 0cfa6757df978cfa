"""Llama and Mistral: TensorRT-LLM ``LLaMAForCausalLM`` (tensorrt_llm/models/llama/).

The reference family: RMSNorm, GatedMLP with SiLU, GPT-NeoX style RoPE, fused
qkv. Upstream facts (tensorrt_llm/models/llama/config.py, convert.py):
``mlp.fc`` <- ``gate_proj`` (the activated branch), ``mlp.gate`` <- ``up_proj``,
``attn_bias`` from HF ``attention_bias``, ``mlp_bias`` written but never read
from HF (we read it), tied embeddings -> lm_head copied from embed_tokens.
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter, WeightRule, qkv_rule, register
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split

_L = "model.layers.{i}."


@register
class LlamaAdapter(ArchAdapter):
    hf_architectures = ("LlamaForCausalLM",)
    family = "llama"
    model_types = ("llama",)
    #: a tiny random model of this family, for the tests and the demo (Hugging Face config kwargs)
    tiny_config: ClassVar[dict | None] = dict(
        model_type="llama", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=251, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    trtllm_base_class = "LLaMAForCausalLM"
    trtllm_module = "llama"
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

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        a = _L + "self_attn."
        rules = [
            WeightRule("input_layernorm.weight", (_L + "input_layernorm.weight",)),
            qkv_rule("attention.qkv.weight", a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            WeightRule("attention.dense.weight", (a + "o_proj.weight",), Split.ROW),
            WeightRule("post_layernorm.weight", (_L + "post_attention_layernorm.weight",)),
            WeightRule("mlp.fc.weight", (_L + "mlp.gate_proj.weight",), Split.COLUMN),
            WeightRule("mlp.gate.weight", (_L + "mlp.up_proj.weight",), Split.COLUMN),
            WeightRule("mlp.proj.weight", (_L + "mlp.down_proj.weight",), Split.ROW),
        ]
        if self.attn_bias(hf):
            rules.append(qkv_rule("attention.qkv.bias", a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"))
            if self.dense_bias(hf):
                rules.append(WeightRule("attention.dense.bias", (a + "o_proj.bias",)))
        if self.mlp_bias(hf):
            rules += [
                WeightRule("mlp.fc.bias", (_L + "mlp.gate_proj.bias",), Split.COLUMN),
                WeightRule("mlp.gate.bias", (_L + "mlp.up_proj.bias",), Split.COLUMN),
                WeightRule("mlp.proj.bias", (_L + "mlp.down_proj.bias",)),
            ]
        return rules

    def dense_bias(self, hf: HFConfig) -> bool:
        """Llama's ``attention_bias`` covers o_proj too; Qwen2 has qkv bias only."""
        return True

    def embedding_rules(self, hf: HFConfig) -> list[WeightRule]:
        return [WeightRule("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), Split.EMBEDDING)]

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        tied = (("model.embed_tokens.weight",),) if self.tied_embeddings(hf) else ()
        return [
            WeightRule("transformer.ln_f.weight", ("model.norm.weight",)),
            WeightRule("lm_head.weight", ("lm_head.weight",), Split.VOCAB, alternatives=tied),
        ]


@register
class MistralAdapter(LlamaAdapter):
    """Mistral = Llama + (optional) sliding-window attention; same tensors and engine class."""

    hf_architectures = ("MistralForCausalLM",)
    family = "mistral"
    model_types = ("mistral",)
    #: a tiny random model of this family, for the tests and the demo (Hugging Face config kwargs)
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
