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

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, Semantics
from trtllm_medusa_ports.archs.weights import LINEARS, NORMS, Role, Source
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class PhiAdapter(ArchAdapter):
    hf_architectures = ("PhiForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"PhiForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`layer_norm_eps != 1e-5`, `num_key_value_heads != num_attention_heads` (`models/phi/model.py`: no `num_kv_heads`, no `eps`)'
    hf_defaults: ClassVar[dict] = {'layer_norm_eps': 1e-05, 'tie_word_embeddings': False, 'hidden_act': 'gelu_new',
                                   'partial_rotary_factor': 0.5}
    norm_epsilon_key = 'layer_norm_eps'
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'tie_word_embeddings': True, 'partial_rotary_factor': 0.25})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'partial_rotary_factor': 0.5}
    check_cases: ClassVar[tuple[tuple[dict, str], ...]] = (
        ({"num_key_value_heads": 2}, "engine-class-limit"), ({"layer_norm_eps": 1e-6}, "engine-class-limit"))
    family = "phi"
    upstream_converter = "tensorrt_llm/models/phi/convert.py"
    model_types = ("phi",)
    display_note = "Phi-2"
    position_summary = "partial RoPE"
    medusa_status = (
        "`trtllm-medusa build`, pp 1 only, multi-head attention only"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="phi", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=256, max_position_embeddings=256, partial_rotary_factor=0.5,
    )
    trtllm_base_class = "PhiForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset()  # the engine class reads the common keys only
    trtllm_module = "phi"
    engine_pipeline_parallel = False  # tensorrt_llm/models/phi/model.py: no send/recv between stages
    names: ClassVar[dict[Role, Source | None]] = {
        Role.DENSE: "self_attn.dense", Role.POST_ATTENTION_NORM: None, Role.FC: "mlp.fc1", Role.GATE: None,
        Role.PROJ: "mlp.fc2", Role.FINAL_NORM: "model.final_layernorm",
    }

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = self.default_epsilon_limit(hf, "layer_norm_eps", "input_layernorm and ln_f")
        if self.num_kv_heads(hf) != self.num_attention_heads(hf):
            # PhiDecoderLayer passes no num_kv_heads to Attention (tensorrt_llm/models/phi/model.py)
            out.append((f"num_key_value_heads {self.num_kv_heads(hf)} differs from num_attention_heads "
                        f"{self.num_attention_heads(hf)}; TensorRT-LLM's PhiForCausalLM is multi-head attention only",
                        "this base cannot be built by TensorRT-LLM's Phi class"))
        return out

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["hidden_act"] = "gelu"  # gelu_new; TensorRT-LLM's gelu is the same tanh form
        cfg["rotary_pct"] = self.rotary_fraction(hf)  # the name PhiDecoderLayer reads
        return cfg

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | LINEARS | {Role.LM_HEAD}

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN, parallel_residual=True, shared_input_norm=True
        )
