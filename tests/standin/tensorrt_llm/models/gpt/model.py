"""tensorrt_llm/models/gpt/{config,model}.py (1.x): GPTConfig, GPTDecoderLayer, GPTModel, GPTForCausalLM
(MODEL_MAP serves Starcoder2ForCausalLM with it).

LayerNorm with bias; attention ``bias=config.bias`` (dense too), ``rotary_embedding_percentage
=config.rotary_pct``, ``qk_layernorm``, ``eps=config.norm_epsilon``; MLP ``GatedMLP`` for a gated
activation else ``MLP`` with ``bias=config.bias``. Layer and model take ``spec_decoding_params``.
``GPTModel.forward`` takes ``position_ids`` as a required positional argument.
"""

from ...layers import (
    MLP,
    Attention,
    AttentionMaskType,
    Embedding,
    GatedMLP,
    LayerNorm,
)
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    add_learned_positions,
    lm_head_for,
    prenorm_block,
    stage_forward,
)


class GPTConfig(PretrainedConfig):
    def __init__(self, *, gpt_variant="gpt2", bias=True, q_scaling=1.0, embedding_scale=None,
                 apply_query_key_layer_scaling=False, rotary_pct=1.0, rotary_base=10000.0, rotary_scaling=None,
                 inner_layernorm=False, norm_before_bmm1=False, moe=None, **kwargs):
        self.gpt_variant, self.bias, self.q_scaling, self.embedding_scale = gpt_variant, bias, q_scaling, embedding_scale
        self.apply_query_key_layer_scaling = apply_query_key_layer_scaling
        self.rotary_pct, self.rotary_base, self.rotary_scaling = rotary_pct, rotary_base, rotary_scaling
        self.inner_layernorm, self.norm_before_bmm1 = inner_layernorm, norm_before_bmm1
        super().__init__(**kwargs)


_GATED = ("swiglu", "gegelu", "geglu")


class GPTDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        tp = config.mapping.tp_size
        self.input_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
            num_layers=config.num_hidden_layers, q_scaling=config.q_scaling,
            apply_query_key_layer_scaling=config.apply_query_key_layer_scaling, dtype=config.dtype,
            attention_mask_type=AttentionMaskType.causal, attention_head_size=config.head_size,
            position_embedding_type=config.position_embedding_type,
            rotary_embedding_percentage=config.rotary_pct, rotary_embedding_base=config.rotary_base,
            rotary_embedding_scaling=config.rotary_scaling, bias=config.bias, tp_size=tp,
            tp_rank=config.mapping.tp_rank, qk_layernorm=config.qk_layernorm,
            inner_layernorm=config.inner_layernorm, eps=config.norm_epsilon)
        cls = GatedMLP if config.hidden_act in _GATED else MLP
        act = "silu" if config.hidden_act == "swiglu" else config.hidden_act
        self.mlp = cls(config.hidden_size, config.intermediate_size, act if cls is GatedMLP else config.hidden_act,
                       bias=config.bias, dtype=config.dtype, tp_size=tp)
        self.post_layernorm = LayerNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, kv_cache_params=None,
                attention_params=None, lora_layer_params=None, spec_decoding_params=None):
        return prenorm_block(self, hidden_states, use_cache,
                             attention_mask=attention_mask, spec_decoding_params=spec_decoding_params,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             lora_layer_params=lora_layer_params)


class GPTModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        self.position_embedding_type = config.position_embedding_type
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
            if config.position_embedding_type == "learned_absolute":
                self.position_embedding = Embedding(config.max_position_embeddings, config.hidden_size,
                                                    dtype=config.dtype)
        self.layers = DecoderLayerList(GPTDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = LayerNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, input_ids, position_ids, use_cache=False, attention_mask=None, kv_cache_params=None,
                attention_params=None, hidden_states=None, prompt_embedding_table=None, prompt_tasks=None,
                prompt_vocab_size=None, lora_params=None, spec_decoding_params=None):
        # hidden_states + position_embedding(position_ids) on the first stage: one position id per packed token,
        # or the add fails (TensorRT's elementwise layer cannot broadcast [tokens, hidden] with [ids, hidden])
        if self.mapping.is_first_pp_rank() and self.position_embedding_type == "learned_absolute":
            add_learned_positions(self.position_embedding, input_ids, position_ids)
        return stage_forward(self, input_ids, hidden_states, use_cache,
                             attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                             attention_params=attention_params, lora_params=lora_params,
                             spec_decoding_params=spec_decoding_params)


class GPTForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('GPT2LMHeadModel', 'GPT2LMHeadCustomModel', 'GPTBigCodeForCausalLM', 'Starcoder2ForCausalLM',
                      'FuyuForCausalLM', 'Kosmos2ForConditionalGeneration', 'JAISLMHeadModel', 'GPTForCausalLM',
                      'NemotronForCausalLM')

    config_class = GPTConfig

    def __init__(self, config):
        transformer = GPTModel(config)
        lm_head = lm_head_for(config, bias=False)
        super().__init__(config, transformer, lm_head)
