"""tensorrt_llm/models/gemma/{config,model}.py (1.x): GemmaConfig, GemmaDecoderLayer, GemmaModel,
GemmaForCausalLM (MODEL_MAP: Gemma, Gemma2 and Gemma3 names).

GemmaConfig: ``architecture`` is a required keyword; ``use_parallel_embedding`` is forced to
``tp_size > 1`` (a given value is dropped); Gemma 2/3 are recognised by comparing
``architecture`` with "Gemma2ForCausalLM" / "Gemma3ForCausalLM" and then require
``query_pre_attn_scalar``. The layer and the model take no ``spec_decoding_params``.
Gemma 3: q/k RmsNorm built without ``eps`` (1e-5); layer i is local unless
``(i + 1) % _sliding_window_pattern == 0``.
"""

import math

from ...layers import (
    Attention,
    AttentionMaskType,
    Embedding,
    GatedMLP,
    LayerNormType,
    RmsNorm,
)
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    prenorm_block,
    stage_forward,
)

GEMMA_ARCHITECTURE = "GemmaForCausalLM"
GEMMA2_ARCHITECTURE = "Gemma2ForCausalLM"
GEMMA3_ARCHITECTURE = "Gemma3ForCausalLM"


class GemmaConfig(PretrainedConfig):
    def __init__(self, *, architecture, rotary_base=10000.0, rotary_scaling=None, attn_bias=False, mlp_bias=False,
                 position_embedding_type="rope_gpt_neox", query_pre_attn_scalar=None,
                 final_logit_softcapping=None, attn_logit_softcapping=None, mapping=None,
                 _sliding_window_pattern=None, rope_local_base_freq=None, sliding_window=None, **kwargs):
        kwargs.pop("use_parallel_embedding", None)
        tp = mapping["tp_size"] if isinstance(mapping, dict) else (mapping.tp_size if mapping else 1)
        self.attn_bias, self.mlp_bias, self.inter_layernorms = attn_bias, mlp_bias, False
        if architecture in (GEMMA2_ARCHITECTURE, GEMMA3_ARCHITECTURE):
            self.inter_layernorms = True
            assert query_pre_attn_scalar is not None, "Gemma2 / Gemma3 models must configure `query_pre_attn_scalar`"
            self.query_pre_attn_scalar = query_pre_attn_scalar
            self.final_logit_softcapping = final_logit_softcapping
            if architecture == GEMMA2_ARCHITECTURE:
                self.attn_logit_softcapping = attn_logit_softcapping
            else:
                self._sliding_window_pattern = _sliding_window_pattern
                self.rope_local_base_freq = rope_local_base_freq
                self.sliding_window = sliding_window
        super().__init__(architecture=architecture, use_parallel_embedding=tp > 1, rotary_base=rotary_base,
                         rotary_scaling=rotary_scaling, position_embedding_type=position_embedding_type,
                         mapping=mapping, **kwargs)

    @property
    def is_gemma_2(self):
        return self.architecture == GEMMA2_ARCHITECTURE

    @property
    def is_gemma_3(self):
        return self.architecture == GEMMA3_ARCHITECTURE


class GemmaDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        q_scaling, max_attn_value, qk_norm, is_sliding, local_base = 1.0, 0.0, False, False, None
        if config.is_gemma_2 or config.is_gemma_3:
            q_scaling = math.sqrt(config.query_pre_attn_scalar) / math.sqrt(config.head_size)
        if config.is_gemma_2:
            max_attn_value = config.attn_logit_softcapping or 0.0
        if config.is_gemma_3:
            qk_norm = True
            is_sliding = bool((layer_idx + 1) % config._sliding_window_pattern)
            local_base = config.rope_local_base_freq
        self.input_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, attention_head_size=config.head_size,
            qk_layernorm=qk_norm, layernorm_type=LayerNormType.RmsNorm,
            max_position_embeddings=config.max_position_embeddings, dtype=config.dtype,
            attention_mask_type=AttentionMaskType.causal, bias=config.attn_bias,
            position_embedding_type="rope_gpt_neox", rotary_embedding_base=config.rotary_base,
            rotary_embedding_base_local=local_base, rotary_embedding_scaling=config.rotary_scaling,
            tp_size=config.mapping.tp_size, q_scaling=q_scaling, max_attn_value=max_attn_value,
            is_local=is_sliding)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=config.mlp_bias,
                            dtype=config.dtype, tp_size=config.mapping.tp_size)
        if config.inter_layernorms:
            self.pre_feedforward_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
            self.post_feedforward_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon,
                                                      dtype=config.dtype)
        self.post_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None, lora_layer_params=None, next_layer_input_layernorm_args=None):
        return prenorm_block(self, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params, norm_before_bmm1=True,
                             lora_layer_params=lora_layer_params)


class GemmaModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(GemmaDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, hidden_states=None, prompt_embedding_table=None, prompt_tasks=None,
                prompt_vocab_size=None, lora_params=None):
        return stage_forward(self, input_ids, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params, lora_params=lora_params)


class GemmaForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('GemmaForCausalLM', 'Gemma2ForCausalLM', 'Gemma3ForCausalLM')

    config_class = GemmaConfig

    def __init__(self, config):
        transformer = GemmaModel(config)
        lm_head = lm_head_for(config, bias=False)
        super().__init__(config, transformer, lm_head)
