"""tensorrt_llm/models/dbrx/{config,model}.py (1.x): DbrxConfig, DbrxDecoderLayer, DbrxModel, DbrxForCausalLM.

``DbrxConfig`` reads ``bias`` (False), ``clip_qkv`` (None), ``rotary_base`` (500000.0), ``rotary_scaling`` and
``moe`` (a dict -> ``MoeConfig.from_dict``; none: the legacy ``moe_num_experts`` / ``moe_top_k`` /
``moe_normalization_mode`` keys, RENORMALIZE by default), validated; its ``to_dict`` writes ``moe`` through
``MoeConfig.to_dict``. The decoder layer: bias-free ``LayerNorm`` (eps ``norm_epsilon``) before attention and
before the MLP, ``Attention`` with the config's position embedding, RoPE base and scaling, ``bias`` and
``clip_qkv``, and ``MOE`` (``moe_config`` and ``mapping``) when ``moe.has_moe()``, else ``GatedMLP``, each with
``ffn_hidden_size=intermediate_size`` and ``bias``. The layer's ``forward`` takes no ``spec_decoding_params``
(upstream passes none to attention). ``DbrxModel`` embeds on the first stage (or ``recv``), ``ln_f``
(bias-free LayerNorm) on the last (or ``send``); ``lm_head`` a ``ColumnLinear`` with ``bias=config.bias``.
"""

from ...layers import Attention, AttentionMaskType, Embedding, GatedMLP, LayerNorm
from ...layers.moe import MOE, MoeConfig
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    prenorm_block,
    stage_forward,
)


class DbrxConfig(PretrainedConfig):
    def __init__(self, *, bias=False, clip_qkv=None, rotary_base=500000.0, rotary_scaling=None, moe=None, **kwargs):
        self.bias, self.clip_qkv = bias, clip_qkv
        self.rotary_base, self.rotary_scaling = rotary_base, rotary_scaling
        if moe is None:  # the legacy fields
            moe = MoeConfig(num_experts=kwargs.pop("moe_num_experts", 0), top_k=kwargs.pop("moe_top_k", 0),
                            normalization_mode=kwargs.pop("moe_normalization_mode",
                                                          MoeConfig.ExpertScaleNormalizationMode.RENORMALIZE))
        elif isinstance(moe, dict):
            moe = MoeConfig.from_dict(moe)
        assert isinstance(moe, MoeConfig)
        self.moe = moe.validate()
        super().__init__(**kwargs)

    def to_dict(self):
        out = super().to_dict()
        out.update(bias=self.bias, clip_qkv=self.clip_qkv, rotary_base=self.rotary_base,
                   rotary_scaling=self.rotary_scaling, moe=self.moe.to_dict())
        return out


class DbrxDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
            dtype=config.dtype, attention_mask_type=AttentionMaskType.causal, bias=config.bias,
            position_embedding_type=config.position_embedding_type, rotary_embedding_base=config.rotary_base,
            rotary_embedding_scaling=config.rotary_scaling, tp_size=config.mapping.tp_size,
            tp_rank=config.mapping.tp_rank, clip_qkv=config.clip_qkv)
        if config.moe.has_moe():
            self.mlp = MOE(config.moe, config.hidden_size, config.intermediate_size, config.hidden_act,
                           mapping=config.mapping, bias=config.bias, dtype=config.dtype,
                           tp_size=config.mapping.tp_size)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=config.bias,
                                dtype=config.dtype, tp_size=config.mapping.tp_size)
        self.post_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None):
        return prenorm_block(self, hidden_states, use_cache, attention_mask=attention_mask,
                             kv_cache_params=kv_cache_params, attention_params=attention_params)


class DbrxModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(DbrxDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = LayerNorm(config.hidden_size, eps=config.norm_epsilon, bias=False, dtype=config.dtype)

    def forward(self, input_ids, position_ids, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, hidden_states=None):
        return stage_forward(self, input_ids, hidden_states, use_cache, attention_mask=attention_mask,
                             kv_cache_params=kv_cache_params, attention_params=attention_params)


class DbrxForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ("DbrxForCausalLM",)

    config_class = DbrxConfig

    def __init__(self, config):
        transformer = DbrxModel(config)
        lm_head = lm_head_for(config, bias=config.bias)
        super().__init__(config, transformer, lm_head)
