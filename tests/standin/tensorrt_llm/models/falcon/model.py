"""tensorrt_llm/models/falcon/{config,model}.py (1.x): FalconConfig, FalconDecoderLayer, FalconModel,
FalconForCausalLM (MODEL_MAP: FalconForCausalLM and RWForCausalLM).

``input_layernorm`` (eps=norm_epsilon); ``mlp_layernorm`` for the new decoder architecture
with two norms; ``post_layernorm`` (default eps 1e-5) only for the sequential layout; attention
and MLP ``bias=config.bias``; MLP ``intermediate_size``. Embedding on the first pipeline stage,
ln_f (default eps) and lm_head on the last, recv/send between. No ``spec_decoding_params``.
"""

from ...layers import MLP, Attention, AttentionMaskType, Embedding, LayerNorm
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    stage_forward,
)


class FalconConfig(PretrainedConfig):
    def __init__(self, *, bias=False, parallel_attention=False, num_ln_in_parallel_attn=None,
                 new_decoder_architecture=False, rotary_base=10000.0, **kwargs):
        self.bias, self.parallel_attention = bias, parallel_attention
        self.num_ln_in_parallel_attn, self.new_decoder_architecture = num_ln_in_parallel_attn, new_decoder_architecture
        self.rotary_base = rotary_base
        super().__init__(**kwargs)


class FalconDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.new_arch = config.new_decoder_architecture
        self.parallel_attn = config.parallel_attention
        self.num_ln = config.num_ln_in_parallel_attn
        if self.num_ln is None and self.new_arch:
            self.num_ln = 2
        parallel = self.new_arch or self.parallel_attn
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        if self.new_arch and self.num_ln == 2:
            self.mlp_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        if not parallel:
            self.post_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
            attention_mask_type=AttentionMaskType.causal, dtype=config.dtype, tp_size=config.mapping.tp_size,
            tp_rank=config.mapping.tp_rank, bias=config.bias, position_embedding_type=config.position_embedding_type,
            rotary_embedding_base=config.rotary_base)
        self.mlp = MLP(config.hidden_size, config.intermediate_size or 4 * config.hidden_size, config.hidden_act,
                       dtype=config.dtype, bias=config.bias, tp_size=config.mapping.tp_size)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        residual = hidden_states
        normed = self.input_layernorm(hidden_states)
        out = self.attention(normed, attention_mask=attention_mask, use_cache=use_cache,
                             kv_cache_params=kv_cache_params, attention_params=attention_params)
        out, present = out if use_cache else (out, None)
        if self.new_arch and self.num_ln == 2:
            mlp_in = self.mlp_layernorm(hidden_states)
        elif self.new_arch or self.parallel_attn:
            mlp_in = normed
        else:
            residual = residual + out
            mlp_in = self.post_layernorm(residual)
        m = self.mlp(mlp_in)
        if self.new_arch or self.parallel_attn:
            m = m + out
        hidden_states = residual + m
        return (hidden_states, present) if use_cache else hidden_states


class FalconModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(FalconDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, hidden_states=None):
        return stage_forward(self, input_ids, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params)


class FalconForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('FalconForCausalLM', 'RWForCausalLM')

    config_class = FalconConfig

    def __init__(self, config):
        transformer = FalconModel(config)
        lm_head = lm_head_for(config, bias=False)
        super().__init__(config, transformer, lm_head)
