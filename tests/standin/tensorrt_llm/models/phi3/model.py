"""tensorrt_llm/models/phi3/{config,model}.py (1.x): Phi3Config, Phi3DecoderLayer, Phi3Model,
Phi3ForCausalLM - mini/medium and the MoE variant (the small variant, with block-sparse attention and MuP, is not
modelled: no family converts to it).

The variant is chosen by ``config.architecture``: ``"PhiMoEForCausalLM"`` (that spelling; transformers saves
``PhimoeForCausalLM``) builds the MoE variant, any other name mini/medium.
mini/medium: RmsNorm ``input_layernorm`` / ``post_layernorm`` / ``ln_f`` (eps=norm_epsilon); attention without
bias; a plain ``MLP`` with ``hidden_act`` "swiglu" (one fused ``fc`` of 2 x intermediate rows, no bias); lm_head
without bias.
MoE: ``LayerNorm`` (with bias, eps=norm_epsilon) for the three norms; attention with bias (qkv and dense);
``MOE`` whose ``MoeConfig`` is made by setting each field of the config's ``moe`` dict on a default one (no
``validate``), with ``mapping`` and no bias; lm_head with bias. A ``moe`` field in the config makes the MLP a
``MOE`` whatever the variant (upstream checks ``hasattr(config, "moe")``).
Both: ``long_rope`` when the config has ``longrope_scaling_short_factors`` (with ``original_max_position_embeddings``;
the MoE variant also reads ``longrope_short_mscale`` / ``longrope_long_mscale``),
``rotary_embedding_percentage=config.rotary_pct``. Embedding, ln_f, lm_head on every pipeline rank, no
recv/send. No ``spec_decoding_params``.
"""

from ...layers import MLP, Attention, AttentionMaskType, Embedding, LayerNorm, RmsNorm
from ...layers.moe import MOE, MoeConfig
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    prenorm_block,
    single_stage_forward,
)


class Phi3Config(PretrainedConfig):
    def __init__(self, *, rotary_base=10000.0, rotary_scaling=None, **kwargs):
        self.rotary_base, self.rotary_scaling = rotary_base, rotary_scaling
        super().__init__(**kwargs)


def _moe_variant(config):
    return config.architecture == "PhiMoEForCausalLM"


def _norm(config):
    cls = LayerNorm if _moe_variant(config) else RmsNorm
    return cls(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)


class Phi3DecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        moe_variant = _moe_variant(config)
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        pe, short, long_, orig = "rope_gpt_neox", None, None, config.max_position_embeddings
        short_mscale = long_mscale = None
        if hasattr(config, "longrope_scaling_short_factors"):
            pe, short, long_ = "long_rope", config.longrope_scaling_short_factors, config.longrope_scaling_long_factors
            orig = config.original_max_position_embeddings
            if moe_variant:
                short_mscale, long_mscale = config.longrope_short_mscale, config.longrope_long_mscale
        self.input_layernorm = _norm(config)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, position_embedding_type=pe,
            rotary_embedding_base=config.rotary_base, max_position_embeddings=config.max_position_embeddings,
            dtype=config.dtype, attention_mask_type=AttentionMaskType.causal, bias=moe_variant,
            tp_size=config.mapping.tp_size, rope_scaling_short_factors=short, rope_scaling_long_factors=long_,
            rope_scaling_short_mscale=short_mscale, rope_scaling_long_mscale=long_mscale,
            original_max_position_embeddings=orig, rotary_embedding_percentage=config.rotary_pct)
        if hasattr(config, "moe"):
            moe_config = MoeConfig()
            for key, value in config.moe.items():
                setattr(moe_config, key, value)
            self.mlp = MOE(moe_config, config.hidden_size, config.intermediate_size, config.hidden_act,
                           mapping=config.mapping, bias=False, dtype=config.dtype, tp_size=config.mapping.tp_size)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, config.hidden_act, dtype=config.dtype,
                           bias=False, tp_size=config.mapping.tp_size)
        self.post_layernorm = _norm(config)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None, lora_layer_params=None):
        return prenorm_block(self, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params, norm_before_bmm1=True,
                             lora_layer_params=lora_layer_params)


class Phi3Model(Module):
    def __init__(self, config):
        super().__init__()
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(Phi3DecoderLayer, config)
        self.ln_f = _norm(config)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None,
                lora_params=None):
        return single_stage_forward(self, self.vocab_embedding(input_ids), use_cache,
                                    attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                                    attention_params=attention_params, lora_params=lora_params)


class Phi3ForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('Phi3ForCausalLM', 'Phi3VForCausalLM', 'Phi3SmallForCausalLM', 'PhiMoEForCausalLM',
                      'Phi4MMForCausalLM')

    config_class = Phi3Config

    def __init__(self, config):
        transformer = Phi3Model(config)
        lm_head = lm_head_for(config, bias=_moe_variant(config), every_stage=True)
        super().__init__(config, transformer, lm_head)
