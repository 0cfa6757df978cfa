"""tensorrt_llm/models/qwen/{config,model}.py (1.2.x): QWenConfig, QWenDecoderLayer, QWenModel,
QWenForCausalLM.

The layer reads ``config.qwen_type`` and ``config.seq_length`` (``max_seqlen_for_logn_scaling``),
neither of which QWenConfig declares: a config without them fails with AttributeError, as
upstream. Attention gets ``bias=attn_bias`` and ``dense_bias=False`` (o_proj never has a bias).
q/k RmsNorm for qwen_type qwen3/qwen3_moe, built without ``eps`` (so 1e-5): this is upstream's
Qwen3 TensorRT-flow support (PR "Add TensorRT-Engine Qwen3 (dense) model support"); the exact
1.2.x file was not available to read, see LEDGER.md.
"""

from ...layers import (
    Attention,
    AttentionMaskType,
    Embedding,
    GatedMLP,
    LayerNormType,
    RmsNorm,
)
from ...layers.moe import MOE, MoeConfig, SharedMoE
from ...module import Module
from ..modeling_utils import (
    DecoderLayerList,
    DecoderModelForCausalLM,
    PretrainedConfig,
    lm_head_for,
    prenorm_block,
    stage_forward,
)


class QWenConfig(PretrainedConfig):
    def __init__(self, *, mlp_bias=False, attn_bias=True, rotary_base=10000.0, rotary_scaling=None,
                 disable_weight_only_quant_plugin=False, use_logn_attn=False, moe=None, num_labels=1,
                 mlp_only_layers=None, decoder_sparse_step=1, moe_intermediate_size=0,
                 moe_shared_expert_intermediate_size=0, **kwargs):
        self.mlp_bias, self.attn_bias = mlp_bias, attn_bias
        self.moe = MoeConfig.from_dict(moe).validate() if isinstance(moe, dict) else (moe or MoeConfig())
        self.moe_intermediate_size = moe_intermediate_size
        self.moe_shared_expert_intermediate_size = moe_shared_expert_intermediate_size
        self.rotary_base, self.rotary_scaling = rotary_base, rotary_scaling
        self.use_logn_attn, self.num_labels = use_logn_attn, num_labels
        self.mlp_only_layers, self.decoder_sparse_step = mlp_only_layers or [], decoder_sparse_step
        super().__init__(**kwargs)

    def to_dict(self):
        """Upstream's ``to_dict`` writes ``moe`` through ``MoeConfig.to_dict`` (a dict, never the object)."""
        out = super().to_dict()
        out["moe"] = self.moe.to_dict()
        return out


class QWenDecoderLayer(Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = layer_idx - config.mapping.pp_layers(config.num_hidden_layers)[0]
        qk_norm = config.qwen_type in ("qwen3", "qwen3_moe")
        self.input_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.attention = Attention(
            local_layer_idx=local, hidden_size=config.hidden_size, attention_head_size=config.head_size,
            num_attention_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            max_seqlen_for_logn_scaling=config.seq_length, max_position_embeddings=config.max_position_embeddings,
            dtype=config.dtype, attention_mask_type=AttentionMaskType.causal, bias=config.attn_bias,
            position_embedding_type=config.position_embedding_type, rotary_embedding_base=config.rotary_base,
            rotary_embedding_scaling=config.rotary_scaling, tp_rank=config.mapping.tp_rank,
            tp_size=config.mapping.tp_size, use_logn_scaling=config.use_logn_attn, dense_bias=False,
            qk_layernorm=qk_norm, layernorm_type=LayerNormType.RmsNorm if qk_norm else LayerNormType.LayerNorm)
        ffn = config.intermediate_size // 2 if config.qwen_type == "qwen" else config.intermediate_size
        if config.qwen_type == "qwen2_moe" and config.moe.has_moe():  # the routed experts and the shared one
            config.moe.shared_expert_intermediate_size = config.moe_shared_expert_intermediate_size
            self.mlp = SharedMoE(config.moe, config.hidden_size, config.moe_intermediate_size, config.hidden_act,
                                 mapping=config.mapping, bias=False, dtype=config.dtype,
                                 tp_size=config.mapping.tp_size, use_shared_gate=True, use_side_stream=True)
        elif config.moe.has_moe():
            self.mlp = MOE(config.moe, config.hidden_size, config.moe_intermediate_size, config.hidden_act,
                           mapping=config.mapping, bias=False, dtype=config.dtype, tp_size=config.mapping.tp_size)
        else:
            self.mlp = GatedMLP(config.hidden_size, ffn, config.hidden_act, dtype=config.dtype, bias=config.mlp_bias,
                                tp_size=config.mapping.tp_size)
        self.post_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, hidden_states, attention_mask=None, use_cache=False, spec_decoding_params=None,
                kv_cache_params=None, attention_params=None, lora_layer_params=None, mrope_params=None):
        return prenorm_block(self, hidden_states, use_cache,
                             attention_mask=attention_mask, spec_decoding_params=spec_decoding_params,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             lora_layer_params=lora_layer_params, mrope_params=mrope_params)


class QWenModel(Module):
    def __init__(self, config):
        super().__init__()
        self.mapping = config.mapping
        if self.mapping.is_first_pp_rank():
            self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = DecoderLayerList(QWenDecoderLayer, config)
        if self.mapping.is_last_pp_rank():
            self.ln_f = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, spec_decoding_params=None, attention_mask=None,
                kv_cache_params=None, attention_params=None, mrope_params=None, hidden_states=None,
                prompt_embedding_table=None, prompt_tasks=None, prompt_vocab_size=None, lora_params=None):
        return stage_forward(self, input_ids, hidden_states, use_cache,
                             spec_decoding_params=spec_decoding_params, attention_mask=attention_mask,
                             kv_cache_params=kv_cache_params, attention_params=attention_params,
                             lora_params=lora_params, mrope_params=mrope_params)


class QWenForCausalLM(DecoderModelForCausalLM):
    #: the names upstream's MODEL_MAP (tensorrt_llm/models/__init__.py) maps to this class
    MODEL_MAP_KEYS = ('QWenLMHeadModel', 'QWenForCausalLM', 'Qwen2ForCausalLM', 'Qwen2MoeForCausalLM',
                      'Qwen2ForSequenceClassification', 'Qwen2VLForConditionalGeneration', 'Qwen2VLModel',
                      'Qwen3ForCausalLM', 'Qwen3MoeForCausalLM')

    config_class = QWenConfig

    def __init__(self, config):
        transformer = QWenModel(config)
        lm_head = lm_head_for(config, bias=False)
        super().__init__(config, transformer, lm_head)
