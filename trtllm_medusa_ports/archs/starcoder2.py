"""StarCoder2: TensorRT-LLM ``GPTForCausalLM`` with ``gpt_variant = "starcoder2"``
(tensorrt_llm/models/gpt/{config,convert}.py).

Llama names, except: LayerNorm with bias (eps ``norm_epsilon``), q/k/v/o and the
plain MLP ``c_fc``/``c_proj`` carry biases when ``use_bias``, GELU (tanh), GQA,
optional sliding window. Upstream's GPT layers *do* pass ``spec_decoding_params``
to attention, but upstream Medusa cannot wrap a GPT base.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from trtllm_medusa_ports.archs.llama import LlamaAdapter
from trtllm_medusa_ports.archs.pytorch_backend import PyTorchModel, two_model
from trtllm_medusa_ports.archs.registry import register
from trtllm_medusa_ports.archs.semantics import MlpKind, NormKind, Semantics
from trtllm_medusa_ports.archs.weights import LINEARS, NORMS, Role, Source
from trtllm_medusa_ports.files.hf_model import HFConfig


@register
class Starcoder2Adapter(LlamaAdapter):
    hf_architectures = ("Starcoder2ForCausalLM",)
    pytorch_models: ClassVar[dict[str, PyTorchModel]] = {"Starcoder2ForCausalLM": two_model("modeling_starcoder2.py")}
    hf_defaults: ClassVar[dict] = {'norm_epsilon': 1e-05, 'tie_word_embeddings': True, 'hidden_act': 'gelu_pytorch_tanh'}
    norm_epsilon_key = 'norm_epsilon'
    test_variants: ClassVar[tuple[dict, ...]] = ({}, {'use_bias': False, 'tie_word_embeddings': False})
    key_cases: ClassVar[dict | None] = {'rope_theta': 12345.0, 'norm_epsilon': 3e-06, 'partial_rotary_factor': 0.5}
    pipeline_test: ClassVar[bool] = True  # verified at pp 2 (see ArchAdapter.pipeline_test)
    family = "starcoder2"
    upstream_converter = "tensorrt_llm/models/gpt/convert.py"
    model_types = ("starcoder2",)
    display_note = ""
    position_summary = "RoPE (GPT-NeoX)"
    medusa_status = (
        "`trtllm-medusa build` (upstream has the plumbing, not the Medusa wrapper)"
    )
    tiny_config: ClassVar[dict | None] = dict(
        model_type="starcoder2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
        use_bias=True, bos_token_id=0, eos_token_id=0,
    )
    trtllm_base_class = "GPTForCausalLM"
    engine_keys: ClassVar[frozenset[str]] = frozenset(['bias', 'gpt_variant', 'sliding_window'])
    trtllm_module = "gpt"
    upstream_medusa_base = False
    upstream_spec_decoding_plumbing = True  # tensorrt_llm/models/gpt/model.py GPTDecoderLayer.forward
    names: ClassVar[dict[Role, Source | None]] = {Role.FC: "mlp.c_fc", Role.GATE: None, Role.PROJ: "mlp.c_proj"}

    def trtllm_config(self, hf: HFConfig) -> dict:
        cfg = super().trtllm_config(hf)
        cfg.update(
            {
                "gpt_variant": "starcoder2",
                "bias": bool(hf.get("use_bias", True)),
                "hidden_act": "gelu",
                "rotary_pct": self.rotary_fraction(hf),
            }
        )
        if hf.get("sliding_window"):
            cfg["sliding_window"] = int(hf.get("sliding_window"))
        return cfg

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        return NORMS | (LINEARS if hf.get("use_bias", True) else frozenset())

    def semantics(self, cfg: dict) -> Semantics:
        return dataclasses.replace(super().semantics(cfg), norm=NormKind.LAYER, mlp=MlpKind.PLAIN)
