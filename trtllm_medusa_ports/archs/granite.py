"""IBM Granite (3.x dense): TensorRT-LLM ``LLaMAForCausalLM`` (tensorrt_llm/models/llama/).

Llama's tensors, plus four scalars a hand port easily loses, each of which changes the output:
- ``embedding_multiplier``: the embeddings are multiplied by it (TensorRT-LLM: ``LLaMAModel.forward``
  multiplies the first stage's embedding output by ``config.embedding_multiplier``);
- ``residual_multiplier``: the attention and the MLP outputs are multiplied by it before each residual
  add (``LLaMADecoderLayer.forward``);
- ``attention_multiplier``: the softmax scale itself, not ``1/sqrt(head_size)``. TensorRT-LLM builds
  its attention with ``q_scaling = 1 / config.attention_multiplier`` and divides by
  ``sqrt(head_size) * q_scaling``, so its config stores the Hugging Face value times
  ``sqrt(head_size)`` (``LLaMAConfig.from_hugging_face`` in tensorrt_llm/models/llama/config.py);
- ``logits_scaling``: the logits are divided by it. TensorRT-LLM stores
  ``output_multiplier_scale = 1 / logits_scaling`` and multiplies the base's logits only
  (``DecoderModelForCausalLM.forward`` in tensorrt_llm/models/modeling_utils.py); the Medusa heads'
  logits are not scaled (tensorrt_llm/models/medusa/model.py), which leaves their argmax unchanged.

``MODEL_MAP`` maps ``GraniteForCausalLM`` to ``LLaMAForCausalLM`` and ``MedusaConfig`` hands every
key of the checkpoint config to its ``LLaMAConfig`` (tensorrt_llm/models/medusa/config.py), so
upstream's Medusa class builds a Granite base once its checkpoint carries these four fields.
Upstream's fused all-reduce paths (``--reduce_fusion``, ``--norm_quant_fusion``, ``--user_buffer``,
``--pp_reduce_scatter``) skip ``residual_multiplier``: ``trtllm-medusa build`` refuses them for
such a checkpoint (rule ``engine-fusion-multiplier``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class GraniteAdapter(LlamaAdapter):
    hf_architectures = ("GraniteForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GraniteForCausalLM": NO_CLASS}
    hf_defaults: ClassVar[dict] = {'rms_norm_eps': 1e-06, 'tie_word_embeddings': False, 'hidden_act': 'silu'}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'tie_word_embeddings': False, 'attention_multiplier': 1.0})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'rms_norm_eps': 3e-06}
    family = "granite"
    upstream_converter = "tensorrt_llm/models/llama/convert.py"
    model_types = ("granite",)
    display_note = "Granite 3.x dense"
    position_summary = "RoPE (GPT-NeoX), embedding/residual/attention/logits multipliers"
    medusa_status = (
        "as Llama (upstream `MedusaForCausalLM` once the four multipliers are in the checkpoint); fused all-reduce flags refused (`engine-fusion-multiplier`)"
    )
    #: multipliers far from 1 (Granite 3.0 2B: 12, 0.22, 1/64, 8) so that dropping one shows
    tiny_config: ClassVar[dict | None] = dict(
        model_type="granite", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625, logits_scaling=8.0,
    )

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        attention = float(hf.get("attention_multiplier", 1.0))
        cfg.update({
            "embedding_multiplier": float(hf.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(hf.get("residual_multiplier", 1.0)),
            # the softmax scale times sqrt(head_size), as LLaMAConfig.from_hugging_face stores it - always:
            # upstream's converter leaves 1.0 unscaled, which the engine reads as 1/sqrt(head_size) while
            # transformers' Granite uses a scale of 1.0
            "attention_multiplier": attention * math.sqrt(cfg["head_size"]),
            "output_multiplier_scale": 1.0 / float(hf.get("logits_scaling", 1.0)),
        })
        return cfg

    def semantics(self, cfg: dict) -> Semantics:
        stored = float(cfg["attention_multiplier"])  # = softmax scale * sqrt(head_size)
        return dataclasses.replace(
            super().semantics(cfg),
            embedding_scale=float(cfg["embedding_multiplier"]),
            residual_scale=float(cfg["residual_multiplier"]),
            # softmax scale = 1 / (sqrt(head_size) * q_scaling), q_scaling = 1 / attention_multiplier
            attention_scale=stored / math.sqrt(int(cfg["head_size"])),
            logits_scale=float(cfg["output_multiplier_scale"]),
        )
