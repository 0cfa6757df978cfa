"""Phi-3.5-MoE: the mixture-of-experts variant of TensorRT-LLM's ``Phi3ForCausalLM`` (tensorrt_llm/models/phi3/).

Upstream facts:
* the variant is chosen by name: ``Phi3DecoderLayer``, ``Phi3Model`` and ``Phi3ForCausalLM`` (model.py) compare
  ``config.architecture`` with ``"PhiMoEForCausalLM"`` - the name Microsoft's config.json carries; transformers
  saves the same model as ``PhimoeForCausalLM`` - so the checkpoint records the engine's spelling
  (``engine_architecture``), whichever the base was saved under;
* the variant's norms are ``LayerNorm`` with bias (eps ``norm_epsilon`` <- HF ``rms_norm_eps``, though transformers
  builds ``nn.LayerNorm`` with it), its attention has a bias on qkv and dense, its lm_head a bias; these are built
  whatever HF's ``attention_bias`` / ``lm_head_bias`` say (config.py passes ``attention_bias`` on; model.py reads
  none), so a base without those biases is an engine-class limit;
* ``Phi3Config.from_hugging_face`` (config.py) writes ``moe``: ``num_local_experts`` experts, ``num_experts_per_tok``
  per token, SPARSE_MIXER routing with ``sparse_mixer_epsilon`` <- ``router_jitter_noise``; a ``moe`` field makes
  the MLP ``MOE`` (no bias), its ``MoeConfig`` set field by field from the dict; ``hidden_act`` "swiglu" (silu);
  long contexts (``longrope``) add ``longrope_short_mscale`` / ``longrope_long_mscale`` beside the factors;
* upstream converts this variant in ``Phi3ForCausalLM.from_hugging_face`` (model.py) through ``ModelWeightsLoader``
  (tensorrt_llm/models/model_weights_loader.py) whenever a quantization config is given, as
  examples/models/core/phi/convert_checkpoint.py always gives one (that script also refuses the transformers
  spelling ``PhimoeForCausalLM``); ``trtllm_modules_to_hf_modules`` maps q/k/v/o_proj and the experts ``w1``
  (the activated gate), ``w3`` (up), ``w2`` (down), router ``gate``, into ``MOE``'s own layout: ``mlp.fc`` per
  expert ``[up; gate]``, ``mlp.proj``, ``mlp.router`` in float32 (tensorrt_llm/layers/moe.py) - Mixtral's layout;
* no send/recv between pipeline stages and no ``spec_decoding_params`` (Phi-3's class).

transformers' ``sparsemixer`` (modeling_phimoe.py) always picks two experts while the engine's SPARSE_MIXER routes
``top_k`` rounds: another ``num_experts_per_tok`` is refused. Phi3ForCausalLM attends to the whole context: a
``sliding_window`` shorter than it gets the sliding-window rule's warning (build with ``max_seq_len`` within the
window) as every family does; Phi-3.5-MoE's own window is its whole context.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.experts import (
    MOE_SPARSE_MIXER,
    moe_semantics,
    per_expert_rules,
)
from trtllm_medusa_ports.archs.phi3 import Phi3Adapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import NormKind, Semantics
from trtllm_medusa_ports.archs.weights import (
    LLAMA_NAMES,
    NORMS,
    Deviation,
    Role,
    Source,
    WeightRule,
)
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.files.jsonfile import is_int


@register
class PhiMoEAdapter(Phi3Adapter):
    hf_architectures = ("PhimoeForCausalLM", "PhiMoEForCausalLM")
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"PhimoeForCausalLM": NO_CLASS, "PhiMoEForCausalLM": NO_CLASS}
    engine_architecture = "PhiMoEForCausalLM"
    engine_limits_summary: ClassVar[str] = (
        "`num_experts_per_tok != 2`, `attention_bias` or `lm_head_bias` false (`models/phi3/model.py` builds both)")
    hf_defaults: ClassVar[dict] = {"rms_norm_eps": 1e-05, "tie_word_embeddings": False, "hidden_act": "silu",
                                   "attention_bias": False, "lm_head_bias": False, "router_jitter_noise": 0.01}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"num_key_value_heads": 4, "router_jitter_noise": 0.2})
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "rms_norm_eps": 3e-06, "router_jitter_noise": 0.05}
    check_cases: ClassVar[tuple[tuple[dict, str], ...]] = (
        ({"num_experts_per_tok": 1}, "engine-class-limit"), ({"attention_bias": False}, "engine-class-limit"),
        ({"lm_head_bias": False}, "engine-class-limit"))
    family = "phimoe"
    #: ``Phi3ForCausalLM.from_hugging_face``, which converts this variant through ModelWeightsLoader
    upstream_converter = "tensorrt_llm/models/phi3/model.py"
    model_types = ("phimoe",)
    display_note = "Phi-3.5-MoE, mixture of experts"
    position_summary = "RoPE (GPT-NeoX; longrope for 128k)"
    medusa_status = ("`trtllm-medusa build`, pp 1 only; tensor and expert parallel; longrope verified for prompts "
                     "within original_max_position_embeddings - max_draft_len")
    tiny_config: ClassVar[dict | None] = dict(
        model_type="phimoe", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
        num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.01, input_jitter_noise=0.0,
        attention_bias=True, lm_head_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    #: Phi3Config keeps ``moe`` as the dict it is given (model.py sets its fields on a MoeConfig)
    engine_keys: ClassVar[frozenset[str]] = Phi3Adapter.engine_keys | {
        "moe", "longrope_short_mscale", "longrope_long_mscale"}
    names: ClassVar[dict[Role, Source | None]] = {
        Role.QKV: LLAMA_NAMES[Role.QKV], Role.FC: None, Role.GATE: None, Role.PROJ: None,  # experts instead
    }
    #: the router, kept in float32 (transformers 5 names it mlp.router, 4 block_sparse_moe.gate)
    full_precision_parameters: ClassVar[tuple[str, ...]] = (
        r".*\.mlp\.router\.weight", r".*\.block_sparse_moe\.gate\.weight")

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["moe"] = self.moe_block(hf, MOE_SPARSE_MIXER, float(self.hf_value(hf, "router_jitter_noise")))
        if cfg["position_embedding_type"] == "long_rope":
            scaling = hf.rope_scaling
            cfg["longrope_short_mscale"] = scaling.get("short_mscale")
            cfg["longrope_long_mscale"] = scaling.get("long_mscale")
            self.refuse_unusable_longrope(hf, cfg)
        return cfg

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = []
        top_k = hf.get(self.experts_per_token_key)
        if is_int(top_k) and top_k != 2:
            out.append((f"num_experts_per_tok {top_k}: transformers' sparsemixer always routes a token to two experts, "
                        "TensorRT-LLM's SPARSE_MIXER routes num_experts_per_tok rounds (moe_kernels.cu)",
                        "Phi-3.5-MoE is served with num_experts_per_tok 2"))
        for key, what in (("attention_bias", "qkv and dense biases"), ("lm_head_bias", "an lm_head bias")):
            if not self.hf_value(hf, key):
                out.append((f"{key} is false, but TensorRT-LLM's PhiMoE variant of Phi3ForCausalLM builds {what} "
                            "(tensorrt_llm/models/phi3/model.py) and would find no weights for them",
                            "this base cannot be built by TensorRT-LLM's Phi3ForCausalLM"))
        return out

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | {Role.QKV, Role.DENSE, Role.LM_HEAD}

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {}  # separate q/k/v (stacked by the QKV split), no fused MLP: the experts have rules of their own

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        return super().layer_rules(hf) + per_expert_rules(
            self.layer_name("block_sparse_moe."), self.num_experts(hf), up="w3", gate="w1", down="w2")

    def semantics(self, cfg: dict) -> Semantics:
        return moe_semantics(dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER), cfg)
