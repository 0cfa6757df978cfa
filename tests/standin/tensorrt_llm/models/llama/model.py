"""tensorrt_llm/models/llama/{config,model}.py (1.2.x): LLaMAConfig, LLaMADecoderLayer, LLaMAModel,
LLaMAForCausalLM. The layer and the model take ``spec_decoding_params`` and hand it to attention."""

from ...layers import Attention, AttentionMaskType, Embedding, GatedMLP, RmsNorm
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


class LLaMAConfig(PretrainedConfig):
    def __init__(self, *, mlp_bias=False, attn_bias=False, rotary_base=10000.0, rotary_scaling=None,
                 residual_mlp=False, disable_weight_only_quant_plugin=False, moe=None,
                 remove_duplicated_kv_heads=False, embedding_multiplier=1.0, attention_multiplier=1.0,
                 residual_multiplier=1.0, output_multiplier_scale=1.0, **kwargs):
        self.mlp_bias, self.attn_bias = mlp_bias, attn_bias
        self.moe = MoeConfig.from_dict(moe).validate() if isinstance(moe, dict) else (moe or MoeConfig())
        self.rotary_base, self.rotary_scaling = rotary_base, rotary_scaling
        self.residual_mlp = residual_mlp
        self.embedding_multiplier, self.attention_multiplier = embedding_multiplier, attention_multiplier
        self.residual_multiplier, self.output_multiplier_scale = residual_multiplier, output_multiplier_scale
        super().__init__(**kwargs)

    def to_dict(self):
        """Upstream's ``to_dict`` writes ``moe`` through ``MoeConfig.to_dict`` (a dict, never the object)."""
        out = super().to_dict()
        out["moe"] = self.moe.to_dict()
        return out


class LLaMADecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        self.input_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, attention_head_size=config.head_size,
            num_attention_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            max_position_embeddings=config.max_position_embeddings, dtype=config.dtype,
            attention_mask_type=AttentionMaskType.causal, bias=config.attn_bias,
            position_embedding_type="rope_gpt_neox", rotary_embedding_base=config.rotary_base,
            rotary_embedding_scaling=config.rotary_scaling, tp_size=config.mapping.tp_size,
            tp_rank=config.mapping.tp_rank, q_scaling=1.0 / config.attention_multiplier)
        if config.moe.has_moe():  # LLaMADecoderLayer: the experts, hidden_act passed through ("swiglu")
            self.mlp = MOE(config.moe, config.hidden_size, config.intermediate_size, config.hidden_act,
                           mapping=config.mapping, bias=config.mlp_bias, dtype=config.dtype,
                           tp_size=config.mapping.tp_size)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=config.mlp_bias,
                                dtype=config.dtype, tp_size=config.mapping.tp_size)
        self.post_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, spec_decoding_params=None,
                kv_cache_params=None, attention_params=None, lora_layer_params=None,
                next_layer_input_layernorm_args=None):
        return prenorm_block(self, hidden_states, use_cache, residual_multiplier=self.config.residual_multiplier,
                             attention_mask=attention_mask, spec_decoding_params=spec_decoding_params,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             lora_layer_params=lora_layer_params)


class LLaMAModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        self.embedding_multiplier = None
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
            self.embedding_multiplier = config.embedding_multiplier
        self.layers = DecoderLayerList(LLaMADecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None, spec_decoding_params=None,
                kv_cache_params=None, attention_params=None, hidden_states=None, hidden_states_for_embed=None,
                prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None, lora_params=None):
        return stage_forward(self, input_ids, hidden_states, use_cache,
                             embedding_multiplier=self.embedding_multiplier, attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params, lora_params=lora_params,
                             spec_decoding_params=spec_decoding_params)


class LLaMAForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('LlamaForCausalLM', 'LlavaLlamaModel', 'ExaoneForCausalLM', 'MistralForCausalLM',
                      'MixtralForCausalLM', 'ArcticForCausalLM', 'InternLMForCausalLM', 'InternLM2ForCausalLM',
                      'InternLMXComposer2ForCausalLM', 'GraniteForCausalLM', 'GraniteMoeForCausalLM',
                      'SkyworkForCausalLM')

    config_class = LLaMAConfig

    def __init__(self, config):
        transformer = LLaMAModel(config)
        lm_head = lm_head_for(config, bias=False)
        super().__init__(config, transformer, lm_head)
