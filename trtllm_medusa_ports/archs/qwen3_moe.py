"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): TensorRT-LLM ``QWenForCausalLM`` with ``MOE``
(tensorrt_llm/models/qwen/, tensorrt_llm/layers/moe.py).

Qwen3's attention (q/k RMS norms per head, no qkv bias); each layer's MLP is ``num_experts`` SiLU-gated
experts of ``moe_intermediate_size``, ``num_experts_per_tok`` per token, no shared expert.

Upstream facts: ``QWenConfig.from_hugging_face`` for ``qwen3_moe`` writes ``hidden_act = "swiglu"`` and
``moe`` with ``normalization_mode`` NONE - hard-coded for every Qwen MoE (tensorrt_llm/models/qwen/config.py,
convert.py: "For Qwen models, it is hard-coded to ExpertScaleNormalizationMode.NONE") - and
``QWenDecoderLayer`` builds a plain ``MOE`` for ``qwen3_moe`` (router float32, ``fc`` up then gate,
``proj``). Qwen3-MoE checkpoints set ``norm_topk_prob: true`` (transformers renormalises the chosen
experts' weights), which the engine does not: rule ``engine-divergence``, as for Qwen2-MoE.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import (
    Role,
    Semantics,
    Source,
    WeightRule,
    register,
    stacked_expert_fc,
    stacked_experts,
)
from trtllm_medusa_ports.archs.qwen2_moe import NONE, Qwen2MoeAdapter, qwen_moe_routing_divergence
from trtllm_medusa_ports.archs.qwen3 import Qwen3Adapter
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split


@register
class Qwen3MoeAdapter(Qwen3Adapter):
    hf_architectures = ("Qwen3MoeForCausalLM",)
    #: the Hugging Face config class's defaults this adapter falls back on (transformers' own; tested)
    hf_defaults: ClassVar[dict] = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"}
    #: test shapes of this family (tiny-config overrides), each converted and verified at tp 1 and 2
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"num_experts_per_tok": 1, "num_key_value_heads": 4})
    #: non-default values of the keys this adapter writes, which the tests read back from the reference
    #: semantics and the engine class (a key written under another name fails)
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "rms_norm_eps": 3e-6, "num_experts_per_tok": 3}
    family = "qwen3_moe"
    model_types = ("qwen3_moe",)
    #: for the README family table (derived: trtllm_medusa_ports/families.py)
    display_note = "mixture of experts"
    position_summary = "RoPE (GPT-NeoX), q/k norm"
    medusa_status = ("`trtllm-medusa build`; tensor parallel, unquantized; `norm_topk_prob: true` (every released "
                     "checkpoint) is routed without renormalisation by the engine (`engine-divergence`)")
    #: a tiny random model of this family, for the tests and the demo (Hugging Face config kwargs)
    tiny_config: ClassVar[dict | None] = dict(
        model_type="qwen3_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    #: QWenConfig reads the MoE fields (tensorrt_llm/models/qwen/config.py)
    engine_keys: ClassVar[frozenset[str]] = Qwen3Adapter.engine_keys | {
        "moe", "moe_intermediate_size", "mlp_only_layers", "decoder_sparse_step"}
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: None, Role.GATE: None, Role.PROJ: None}  # experts instead
    #: the router, kept in float32
    full_precision_parameters: ClassVar[tuple[str, ...]] = (r".*\.mlp\.gate\.weight",)
    # the routing facts are Qwen2-MoE's
    num_experts = Qwen2MoeAdapter.num_experts
    top_k = Qwen2MoeAdapter.top_k
    port_limits = Qwen2MoeAdapter.port_limits  # dense layers among the sparse ones

    def engine_divergences(self, hf: HFConfig) -> list[tuple[str, str]]:
        return super().engine_divergences(hf) + qwen_moe_routing_divergence(hf)

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["qwen_type"] = "qwen3_moe"
        cfg["hidden_act"] = "swiglu"
        cfg["moe"] = {"num_experts": self.num_experts(hf), "shared_expert_intermediate_size": 0,
                      "top_k": self.top_k(hf), "normalization_mode": NONE, "sparse_mixer_epsilon": 0.01,
                      "tp_mode": 0, "device_limited_n_group": 0, "device_limited_topk_group": 0,
                      "device_limited_routed_scaling_factor": 1.0}
        cfg["moe_intermediate_size"] = int(hf.require("moe_intermediate_size", int))
        cfg["mlp_only_layers"] = list(hf.get("mlp_only_layers") or [])
        cfg["decoder_sparse_step"] = int(hf.get("decoder_sparse_step") or 1)
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        mlp = self.layer_name("mlp.")
        experts = range(self.num_experts(hf))
        fc = tuple(f"{mlp}experts.{e}.{w}.weight" for e in experts for w in ("up_proj", "gate_proj"))
        proj = tuple(f"{mlp}experts.{e}.down_proj.weight" for e in experts)
        return super().layer_rules(hf) + [
            WeightRule("mlp.router.weight", (f"{mlp}gate.weight",), Split.REPLICATE, dtype="float32"),
            WeightRule("mlp.fc.weight", fc, Split.EXPERT_PAIR, stacked_expert_fc, experts=True),
            WeightRule("mlp.proj.weight", proj, Split.EXPERT_ROW, stacked_experts, experts=True),
        ]

    def semantics(self, cfg: dict) -> Semantics:
        moe = cfg["moe"]
        return dataclasses.replace(super().semantics(cfg), hidden_act="silu", moe_num_experts=int(moe["num_experts"]),
                                   moe_top_k=int(moe["top_k"]), moe_renormalize=int(moe["normalization_mode"]) == 1)
