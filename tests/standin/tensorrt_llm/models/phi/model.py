"""tensorrt_llm/models/phi/{config,model}.py (1.x): PhiConfig, PhiDecoderLayer, PhiModel, PhiForCausalLM.

Multi-head attention only (no ``num_kv_heads`` passed) with bias; ``rotary_embedding_percentage
=config.rotary_pct`` (AttributeError without it); LayerNorms with the default eps (1e-5); one
shared input norm, parallel residual. Embedding, ln_f and lm_head (with bias) are built on every
pipeline rank and the model has no recv/send. No ``spec_decoding_params`` anywhere.
"""

from ...layers import MLP, Attention, AttentionMaskType, Embedding, LayerNorm
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    single_stage_forward,
)


class PhiConfig(PretrainedConfig):
    def __init__(self, *, rotary_base=10000.0, rotary_scaling=None, **kwargs):
        self.rotary_base, self.rotary_scaling = rotary_base, rotary_scaling
        super().__init__(**kwargs)


class PhiDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            rotary_embedding_percentage=config.rotary_pct, position_embedding_type=config.position_embedding_type,
            rotary_embedding_base=config.rotary_base, max_position_embeddings=config.max_position_embeddings,
            dtype=config.dtype, attention_mask_type=AttentionMaskType.causal, bias=True,
            tp_size=config.mapping.tp_size)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, config.hidden_act, dtype=config.dtype,
                       tp_size=config.mapping.tp_size)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None, lora_layer_params=None):
        normed = self.input_layernorm(hidden_states)
        out = self.attention(normed, attention_mask=attention_mask, use_cache=use_cache,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             norm_before_bmm1=True, lora_layer_params=lora_layer_params)
        out, present = out if use_cache else (out, None)
        hidden_states = hidden_states + out + self.mlp(normed)
        return (hidden_states, present) if use_cache else hidden_states


class PhiModel(Module):
    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(PhiDecoderLayer, config)
        self.ln_f = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None,
                lora_params=None):
        return single_stage_forward(self, self.vocab_embedding(input_ids), use_cache,
                                    attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                                    attention_params=attention_params, lora_params=lora_params)


class PhiForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('PhiForCausalLM',)

    config_class = PhiConfig

    def __init__(self, config):
        transformer = PhiModel(config)
        lm_head = lm_head_for(config, bias=True, every_stage=True)
        super().__init__(config, transformer, lm_head)

    @classmethod
    def check_config(cls, config):
        config.set_if_not_exist("partial_rotary_factor", 0.4)
        config.set_if_not_exist("rotary_base", 10000.0)
