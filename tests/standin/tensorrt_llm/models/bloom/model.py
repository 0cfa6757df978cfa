"""tensorrt_llm/models/bloom/model.py: BloomDecoderLayer, BloomModel, BloomForCausalLM.

No ``config_class``. Reads ``config.share_embedding_table`` (AttributeError without it: the 1.x
PretrainedConfig has no such field), ``use_parallel_embedding`` and ``embedding_sharding_dim``.
ALiBi, bias everywhere, GELU MLP of ``intermediate_size``, LayerNorms with the default eps;
``ln_embed`` after the embedding. Everything on every pipeline rank, no recv/send. No
``spec_decoding_params``. Only a pre-1.x copy of this file could be read (see LEDGER.md): the
Attention call is written here with the keyword-only 1.x signature.
"""

from ...layers import MLP, Attention, AttentionMaskType, Embedding, LayerNorm
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    lm_head_for,
    prenorm_block,
    single_stage_forward,
)


class BloomDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, num_layers=config.num_hidden_layers, dtype=config.dtype,
            attention_mask_type=AttentionMaskType.causal, position_embedding_type="alibi", bias=True,
            tp_size=config.mapping.tp_size, tp_rank=config.mapping.tp_rank)
        self.mlp = MLP(config.hidden_size, config.intermediate_size or 4 * config.hidden_size, "gelu", bias=True,
                       dtype=config.dtype, tp_size=config.mapping.tp_size)
        self.post_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        return prenorm_block(self, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params)


class BloomModel(Module):
    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.ln_embed = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(BloomDecoderLayer, config)
        self.ln_f = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None, attention_params=None):
        hidden_states = self.ln_embed(self.vocab_embedding(input_ids))
        return single_stage_forward(self, hidden_states, use_cache,
                                    attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                                    attention_params=attention_params)


class BloomForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('BloomForCausalLM',)

    def __init__(self, config):
        transformer = BloomModel(config)
        share = transformer.vocab_embedding.weight if config.share_embedding_table else None
        lm_head = lm_head_for(config, bias=False, every_stage=True)
        if share is not None:
            lm_head.weight = share
        super().__init__(config, transformer, lm_head)
