"""Gemma, Gemma2, Gemma3 (text): TensorRT-LLM ``GemmaForCausalLM`` (tensorrt_llm/models/gemma/).

Llama, except (facts from tensorrt_llm/models/gemma/{config,convert,model}.py):
- RMSNorm computes ``x * (1 + w)``: the converter stores ``w + 1`` for every norm
  (q/k norms included), TensorRT-LLM multiplies by the stored weight;
- the embedding is scaled by ``sqrt(hidden_size)`` at run time (stored unscaled);
- GELU (tanh) gated MLP, head_dim given explicitly (256 on 7B), tied lm_head;
- Gemma2: sandwich norms (``post_layernorm`` on the attention output, then
  ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``), attention scale
  ``query_pre_attn_scalar ** -0.5``, attention and final logit soft-capping,
  sliding/global layers;
- Gemma3: Gemma2 without attention soft-capping, plus q/k RMSNorms and a separate
  RoPE base for local layers (``rope_local_base_freq``; layer i is local unless
  ``(i + 1) % _sliding_window_pattern == 0``).
Upstream's Gemma layers do not pass ``spec_decoding_params`` to attention.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel, no_capture
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import NORMS, Deviation, Role, Source, plus_one
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class GemmaAdapter(LlamaAdapter):
    hf_architectures = ("GemmaForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GemmaForCausalLM": NO_CLASS}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': True, 'hidden_act': 'gelu_pytorch_tanh'}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'num_key_value_heads': 4})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06}
    family = "gemma"
    upstream_converter = "tensorrt_llm/models/gemma/convert.py"
    model_types = ("gemma",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = (
        "`trtllm-medusa build` (adds spec-decoding plumbing, SiLU heads); head size 256 needs XQA JIT"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gemma", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, vocab_size=256,
        max_position_embeddings=256, hidden_activation="gelu_pytorch_tanh",
    )
    trtllm_base_class = "GemmaForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['_sliding_window_pattern', 'attn_bias', 'attn_logit_softcapping', 'final_logit_softcapping', 'inter_layernorms', 'mlp_bias', 'qk_layernorm', 'query_pre_attn_scalar', 'rope_local_base_freq', 'sliding_window'])
    trtllm_module = "gemma"
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = False

    def attn_bias(self, hf: HFConfig) -> bool:
        return bool(hf.get("attention_bias", False))

    def forced_parallel_embedding(self, tp_size: int) -> bool | None:
        # GemmaConfig.__init__ ignores the checkpoint's flag and sets
        # use_parallel_embedding = tp_size > 1 (tensorrt_llm/models/gemma/config.py), so the
        # embedding must be written split on the vocabulary when tp > 1.
        return tp_size > 1

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["hidden_act"] = "gelu"  # tanh GELU: TensorRT-LLM's "gelu" is the tanh approximation
        cfg["inter_layernorms"] = False
        return cfg

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        # every Gemma norm computes x * (1 + w): stored as w + 1 (see plus_one)
        return {role: Deviation(combine=plus_one) for role in NORMS}

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), embedding_scale=math.sqrt(cfg["hidden_size"]))


@register
class Gemma2Adapter(GemmaAdapter):
    hf_architectures = ("Gemma2ForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Gemma2ForCausalLM": no_capture("modeling_gemma2.py")}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': True, 'hidden_act': 'gelu_pytorch_tanh'}
    expected_check_errors: ClassVar[frozenset[str]] = frozenset({"attention-softcapping"})
    test_variants: ClassVar[tuple[dict, ...]] = ({},)
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06, 'query_pre_attn_scalar': 64}
    family = "gemma2"
    upstream_converter = "tensorrt_llm/models/gemma/convert.py"
    model_types = ("gemma2",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX), soft-capping"
    medusa_status = (
        "**rejected**: XQA ignores attention soft-capping (`attention-softcapping`); reference verifies the conversion"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
        max_position_embeddings=256, query_pre_attn_scalar=32, sliding_window=128,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
    )
    float16_unsafe = True  # Gemma 2/3: bfloat16 models, hidden states of 1e5 (Gemma 3 inherits)
    names: ClassVar[dict[Role, Source | None]] = {
        Role.PRE_FEEDFORWARD_NORM: "pre_feedforward_layernorm", Role.POST_FEEDFORWARD_NORM: "post_feedforward_layernorm",
    }

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["inter_layernorms"] = True
        cfg["query_pre_attn_scalar"] = hf.get("query_pre_attn_scalar") or cfg["head_size"]
        cfg["final_logit_softcapping"] = hf.get("final_logit_softcapping")
        cfg["attn_logit_softcapping"] = hf.get("attn_logit_softcapping")
        if hf.get("sliding_window"):
            cfg["sliding_window"] = int(hf.get("sliding_window"))
        return cfg


    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg),
            post_attention_norm_after=True,
            attention_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5,
            attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
        )


@register
class Gemma3Adapter(Gemma2Adapter):
    hf_architectures = ("Gemma3ForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Gemma3ForCausalLM": no_capture("modeling_gemma3.py")}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': True, 'hidden_act': 'gelu_pytorch_tanh'}
    test_variants: ClassVar[tuple[dict, ...]] = ({},)
    key_cases: ClassVar[dict | None] = {'rms_norm_eps': 3e-06, 'query_pre_attn_scalar': 64}
    pipeline_test: ClassVar[bool] = True  # verified at pp 2 (see ArchAdapter.pipeline_test)
    family = "gemma3"
    upstream_converter = "tensorrt_llm/models/gemma/convert.py"
    model_types = ("gemma3_text", "gemma3")
    display_note = ""
    position_summary = "RoPE, local/global bases, q/k norm"
    medusa_status = (
        "`trtllm-medusa build`; keep `max_seq_len <= sliding_window`"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
        max_position_embeddings=256, query_pre_attn_scalar=32, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"], _sliding_window_pattern=2,
    )
    names: ClassVar[dict[Role, Source | None]] = {Role.Q_NORM: "self_attn.q_norm", Role.K_NORM: "self_attn.k_norm"}

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.pop("attn_logit_softcapping", None)
        cfg["qk_layernorm"] = True
        cfg["_sliding_window_pattern"] = global_layer_period(hf)
        local = hf.rope_theta_for("sliding_attention", float(hf.get("rope_local_base_freq") or 10000.0))
        cfg["rope_local_base_freq"] = local
        return cfg


    def engine_divergences(self, hf: HFConfig) -> list[tuple[str, str]]:
        types = hf.get("layer_types")
        if types and _period_of(types) is None:
            return [(f"layer_types {types} is no pattern TensorRT-LLM's Gemma 3 can build: it makes layer i global "
                     "exactly when (i + 1) % _sliding_window_pattern == 0 (tensorrt_llm/models/gemma/model.py)",
                     "serve this base without Medusa on TensorRT-LLM; --allow_unsupported writes the checkpoint "
                     "with the pattern keys, and `verify` then shows the difference")]
        glob, local = hf.rope_scaling_for("full_attention"), hf.rope_scaling_for("sliding_attention")
        if glob and glob != local:
            return [(f"rope scaling {glob} applies to global layers only in transformers (local layers: "
                     f"{local or 'unscaled'}), but TensorRT-LLM builds every layer's RoPE with the one "
                     "rotary_scaling (tensorrt_llm/models/gemma/model.py GemmaDecoderLayer passes "
                     "rotary_embedding_scaling=config.rotary_scaling to local layers too; "
                     "tensorrt_llm/layers/attention.py Attention.create_attention_const_params builds the "
                     "rope_local_base_freq tables with it): local layers would rotate at other frequencies",
                     "serve this base without rope_scaling (remove it and keep max_seq_len within the unscaled "
                     "context), or without Medusa on TensorRT-LLM; --allow_unsupported writes the checkpoint, "
                     "and `verify` then shows the difference")]
        return []

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(
            super().semantics(cfg),
            attn_logit_softcapping=None,
            qk_norm=True,
            local_rotary_base=float(cfg["rope_local_base_freq"]),
            # the engine scales local layers with the global rotary_scaling (engine_divergences above)
            local_rotary_scaling=cfg.get("rotary_scaling"),
            sliding_window_pattern=int(cfg["_sliding_window_pattern"]),
        )


def _period_of(layer_types: list) -> int | None:
    """The p that makes layer i global (``full_attention``) exactly when ``(i + 1) % p == 0``; no global layer: one
    past the last layer. None where no p does."""
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    period = full[0] + 1 if full else len(layer_types) + 1
    ok = all((t == "full_attention") == ((i + 1) % period == 0) for i, t in enumerate(layer_types))
    return period if ok else None


def global_layer_period(hf: HFConfig) -> int:
    """TensorRT-LLM's ``_sliding_window_pattern`` for a Gemma 3 base: from ``layer_types`` where the config has them,
    as transformers runs its layers by them (transformers 4.57 saves a stale ``_sliding_window_pattern`` of 6 beside
    the layer types it was given); else the pattern keys, 6 by default."""
    period = _period_of(hf.get("layer_types") or [])
    if hf.get("layer_types") and period is not None:
        return period
    return int(hf.get("_sliding_window_pattern") or hf.get("sliding_window_pattern") or 6)
