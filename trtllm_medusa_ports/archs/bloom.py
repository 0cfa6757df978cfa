"""Bloom: TensorRT-LLM ``BloomForCausalLM`` (tensorrt_llm/models/bloom/), ALiBi.

The weight mapping exists so that users see what a port needs, and the reference
executes it with tree ALiBi computed from tree *depth* (position = past + depth),
not from the slot index - but TensorRT-LLM cannot serve it with Medusa (XQA has no
ALiBi): ``check`` rejects it (``alibi-position-embedding``) and ``convert`` writes it
only with ``--allow_unsupported``.

Mapping (examples/models/contrib/bloom/convert_checkpoint.py): ``query_key_value``
rows interleaved per head ``(heads, 3, head_dim)`` -> ``(3, heads*head_dim)``
before the split; ``word_embeddings_layernorm`` -> ``transformer.ln_embed``;
LayerNorms with bias; plain GELU MLP; lm_head = the word embeddings.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import (
    ArchAdapter,
    MlpKind,
    NormKind,
    PositionEmbedding,
    Semantics,
    WeightRule,
    linear_rules,
    per_head_interleaved_qkv,
    register,
)
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split

_L = "transformer.h.{i}."


@register
class BloomAdapter(ArchAdapter):
    hf_architectures = ("BloomForCausalLM",)
    family = "bloom"
    model_types = ("bloom",)
    #: a tiny random model of this family, for the tests and the demo (Hugging Face config kwargs)
    tiny_config: ClassVar[dict | None] = dict(model_type="bloom", hidden_size=64, n_layer=2, n_head=4, vocab_size=256)
    trtllm_base_class = "BloomForCausalLM"
    trtllm_module = "bloom"
    engine_pipeline_parallel = False  # tensorrt_llm/models/bloom/model.py: no send/recv between stages
    position_embedding_kind = "alibi"

    def intermediate_size(self, hf: HFConfig) -> int:
        return 4 * self.hidden_size(hf)

    def tied_embeddings(self, hf: HFConfig) -> bool:
        return True

    def alibi_reason(self, hf: HFConfig) -> str | None:
        return "Bloom always uses ALiBi"

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        return self.default_epsilon_limit(hf, "layer_norm_epsilon", "every LayerNorm")

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.update({"norm_epsilon": float(hf.get("layer_norm_epsilon", 1e-5)), "hidden_act": "gelu",
                    # BloomForCausalLM reads it and PretrainedConfig has no default for it
                    # (tensorrt_llm/models/bloom/model.py); lm_head.weight is written on its own
                    "share_embedding_table": False})
        for k in ("rotary_base", "rotary_scaling"):
            cfg.pop(k, None)
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        split_qkv = per_head_interleaved_qkv(self.num_heads(hf), self.head_size(hf))
        a = _L + "self_attention."
        return [
            *linear_rules("input_layernorm", _L + "input_layernorm"),
            *linear_rules("attention.qkv", a + "query_key_value", Split.QKV, split_qkv),
            *linear_rules("attention.dense", a + "dense", Split.ROW),
            *linear_rules("post_layernorm", _L + "post_attention_layernorm"),
            *linear_rules("mlp.fc", _L + "mlp.dense_h_to_4h", Split.COLUMN),
            *linear_rules("mlp.proj", _L + "mlp.dense_4h_to_h", Split.ROW),
        ]

    def embedding_rules(self, hf: HFConfig) -> list[WeightRule]:
        return [
            WeightRule("transformer.vocab_embedding.weight", ("transformer.word_embeddings.weight",), Split.EMBEDDING),
            *linear_rules("transformer.ln_embed", "transformer.word_embeddings_layernorm"),
        ]

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        return [
            *linear_rules("transformer.ln_f", "transformer.ln_f"),
            WeightRule("lm_head.weight", ("lm_head.weight",), Split.VOCAB,
                       alternatives=(("transformer.word_embeddings.weight",),)),
        ]

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN, position_embedding=PositionEmbedding.ALIBI, has_embedding_norm=True
        )
