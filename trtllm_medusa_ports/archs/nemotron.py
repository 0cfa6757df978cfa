"""NVIDIA Nemotron (Nemotron-4, Minitron): TensorRT-LLM ``GPTForCausalLM`` with ``gpt_variant = "nemotron"``
(``MODEL_MAP`` maps ``NemotronForCausalLM`` to it; tensorrt_llm/models/gpt/{config,convert,model}.py).

Llama names, except: the plain MLP ``up_proj`` -> squared ReLU -> ``down_proj`` (no gate; TensorRT-LLM's
``MLP`` with ``hidden_act = "squared-relu"``, which ``ACT2FN`` maps to ``pow(relu(x), 2)``:
tensorrt_llm/functional.py), and ``NemotronLayerNorm1P`` norms: a LayerNorm with a bias that scales by
``w + 1``. TensorRT-LLM's GPT layers build plain ``LayerNorm`` s, so upstream's converter adds 1 to the
weights of ``input_layernorm``, ``post_attention_layernorm`` and the final ``norm`` and keeps their biases
(tensorrt_llm/models/gpt/convert.py ``load_weights_from_hf_model``): ``plus_one`` on the weight alone,
computed in float32 before the cast. RoPE rotates the first ``partial_rotary_factor`` of each head
(GPT-NeoX halves: ``rope_gpt_neox`` with ``rotary_pct``; transformers' default factor is 0.5). The GPT
``Attention`` takes ``attention_head_size = config.head_size``, so a ``head_dim`` other than
``hidden / heads`` is written as ``head_size``.

Where we depart from upstream's converter: it writes ``bias = False`` whatever the config (Hugging Face
linear biases would be dropped with a warning); the GPT class has one ``bias`` for attention and MLP, so
we write it from ``attention_bias`` / ``mlp_bias`` and refuse the two differing (rule ``engine-class-limit``).
Upstream's GPT layers pass ``spec_decoding_params`` to attention (``GPTDecoderLayer.forward``), but upstream
Medusa cannot wrap a GPT base (tensorrt_llm/models/medusa/config.py reads ``rms_norm_eps``), so Nemotron
builds with ``trtllm-medusa build``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, no_capture
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, Semantics
from trtllm_medusa_ports.archs.weights import (
    LINEARS,
    NORMS,
    Deviation,
    Role,
    Source,
    first_tensor,
    plus_one,
)
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class NemotronAdapter(LlamaAdapter):
    hf_architectures = ("NemotronForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"NemotronForCausalLM": no_capture("modeling_nemotron.py")}
    hf_defaults: ClassVar[dict] = {"norm_eps": 1e-05, "tie_word_embeddings": False, "hidden_act": "relu2",
                                   "partial_rotary_factor": 0.5}
    norm_epsilon_key = "norm_eps"
    test_variants: ClassVar[tuple[dict, ...]] = (
        {}, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
        {"num_key_value_heads": 4, "head_dim": 32, "partial_rotary_factor": 0.25},
    )
    key_cases: ClassVar[dict | None] = {"rope_theta": 12345.0, "norm_eps": 3e-06, "partial_rotary_factor": 0.25}
    pipeline_test: ClassVar[bool] = True  # GPTModel has send/recv between stages
    #: the MLP squares its input: norms of 1e3 would put the tiny model's hidden states past float16's range
    #: (about 7e4); 300 gives 3e3, where both half-precision roundings still matter
    magnitude_test_norm_offset: ClassVar[float] = 300.0
    engine_limits_summary: ClassVar[str] = ('`attention_bias != mlp_bias` (`models/gpt/model.py`: one `bias` for the '
                                            'attention and MLP linears)')
    family = "nemotron"
    upstream_converter = "tensorrt_llm/models/gpt/convert.py"
    model_types = ("nemotron",)
    display_note = "Nemotron-4, Minitron"
    position_summary = "partial RoPE (GPT-NeoX)"
    medusa_status = "`trtllm-medusa build` (upstream has the plumbing, not the Medusa wrapper)"
    tiny_config: ClassVar[dict | None] = dict(
        model_type="nemotron", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    trtllm_base_class = "GPTForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(["bias", "gpt_variant"])
    trtllm_module = "gpt"
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/gpt/model.py GPTDecoderLayer.forward
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: "mlp.up_proj", Role.GATE: None}

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        act = cfg["hidden_act"]  # transformers' relu2 is TensorRT-LLM's squared-relu (upstream writes that name)
        cfg.update(gpt_variant="nemotron", bias=self.attn_bias(hf), rotary_pct=self.rotary_fraction(hf),
                   hidden_act="squared-relu" if act == "relu2" else act)
        return cfg

    def attn_bias(self, hf: HFConfig) -> bool:
        return bool(hf.get("attention_bias", False))

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        if self.attn_bias(hf) != self.mlp_bias(hf):
            return [(f"attention_bias {self.attn_bias(hf)} with mlp_bias {self.mlp_bias(hf)}: TensorRT-LLM's GPT "
                     "class has one bias flag for its attention and MLP linears (tensorrt_llm/models/gpt/model.py)",
                     "only a base with both or neither can be served")]
        return []

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | (LINEARS if self.attn_bias(hf) else frozenset())

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        # LayerNorm1P scales by w + 1 and adds its bias as it is: w + 1 stored, the bias unchanged
        return {role: Deviation(combine=plus_one, bias_combine=first_tensor) for role in NORMS}

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN)
