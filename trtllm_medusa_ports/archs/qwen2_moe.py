"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): TensorRT-LLM ``QWenForCausalLM`` with ``SharedMoE``
(tensorrt_llm/models/qwen/, tensorrt_llm/layers/moe.py).

Qwen2's attention; each layer's MLP is ``num_experts`` SiLU-gated experts (``moe_intermediate_size``),
``num_experts_per_tok`` of them weighted by their share of the softmax over all experts, renormalised over the
chosen ones when ``norm_topk_prob`` is true, plus a shared expert (``shared_expert_intermediate_size``)
scaled by ``sigmoid(shared_expert_gate(x))``.

Upstream facts: ``QWenConfig.from_hugging_face`` for ``qwen2_moe`` writes ``hidden_act = "swiglu"``,
``moe = MoeConfig(num_experts, top_k=num_experts_per_tok, normalization_mode=NONE)`` and the top-level
``moe_intermediate_size``, ``moe_shared_expert_intermediate_size``, ``mlp_only_layers``,
``decoder_sparse_step``; ``QWenDecoderLayer`` builds ``SharedMoE(use_shared_gate=True)``: ``MOE`` (router
float32 ``[experts, hidden]``, ``fc`` ``[experts, 2 * inter / tp, hidden]`` up then gate, ``proj``), a
``shared_expert`` ``MLP(hidden, shared, "swiglu")`` whose ``fc`` is ``[up; gate]`` split per half over tp,
and ``shared_expert_gate`` ``RowLinear(hidden, 1, tp_size=1)`` in the model dtype; the output is
``routed + sigmoid(gate(x)) * shared(x)`` and one all-reduce (qwen/convert.py ``load_weights_from_hf_model``).
Routing: NONE is hard-coded only in upstream's own HF converter (``QWenConfig.from_hugging_face``);
``QWenConfig.__init__`` takes the checkpoint's ``moe`` block as written (``MoeConfig.from_dict``),
``models/qwen/model.py`` hands ``config.moe`` to ``MOE`` / ``SharedMoE``, and ``layers/moe.py``
``MixtureOfExperts`` renormalises the top-k weights under RENORMALIZE (a softmax over the chosen logits, which
equals transformers' ``norm_topk_prob`` division of the chosen softmax shares). So this port writes
RENORMALIZE when ``norm_topk_prob`` is true, as upstream's DeepSeek converter does for its renormalised
routing, and NONE otherwise. Dense layers among the sparse ones (``mlp_only_layers``,
``decoder_sparse_step`` > 1) are refused.
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.experts import (
    MOE_NONE,
    MOE_RENORMALIZE,
    moe_semantics,
    per_expert_rules,
)
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, no_capture
from trtllm_medusa_ports.archs.qwen2 import Qwen2Adapter
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import Role, Source, WeightRule, layout_only
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.weights.arrays import Array, cat
from trtllm_medusa_ports.weights.sharding import Split


@layout_only
def _up_then_gate(ts: list[Array]) -> Array:
    """The shared expert's ``[up; gate]`` (the linear half first, as ``MLP``'s swiglu chunks it); a pure
    layout, so it takes the byte path."""
    return cat([ts[0], ts[1]], dim=0)


def qwen_moe_routing(hf: HFConfig) -> int:
    """The ``normalization_mode`` that computes what transformers does: RENORMALIZE under ``norm_topk_prob``
    (every released Qwen3-MoE), NONE without it (Qwen1.5-MoE, Qwen2-57B-A14B)."""
    return MOE_RENORMALIZE if hf.get("norm_topk_prob") else MOE_NONE


def qwen_moe_fields(adapter, hf: HFConfig, cfg: dict, qwen_type: str) -> dict:
    """``cfg`` with what ``QWenConfig`` reads for a Qwen MoE, the routing mode the base's (:func:`qwen_moe_routing`)."""
    cfg.update(qwen_type=qwen_type, hidden_act="swiglu", moe=adapter.moe_block(hf, qwen_moe_routing(hf)),
               moe_intermediate_size=int(hf.require("moe_intermediate_size", int)),
               mlp_only_layers=list(hf.get("mlp_only_layers") or []),
               decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1))
    return cfg


def qwen_expert_rules(adapter, hf: HFConfig) -> list[WeightRule]:
    """The routed experts of a Qwen MoE layer: ``mlp.experts.E.{up,gate,down}_proj``, router ``mlp.gate``."""
    return per_expert_rules(adapter.layer_name("mlp."), adapter.num_experts(hf), up="up_proj", gate="gate_proj",
                            down="down_proj")


@register
class Qwen2MoeAdapter(Qwen2Adapter):
    hf_architectures = ("Qwen2MoeForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Qwen2MoeForCausalLM": no_capture("modeling_qwen_moe.py")}
    hf_defaults: ClassVar[dict] = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"num_experts_per_tok": 3, "num_key_value_heads": 4},
                                                 {"norm_topk_prob": True})
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "rms_norm_eps": 3e-6, "num_experts_per_tok": 3}
    family = "qwen2_moe"
    upstream_converter = "tensorrt_llm/models/qwen/convert.py"
    model_types = ("qwen2_moe",)
    display_note = "mixture of experts, shared expert"
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = "`trtllm-medusa build`; tensor and expert parallel; float or weight-only (INT8/INT4) experts"
    tiny_config: ClassVar[dict | None] = dict(
        model_type="qwen2_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, max_window_layers=2, use_sliding_window=False,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )
    #: QWenConfig reads the MoE fields (tensorrt_llm/models/qwen/config.py)
    engine_keys: ClassVar[frozenset[str]] = Qwen2Adapter.engine_keys | {
        "moe", "moe_intermediate_size", "moe_shared_expert_intermediate_size", "mlp_only_layers",
        "decoder_sparse_step"}
    upstream_medusa_base = False  # MedusaConfig.from_hugging_face drops the MoE (tensorrt_llm/models/medusa/config.py)
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: None, Role.GATE: None, Role.PROJ: None}  # experts instead
    #: the router, kept in float32 (the shared expert's gate stays in the model dtype, as upstream stores it)
    full_precision_parameters: ClassVar[tuple[str, ...]] = (r".*\.mlp\.gate\.weight",)

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = qwen_moe_fields(self, hf, super().trtllm_config(hf), "qwen2_moe")
        cfg["moe_shared_expert_intermediate_size"] = int(hf.require("shared_expert_intermediate_size", int))
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        mlp = self.layer_name("mlp.")
        shared = f"{mlp}shared_expert."
        return super().layer_rules(hf) + qwen_expert_rules(self, hf) + [
            WeightRule("mlp.shared_expert.fc.weight", (f"{shared}up_proj.weight", f"{shared}gate_proj.weight"),
                       Split.COLUMN_PAIR, _up_then_gate, experts=True),
            WeightRule("mlp.shared_expert.proj.weight", (f"{shared}down_proj.weight",), Split.ROW, experts=True),
            WeightRule("mlp.shared_expert_gate.weight", (f"{mlp}shared_expert_gate.weight",), Split.REPLICATE),
        ]

    def port_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        if hf.get("mlp_only_layers") or int(hf.get("decoder_sparse_step") or 1) != 1:
            return [("dense MLP layers among the sparse ones (mlp_only_layers, decoder_sparse_step > 1) are not "
                     "converted by this port yet", "convert a Qwen2-MoE whose every layer is sparse")]
        return []

    def semantics(self, cfg: dict) -> Semantics:
        return moe_semantics(super().semantics(cfg), cfg, shared_expert=True)
