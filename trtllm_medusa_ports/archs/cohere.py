"""Cohere Command-R: TensorRT-LLM ``CohereForCausalLM`` (tensorrt_llm/models/commandr/).

Llama's tensor names with another layer: one LayerNorm without bias (``CohereLayerNorm``: mean
subtracted, weight only) feeds attention and MLP in parallel, ``x + attn(ln(x)) + mlp(ln(x))``, with
no post-attention norm; interleaved RoPE over the whole head (``rope_gptj``: transformers'
``repeat_interleave`` of the frequencies); the logits multiplied by ``logit_scale``.

Upstream facts (tensorrt_llm/models/commandr/config.py ``CohereConfig.from_hugging_face``, model.py):
``norm_epsilon`` <- ``layer_norm_eps``, ``output_multiplier_scale`` <- ``logit_scale`` (applied to the
base's logits after ``lm_head`` by ``DecoderModelForCausalLM.forward``, the Medusa heads' not),
``rotary_base`` <- ``rope_theta`` (``rope_scaling`` is not read), ``attn_bias`` <- ``attention_bias``
(qkv and dense), ``head_size = hidden_size // num_attention_heads`` (``head_dim`` is not read);
``CohereDecoderLayer`` builds ``LayerNorm(bias=False, eps=norm_epsilon)`` and a ``GatedMLP`` without
bias (``mlp.fc`` <- ``gate_proj``, ``mlp.gate`` <- ``up_proj``), and ``CohereModel`` always splits the
vocabulary embedding over the tensor-parallel ranks. The layer and the model pass
``spec_decoding_params`` to attention and send hidden states between pipeline stages.
``use_qk_norm`` (Command R+ 08-2024) is this port's limit: its per-head q/k LayerNorms are not
converted yet.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import NormKind, PositionEmbedding, Semantics
from trtllm_medusa_ports.archs.weights import Role, Source
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class CohereAdapter(LlamaAdapter):
    hf_architectures = ("CohereForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"CohereForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`head_dim != hidden_size / num_attention_heads`, `rope_scaling` set (`models/commandr/config.py` derives the head size and reads no scaling)'
    hf_defaults: ClassVar[dict] = {'layer_norm_eps': 1e-05, 'tie_word_embeddings': True, 'hidden_act': 'silu'}
    norm_epsilon_key = 'layer_norm_eps'
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"attention_bias": True, "tie_word_embeddings": False,
                                                      "num_key_value_heads": 4})
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "layer_norm_eps": 3e-6}
    pipeline_test: ClassVar[bool] = True  # verified at pp 2 (see ArchAdapter.pipeline_test)
    family = "cohere"
    upstream_converter = "tensorrt_llm/models/commandr/model.py"
    model_types = ("cohere",)
    display_note = "Command-R"
    position_summary = "RoPE (GPT-J, interleaved), logit scale"
    medusa_status = "`trtllm-medusa build`; `use_qk_norm` refused (`port-limit`)"
    #: a logit scale far from 1 so that dropping it shows
    tiny_config: ClassVar[dict | None] = dict(
        model_type="cohere", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        layer_norm_eps=1e-5, rope_theta=10000.0, logit_scale=0.25, tie_word_embeddings=True,
        use_qk_norm=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    trtllm_base_class = "CohereForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['attn_bias', 'output_multiplier_scale'])
    trtllm_module = "commandr"
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/commandr/model.py CohereDecoderLayer.forward
    position_embedding = PositionEmbedding.ROPE_GPTJ
    names: ClassVar[dict[Role, Source | None]] = {Role.POST_ATTENTION_NORM: None}  # one norm for both branches

    def attn_bias(self, hf: HFConfig) -> bool:
        return bool(hf.get("attention_bias", False))

    def mlp_bias(self, hf: HFConfig) -> bool:
        return False  # CohereDecoderLayer builds its GatedMLP without bias

    def forced_parallel_embedding(self, tp_size: int) -> bool | None:
        # CohereModel builds its Embedding with the tensor-parallel group, split on the vocabulary,
        # whatever the checkpoint's use_parallel_embedding (tensorrt_llm/models/commandr/model.py)
        return tp_size > 1

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.pop("rotary_scaling")  # not read by CohereConfig (engine_limits refuses a scaled RoPE)
        scale = hf.get("logit_scale", 0.0625)  # CohereConfig's default; a number (files/hf_model.py) or null
        if scale is None:
            raise ModelError("field logit_scale is null; Cohere multiplies its logits by it (a number)",
                             where=str(hf.path), fix="write the original model's logit_scale, or remove the field "
                                                     "for CohereConfig's default 0.0625")
        cfg["output_multiplier_scale"] = float(scale)
        return cfg

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = []
        head_dim, derived = hf.get("head_dim"), self.hidden_size(hf) // self.num_attention_heads(hf)
        if isinstance(head_dim, int) and head_dim != derived:
            out.append((f"head_dim {head_dim} differs from hidden_size / num_attention_heads ({derived}), the head "
                        "size TensorRT-LLM's CohereConfig always uses (tensorrt_llm/models/commandr/config.py)",
                        "this base cannot be built exactly by TensorRT-LLM's CohereForCausalLM"))
        if hf.rope_scaling:
            out.append((f"rope_scaling {hf.rope_scaling} is not read by TensorRT-LLM's CohereConfig "
                        "(tensorrt_llm/models/commandr/config.py): the engine would rotate unscaled",
                        "this base cannot be built exactly by TensorRT-LLM's CohereForCausalLM"))
        return out

    def port_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        if hf.get("use_qk_norm"):
            return [("use_qk_norm: the per-head q/k LayerNorms (attention.q_layernorm / k_layernorm) are not "
                     "converted or verified by this port yet",
                     "convert a Command-R without use_qk_norm, or add the norms to trtllm_medusa_ports/archs/cohere.py "
                     "(docs/porting-guide.md)")]
        return []

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, parallel_residual=True,
                                   shared_input_norm=True, logits_scale=float(cfg["output_multiplier_scale"]))
