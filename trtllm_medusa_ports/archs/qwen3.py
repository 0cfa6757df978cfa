"""Qwen3 (dense): Qwen2, except no qkv bias and an RMSNorm over each head of q and k
before RoPE (``attention.q_layernorm`` / ``k_layernorm``; tensorrt_llm/models/qwen/convert.py).

TensorRT-LLM 1.2.x maps ``Qwen3ForCausalLM`` to ``QWenForCausalLM``, but upstream
``MedusaForCausalLM`` builds its QWen base without a way for us to confirm the
q/k norms are applied in the 1.2 TensorRT flow, so checkpoints get our own
architecture name and are built by ``trtllm-medusa build`` (never silently wrong).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, one_model
from trtllm_medusa_ports.archs.qwen2 import Qwen2Adapter
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import Role, Source
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class Qwen3Adapter(Qwen2Adapter):
    hf_architectures = ("Qwen3ForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Qwen3ForCausalLM": one_model("modeling_qwen3.py")}
    engine_limits_summary: ClassVar[str] = '`attention_bias: true` (`models/qwen/model.py` builds attention with `dense_bias=False`)'
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': False, 'hidden_act': 'silu'}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'tie_word_embeddings': True, 'num_key_value_heads': 1})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06}
    family = "qwen3"
    upstream_converter = "tensorrt_llm/models/qwen/convert.py"
    model_types = ("qwen3",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX), q/k norm"
    medusa_status = (
        "`trtllm-medusa build` (upstream's Medusa-over-QWen q/k-norm path unconfirmed for 1.2); `attention_bias: true` refused (o_proj bias)"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
        max_position_embeddings=256, rope_theta=1000000.0, tie_word_embeddings=False,
    )
    upstream_medusa_base = False
    names: ClassVar[dict[Role, Source | None]] = {Role.Q_NORM: "self_attn.q_norm", Role.K_NORM: "self_attn.k_norm"}

    def attn_bias(self, hf: HFConfig) -> bool:
        return bool(hf.get("attention_bias", False))

    def dense_bias(self, hf: HFConfig) -> bool:
        return True

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        if self.attn_bias(hf):
            # QWenDecoderLayer builds Attention(bias=attn_bias, dense_bias=False)
            # (tensorrt_llm/models/qwen/model.py): o_proj's bias would be dropped
            return [("attention_bias is true, but TensorRT-LLM's QWenForCausalLM never gives the attention "
                     "output projection (o_proj) a bias: it would be dropped",
                     "this base cannot be built exactly by TensorRT-LLM's QWen class")]
        return []

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["qwen_type"] = "qwen3"
        cfg["qk_layernorm"] = True
        return cfg

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), qk_norm=True)
