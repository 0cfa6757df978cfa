"""DBRX (Databricks): TensorRT-LLM ``DbrxForCausalLM`` (tensorrt_llm/models/dbrx/{config,model}.py; upstream's
converter: examples/models/contrib/dbrx/convert_checkpoint.py ``convert_hf_dbrx``).

A pre-norm decoder with bias-free LayerNorms (``nn.LayerNorm(d_model, bias=False)``: transformers'
modeling_dbrx.py; no epsilon key, 1e-5 - upstream's converter writes ``norm_epsilon`` 1e-5), GPT-NeoX RoPE whose
base is ``attn_config.rope_theta``, a fused ``Wqkv`` ``[q; k; v]`` (``attn_config.kv_n_heads`` KV heads) clamped to
``attn_config.clip_qkv``, and a mixture of ``ffn_config.moe_num_experts`` SiLU-gated experts routed to
``ffn_config.moe_top_k``: softmax over every expert, the top k, divided by their p-norm for
``moe_normalize_expert_weights`` p (1: their sum, TensorRT-LLM's RENORMALIZE; null: as they are, NONE). The experts
are stored 2-D: ``ffn.experts.mlp.w1`` (gate) and ``v1`` (up) ``[experts x ffn, d_model]``, and ``w2``, the
down-projection, ``[experts x ffn, d_model]`` multiplied as ``x @ w2[e]`` - transposed against ``MOE``'s
``proj`` ``[experts, d_model, ffn]`` (moved by the byte path's transposed blocks). ``MOE``'s ``fc`` is ``[up; gate]``
per expert (``v1`` then ``w1``, as ``convert_hf_dbrx`` concatenates them); the router ``ffn.router.layer`` is
stored in float32. Every setting but the sizes lives in the nested ``attn_config`` / ``ffn_config`` objects, read
through their paths with DbrxAttentionConfig's and DbrxFFNConfig's defaults.

``DbrxDecoderLayer`` passes no ``spec_decoding_params`` to its attention (``trtllm-medusa build`` adds the
plumbing); ``DbrxModel`` sends hidden states between pipeline stages. transformers 5 (5.25 read) computes DBRX's
RoPE from ``rope_parameters`` - its own default 10000 where config.json has none - and ignores
``attn_config.rope_theta`` (500000 on the released model), and fails on ``clip_qkv: null``; both are said by rule
``transformers-divergence`` with the workaround (the engine is right, transformers' reference is not).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.experts import (
    MOE_NONE,
    MOE_RENORMALIZE,
    moe_semantics,
    transposed_experts,
)
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import NormKind, Semantics
from trtllm_medusa_ports.archs.weights import (
    Deviation,
    Role,
    Source,
    WeightRule,
    fused_qkv,
    layout_only,
)
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.files.jsonfile import is_number
from trtllm_medusa_ports.weights.arrays import cat
from trtllm_medusa_ports.weights.sharding import Split


def _up_then_gate(experts: int):
    """``MOE``'s fc per expert, ``[up; gate]``: ``v1``'s and ``w1``'s ``[experts x ffn, d_model]`` viewed per expert
    and stacked along the intermediate dim (a pure layout: the byte path moves it)."""
    @layout_only
    def combine(ts):
        up, gate = (t.reshape((experts, -1, t.shape[-1])) for t in ts)
        return cat([up, gate], dim=1)
    return combine


@register
class DbrxAdapter(ArchAdapter):
    hf_architectures = ("DbrxForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"DbrxForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = ("`ffn_config.moe_normalize_expert_weights` other than 1 or null "
                                            "(`layers/moe.py`: RENORMALIZE divides by the sum, NONE leaves the "
                                            "weights)")
    #: DbrxConfig's, DbrxAttentionConfig's and DbrxFFNConfig's defaults (transformers configuration_dbrx.py)
    hf_defaults: ClassVar[dict] = {
        "tie_word_embeddings": False, "max_seq_len": 2048, "attn_config.rope_theta": 10000.0,
        "attn_config.kv_n_heads": 1, "ffn_config.ffn_hidden_size": 3584, "ffn_config.moe_top_k": 1,
        "ffn_config.moe_num_experts": 4, "ffn_config.moe_normalize_expert_weights": 1.0,
        "ffn_config.ffn_act_fn.name": "silu"}
    norm_epsilon_key = None
    fixed_norm_epsilon = 1e-5  # nn.LayerNorm's default; no config key
    max_positions_key = "max_seq_len"
    activation_key = "ffn_config.ffn_act_fn.name"
    rope_theta_key = "attn_config.rope_theta"
    expert_count_keys: ClassVar[tuple[str, ...]] = ("ffn_config.moe_num_experts",)
    experts_per_token_key = "ffn_config.moe_top_k"
    key_cases: ClassVar[dict | None] = {"attn_config.rope_theta": 12345.0, "ffn_config.moe_top_k": 3}
    test_variants: ClassVar[tuple[dict, ...]] = (
        {}, {"attn_config": {"kv_n_heads": 4, "clip_qkv": 0.05, "rope_theta": 10000.0},
             "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 1,
                            "moe_normalize_expert_weights": None}})  # DbrxConfig refuses tied embeddings
    pipeline_test = True
    family = "dbrx"
    upstream_converter = "examples/models/contrib/dbrx/convert_checkpoint.py"
    model_types = ("dbrx",)
    display_note = "mixture of experts, nested configs"
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = ("`trtllm-medusa build`; tensor and expert parallel; float or weight-only (INT8/INT4) experts; "
                     "FP8 refused (experts)")
    #: clip_qkv small enough to clamp some of the tiny model's q/k/v
    tiny_config: ClassVar[dict | None] = dict(
        model_type="dbrx", d_model=64, n_heads=4, n_layers=2, max_seq_len=256, vocab_size=256,
        attn_config={"kv_n_heads": 2, "clip_qkv": 0.12, "rope_theta": 10000.0},
        ffn_config={"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2},
    )
    trtllm_base_class = "DbrxForCausalLM"
    #: DbrxConfig's own fields (rotary_base / rotary_scaling are every class's)
    engine_keys: ClassVar[frozenset[str]] = frozenset({"bias", "clip_qkv", "moe"})
    trtllm_module = "dbrx"
    layer_prefix = "transformer.blocks.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "transformer.wte", Role.INPUT_NORM: "norm_attn_norm.norm_1",
        Role.QKV: "norm_attn_norm.attn.Wqkv", Role.DENSE: "norm_attn_norm.attn.out_proj",
        Role.POST_ATTENTION_NORM: "norm_attn_norm.norm_2", Role.FC: None, Role.GATE: None, Role.PROJ: None,
        Role.FINAL_NORM: "transformer.norm_f",
    }
    #: the router, kept in float32 (``MOE`` declares it so)
    full_precision_parameters: ClassVar[tuple[str, ...]] = (r".*\.ffn\.router\.layer\.weight",)
    #: the experts' 2-D stores: w1 (gate) and v1 (up) per row, w2 transposed (quant/emulate.py)
    expert_weight_leaves: ClassVar[dict[str, tuple[str, bool]]] = {"w1": ("fc", False), "v1": ("fc", False),
                                                                   "w2": ("proj", True)}

    def num_kv_heads(self, hf: HFConfig) -> int:
        return int(self.hf_value(hf, "attn_config.kv_n_heads"))

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(self.hf_value(hf, "ffn_config.ffn_hidden_size"))

    def expert_field_keys(self, hf: HFConfig) -> tuple[str, str, str]:
        return self.expert_count_keys[0], "ffn_config.ffn_hidden_size", "d_model"

    def normalization(self, hf: HFConfig) -> int | None:
        """TensorRT-LLM's routing for ``moe_normalize_expert_weights``: 1 (DbrxFFNConfig's default where the key is
        left out) is RENORMALIZE, null NONE; another p-norm has none (engine limit)."""
        key = "ffn_config.moe_normalize_expert_weights"
        p = hf.get(key, self.hf_defaults[key])  # present and null: no normalization
        if p is not None and not (is_number(p) and math.isfinite(p)):
            raise ModelError(f"{key} is {json.dumps(p)}: the p of the p-norm the chosen experts' weights are divided "
                             "by (a number; 1 for their sum), or null for none", where=str(hf.path),
                             fix=f"write {key} as the model's published config has it (1 for DBRX)")
        return MOE_NONE if p is None else MOE_RENORMALIZE if float(p) == 1.0 else None

    @staticmethod
    def require_settings(hf: HFConfig) -> None:
        """``attn_config`` / ``ffn_config`` present as objects: null (or left out) would read every setting at its
        config class's default (1 KV head, no clamp, RoPE base 10000, 4 experts routed to 1), which no released DBRX
        has and the weights' shapes alone cannot tell (transformers 4.x reads them so; 5.x fails on a null
        attn_config)."""
        for key, what in (("attn_config", "attention settings"), ("ffn_config", "experts' settings")):
            if not isinstance(hf.get(key), dict):
                raise ModelError(f"{key} is {json.dumps(hf.get(key))}: DBRX keeps its {what} there, and every one "
                                 "would be read at its default", where=str(hf.path),
                                 fix=f"write {key} as the model's published config.json has it")

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        self.require_settings(hf)
        if self.normalization(hf) is None:
            p = hf.get("ffn_config.moe_normalize_expert_weights")
            return [(f"ffn_config.moe_normalize_expert_weights {p}: the chosen experts' weights divided by their "
                     f"{p}-norm, which TensorRT-LLM's MOE does not compute (RENORMALIZE divides by their sum, NONE "
                     "leaves them: tensorrt_llm/layers/moe.py)",
                     "this base cannot be built exactly by TensorRT-LLM's DbrxForCausalLM")]
        return []

    def port_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        act = self.activation(hf)
        if act != "silu":
            return [(f"ffn_config.ffn_act_fn {act}: this port converts SiLU-gated experts only",
                     "convert a DBRX base with SiLU experts (every released DBRX)")]
        return []

    def transformers_divergences(self, hf: HFConfig, transformers_version: str) -> list[tuple[str, str]]:
        major = int(transformers_version.split(".")[0]) if transformers_version[:1].isdigit() else 0
        if major < 5:
            return []
        out = []
        theta = self.rotary_base(hf)
        params = hf.get("rope_parameters")
        theirs = float(params.get("rope_theta", 10000.0)) if isinstance(params, dict) else 10000.0
        if theirs != theta:
            out.append((f"transformers {transformers_version} computes DBRX's RoPE from rope_parameters (base "
                        f"{theirs:g}{'' if isinstance(params, dict) else ', its default: config.json has none'}) and "
                        f"ignores attn_config.rope_theta ({theta:g}), which the engine uses: verify's transformers "
                        "side would not be the model",
                        f'add "rope_parameters": {{"rope_type": "default", "rope_theta": {theta:g}}} to a copy of '
                        "config.json for verify, or verify with transformers 4.x (TensorRT-LLM 1.2's environment "
                        "pins 4.57)"))
        if hf.get("attn_config.clip_qkv") is None:
            out.append((f"transformers {transformers_version} fails on DBRX with clip_qkv null (torch.clamp with no "
                        "bound); the engine skips the clamp",
                        "verify with transformers 4.x (TensorRT-LLM 1.2's environment pins 4.57)"))
        return out

    def trtllm_config(self, hf: HFConfig) -> dict:
        self.require_settings(hf)
        cfg = super().trtllm_config(hf)
        cfg.update(hidden_act="swiglu", bias=False, clip_qkv=hf.get("attn_config.clip_qkv"),
                   moe=self.moe_block(hf, self.normalization(hf) or MOE_NONE))
        return cfg

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        return {Role.QKV: Deviation(combine=fused_qkv(self.num_attention_heads(hf), self.num_kv_heads(hf),
                                                      self.head_size(hf)))}

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        ffn, experts = self.layer_name("ffn."), self.num_experts(hf)
        return super().layer_rules(hf) + [
            WeightRule("mlp.router.weight", (f"{ffn}router.layer.weight",), Split.REPLICATE, dtype="float32"),
            WeightRule("mlp.fc.weight", (f"{ffn}experts.mlp.v1", f"{ffn}experts.mlp.w1"), Split.EXPERT_PAIR,
                       _up_then_gate(experts), experts=True),
            WeightRule("mlp.proj.weight", (f"{ffn}experts.mlp.w2",), Split.EXPERT_ROW, transposed_experts(experts),
                       experts=True),
        ]

    def semantics(self, cfg: dict) -> Semantics:
        sem = dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, clip_qkv=cfg.get("clip_qkv"))
        return moe_semantics(sem, cfg)
