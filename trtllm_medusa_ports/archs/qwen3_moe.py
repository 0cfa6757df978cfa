"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): TensorRT-LLM ``QWenForCausalLM`` with ``MOE``
(tensorrt_llm/models/qwen/, tensorrt_llm/layers/moe.py).

Qwen3's attention (q/k RMS norms per head, no qkv bias); each layer's MLP is ``num_experts`` SiLU-gated
experts of ``moe_intermediate_size``, ``num_experts_per_tok`` per token, no shared expert.

Upstream facts: ``QWenConfig`` reads ``hidden_act = "swiglu"`` and the ``moe`` block as the checkpoint writes
it (tensorrt_llm/models/qwen/config.py), and ``QWenDecoderLayer`` builds a plain ``MOE`` for ``qwen3_moe``
(router float32, ``fc`` up then gate, ``proj``). Qwen3-MoE checkpoints set ``norm_topk_prob: true``
(transformers renormalises the chosen experts' weights): the port writes RENORMALIZE for it, which
``layers/moe.py`` computes (see qwen2_moe.py; upstream's own HF converter writes NONE, which would differ).
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.experts import moe_semantics
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, one_model
from trtllm_medusa_ports.archs.qwen2_moe import (
    Qwen2MoeAdapter,
    qwen_expert_rules,
    qwen_moe_fields,
)
from trtllm_medusa_ports.archs.qwen3 import Qwen3Adapter
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import Role, Source, WeightRule
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class Qwen3MoeAdapter(Qwen3Adapter):
    hf_architectures = ("Qwen3MoeForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Qwen3MoeForCausalLM": one_model("modeling_qwen3_moe.py")}
    hf_defaults: ClassVar[dict] = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"num_experts_per_tok": 1, "num_key_value_heads": 4},
                                                 {"norm_topk_prob": False})
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "rms_norm_eps": 3e-6, "num_experts_per_tok": 3}
    family = "qwen3_moe"
    upstream_converter = "tensorrt_llm/models/qwen/convert.py"
    model_types = ("qwen3_moe",)
    display_note = "mixture of experts"
    position_summary = "RoPE (GPT-NeoX), q/k norm"
    medusa_status = ("`trtllm-medusa build`; tensor and expert parallel; float or weight-only experts; `norm_topk_prob: true` (every released "
                     "checkpoint) written as RENORMALIZE routing")
    tiny_config: ClassVar[dict | None] = dict(
        model_type="qwen3_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[],  # norm_topk_prob as every released Qwen3-MoE sets it
    )
    #: QWenConfig reads the MoE fields (tensorrt_llm/models/qwen/config.py)
    engine_keys: ClassVar[frozenset[str]] = Qwen3Adapter.engine_keys | {
        "moe", "moe_intermediate_size", "mlp_only_layers", "decoder_sparse_step"}
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: None, Role.GATE: None, Role.PROJ: None}  # experts instead
    #: the router, kept in float32
    full_precision_parameters: ClassVar[tuple[str, ...]] = (r".*\.mlp\.gate\.weight",)
    port_limits = Qwen2MoeAdapter.port_limits  # Qwen2-MoE's: dense layers among the sparse ones

    def trtllm_config(self, hf: HFConfig) -> dict:
        return qwen_moe_fields(self, hf, super().trtllm_config(hf), "qwen3_moe")

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        return super().layer_rules(hf) + qwen_expert_rules(self, hf)

    def semantics(self, cfg: dict) -> Semantics:
        return moe_semantics(super().semantics(cfg), cfg)
