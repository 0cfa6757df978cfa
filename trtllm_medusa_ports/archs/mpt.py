"""MPT: TensorRT-LLM ``MPTForCausalLM`` (tensorrt_llm/models/mpt/), ALiBi by default.

Like Bloom, mapped and executed by the reference (tree ALiBi from depth, MPT's own
slopes for head counts that are not powers of two, ``clip_qkv``), rejected by
``check`` when ALiBi is on. Mapping (examples/models/contrib/mpt/convert_checkpoint.py):
``Wqkv`` is ``[q; k; v]`` (``kv_n_heads`` for GQA), ``norm_1``/``norm_2``/``norm_f`` are
LayerNorms without bias, ``ffn.up_proj``/``down_proj`` plain GELU MLP of
``expansion_ratio`` x hidden, lm_head = ``wte``. transformers' MPT has no biases at all
(whatever ``no_bias`` says; it drops the LayerNorm biases of Hub checkpoints), so
neither does the mapping: a checkpoint with biases is refused as "tensors with no place".
transformers also ignores ``attn_config.alibi_bias_max`` (its slopes always use 8)
while TensorRT-LLM and the reference honour it: a base with another value differs
from transformers by construction.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import (
    AlibiStyle,
    MlpKind,
    NormKind,
    PositionEmbedding,
    Semantics,
)
from trtllm_medusa_ports.archs.weights import Deviation, Role, Source, fused_qkv
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class MPTAdapter(ArchAdapter):
    hf_architectures = ("MptForCausalLM", "MPTForCausalLM")
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"MptForCausalLM": NO_CLASS, "MPTForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`expansion_ratio != 4`, `attn_config.alibi: false`, `layer_norm_epsilon != 1e-5` for ln_f (`models/mpt/model.py`: a 4 x hidden MLP and ALiBi hard-coded, ln_f without `eps`)'
    hf_defaults: ClassVar[dict] = {'layer_norm_epsilon': 1e-05, 'tie_word_embeddings': True, 'hidden_act': 'gelu',
                                   'max_seq_len': 2048, 'expansion_ratio': 4,
                                   # MptAttentionConfig's, read through their paths (files/hf_model.py lookup)
                                   'attn_config.alibi': True, 'attn_config.alibi_bias_max': 8}  # MptConfig's
    max_positions_key = "max_seq_len"
    norm_epsilon_key = 'layer_norm_epsilon'
    expected_check_errors: ClassVar[frozenset[str]] = frozenset({"alibi-position-embedding"})
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'n_heads': 2, 'attn_config': {'alibi': True, 'clip_qkv': 0.5}})
    key_cases: ClassVar[dict | None] = {}
    family = "mpt"
    upstream_converter = "examples/models/contrib/mpt/convert_checkpoint.py"
    model_types = ("mpt",)
    display_note = ""
    position_summary = "ALiBi"
    medusa_status = (
        "**rejected** like Bloom"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="mpt", d_model=64, n_layers=2, n_heads=4, vocab_size=256, max_seq_len=256,
        attn_config={"alibi": True, "alibi_bias_max": 8},
    )
    trtllm_base_class = "MPTForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['alibi_bias_max', 'bias', 'clip_qkv'])
    trtllm_module = "mpt"
    upstream_config_class = False  # the class takes PretrainedConfig (tensorrt_llm/models/mpt/)
    engine_pipeline_parallel = False  # tensorrt_llm/models/mpt/model.py: no send/recv between stages
    position_embedding = PositionEmbedding.ALIBI
    layer_prefix = "transformer.blocks.{i}."
    names: ClassVar[dict[Role, Source | None]] = {  # no biases anywhere (MPT's no_bias)
        Role.EMBEDDING: "transformer.wte", Role.INPUT_NORM: "norm_1", Role.QKV: "attn.Wqkv", Role.DENSE: "attn.out_proj",
        Role.POST_ATTENTION_NORM: "norm_2", Role.FC: "ffn.up_proj", Role.GATE: None, Role.PROJ: "ffn.down_proj",
        Role.FINAL_NORM: "transformer.norm_f",
    }

    def alibi(self, hf: HFConfig) -> bool:
        return bool(self.hf_value(hf, "attn_config.alibi"))

    def num_kv_heads(self, hf: HFConfig) -> int:
        # upstream's converter reads kv_n_heads (GQA MPT checkpoints); transformers' MptAttentionConfig has none
        return int(hf.get("attn_config.kv_n_heads") or self.num_attention_heads(hf))

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(self.hf_value(hf, "expansion_ratio") * self.hidden_size(hf))

    def tied_embeddings(self, hf: HFConfig) -> bool:
        return True

    def alibi_reason(self, hf: HFConfig) -> str | None:
        return "MPT with attn_config.alibi = true" if self.alibi(hf) else None

    def exact_gelu(self, hf: HFConfig) -> bool:
        return True  # MptMLP is nn.GELU(approximate="none"); the config names no activation

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        # tensorrt_llm/models/mpt/model.py: MLP of 4 x hidden (expansion_ratio is never read), ALiBi
        # in every layer whatever the config says, ln_f with the default epsilon
        out = self.default_epsilon_limit(hf, "layer_norm_epsilon", "ln_f")
        ratio = self.hf_value(hf, "expansion_ratio")
        if ratio != 4:
            out.append((f"expansion_ratio {ratio}: TensorRT-LLM's MPTForCausalLM always builds a 4 x hidden MLP",
                        "this base cannot be built by TensorRT-LLM's MPT class"))
        if not self.alibi(hf):
            out.append(("attn_config.alibi is false, but TensorRT-LLM's MPTForCausalLM always applies ALiBi "
                        "(and has no learned position embedding)",
                        "this base cannot be built by TensorRT-LLM's MPT class"))
        return out

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.update(
            {
                "hidden_act": "gelu",
                "bias": False,
                "clip_qkv": hf.get("attn_config.clip_qkv"),  # None: no clipping (MptAttentionConfig's default)
                "alibi_bias_max": self.hf_value(hf, "attn_config.alibi_bias_max"),
                "max_position_embeddings": self.max_positions(hf),
                "position_embedding_type": "alibi" if self.alibi(hf) else "learned_absolute",
            }
        )
        return cfg

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {Role.QKV: Deviation(combine=fused_qkv(self.num_attention_heads(hf), self.num_kv_heads(hf), self.head_size(hf)))}

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg),
            norm=NormKind.LAYER,
            mlp=MlpKind.PLAIN,
            position_embedding=PositionEmbedding(cfg["position_embedding_type"]),
            alibi_style=AlibiStyle.MPT,
            alibi_bias_max=float(cfg["alibi_bias_max"]),
            clip_qkv=cfg.get("clip_qkv"),
        )
