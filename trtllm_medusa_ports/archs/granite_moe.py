"""IBM Granite MoE (Granite 3.x MoE): TensorRT-LLM ``LLaMAForCausalLM`` with ``MOE`` (``MODEL_MAP`` maps
``GraniteMoeForCausalLM`` to it; tensorrt_llm/models/llama/, tensorrt_llm/layers/moe.py).

Granite's attention and its four multipliers (archs/granite.py); each layer's MLP is ``num_local_experts``
SiLU-gated experts stored fused by transformers - ``block_sparse_moe.input_linear`` ``[experts, 2 x inter,
hidden]`` with the *gate* half first (``GraniteMoeExperts``: ``gate, up = linear(...).chunk(2)``) and
``output_linear`` ``[experts, hidden, inter]`` - routed by ``block_sparse_moe.router.layer``: the top-k
logits, then a softmax over them (``GraniteMoeTopKRouter``), which is TensorRT-LLM's RENORMALIZE.
TensorRT-LLM's ``MOE`` wants each expert's fc as ``[up; gate]`` (the linear half first), so the halves are
swapped; the router is stored in float32 (``MOE`` declares it so). Tensor and expert parallelism as for
Mixtral, on the byte path (the swap is a pure layout); weight-only experts as for Mixtral, FP8 ones refused (rule ``port-limit``).
"""

from __future__ import annotations

from typing import ClassVar

from trtllm_medusa_ports.archs.experts import MOE_RENORMALIZE, moe_semantics
from trtllm_medusa_ports.archs.granite import GraniteAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import Role, Source, WeightRule, layout_only
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.weights.arrays import Array, cat
from trtllm_medusa_ports.weights.sharding import Split


@layout_only
def _up_then_gate_experts(ts: list[Array]) -> Array:
    """transformers' fused ``[gate; up]`` per expert as TensorRT-LLM's ``[up; gate]``: a pure layout (the
    halves swapped along dim 1), so the experts take the byte path."""
    t = ts[0]
    half = t.shape[1] // 2
    return cat([t[:, half:], t[:, :half]], dim=1)


@register
class GraniteMoeAdapter(GraniteAdapter):
    hf_architectures = ("GraniteMoeForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GraniteMoeForCausalLM": NO_CLASS}
    hf_defaults: ClassVar[dict] = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu"}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"num_experts_per_tok": 1, "tie_word_embeddings": True})
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "rms_norm_eps": 3e-6, "num_experts_per_tok": 3}
    family = "granitemoe"
    upstream_converter = "tensorrt_llm/models/llama/convert.py"
    model_types = ("granitemoe",)
    display_note = "Granite 3.x MoE"
    position_summary = "RoPE (GPT-NeoX), Granite's multipliers"
    medusa_status = "`trtllm-medusa build`; tensor and expert parallel; float or weight-only (INT8/INT4) experts"
    #: multipliers far from 1, as for Granite
    tiny_config: ClassVar[dict | None] = dict(
        model_type="granitemoe", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, num_local_experts=4,
        num_experts_per_tok=2, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
        logits_scaling=8.0,
    )
    #: LLaMAConfig reads ``moe``
    engine_keys: ClassVar[frozenset[str]] = GraniteAdapter.engine_keys | {"moe"}
    upstream_medusa_base = False  # MedusaConfig.from_hugging_face drops the MoE (tensorrt_llm/models/medusa/config.py)
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: None, Role.GATE: None, Role.PROJ: None}  # experts instead
    #: the router, kept in float32 (transformers 5: block_sparse_moe.router.weight; 4: router.layer.weight)
    full_precision_parameters: ClassVar[tuple[str, ...]] = (r".*\.block_sparse_moe\.router\.(layer\.)?weight",)

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["hidden_act"] = "swiglu"
        cfg["moe"] = self.moe_block(hf, MOE_RENORMALIZE)
        return cfg

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        moe = self.layer_name("block_sparse_moe.")
        return super().layer_rules(hf) + [
            WeightRule("mlp.router.weight", (f"{moe}router.layer.weight",), Split.REPLICATE, dtype="float32"),
            WeightRule("mlp.fc.weight", (f"{moe}input_linear.weight",), Split.EXPERT_PAIR, _up_then_gate_experts,
                       experts=True),
            WeightRule("mlp.proj.weight", (f"{moe}output_linear.weight",), Split.EXPERT_ROW, experts=True),
        ]

    def semantics(self, cfg: dict) -> Semantics:
        return moe_semantics(super().semantics(cfg), cfg)
