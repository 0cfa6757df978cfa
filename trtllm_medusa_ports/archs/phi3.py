"""Phi-3 / Phi-3.5 (mini, medium): TensorRT-LLM ``Phi3ForCausalLM`` (tensorrt_llm/models/phi3/).

Llama, except the projections are fused: ``qkv_proj`` holds ``[q; k; v]`` rows,
and ``gate_up_proj`` holds ``[gate; up]``, which TensorRT-LLM's non-gated ``MLP``
with ``hidden_act = "swiglu"`` reads as one ``mlp.fc`` whose *second* half is
activated: the converter stores ``[up; gate]`` (tensorrt_llm/models/phi3/convert.py),
split per rank half by half. Long contexts use ``longrope`` ("su") scaling: two RoPE tables, of which the engine
picks one per step (a context step by the tokens it computes, a generation step by the prompt plus the max
draft length: archs/semantics.py ``LongRope``); the reference executor computes both.
Upstream's Phi-3 layers do not pass ``spec_decoding_params`` to attention.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, no_capture
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import LongRope, MlpKind, PositionEmbedding, Semantics
from trtllm_medusa_ports.archs.weights import Deviation, Role, Source, fused_qkv, layout_only
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.checkpoint_schema import (
    LONGROPE_FACTOR_KEYS,
    LONGROPE_MSCALE_KEYS,
    longrope_problems,
)
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.weights.arrays import Array, cat, chunk
from trtllm_medusa_ports.weights.sharding import Split

#: how Phi-3 configs spell longrope: "su" and "yarn" in those written before transformers renamed them, which
#: transformers' Phi3Config still reads as "longrope" (configuration_phi3.py; it refuses every other type)
LONGROPE_SPELLINGS = ("longrope", "su", "yarn")


@layout_only
def _up_then_gate(ts: list[Array]) -> Array:
    gate, up = chunk(ts[0], 2, 0)
    return cat([up, gate], dim=0)


#: the checkpoint's long_rope keys (files/checkpoint_schema.py names problems by them) -> rope_scaling's, which
#: the user's config.json holds
HF_LONGROPE_NAMES = {"longrope_scaling_short_factors": "short_factor", "longrope_scaling_long_factors": "long_factor",
                     "longrope_short_mscale": "short_mscale", "longrope_long_mscale": "long_mscale"}


def _in_hf_names(problem: str) -> str:
    """A long_rope problem as config.json's rope_scaling names the keys."""
    for ours, theirs in HF_LONGROPE_NAMES.items():
        problem = problem.replace(ours, theirs)
    return problem


@register
class Phi3Adapter(LlamaAdapter):
    hf_architectures = ("Phi3ForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Phi3ForCausalLM": no_capture("modeling_phi3.py")}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-05, 'tie_word_embeddings': False, 'hidden_act': 'silu'}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'num_key_value_heads': 4, 'partial_rotary_factor': 0.5})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06, 'partial_rotary_factor': 0.5}
    family = "phi3"
    upstream_converter = "tensorrt_llm/models/phi3/convert.py"
    model_types = ("phi3",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX; longrope for 128k)"
    medusa_status = (
        "`trtllm-medusa build`, pp 1 only; longrope verified for prompts within original_max_position_embeddings - "
        "max_draft_len"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="phi3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    trtllm_base_class = "Phi3ForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['longrope_scaling_long_factors', 'longrope_scaling_short_factors', 'original_max_position_embeddings'])
    trtllm_module = "phi3"
    engine_pipeline_parallel = False  # tensorrt_llm/models/phi3/model.py: no send/recv between stages
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = False
    names: ClassVar[dict[Role, Source | None]] = {
        Role.QKV: "self_attn.qkv_proj", Role.FC: "mlp.gate_up_proj", Role.GATE: None,
    }

    def attn_bias(self, hf: HFConfig) -> bool:
        return False

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["hidden_act"] = "swiglu"
        cfg["rotary_pct"] = self.rotary_fraction(hf)
        scaling = hf.rope_scaling
        if scaling and scaling.get("type") in LONGROPE_SPELLINGS:
            cfg["position_embedding_type"] = "long_rope"
            # upstream's Phi-3 route writes no rotary_scaling (tensorrt_llm/models/phi3/config.py passes none, so
            # Phi3Config keeps None): the tables come from the keys below, and "su" or "yarn" would not parse
            # (RotaryScalingType.from_string in tensorrt_llm/functional.py raises on them when the model is built)
            cfg["rotary_scaling"] = None
            cfg["original_max_position_embeddings"] = hf.rope_original_max_positions
            cfg["longrope_scaling_short_factors"] = scaling.get("short_factor")
            cfg["longrope_scaling_long_factors"] = scaling.get("long_factor")
            self.refuse_unusable_longrope(hf, cfg)
        return cfg

    def refuse_unusable_longrope(self, hf: HFConfig, cfg: dict) -> None:
        """The long_rope tables this config would give the engine, judged as every reader of the checkpoint judges
        them (files/checkpoint_schema.py ``longrope_problems``): junk is config.json's error here, not verify's."""
        problems = longrope_problems({**cfg, "rotary_pct": cfg.get("rotary_pct", 1.0)})
        if problems:
            spelled = (hf.rope_scaling or {}).get("type")
            raise ModelError(f"rope_scaling (type {spelled!r}, Phi-3's longrope) cannot give the engine its two RoPE "
                             "tables: "
                             + "; ".join(map(_in_hf_names, problems)),
                             where=str(hf.path),
                             fix="config.json's rope_scaling needs short_factor and long_factor (one positive number per "
                                 "rotated frequency) and original_max_position_embeddings (a positive int), as "
                                 "the model's published config has them")

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {
            Role.QKV: Deviation(combine=fused_qkv(self.num_attention_heads(hf), self.num_kv_heads(hf), self.head_size(hf))),
            # [gate; up] stored [up; gate], cut half by half per rank (see the module docstring)
            Role.FC: Deviation(combine=_up_then_gate, split=Split.COLUMN_PAIR),
        }

    def semantics(self, cfg: dict) -> Semantics:
        base = super().semantics(cfg)
        return dataclasses.replace(base, mlp=MlpKind.SWIGLU, hidden_act="silu",
                                   longrope=_longrope(cfg) if base.position_embedding is PositionEmbedding.LONG_ROPE
                                   else None)


def _longrope(cfg: dict) -> LongRope | None:
    """The engine's two tables from config.json; None where they cannot be built (files/checkpoint_schema.py
    ``longrope_problems``, the one judge, which every reader of the checkpoint runs first and names)."""
    if longrope_problems(cfg):
        return None
    factors = [cfg[k] for k in LONGROPE_FACTOR_KEYS]
    mscales = [cfg.get(k) for k in LONGROPE_MSCALE_KEYS]  # PhiMoE writes its own
    original = cfg["original_max_position_embeddings"]
    return LongRope(*(tuple(map(float, f)) for f in factors), original,
                    *(None if m is None else float(m) for m in mscales))
