"""GPT-2 (``GPT2LMHeadModel``) and GPTBigCode (StarCoder 1, SantaCoder, WizardCoder: ``GPTBigCodeForCausalLM``) on
TensorRT-LLM's ``GPTForCausalLM`` (``MODEL_MAP`` maps both names to it; tensorrt_llm/models/gpt/{config,convert,
model}.py): learned absolute positions, pre-norm LayerNorms with biases, a plain GELU MLP, biases on every linear,
tied embeddings.

Upstream facts: ``GPTModel.forward`` adds ``position_embedding(position_ids)`` to the token embeddings
(``transformer.position_embedding`` from ``wpe``; ``max_position_embeddings`` from ``n_positions``); the layers
pass ``spec_decoding_params`` to attention. GPT-2's ``Conv1D`` weights are ``[in, out]``, transposed by upstream's
converter for the ``gpt2`` variant (``c_attn`` q, k, v stacked along the output). GPTBigCode's ``nn.Linear``
``c_attn`` stacks ``[q; k; v]`` with one KV head under ``multi_query`` and interleaves them per head
(``(heads, 3, head_dim)``) without it (transformers' ``GPTBigCodeAttention``); upstream's ``starcoder`` variant
forces one KV head, so it cannot convert a ``multi_query: false`` model at all, which this port writes with
its real KV heads.

In a Medusa generation step TensorRT-LLM's runtime gives one position id per sequence (the root's), not one per
tree token (cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp; ``updatesPositionIds()`` excludes Medusa,
cpp/include/tensorrt_llm/runtime/speculativeDecodingMode.h) and ``spec_decoding_position_offsets`` reach only the
attention op: our engine class rebuilds every tree token's position from the two (engine/positions.py).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, PositionEmbedding, Semantics
from trtllm_medusa_ports.archs.weights import (
    LINEARS,
    NORMS,
    Deviation,
    Role,
    Source,
    first_tensor,
    fused_qkv,
    per_head_interleaved_qkv,
    tensor_path,
)
from trtllm_medusa_ports.files.hf_model import HFConfig


@tensor_path("GPT-2's Conv1D weights are [in, out]: transposed")
def _transposed(ts):
    """A ``Conv1D`` weight ``[in, out]`` as a linear's ``[out, in]``."""
    return ts[0].T


def _transposed_qkv(num_heads: int, head_size: int):
    split = fused_qkv(num_heads, num_heads, head_size)

    @tensor_path("GPT-2's Conv1D c_attn is [in, 3 x hidden]: transposed, then split")
    def combine(ts):
        return split([ts[0].T])

    return combine


class _GPTLearnedPositions(LlamaAdapter):
    """What GPT-2 and GPTBigCode share on TensorRT-LLM's GPT class."""

    layer_prefix = "transformer.h.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "transformer.wte", Role.POSITION_EMBEDDING: "transformer.wpe", Role.INPUT_NORM: "ln_1",
        Role.QKV: "attn.c_attn", Role.DENSE: "attn.c_proj", Role.POST_ATTENTION_NORM: "ln_2",
        Role.FC: "mlp.c_fc", Role.GATE: None, Role.PROJ: "mlp.c_proj", Role.FINAL_NORM: "transformer.ln_f",
    }
    norm_epsilon_key = "layer_norm_epsilon"
    max_positions_key = "n_positions"
    activation_key = "activation_function"
    position_embedding = PositionEmbedding.LEARNED_ABSOLUTE
    pipeline_test: ClassVar[bool] = True  # GPTModel sends hidden states between stages
    trtllm_base_class = "GPTForCausalLM"
    trtllm_module = "gpt"
    engine_keys: ClassVar[frozenset[str]] = frozenset(["bias", "gpt_variant"])
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/gpt/model.py GPTDecoderLayer.forward
    ignored_hf_tensors = LlamaAdapter.ignored_hf_tensors + (r".*\.attn\.(masked_)?bias",)
    gpt_variant: ClassVar[str] = ""

    def num_kv_heads(self, hf: HFConfig) -> int:
        return self.num_attention_heads(hf)

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(hf.get("n_inner") or 4 * self.hidden_size(hf))

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.update(gpt_variant=self.gpt_variant, bias=True)
        return cfg

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = []
        if not self.hf_value(hf, "scale_attn_weights"):
            out.append(("scale_attn_weights false: the attention is not scaled by 1 / sqrt(head_dim), which "
                        "TensorRT-LLM's GPT attention always does (q_scaling 1; tensorrt_llm/models/gpt/model.py)",
                        "only a base with scaled attention can be served"))
        if hf.get("scale_attn_by_inverse_layer_idx"):
            out.append(("scale_attn_by_inverse_layer_idx: a per-layer attention scale TensorRT-LLM's GPT class has "
                        "no field for", "only a base without it can be served"))
        return out

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | LINEARS

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN)


@register
class GPT2Adapter(_GPTLearnedPositions):
    hf_architectures = ("GPT2LMHeadModel",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GPT2LMHeadModel": NO_CLASS}
    hf_defaults: ClassVar[dict] = {"layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                                   "activation_function": "gelu_new", "n_positions": 1024, "scale_attn_weights": True}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"n_inner": 96, "tie_word_embeddings": False})
    key_cases: ClassVar[dict | None] = {"layer_norm_epsilon": 3e-06}
    family = "gpt2"
    upstream_converter = "tensorrt_llm/models/gpt/convert.py"
    model_types = ("gpt2",)
    display_note = ""
    position_summary = "learned absolute"
    medusa_status = ("`trtllm-medusa build` (our engine class rebuilds each tree token's position id, which "
                     "TensorRT-LLM's runtime gives once per sequence)")
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=256,
        bos_token_id=1, eos_token_id=2,
    )
    gpt_variant = "gpt2"

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        heads, head = self.num_attention_heads(hf), self.head_size(hf)
        bias_qkv = fused_qkv(heads, heads, head)
        out = {role: Deviation(combine=_transposed, bias_combine=first_tensor)
               for role in (Role.DENSE, Role.FC, Role.PROJ)}
        out[Role.QKV] = Deviation(combine=_transposed_qkv(heads, head), bias_combine=bias_qkv)
        return out


@register
class GPTBigCodeAdapter(_GPTLearnedPositions):
    hf_architectures = ("GPTBigCodeForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GPTBigCodeForCausalLM": NO_CLASS}
    hf_defaults: ClassVar[dict] = {"layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                                   "activation_function": "gelu_pytorch_tanh", "n_positions": 1024,
                                   "scale_attn_weights": True, "multi_query": True}
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"multi_query": False, "n_inner": 96},
                                                 {"tie_word_embeddings": False})
    key_cases: ClassVar[dict | None] = {"layer_norm_epsilon": 3e-06}
    family = "gpt_bigcode"
    upstream_converter = "tensorrt_llm/models/gpt/convert.py"
    model_types = ("gpt_bigcode",)
    display_note = "StarCoder 1, SantaCoder, WizardCoder"
    position_summary = "learned absolute"
    medusa_status = ("`trtllm-medusa build` (tree positions rebuilt by our engine class); multi-query and "
                     "multi-head `c_attn` (upstream's `starcoder` variant forces one KV head)")
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gpt_bigcode", n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=256,
        multi_query=True, bos_token_id=1, eos_token_id=2,
    )
    gpt_variant = "starcoder"

    def num_kv_heads(self, hf: HFConfig) -> int:
        return 1 if self.hf_value(hf, "multi_query") else self.num_attention_heads(hf)

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        heads, kv, head = self.num_attention_heads(hf), self.num_kv_heads(hf), self.head_size(hf)
        split = fused_qkv(heads, kv, head) if kv == 1 else per_head_interleaved_qkv(heads, head)
        return {Role.QKV: Deviation(combine=split)}
