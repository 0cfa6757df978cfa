"""Falcon with RoPE (7B multi-query, 40B/180B ``new_decoder_architecture``):
TensorRT-LLM ``FalconForCausalLM`` (tensorrt_llm/models/falcon/).

LayerNorm; one fused ``query_key_value`` grouped per KV head
``(kv_heads, heads/kv_heads + 2, head_dim)`` (covers MHA, MQA and GQA); plain GELU
MLP of ``ffn_hidden_size`` (default 4 x hidden); attention and MLP in parallel
(``parallel_attn``: one shared norm; new architecture: ``ln_attn`` / ``ln_mlp``,
which TensorRT-LLM calls ``input_layernorm`` / ``mlp_layernorm``); biases only
when ``bias``. ALiBi variants (``alibi: true``) are converted only with
``--allow_unsupported`` and are not executed by the reference.
Upstream's Falcon layers do not pass ``spec_decoding_params`` to attention.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, Semantics
from trtllm_medusa_ports.archs.weights import LINEARS, NORMS, Deviation, Role, Source, grouped_qkv
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class FalconAdapter(ArchAdapter):
    hf_architectures = ("FalconForCausalLM", "RWForCausalLM")
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"FalconForCausalLM": NO_CLASS, "RWForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`layer_norm_epsilon != 1e-5` for ln_f, and post_layernorm in the sequential layout (`models/falcon/model.py`: built without `eps`)'
    hf_defaults: ClassVar[dict] = {'layer_norm_epsilon': 1e-05, 'tie_word_embeddings': True, 'hidden_act': 'gelu'}
    norm_epsilon_key = 'layer_norm_epsilon'
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'new_decoder_architecture': True, 'num_kv_heads': 2, 'bias': True}, {'multi_query': False, 'parallel_attn': False, 'bias': True})  # 7B style (multi-query, parallel attention, no bias), 40B style, the plain variant
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0}
    pipeline_test: ClassVar[bool] = True  # verified at pp 2 (see ArchAdapter.pipeline_test)
    family = "falcon"
    upstream_converter = "tensorrt_llm/models/falcon/convert.py"
    model_types = ("falcon", "RefinedWeb", "RefinedWebModel")
    display_note = "RoPE variants"
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = (
        "`trtllm-medusa build`; ALiBi variants rejected"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=256, multi_query=True, parallel_attn=True, bias=False, alibi=False,
        new_decoder_architecture=False, bos_token_id=0, eos_token_id=0,
    )
    trtllm_base_class = "FalconForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['bias', 'new_decoder_architecture', 'num_ln_in_parallel_attn', 'parallel_attention'])
    trtllm_module = "falcon"
    #: norms as in Falcon-7B (parallel attention, one shared norm); ``weight_sources`` adapts them
    layer_prefix = "transformer.h.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "transformer.word_embeddings", Role.QKV: "self_attention.query_key_value",
        Role.DENSE: "self_attention.dense", Role.POST_ATTENTION_NORM: None, Role.FC: "mlp.dense_h_to_4h",
        Role.GATE: None, Role.PROJ: "mlp.dense_4h_to_h", Role.FINAL_NORM: "transformer.ln_f",
    }

    def num_kv_heads(self, hf: HFConfig) -> int:
        if hf.get("new_decoder_architecture"):
            return int(hf.get("num_kv_heads") or self.num_attention_heads(hf))
        return 1 if hf.get("multi_query", True) else self.num_attention_heads(hf)

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(hf.get("ffn_hidden_size") or 4 * self.hidden_size(hf))

    def two_norms(self, hf: HFConfig) -> bool:
        if not hf.get("new_decoder_architecture"):
            return False
        return (hf.get("num_ln_in_parallel_attn") or 2) == 2

    def parallel(self, hf: HFConfig) -> bool:
        return bool(hf.get("new_decoder_architecture") or hf.get("parallel_attn", True))

    def parallel_warnings(self, hf: HFConfig, tp_size: int) -> list[tuple[str, str]]:
        if tp_size > 1 and hf.get("bias", False) and self.parallel(hf):
            return [("Falcon with parallel attention and biases at tp > 1: newer copies of "
                     "tensorrt_llm/models/falcon/model.py are reported to build the dense and MLP output layers "
                     "without a tp_group and all-reduce their sum once, which would add each rank's row biases "
                     "tp_size times; the copy read here adds them once (as the reference executor does), and the "
                     "1.2 file could not be read to settle it",
                     "validate on GPU (scripts/validate_on_gpu.sh) before serving, or serve at tp 1")]
        return []

    def alibi_reason(self, hf: HFConfig) -> str | None:
        return "Falcon with alibi = true" if hf.get("alibi") else None

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        norms = "ln_f" if self.parallel(hf) else "ln_f and post_layernorm"
        return self.default_epsilon_limit(hf, "layer_norm_epsilon", norms)

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.update(
            {
                "hidden_act": "gelu",
                "bias": bool(hf.get("bias", False)),
                "parallel_attention": self.parallel(hf),
                "new_decoder_architecture": bool(hf.get("new_decoder_architecture", False)),
                "num_ln_in_parallel_attn": 2 if self.two_norms(hf) else 1,
                "position_embedding_type": "alibi_with_scale" if hf.get("alibi") else "rope_gpt_neox",
            }
        )
        return cfg

    def weight_sources(self, hf: HFConfig) -> dict[Role, Source]:
        sources = dict(self.weights)
        if self.two_norms(hf):
            sources[Role.INPUT_NORM], sources[Role.MLP_NORM] = self.layer_name("ln_attn"), self.layer_name("ln_mlp")
        elif not self.parallel(hf):
            sources[Role.POST_ATTENTION_NORM] = self.layer_name("post_attention_layernorm")
        return sources

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | (LINEARS if hf.get("bias", False) else frozenset())

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {Role.QKV: Deviation(combine=grouped_qkv(self.num_attention_heads(hf), self.num_kv_heads(hf), self.head_size(hf)))}

    def semantics(self, cfg: dict) -> Semantics:
        parallel = bool(cfg["parallel_attention"])
        two = int(cfg["num_ln_in_parallel_attn"]) == 2
        return dataclasses.replace(
            super().semantics(cfg),
            norm=NormKind.LAYER,
            mlp=MlpKind.PLAIN,
            parallel_residual=parallel,
            shared_input_norm=parallel and not two,
            mlp_norm="mlp_layernorm" if two else "post_layernorm",
        )
