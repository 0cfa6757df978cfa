"""Phi-2 (and Phi-1.5): TensorRT-LLM ``PhiForCausalLM`` (tensorrt_llm/models/phi/).

Not Llama-shaped: LayerNorm with bias; attention and MLP run in parallel on the
same normalised input (one ``input_layernorm``); q/k/v/dense with biases; partial
rotary embedding (``partial_rotary_factor``, 0.4 on Phi-2); plain MLP ``fc1``/``fc2``
with ``gelu_new``; ``final_layernorm``; ``lm_head`` has a bias.
Upstream's Phi layers do not pass ``spec_decoding_params`` to attention.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import (
    ArchAdapter,
    MlpKind,
    NormKind,
    Semantics,
    WeightRule,
    linear_rules,
    qkv_rule,
    register,
)
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split

_L = "model.layers.{i}."


@register
class PhiAdapter(ArchAdapter):
    hf_architectures = ("PhiForCausalLM",)
    family = "phi"
    model_types = ("phi",)
    #: a tiny random model of this family, for the tests and the demo (Hugging Face config kwargs)
    tiny_config: ClassVar[dict | None] = dict(
        model_type="phi", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=256, max_position_embeddings=256, partial_rotary_factor=0.5,
    )
    trtllm_base_class = "PhiForCausalLM"
    trtllm_module = "phi"
    engine_pipeline_parallel = False  # tensorrt_llm/models/phi/model.py: no send/recv between stages

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = self.default_epsilon_limit(hf, "layer_norm_eps", "input_layernorm and ln_f")
        if self.num_kv_heads(hf) != self.num_heads(hf):
            # PhiDecoderLayer passes no num_kv_heads to Attention (tensorrt_llm/models/phi/model.py)
            out.append((f"num_key_value_heads {self.num_kv_heads(hf)} differs from num_attention_heads "
                        f"{self.num_heads(hf)}; TensorRT-LLM's PhiForCausalLM is multi-head attention only",
                        "this base cannot be built by TensorRT-LLM's Phi class"))
        return out

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["norm_epsilon"] = float(hf.get("layer_norm_eps", 1e-5))
        cfg["hidden_act"] = "gelu"  # gelu_new; TensorRT-LLM's gelu is the same tanh form
        cfg["rotary_pct"] = hf.partial_rotary_factor  # the name PhiDecoderLayer reads
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        a = _L + "self_attn."
        return [
            *linear_rules("input_layernorm", _L + "input_layernorm"),
            qkv_rule("attention.qkv.weight", a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            qkv_rule("attention.qkv.bias", a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"),
            *linear_rules("attention.dense", a + "dense", Split.ROW),
            *linear_rules("mlp.fc", _L + "mlp.fc1", Split.COLUMN),
            *linear_rules("mlp.proj", _L + "mlp.fc2", Split.ROW),
        ]

    def embedding_rules(self, hf: HFConfig) -> list[WeightRule]:
        return [WeightRule("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), Split.EMBEDDING)]

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        tied = (("model.embed_tokens.weight",),) if self.tied_embeddings(hf) else ()
        return [
            *linear_rules("transformer.ln_f", "model.final_layernorm"),
            WeightRule("lm_head.weight", ("lm_head.weight",), Split.VOCAB, alternatives=tied),
            WeightRule("lm_head.bias", ("lm_head.bias",), Split.VOCAB),
        ]

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN, parallel_residual=True, shared_input_norm=True
        )
