"""tensorrt_llm/layers/attention.py ``Attention`` and ``SpecDecodingParams`` (1.2.x).

``Attention.__init__`` is keyword-only. Per rank: ``nh // tp`` query heads (nh must
divide by tp) and ``ceil(nkv / tp)`` KV heads (replicated when nkv < tp); ``qkv``
ColumnLinear(hidden, (nq + 2 nkv) * head_size per rank, bias=bias); ``dense``
RowLinear(nh * head_size, hidden, bias=dense_bias, which defaults to bias); with
``qk_layernorm`` a ``q_layernorm`` / ``k_layernorm`` of ``layernorm_type`` over the
head size, built with the ``eps`` argument (default 1e-5, not the model's epsilon).
``forward`` takes ``spec_decoding_params``; the stand-in records what it received.
"""

from .. import CALLS
from ..functional import Tensor, rotary_scaling_type
from ..layers.linear import ColumnLinear, RowLinear
from ..layers.normalization import LayerNorm, RmsNorm
from ..module import Module


class PositionEmbeddingType:
    """tensorrt_llm/functional.py PositionEmbeddingType (the names config.json uses)."""

    learned_absolute = "learned_absolute"
    rope_gptj = "rope_gptj"
    rope_gpt_neox = "rope_gpt_neox"
    long_rope = "long_rope"
    alibi = "alibi"
    alibi_with_scale = "alibi_with_scale"
    relative = "relative"
    chatglm = "chatglm"
    yarn = "yarn"
    mrope = "mrope"
    deferred = "deferred"

    @classmethod
    def from_string(cls, s):
        # upstream: PositionEmbeddingType[s], a KeyError turned into this ValueError
        if not isinstance(s, str) or s not in vars(cls) or s.startswith("_") or s == "from_string":
            raise ValueError(f"Unsupported position embedding type: {s}")
        return s


class LayerNormType:
    LayerNorm = "LayerNorm"
    RmsNorm = "RmsNorm"


class AttentionMaskType:
    padding = 0
    causal = 1
    bidirectional = 2


class SpecDecodingParams:
    def __init__(self, spec_decoding_is_generation_length_variable=False, spec_decoding_max_generation_length=1,
                 spec_decoding_generation_lengths=None, spec_decoding_position_offsets=None,
                 spec_decoding_packed_mask=None, spec_decoding_use=None):
        self.spec_decoding_is_generation_length_variable = spec_decoding_is_generation_length_variable
        self.spec_decoding_max_generation_length = spec_decoding_max_generation_length
        self.spec_decoding_generation_lengths = spec_decoding_generation_lengths
        self.spec_decoding_position_offsets = spec_decoding_position_offsets
        self.spec_decoding_packed_mask = spec_decoding_packed_mask
        self.spec_decoding_use = spec_decoding_use


class KeyValueCacheParams:
    def __init__(self, past_key_value=None, **kwargs):
        self.past_key_value = past_key_value
        for k, v in kwargs.items():
            setattr(self, k, v)


class AttentionParams:
    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)


class Attention(Module):
    def __init__(self, *, local_layer_idx, hidden_size, num_attention_heads, num_kv_heads=None,
                 max_position_embeddings=1024, num_layers=1, apply_query_key_layer_scaling=False,
                 attention_head_size=None, qk_layernorm=False, layernorm_type=LayerNormType.LayerNorm,
                 layernorm_share=True, inner_layernorm=False, eps=1e-05, attention_mask_type=AttentionMaskType.padding,
                 bias=True, dtype=None, position_embedding_type=PositionEmbeddingType.learned_absolute,
                 rotary_embedding_base=10000.0, rotary_embedding_base_local=1.0, rotary_embedding_scaling=None,
                 rotary_embedding_percentage=1.0, rope_scaling_short_factors=None, rope_scaling_long_factors=None,
                 rope_scaling_short_mscale=None, rope_scaling_long_mscale=None, original_max_position_embeddings=1024,
                 tp_group=None, tp_size=1, tp_rank=0, quant_mode=None, q_scaling=1.0, cross_attention=False,
                 relative_attention=False, max_distance=0, num_buckets=0, dense_bias=None, clip_qkv=None,
                 alibi_bias_max=8, skip_cross_kv=False, max_attn_value=0.0, block_sparse_params=None,
                 use_implicit_relative_attention=False, reorder=False, enable_qkv=True, cp_group=None, cp_size=1,
                 cp_rank=0, max_seqlen_for_logn_scaling=8192, use_logn_scaling=False, is_local=False):
        super().__init__()
        if num_attention_heads % tp_size:
            raise AssertionError(f"num_attention_heads {num_attention_heads} is not divisible by tp_size {tp_size}")
        self.local_layer_idx = local_layer_idx
        self.attention_head_size = attention_head_size or hidden_size // num_attention_heads
        self.num_attention_heads = num_attention_heads // tp_size
        nkv = num_kv_heads if num_kv_heads is not None else num_attention_heads
        self.num_attention_kv_heads = (nkv + tp_size - 1) // tp_size
        self.position_embedding_type = position_embedding_type
        self.rotary_embedding_base = rotary_embedding_base
        self.rotary_embedding_base_local = rotary_embedding_base_local
        self.rotary_embedding_scaling = rotary_embedding_scaling
        # Attention.__init__ parses the scaling it is given (the plugin's rotary_embedding_scale_type / _scale)
        self.rotary_embedding_scale_type, self.rotary_embedding_scale = rotary_scaling_type(rotary_embedding_scaling)
        self.rotary_embedding_percentage = rotary_embedding_percentage
        self.q_scaling = q_scaling
        self.max_attn_value = max_attn_value
        self.rope_scaling_short_factors, self.rope_scaling_long_factors = (rope_scaling_short_factors,
                                                                           rope_scaling_long_factors)
        self.original_max_position_embeddings = original_max_position_embeddings
        self.alibi_bias_max = alibi_bias_max
        self.clip_qkv = clip_qkv
        self.is_local = is_local
        self.qk_layernorm = qk_layernorm
        hs = self.attention_head_size
        qkv_out = tp_size * (self.num_attention_heads + 2 * self.num_attention_kv_heads) * hs
        self.qkv = ColumnLinear(hidden_size, qkv_out, bias=bias, dtype=dtype, tp_size=tp_size, gather_output=False,
                                is_qkv=True)
        self.dense = RowLinear(tp_size * self.num_attention_heads * hs, hidden_size,
                               bias=bias if dense_bias is None else dense_bias, dtype=dtype, tp_size=tp_size)
        if qk_layernorm:
            norm = RmsNorm if layernorm_type == LayerNormType.RmsNorm else LayerNorm
            self.q_layernorm = norm(hs, eps=eps, dtype=dtype)
            self.k_layernorm = norm(hs, eps=eps, dtype=dtype)
            self.qk_layernorm_eps = eps

    def forward(self, hidden_states, attention_mask=None, attention_packed_mask=None, use_cache=False,
                spec_decoding_params=None, mrope_params=None, kv_cache_params=None, attention_params=None,
                encoder_output=None, position_embedding=None, norm_before_bmm1=False, lora_layer_params=None,
                cross_kv_cache_gen=None, cross_kv_reuse=None, all_reduce_params=None, skip_attn=None):
        CALLS.append(("attention", self.local_layer_idx, spec_decoding_params))
        out = Tensor(f"attention({hidden_states.name})")
        return (out, Tensor("present")) if use_cache else out
