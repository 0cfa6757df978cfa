"""tensorrt_llm/models/gptj/{config,model}.py (1.2.x): GPTJConfig, GPTJDecoderLayer, GPTJModel, GPTJForCausalLM.

``GPTJConfig`` adds ``rotary_dim`` (64). ``GPTJDecoderLayer``: ``LayerNorm(eps=norm_epsilon)`` with bias
feeding attention and MLP in parallel; attention without bias, multi-head (no ``num_kv_heads``),
``rope_gptj`` with ``rotary_embedding_percentage = rotary_dim / head_size``; ``MLP(4 x hidden, "gelu",
bias=True)``; attention and MLP without their own all-reduce (``tp_group=None``): the layer sums them and
all-reduces once, so every rank adds its ``mlp.proj`` bias. ``GPTJModel``: embedding, layers, ``ln_f``
(LayerNorm without ``eps``) on every rank, no recv/send; lm_head with bias. No ``spec_decoding_params``.
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


class GPTJConfig(PretrainedConfig):
    def __init__(self, *, rotary_dim=64, **kwargs):
        self.rotary_dim = rotary_dim
        super().__init__(**kwargs)


class GPTJDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        head_size = config.hidden_size // config.num_attention_heads
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            rotary_embedding_percentage=config.rotary_dim / head_size, position_embedding_type="rope_gptj",
            max_position_embeddings=config.max_position_embeddings, dtype=config.dtype,
            attention_mask_type=AttentionMaskType.causal, bias=False, tp_size=config.mapping.tp_size)
        self.mlp = MLP(config.hidden_size, config.hidden_size * 4, "gelu", bias=True, dtype=config.dtype,
                       tp_size=config.mapping.tp_size)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        normed = self.input_layernorm(hidden_states)
        out = self.attention(normed, attention_mask=attention_mask, use_cache=use_cache,
                             kv_cache_params=kv_cache_params, attention_params=attention_params)
        out, present = out if use_cache else (out, None)
        hidden_states = hidden_states + out + self.mlp(normed)  # one all-reduce of attn + mlp upstream
        return (hidden_states, present) if use_cache else hidden_states


class GPTJModel(Module):
    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(GPTJDecoderLayer, config)
        self.ln_f = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None):
        return single_stage_forward(self, self.vocab_embedding(input_ids), use_cache,
                                    attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                                    attention_params=attention_params)


class GPTJForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('GPTJForCausalLM',)

    config_class = GPTJConfig

    def __init__(self, config):
        transformer = GPTJModel(config)
        lm_head = lm_head_for(config, bias=True, every_stage=True)
        super().__init__(config, transformer, lm_head)
