"""GPT-NeoX / Pythia: TensorRT-LLM ``GPTNeoXForCausalLM`` (tensorrt_llm/models/gptneox/).

LayerNorm with bias; ``query_key_value`` rows are interleaved per head
``(heads, 3, head_dim)`` and must become ``(3, heads*head_dim)`` before the split
(examples/models/contrib/gptneox/convert_checkpoint.py); partial rotary
(``rotary_pct``, 0.25) with base ``rotary_emb_base``; parallel residual
``x + attn(ln1(x)) + mlp(ln2(x))`` when ``use_parallel_residual``; the MLP norm is
named ``post_attention_layernorm`` in the TensorRT-LLM checkpoint; ``embed_out`` is
the lm_head. HF's "gelu" is exact (erf); TensorRT-LLM computes the tanh form.
Upstream's GPT-NeoX layers do not pass ``spec_decoding_params`` to attention.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, Semantics
from trtllm_medusa_ports.archs.weights import (
    LINEARS,
    NORMS,
    Deviation,
    Role,
    Source,
    per_head_interleaved_qkv,
)
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class GPTNeoXAdapter(ArchAdapter):
    hf_architectures = ("GPTNeoXForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GPTNeoXForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`intermediate_size != 4 x hidden_size`, `layer_norm_eps != 1e-5`, `use_parallel_residual: false` (`models/gptneox/model.py`: a 4 x hidden MLP, always the parallel residual, LayerNorms without `eps`)'
    hf_defaults: ClassVar[dict] = {'layer_norm_eps': 1e-05, 'tie_word_embeddings': False, 'hidden_act': 'gelu',
                                   'partial_rotary_factor': 0.25}
    norm_epsilon_key = 'layer_norm_eps'
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'tie_word_embeddings': True, 'rotary_pct': 0.5})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'partial_rotary_factor': 0.5}
    check_cases: ClassVar[tuple[tuple[dict, str], ...]] = (
        ({"intermediate_size": 96}, "engine-class-limit"), ({"use_parallel_residual": False}, "engine-class-limit"),
        ({"layer_norm_eps": 1e-6}, "engine-class-limit"))
    family = "gpt_neox"
    upstream_converter = "examples/models/contrib/gptneox/convert_checkpoint.py"
    model_types = ("gpt_neox", "gptneox")
    display_note = "Pythia"
    position_summary = "partial RoPE"
    medusa_status = (
        "`trtllm-medusa build`, pp 1 only, parallel residual only; engine GELU is the tanh form (`gelu-approximation`)"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gpt_neox", hidden_size=64, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=256, max_position_embeddings=256, rotary_pct=0.25,
        bos_token_id=0, eos_token_id=0,
    )
    trtllm_base_class = "GPTNeoXForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['rotary_emb_base'])
    trtllm_module = "gptneox"
    upstream_config_class = False  # the class takes PretrainedConfig (tensorrt_llm/models/gptneox/)
    engine_pipeline_parallel = False  # tensorrt_llm/models/gptneox/model.py: no send/recv between stages
    layer_prefix = "gpt_neox.layers.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "gpt_neox.embed_in", Role.QKV: "attention.query_key_value", Role.DENSE: "attention.dense",
        Role.FC: "mlp.dense_h_to_4h", Role.GATE: None, Role.PROJ: "mlp.dense_4h_to_h",
        Role.FINAL_NORM: "gpt_neox.final_layer_norm", Role.LM_HEAD: "embed_out",
    }
    lm_head_fallbacks = ("lm_head",)

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        # tensorrt_llm/models/gptneox/model.py builds its MLP as 4 x hidden and its LayerNorms
        # with the default epsilon; the example converter writes neither field.
        out = []
        hidden, inter = self.hidden_size(hf), self.intermediate_size(hf)
        if inter != 4 * hidden:
            out.append((f"intermediate_size {inter} is not 4 x hidden_size ({4 * hidden}); TensorRT-LLM's "
                        "GPTNeoXForCausalLM always builds a 4 x hidden MLP",
                        "this base cannot be built by TensorRT-LLM's GPT-NeoX class"))
        if not hf.get("use_parallel_residual", True):
            out.append(("use_parallel_residual is false, but TensorRT-LLM's GPTNeoXDecoderLayer always computes "
                        "the parallel residual x + attn(ln1(x)) + mlp(ln2(x))",
                        "this base cannot be built by TensorRT-LLM's GPT-NeoX class"))
        out += self.default_epsilon_limit(hf, "layer_norm_eps", "every LayerNorm")
        return out

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["hidden_act"] = "gelu"
        cfg["rotary_pct"] = self.rotary_fraction(hf)
        cfg["rotary_emb_base"] = hf.rope_theta  # the name GPTNeoXForCausalLM reads
        return cfg

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | LINEARS

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {
            Role.QKV: Deviation(combine=per_head_interleaved_qkv(self.num_attention_heads(hf), self.head_size(hf))),
            # GPTNeoXDecoderLayer's name for the MLP's norm (tensorrt_llm/models/gptneox/model.py)
            Role.POST_ATTENTION_NORM: Deviation(trtllm_name="post_attention_layernorm"),
        }

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg),
            norm=NormKind.LAYER,
            mlp=MlpKind.PLAIN,
            rotary_base=float(cfg["rotary_emb_base"]),
            parallel_residual=True,  # GPTNeoXDecoderLayer always; sequential bases are refused
            mlp_norm="post_attention_layernorm",
        )
