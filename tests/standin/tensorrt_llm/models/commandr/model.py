"""tensorrt_llm/models/commandr/{config,model}.py (1.2.x): CohereConfig, CohereDecoderLayer, CohereModel,
CohereForCausalLM.

``CohereConfig`` adds ``output_multiplier_scale`` (0.0625), ``rotary_base`` (10000.0) and ``attn_bias``
(False). ``CohereDecoderLayer``: one ``LayerNorm(bias=False, eps=norm_epsilon)`` feeding attention and
the ``GatedMLP`` (no bias) in parallel, ``x + attn(ln(x)) + mlp(ln(x))``; attention with
``bias=attn_bias``, ``position_embedding_type=rope_gptj`` (fixed in the layer), ``rotary_embedding_base
=rotary_base``, the config's ``head_size`` and KV heads. The layer and the model take
``spec_decoding_params``; ``CohereModel`` builds its Embedding split on the vocabulary over the tensor-
parallel ranks, the embedding on the first stage and ``ln_f`` (LayerNorm without bias) on the last,
recv/send between stages. The base logits are multiplied by ``output_multiplier_scale`` in
``DecoderModelForCausalLM.forward`` (models/modeling_utils.py here).
"""

from ...layers import Attention, AttentionMaskType, Embedding, GatedMLP, LayerNorm
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    stage_forward,
)


class CohereConfig(PretrainedConfig):
    def __init__(self, *, output_multiplier_scale=0.0625, rotary_base=10000.0, attn_bias=False, **kwargs):
        self.output_multiplier_scale, self.rotary_base, self.attn_bias = output_multiplier_scale, rotary_base, attn_bias
        super().__init__(**kwargs)


class CohereDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, attention_head_size=config.head_size,
            num_attention_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            max_position_embeddings=config.max_position_embeddings, dtype=config.dtype,
            attention_mask_type=AttentionMaskType.causal, bias=config.attn_bias,
            position_embedding_type="rope_gptj", rotary_embedding_base=config.rotary_base,
            tp_size=config.mapping.tp_size, tp_rank=config.mapping.tp_rank)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=False,
                            dtype=config.dtype, tp_size=config.mapping.tp_size)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, spec_decoding_params=None,
                kv_cache_params=None, attention_params=None):
        normed = self.input_layernorm(hidden_states)
        out = self.attention(normed, attention_mask=attention_mask, use_cache=use_cache,
                             spec_decoding_params=spec_decoding_params, kv_cache_params=kv_cache_params,
                             attention_params=attention_params)
        out, present = out if use_cache else (out, None)
        hidden_states = hidden_states + out + self.mlp(normed)
        return (hidden_states, present) if use_cache else hidden_states


class CohereModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype,
                                             tp_size=config.mapping.tp_size, sharding_dim=0,
                                             tp_rank=config.mapping.tp_rank)
        self.layers = DecoderLayerList(CohereDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)

    def forward(self, input_ids=None, position_ids=None, use_cache=False, attention_mask=None,
                spec_decoding_params=None, kv_cache_params=None, attention_params=None, hidden_states=None):
        return stage_forward(self, input_ids, hidden_states, use_cache, attention_mask=attention_mask,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             spec_decoding_params=spec_decoding_params)


class CohereForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('CohereForCausalLM',)

    config_class = CohereConfig

    def __init__(self, config):
        transformer = CohereModel(config)
        lm_head = lm_head_for(config, bias=False)
        super().__init__(config, transformer, lm_head)
