"""OPT (``OPTForCausalLM``): TensorRT-LLM ``OPTForCausalLM`` (tensorrt_llm/models/opt/model.py; upstream's converter:
examples/models/contrib/opt/convert_checkpoint.py ``convert_hf_opt``).

Learned absolute positions whose table carries two rows more than the context (transformers'
``OPTLearnedPositionalEmbedding`` adds an offset of 2 to every position id; upstream's converter writes
``embed_positions[2:]``, so the engine's row p is the base's position p); LayerNorms with biases (no epsilon key:
``nn.LayerNorm``'s 1e-5, as the engine's ``LayerNorm``); separate q / k / v and ``out_proj`` with biases; a plain MLP
``fc1`` / ``fc2`` (``ffn_dim``) with ``activation_function`` (ReLU); the lm_head tied to the token embedding.

Upstream facts (tensorrt_llm/models/opt/model.py, 1.2): ``OPTDecoderLayer`` normalises before attention and MLP where
``do_layer_norm_before`` (``input_layernorm``, ``post_layernorm``) and after them otherwise; ``OPTModel`` adds
``position_embedding(position_ids)`` to the token embeddings, applies ``ln_f`` only where ``do_layer_norm_before``,
and has no pipeline stages (no send / recv); its ``forward(**kwargs)`` swallows ``spec_decoding_params`` and the
layers never pass it (``trtllm-medusa build`` adds the plumbing); ``OPTForCausalLM.check_config`` defaults
``do_layer_norm_before`` to False - the opposite of transformers' OPTConfig - so the checkpoint always writes it.
``Attention`` and ``MLP`` are built with biases and ``LayerNorm`` with weight and bias whatever the config says.
As for GPT-2, TensorRT-LLM's runtime gives one position id per generation request in a Medusa step: our engine class
rebuilds each tree token's (engine/positions.py).

Post-norm bases (``do_layer_norm_before: false``) normalise after each residual add and have no final norm
(``Semantics.post_norm``, ``final_norm``). Not converted (rule ``port-limit``): a ``word_embed_proj_dim`` other than
``hidden_size`` (OPT-350m's ``project_in`` / ``project_out``: transformers' Medusa heads read the state after
``project_out``, which the engine hands them before it).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, PositionEmbedding, Semantics
from trtllm_medusa_ports.archs.weights import LINEARS, NORMS, Deviation, Role, Source, tensor_path
from trtllm_medusa_ports.files.hf_model import HFConfig

#: rows transformers' OPTLearnedPositionalEmbedding keeps before position 0
POSITION_OFFSET = 2


@tensor_path("OPT's position table starts 2 rows late: the first two rows are dropped")
def _from_position_zero(ts):
    """transformers' table ``[max_positions + 2, hidden]`` as the engine's ``[max_positions, hidden]``."""
    return ts[0][POSITION_OFFSET:]


@register
class OPTAdapter(ArchAdapter):
    hf_architectures = ("OPTForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"OPTForCausalLM": NO_CLASS}
    hf_defaults: ClassVar[dict] = {"activation_function": "relu", "max_position_embeddings": 2048, "ffn_dim": 3072,
                                   "tie_word_embeddings": True, "do_layer_norm_before": True, "enable_bias": True,
                                   "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False}
    engine_limits_summary: ClassVar[str] = ("`enable_bias: false`, `layer_norm_elementwise_affine: false`, "
                                            "`_remove_final_layer_norm: true` (`models/opt/model.py`: biases and "
                                            "norm parameters always built, `ln_f` with every pre-norm base)")
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"ffn_dim": 96, "tie_word_embeddings": False},
                                                 {"do_layer_norm_before": False})
    key_cases: ClassVar[dict | None] = {"activation_function": "gelu"}
    check_cases: ClassVar[tuple[tuple[dict, str], ...]] = (
        ({"word_embed_proj_dim": 32}, "port-limit"), ({"enable_bias": False}, "engine-class-limit"))
    family = "opt"
    upstream_converter = "examples/models/contrib/opt/convert_checkpoint.py"
    model_types = ("opt",)
    display_note = ""
    position_summary = "learned absolute (offset 2)"
    medusa_status = ("`trtllm-medusa build` (adds the plumbing and each tree token's position id), pp 1 only; "
                     "pre- and post-norm; `word_embed_proj_dim != hidden_size` (OPT-350m) refused")
    tiny_config: ClassVar[dict | None] = dict(
        model_type="opt", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
        max_position_embeddings=256, vocab_size=256, word_embed_proj_dim=64, do_layer_norm_before=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    trtllm_base_class = "OPTForCausalLM"
    trtllm_module = "opt"
    upstream_config_class = False  # the class takes PretrainedConfig (tensorrt_llm/models/opt/)
    engine_keys: ClassVar[frozenset[str]] = frozenset({"do_layer_norm_before"})
    engine_pipeline_parallel = False  # tensorrt_llm/models/opt/model.py: no send / recv between stages
    position_embedding = PositionEmbedding.LEARNED_ABSOLUTE
    norm_epsilon_key = None
    fixed_norm_epsilon = 1e-5  # nn.LayerNorm's default in transformers' OPT; the engine's LayerNorm's
    activation_key = "activation_function"
    layer_prefix = "model.decoder.layers.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "model.decoder.embed_tokens", Role.POSITION_EMBEDDING: "model.decoder.embed_positions",
        Role.INPUT_NORM: "self_attn_layer_norm",
        Role.QKV: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), Role.DENSE: "self_attn.out_proj",
        Role.POST_ATTENTION_NORM: "final_layer_norm", Role.FC: "fc1", Role.GATE: None, Role.PROJ: "fc2",
        Role.FINAL_NORM: "model.decoder.final_layer_norm",
    }

    def num_kv_heads(self, hf: HFConfig) -> int:
        return self.num_attention_heads(hf)

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(self.hf_value(hf, "ffn_dim"))  # OPTConfig's 3072 where config.json leaves it out

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg["do_layer_norm_before"] = bool(self.hf_value(hf, "do_layer_norm_before"))  # the engine's default: False
        return cfg

    def weight_sources(self, hf: HFConfig) -> dict[Role, Source]:
        sources = super().weight_sources(hf)
        if not self.hf_value(hf, "do_layer_norm_before"):  # post-norm: transformers' OPT has no final norm
            sources.pop(Role.FINAL_NORM, None)
        return sources

    def port_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = []
        proj = hf.get("word_embed_proj_dim")
        if proj is not None and proj != self.hidden_size(hf):
            out.append((f"word_embed_proj_dim {proj} is not hidden_size {self.hidden_size(hf)}: transformers applies "
                        "project_out between the decoder and the lm_head, where Medusa heads read the state after "
                        "it; TensorRT-LLM's OPT class has no project_out (upstream's converter folds it into the "
                        "lm_head), so the engine would hand the heads the state before it",
                        "convert an OPT whose word_embed_proj_dim equals hidden_size"))
        return out

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        cls = "TensorRT-LLM's OPTForCausalLM"
        out = []
        for key, value, what in (("enable_bias", False, "builds every linear with a bias"),
                                 ("layer_norm_elementwise_affine", False, "builds every LayerNorm with a weight and a "
                                                                          "bias"),
                                 ("_remove_final_layer_norm", True, "applies ln_f after the last pre-norm layer")):
            if bool(self.hf_value(hf, key)) == value:
                out.append((f"{key} {str(value).lower()}: {cls} always {what} (tensorrt_llm/models/opt/model.py)",
                            f"this base cannot be built by {cls}"))
        return out

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | LINEARS

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {Role.POSITION_EMBEDDING: Deviation(combine=_from_position_zero)}

    def semantics(self, cfg: dict) -> Semantics:
        pre = bool(cfg["do_layer_norm_before"])
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN, post_norm=not pre,
                                   final_norm=pre)
