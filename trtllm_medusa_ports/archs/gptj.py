"""GPT-J: TensorRT-LLM ``GPTJForCausalLM`` (tensorrt_llm/models/gptj/).

One LayerNorm with bias (``ln_1``) feeds attention and MLP in parallel, ``x + attn(ln(x)) + mlp(ln(x))``;
separate q/k/v and ``out_proj`` without bias; partial interleaved RoPE over the first ``rotary_dim``
features (``rope_gptj``; transformers' ``rotate_every_two``) with base 10000; a plain MLP ``fc_in`` /
``fc_out`` with biases and ``gelu_new``; ``ln_f``; an lm_head with bias.

Upstream facts (tensorrt_llm/models/gptj/{config,model,convert}.py): ``GPTJConfig`` adds only
``rotary_dim``; ``GPTJDecoderLayer`` builds attention without bias and with
``rotary_embedding_percentage = rotary_dim / head_size`` (multi-head: no ``num_kv_heads``), an ``MLP`` of
``4 x hidden`` (``n_inner`` is not read) with bias and ``hidden_act = "gelu"`` (the tanh form, which is
``gelu_new``), and ``ln_f`` without ``eps`` (1e-5). Its attention and MLP do no all-reduce of their own:
the layer sums them and all-reduces once, so every rank adds ``mlp.proj``'s bias and convert.py writes
that bias on rank 0 only, zeros elsewhere (``Split.FIRST_RANK``). The model has no ``spec_decoding_params``
(``trtllm-medusa build`` adds the plumbing) and no pipeline stages (every rank embeds, no recv/send).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import NO_CLASS, PyTorchModel
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, PositionEmbedding, Semantics
from trtllm_medusa_ports.archs.weights import Deviation, Role, Source
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.weights.sharding import Split

#: activations TensorRT-LLM's "gelu" (the tanh approximation) computes exactly
_TANH_GELUS = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")


@register
class GPTJAdapter(ArchAdapter):
    hf_architectures = ("GPTJForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"GPTJForCausalLM": NO_CLASS}
    engine_limits_summary: ClassVar[str] = '`n_inner != 4 x n_embd`, `layer_norm_epsilon != 1e-5` for ln_f, an `activation_function` other than a tanh GELU (`models/gptj/model.py`: a 4 x hidden MLP, `"gelu"`, ln_f without `eps`)'
    max_positions_key = 'n_positions'
    hf_defaults: ClassVar[dict] = {'n_positions': 2048, 'layer_norm_epsilon': 1e-05, 'tie_word_embeddings': False, 'hidden_act': 'gelu_new'}
    norm_epsilon_key = 'layer_norm_epsilon'
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {"rotary_dim": 16, "tie_word_embeddings": True})
    key_cases: ClassVar[dict | None] = {"rotary_dim": 4}
    family = "gptj"
    upstream_converter = "tensorrt_llm/models/gptj/convert.py"
    model_types = ("gptj",)
    display_note = ""
    position_summary = "partial RoPE (GPT-J, interleaved)"
    medusa_status = "`trtllm-medusa build`, pp 1 only, multi-head attention only"
    tiny_config: ClassVar[dict | None] = dict(
        model_type="gptj", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256, vocab_size=256,
        layer_norm_epsilon=1e-5, activation_function="gelu_new", tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )
    trtllm_base_class = "GPTJForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset()  # the engine class reads the common keys only
    trtllm_module = "gptj"
    engine_pipeline_parallel = False  # tensorrt_llm/models/gptj/model.py: no send/recv between stages
    position_embedding = PositionEmbedding.ROPE_GPTJ
    layer_prefix = "transformer.h.{i}."
    names: ClassVar[dict[Role, Source | None]] = {
        Role.EMBEDDING: "transformer.wte", Role.INPUT_NORM: "ln_1",
        Role.QKV: ("attn.q_proj", "attn.k_proj", "attn.v_proj"), Role.DENSE: "attn.out_proj",
        Role.POST_ATTENTION_NORM: None, Role.FC: "mlp.fc_in", Role.GATE: None, Role.PROJ: "mlp.fc_out",
        Role.FINAL_NORM: "transformer.ln_f",
    }
    # older checkpoints carry the causal-mask buffers of transformers' GPTJAttention
    ignored_hf_tensors = ArchAdapter.ignored_hf_tensors + (r".*attn\.(masked_)?bias", r".*attn\.embed_positions")

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(hf.get("n_inner") or 4 * self.hidden_size(hf))

    def exact_gelu(self, hf: HFConfig) -> bool:
        return hf.get("activation_function") == "gelu"

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.pop("rotary_scaling")  # GPTJConfig reads no scaling (transformers' GPT-J has none)
        cfg["hidden_act"] = "gelu"  # GPTJDecoderLayer's own; the tanh form, which is gelu_new
        cfg["rotary_base"] = 10000.0  # GPT-J's, and what the engine's attention builds (no config key)
        cfg["rotary_dim"] = int(hf.get("rotary_dim") or self.head_size(hf))  # GPTJConfig's own field
        return cfg

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        out = self.default_epsilon_limit(hf, "layer_norm_epsilon", "ln_f")
        cls = "TensorRT-LLM's GPTJForCausalLM"
        if self.intermediate_size(hf) != 4 * self.hidden_size(hf):
            out.append((f"n_inner {hf.get('n_inner')} is not 4 x n_embd ({4 * self.hidden_size(hf)}); {cls} always "
                        "builds a 4 x hidden MLP (tensorrt_llm/models/gptj/model.py)",
                        f"this base cannot be built by {cls}"))
        act = hf.get("activation_function") or "gelu_new"
        if act not in _TANH_GELUS and act != "gelu":  # exact gelu: rule gelu-approximation warns
            out.append((f"activation_function {act!r}: {cls} always computes the tanh GELU",
                        f"this base cannot be built by {cls}"))
        return out

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return frozenset({Role.INPUT_NORM, Role.FC, Role.PROJ, Role.FINAL_NORM, Role.LM_HEAD})

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        # the layer all-reduces attention + MLP once, and every rank adds its copy of fc_out's bias
        return {Role.PROJ: Deviation(bias_split=Split.FIRST_RANK)}

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN,
                                   parallel_residual=True, shared_input_norm=True, row_bias_every_rank=True)
