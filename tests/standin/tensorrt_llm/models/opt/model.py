"""tensorrt_llm/models/opt/model.py (1.2.x): OPTDecoderLayer, OPTModel, OPTForCausalLM (no config class of its own:
``PretrainedConfig`` carries ``do_layer_norm_before``, which ``OPTForCausalLM.check_config`` sets to False where the
checkpoint has none).

``OPTDecoderLayer``: ``input_layernorm`` / ``post_layernorm`` (LayerNorm with weight and bias, default epsilon)
before attention and MLP where ``do_layer_norm_before``, after each residual add otherwise; ``Attention`` and ``MLP``
(``intermediate_size``, or 4 x hidden where None; ``config.hidden_act``) with their default biases; the layer passes
no ``spec_decoding_params``. ``OPTModel``: ``vocab_embedding`` + ``position_embedding(position_ids)``, the layers,
``ln_f`` only where ``do_layer_norm_before``; every rank embeds and normalises (no recv / send); its ``forward``
takes ``**kwargs``, so a ``spec_decoding_params`` passed to it is dropped without a word. The lm_head has no bias.
"""

from ...layers import MLP, Attention, AttentionMaskType, Embedding, LayerNorm
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    add_learned_positions,
    lm_head_for,
)


class OPTDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.do_layer_norm_before = config.do_layer_norm_before
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            max_position_embeddings=config.max_position_embeddings, attention_mask_type=AttentionMaskType.causal,
            dtype=config.dtype, tp_size=config.mapping.tp_size)
        ffn = config.hidden_size * 4 if config.intermediate_size is None else config.intermediate_size
        self.mlp = MLP(config.hidden_size, ffn, config.hidden_act, dtype=config.dtype, tp_size=config.mapping.tp_size)
        self.post_layernorm = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        residual = hidden_states
        attention_input = self.input_layernorm(hidden_states) if self.do_layer_norm_before else hidden_states
        out = self.attention(attention_input, attention_mask=attention_mask, use_cache=use_cache,
                             kv_cache_params=kv_cache_params, attention_params=attention_params)
        out, present = out if use_cache else (out, None)
        hidden_states = residual + out
        if not self.do_layer_norm_before:
            hidden_states = self.input_layernorm(hidden_states)
        residual = hidden_states
        mlp_input = self.post_layernorm(hidden_states) if self.do_layer_norm_before else hidden_states
        hidden_states = residual + self.mlp(mlp_input)
        if not self.do_layer_norm_before:
            hidden_states = self.post_layernorm(hidden_states)
        return (hidden_states, present) if use_cache else hidden_states


class OPTModel(Module):
    def __init__(self, config):
        super().__init__()
        self.do_layer_norm_before = config.do_layer_norm_before
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.position_embedding = Embedding(config.max_position_embeddings, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(OPTDecoderLayer, config)
        if self.do_layer_norm_before:
            self.ln_f = LayerNorm(config.hidden_size, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None,
                **kwargs):
        hidden_states = self.vocab_embedding(input_ids)
        add_learned_positions(self.position_embedding, input_ids, position_ids)
        out = self.layers.forward(hidden_states, use_cache=use_cache, attention_mask=attention_mask,
                                  kv_cache_params=kv_cache_params, attention_params=attention_params)
        hidden_states, presents = out if use_cache else (out, None)
        if self.do_layer_norm_before:
            hidden_states = self.ln_f(hidden_states)
        return (hidden_states, presents) if use_cache else hidden_states


class OPTForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('OPTForCausalLM',)

    def __init__(self, config):
        self.check_config(config)
        transformer = OPTModel(config)
        lm_head = lm_head_for(config, bias=False, every_stage=True)
        super().__init__(config, transformer, lm_head)

    def check_config(self, config):
        config.set_if_not_exist("do_layer_norm_before", False)
