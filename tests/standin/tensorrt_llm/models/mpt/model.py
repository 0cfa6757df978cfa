"""tensorrt_llm/models/mpt/model.py (1.x): MPTDecoderLayer, MPTModel, MPTForCausalLM.

No ``config_class``. ALiBi hard-coded (with ``clip_qkv`` and ``alibi_bias_max``), MLP 4 x hidden
(``expansion_ratio`` is never read) with ``bias=config.bias``, LayerNorms without bias
(eps=norm_epsilon, ln_f the default 1e-5). Embedding built on the first pipeline stage and ln_f /
lm_head on the last, but ``forward`` uses embedding and ln_f on every stage (no recv/send).
``MPTModel.forward`` takes ``position_ids`` as a required positional argument.
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


class MPTDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, attention_mask_type=AttentionMaskType.causal,
            dtype=config.dtype, tp_size=config.mapping.tp_size, tp_rank=config.mapping.tp_rank, bias=config.bias,
            position_embedding_type="alibi", clip_qkv=config.clip_qkv, alibi_bias_max=config.alibi_bias_max)
        self.mlp = MLP(config.hidden_size, config.hidden_size * 4, config.hidden_act, bias=config.bias,
                       dtype=config.dtype, tp_size=config.mapping.tp_size)
        self.post_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        return prenorm_block(self, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params)


class MPTModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(MPTDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = LayerNorm(config.hidden_size, bias=False, dtype=config.dtype)

    def forward(self, input_ids, position_ids, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None):
        return single_stage_forward(self, self.vocab_embedding(input_ids), use_cache,
                                    attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                                    attention_params=attention_params)


class MPTForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('MPTForCausalLM', 'MptForCausalLM')

    def __init__(self, config):
        transformer = MPTModel(config)
        lm_head = lm_head_for(config, bias=config.bias)
        super().__init__(config, transformer, lm_head)

    @classmethod
    def check_config(cls, config):
        config.set_if_not_exist("bias", False)
        config.set_if_not_exist("clip_qkv", None)
        config.set_if_not_exist("alibi_bias_max", 8)
