"""StarCoder2: TensorRT-LLM ``GPTForCausalLM`` with ``gpt_variant = "starcoder2"``
(tensorrt_llm/models/gpt/{config,convert}.py).

Llama names, except: LayerNorm with bias (eps ``norm_epsilon``), q/k/v/o and the
plain MLP ``c_fc``/``c_proj`` carry biases when ``use_bias``, GELU (tanh), GQA,
optional sliding window. Upstream's GPT layers *do* pass ``spec_decoding_params``
to attention, but upstream Medusa cannot wrap a GPT base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import (
    MlpKind,
    NormKind,
    Semantics,
    WeightRule,
    linear_rules,
    qkv_rule,
    register,
)
from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split

_L = "model.layers.{i}."


@register
class Starcoder2Adapter(LlamaAdapter):
    hf_architectures = ("Starcoder2ForCausalLM",)
    family = "starcoder2"
    model_types = ("starcoder2",)
    #: a tiny random model of this family, for the tests and the demo (Hugging Face config kwargs)
    tiny_config: ClassVar[dict | None] = dict(
        model_type="starcoder2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        use_bias=True, bos_token_id=0, eos_token_id=0,
    )
    trtllm_base_class = "GPTForCausalLM"
    trtllm_module = "gpt"
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/gpt/model.py GPTDecoderLayer.forward

    def tied_embeddings(self, hf: HFConfig) -> bool:
        return bool(hf.get("tie_word_embeddings", True))

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.update(
            {
                "gpt_variant": "starcoder2",
                "bias": bool(hf.get("use_bias", True)),
                "norm_epsilon": float(hf.get("norm_epsilon", 1e-5)),
                "hidden_act": "gelu",
                "rotary_pct": hf.partial_rotary_factor,
            }
        )
        for k in ("attn_bias", "mlp_bias"):
            cfg.pop(k, None)
        if hf.get("sliding_window"):
            cfg["sliding_window"] = int(hf.get("sliding_window"))
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        a = _L + "self_attn."
        bias = bool(hf.get("use_bias", True))
        rules = [
            *linear_rules("input_layernorm", _L + "input_layernorm"),
            qkv_rule("attention.qkv.weight", a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            *linear_rules("attention.dense", a + "o_proj", Split.ROW, bias=bias),
            *linear_rules("post_layernorm", _L + "post_attention_layernorm"),
            *linear_rules("mlp.fc", _L + "mlp.c_fc", Split.COLUMN, bias=bias),
            *linear_rules("mlp.proj", _L + "mlp.c_proj", Split.ROW, bias=bias),
        ]
        if bias:
            rules.append(qkv_rule("attention.qkv.bias", a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"))
        return rules

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        return super().final_rules(hf) + [WeightRule("transformer.ln_f.bias", ("model.norm.bias",))]

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN)
