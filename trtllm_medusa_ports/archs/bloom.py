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

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, PositionEmbedding, Semantics
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
class BloomAdapter(ArchAdapter):
    hf_architectures = ("BloomForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"BloomForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`layer_norm_epsilon != 1e-5` (`models/bloom/model.py` passes no `eps`)'
    # BloomConfig has no context length (ALiBi, no position table): 2048 is the BLOOM models' training context,
    # declared rather than guessed per config
    hf_defaults: ClassVar[dict] = {'layer_norm_epsilon': 1e-05, 'tie_word_embeddings': True, 'hidden_act': 'gelu',
                                   'max_position_embeddings': 2048}
    norm_epsilon_key = 'layer_norm_epsilon'
    expected_check_errors: ClassVar[frozenset[str]] = frozenset({"alibi-position-embedding"})
    test_variants: ClassVar[tuple[dict, ...]] = ({},)
    key_cases: ClassVar[dict | None] = {}
    family = "bloom"
    upstream_converter = "examples/models/contrib/bloom/convert_checkpoint.py"
    model_types = ("bloom",)
    display_note = ""
    position_summary = "ALiBi"
    medusa_status = (
        "**rejected** (`alibi-position-embedding`); mapping and reference (tree ALiBi from depth) exist, `--allow_unsupported` writes it"
    )
    tiny_config: ClassVar[dict | None] = dict(model_type="bloom", hidden_size=64, n_layer=2, n_head=4, vocab_size=256)
    trtllm_base_class = "BloomForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['share_embedding_table'])
    trtllm_module = "bloom"
    upstream_config_class = False  # the class takes PretrainedConfig (tensorrt_llm/models/bloom/)
    engine_pipeline_parallel = False  # tensorrt_llm/models/bloom/model.py: no send/recv between stages
    position_embedding = PositionEmbedding.ALIBI
    layer_prefix = "transformer.h.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "transformer.word_embeddings", Role.EMBEDDING_NORM: "transformer.word_embeddings_layernorm",
        Role.QKV: "self_attention.query_key_value", Role.DENSE: "self_attention.dense",
        Role.FC: "mlp.dense_h_to_4h", Role.GATE: None, Role.PROJ: "mlp.dense_4h_to_h",
        Role.FINAL_NORM: "transformer.ln_f",
    }

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
        cfg.update({"hidden_act": "gelu",
                    # BloomForCausalLM reads it and PretrainedConfig has no default for it
                    # (tensorrt_llm/models/bloom/model.py); lm_head.weight is written on its own
                    "share_embedding_table": False})
        return cfg

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | LINEARS

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {Role.QKV: Deviation(combine=per_head_interleaved_qkv(self.num_attention_heads(hf), self.head_size(hf)))}

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN, position_embedding=PositionEmbedding.ALIBI, has_embedding_norm=True
        )
