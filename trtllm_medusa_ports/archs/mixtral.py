"""Mixtral (sparse mixture of experts): TensorRT-LLM ``LLaMAForCausalLM`` with its ``MOE`` layer
(tensorrt_llm/models/llama/, tensorrt_llm/layers/moe.py).

Mistral's attention; each layer's MLP is ``num_local_experts`` SiLU-gated experts of which a float32 router
picks ``num_experts_per_tok`` per token, weighted by a softmax over the chosen experts' logits.

Upstream facts: ``LLaMAConfig.from_hugging_face`` writes ``hidden_act = "swiglu"`` and
``moe = MoeConfig(num_experts=num_local_experts, top_k=num_experts_per_tok, normalization_mode=RENORMALIZE)``
(its ``to_dict`` writes all nine ``MoeConfig`` fields; ``MoeConfig.from_dict`` is ``cls(**d)``);
``LLaMADecoderLayer`` builds ``MOE`` when ``moe.num_experts > 1``, which declares ``mlp.router.weight``
``[experts, hidden]`` in float32 (``RowLinear(..., dtype="float32", tp_size=1)``: never split),
``mlp.fc.weight`` ``[experts, 2 * inter / tp, hidden]`` whose first half is the linear part (HF ``w3``,
up_proj) and second half the activated gate (HF ``w1``, gate_proj) - "the inverse of GatedMLP" - and
``mlp.proj.weight`` ``[experts, hidden, inter / tp]`` (HF ``w2``); RENORMALIZE takes the top-k float32
logits and a softmax over them (cpp/tensorrt_llm/kernels/mixtureOfExperts/moe_kernels.cu), which is
transformers' softmax over all experts, top-k, renormalised. ``Mapping``'s ``moe_tp_size`` /
``moe_ep_size`` default to pure tensor parallelism (``moe_tp = tp``, ``moe_ep = 1``); ``--moe_ep_size``
writes expert parallelism. Weight-only experts stay float in the file (TensorRT-LLM quantizes them at load);
FP8 experts are refused (rule ``port-limit``).
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.experts import MOE_RENORMALIZE, moe_semantics, per_expert_rules
from trtllm_medusa_ports.archs.llama import MistralAdapter
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, no_capture
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import Role, Source, WeightRule
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.files.jsonfile import is_int


@register
class MixtralAdapter(MistralAdapter):
    hf_architectures = ("MixtralForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"MixtralForCausalLM": no_capture("modeling_mixtral.py")}
    engine_limits_summary: ClassVar[str] = '`num_experts_per_tok > num_local_experts`'
    hf_defaults: ClassVar[dict] = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"num_experts_per_tok": 1, "num_key_value_heads": 4})
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "rms_norm_eps": 3e-6, "num_experts_per_tok": 3}
    pipeline_test: ClassVar[bool] = True  # verified at pp 2 (see ArchAdapter.pipeline_test)
    family = "mixtral"
    upstream_converter = "tensorrt_llm/models/llama/convert.py"
    model_types = ("mixtral",)
    display_note = "mixture of experts"
    position_summary = "RoPE (GPT-NeoX), sliding window"
    medusa_status = "`trtllm-medusa build`; tensor and expert parallel; float or weight-only (INT8/INT4) experts"
    tiny_config: ClassVar[dict | None] = dict(
        model_type="mixtral", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
        num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
    )
    #: LLaMAConfig reads ``moe`` (LLaMAConfig.__init__: a dict becomes MoeConfig.from_dict)
    engine_keys: ClassVar[frozenset[str]] = MistralAdapter.engine_keys | {"moe"}
    upstream_medusa_base = False  # MedusaConfig.from_hugging_face drops the MoE (tensorrt_llm/models/medusa/config.py)
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: None, Role.GATE: None, Role.PROJ: None}  # experts instead
    #: the router, kept in float32 (transformers 5 names it mlp.gate, 4 block_sparse_moe.gate)
    full_precision_parameters: ClassVar[tuple[str, ...]] = (r".*\.(mlp|block_sparse_moe)\.gate\.weight",)

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["hidden_act"] = "swiglu"  # LLaMAConfig.from_hugging_face for MoE: the experts' gated SiLU
        cfg["moe"] = self.moe_block(hf, MOE_RENORMALIZE)
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        return super().layer_rules(hf) + per_expert_rules(
            self.layer_name("block_sparse_moe."), self.num_experts(hf), up="w3", gate="w1", down="w2")

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        # read as written, not through top_k(), which refuses this config where it is read (archs/experts.py
        # experts_per_token): `check` reports that refusal and this limit beside it instead of stopping at the rule
        top_k, experts = hf.get("num_experts_per_tok"), hf.get("num_local_experts")
        if is_int(top_k) and is_int(experts) and top_k > experts:
            return [(f"num_experts_per_tok {top_k} is above num_local_experts {experts}",
                     "this is not a valid Mixtral config")]
        return []

    def semantics(self, cfg: dict) -> Semantics:
        return moe_semantics(super().semantics(cfg), cfg)
