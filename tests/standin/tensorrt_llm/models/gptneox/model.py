"""tensorrt_llm/models/gptneox/model.py (1.x): GPTNeoXDecoderLayer, GPTNeoXModel, GPTNeoXForCausalLM.

No ``config_class``: the plain PretrainedConfig, and the model reads ``config.rotary_pct`` and
``config.rotary_emb_base`` (AttributeError without them). Always the parallel residual
``x + attn(ln1(x)) + mlp(ln2(x))``; MLP 4 x hidden with bias; LayerNorms with the default eps
(1e-5). Embedding, ln_f and lm_head on every pipeline rank, no recv/send. No
``spec_decoding_params``.
"""

from ...layers import MLP, Attention, AttentionMaskType, Embedding, LayerNorm
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    lm_head_for,
    single_stage_forward,
)


class GPTNeoXDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.post_attention_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            rotary_embedding_percentage=config.rotary_pct, rotary_embedding_base=config.rotary_emb_base,
            position_embedding_type="rope_gpt_neox", max_position_embeddings=config.max_position_embeddings,
            dtype=config.dtype, attention_mask_type=AttentionMaskType.causal, bias=True,
            tp_size=config.mapping.tp_size)
        self.mlp = MLP(config.hidden_size, config.hidden_size * 4, config.hidden_act, dtype=config.dtype,
                       tp_size=config.mapping.tp_size)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        out = self.attention(self.input_layernorm(hidden_states), attention_mask=attention_mask, use_cache=use_cache,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             norm_before_bmm1=True)
        out, present = out if use_cache else (out, None)
        hidden_states = hidden_states + out + self.mlp(self.post_attention_layernorm(hidden_states))
        return (hidden_states, present) if use_cache else hidden_states


class GPTNeoXModel(Module):
    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(GPTNeoXDecoderLayer, config)
        self.ln_f = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None):
        return single_stage_forward(self, self.vocab_embedding(input_ids), use_cache,
                                    attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                                    attention_params=attention_params)


class GPTNeoXForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('GPTNeoXForCausalLM',)

    def __init__(self, config):
        transformer = GPTNeoXModel(config)
        lm_head = lm_head_for(config, bias=False, every_stage=True)
        super().__init__(config, transformer, lm_head)
