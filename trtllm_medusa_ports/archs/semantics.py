"""How a base computes, as the reference executor and the engine adapters need it: norms, MLP kinds,
position embeddings, and the ``Semantics`` an adapter derives from a TensorRT-LLM config.json."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class NormKind(str, enum.Enum):
    RMS = "rms"
    LAYER = "layer"


class MlpKind(str, enum.Enum):
    GATED = "gated"  # proj(act(fc(x)) * gate(x))
    PLAIN = "plain"  # proj(act(fc(x)))
    SWIGLU = "swiglu"  # one fused fc [up; gate]: proj(up * silu(gate))


class PositionEmbedding(str, enum.Enum):
    """TensorRT-LLM's ``position_embedding_type`` values this project meets."""

    ROPE_GPT_NEOX = "rope_gpt_neox"
    ROPE_GPTJ = "rope_gptj"
    LONG_ROPE = "long_rope"
    ALIBI = "alibi"
    ALIBI_WITH_SCALE = "alibi_with_scale"
    LEARNED_ABSOLUTE = "learned_absolute"

    @property
    def is_rope(self) -> bool:
        return self in (PositionEmbedding.ROPE_GPT_NEOX, PositionEmbedding.ROPE_GPTJ, PositionEmbedding.LONG_ROPE)


class AlibiStyle(str, enum.Enum):
    """How ALiBi slopes are made for a head count that is not a power of two."""

    BLOOM = "bloom"
    MPT = "mpt"


@dataclass(frozen=True)
class LongRope:
    """``long_rope`` (Phi-3 / Phi-3.5 with 128k context): two RoPE tables, each inverse frequency divided by its
    factor. The engine builds both (tensorrt_llm/layers/attention.py ``create_attention_const_params``, with
    ``RopeEmbeddingUtils.create_sinusoidal_positions_long_rope_for_attention_plugin``) and picks one per request
    per phase by the lengths the batch manager gives it (see :meth:`context_long`, :meth:`generation_long`). ``short_mscale`` / ``long_mscale`` None: derived from the
    table's size, as upstream does (PhiMoE writes its own)."""

    short_factors: tuple[float, ...]
    long_factors: tuple[float, ...]
    original_max_positions: int
    short_mscale: float | None = None
    long_mscale: float | None = None

    # The attention plugin takes the long table when the longest "context length" among the requests of the phase
    # it runs exceeds original_max_position_embeddings (cpp/tensorrt_llm/plugins/gptAttentionPlugin/
    # gptAttentionPlugin.cpp: useLongRoPECache = isLongRoPE() && max(host_context_lengths) > original), and the
    # batch manager fills those lengths per phase (cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp
    # setFromInputs): a context request gives the tokens its step computes (the chunk; with chunked context or KV
    # cache block reuse, on by default, not the whole prompt), a generation request its prompt plus its draft
    # tokens, for Medusa the engine's max draft length whatever the tree (trtGptModelInflightBatching.cpp
    # updateRequests). Requests batched in one phase share the longest.

    def context_long(self, computed_tokens: int) -> bool:
        """Whether a context step computing ``computed_tokens`` (the whole prompt, or one chunk of it) runs on the
        long factors."""
        return computed_tokens > self.original_max_positions

    def generation_long(self, prompt_tokens: int, draft_tokens: int) -> bool:
        """Whether the generation steps of a request with ``prompt_tokens`` run on the long factors, in an engine
        whose max draft length is ``draft_tokens`` (0 without speculative decoding)."""
        return prompt_tokens + draft_tokens > self.original_max_positions

    def short_window(self, draft_tokens: int) -> int:
        """The longest prompt whose context step and every generation step run on the short table (may be < 1)."""
        return self.original_max_positions - draft_tokens


#: the YaRN options TensorRT-LLM 1.2 reads from ``rotary_scaling`` and their defaults there
#: (tensorrt_llm/layers/attention.py ``create_attention_const_params``): ``factor`` 1.0, ``beta_fast`` 32.0,
#: ``beta_slow`` 1.0, ``mscale`` 1.0, ``mscale_all_dim`` 0.0, ``original_max_position_embeddings`` 4096
YARN_DEFAULTS = {"factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0,
                 "original_max_position_embeddings": 4096}


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale for a context ``scale`` times the original: 0.1 * mscale * ln(scale) + 1 above 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_engine_mscale(scaling: dict) -> float:
    """The factor the engine multiplies YaRN's cos and sin by: get_mscale(factor, mscale) / get_mscale(factor,
    mscale_all_dim), with the engine's defaults (1.0 and 0.0: plain 0.1 ln(factor) + 1)."""
    o = {**YARN_DEFAULTS, **{k: v for k, v in scaling.items() if v is not None}}
    return yarn_get_mscale(float(o["factor"]), float(o["mscale"])) / yarn_get_mscale(float(o["factor"]),
                                                                                       float(o["mscale_all_dim"]))



@dataclass(frozen=True)
class Semantics:
    """How the network computes, as the reference executor and engine adapters need it.

    Derived from the TensorRT-LLM config.json by the family adapter.
    """

    norm: NormKind = NormKind.RMS
    norm_epsilon: float = 1e-6
    mlp: MlpKind = MlpKind.GATED
    hidden_act: str = "silu"
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE_GPT_NEOX
    rotary_dim: int = 0  # 0 = the whole head
    rotary_base: float = 10000.0
    rotary_scaling: dict | None = None
    parallel_residual: bool = False  # x + attn(ln(x)) + mlp(ln2(x)) (GPT-NeoX) / shared ln (Phi-2, Falcon)
    shared_input_norm: bool = False  # parallel residual reading one norm (Falcon-7B, Phi-2)
    embedding_scale: float = 1.0
    residual_scale: float = 1.0  # Granite: attention and MLP outputs scaled before each residual add
    logits_scale: float = 1.0  # Granite: the base's logits (not the Medusa heads') multiplied by it
    has_embedding_norm: bool = False  # Bloom's word_embeddings_layernorm
    attention_scale: float | None = None  # None = 1/sqrt(head_size)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    qk_norm: bool = False
    #: epsilon of the q/k norms in the engine: TensorRT-LLM's Attention default (1e-5), because the
    #: Gemma 3 and QWen layers build them without passing eps (tensorrt_llm/layers/attention.py,
    #: models/gemma/model.py, models/qwen/model.py), whatever the model's rms_norm_eps
    qk_norm_epsilon: float = 1e-5
    post_attention_norm_after: bool = False  # Gemma2/3: norm on the attention output too
    #: post-norm layers (OPT-350m: ``do_layer_norm_before`` false): ``ln1(x + attn(x))``, then ``ln2(h + mlp(h))``,
    #: the attention and the MLP reading the un-normalised state
    post_norm: bool = False
    #: a final norm (``transformer.ln_f``) between the last layer and the lm_head; False: none (OPT's post-norm)
    final_norm: bool = True
    mlp_norm: str = "post_layernorm"  # name of the norm in front of the MLP (GPT-NeoX: post_attention_layernorm)
    longrope: LongRope | None = None  # position_embedding long_rope: its two tables
    local_rotary_base: float | None = None  # Gemma3: local (sliding) layers use another RoPE base
    #: the RoPE scaling the *engine* applies on local layers (Gemma3: the global one, see archs/gemma.py)
    local_rotary_scaling: dict | None = None
    sliding_window_pattern: int = 0  # Gemma3: layer i is local unless (i + 1) % pattern == 0
    sliding_window: int | None = None  # window of local layers (the executor refuses longer sequences)
    alibi_bias_max: float = 8.0
    alibi_style: AlibiStyle = AlibiStyle.BLOOM
    clip_qkv: float | None = None  # MPT
    #: mixture of experts (Mixtral): experts of a gated SiLU MLP chosen per token by a float32 router, ``top_k``
    #: of them weighted by a softmax over their logits (``moe_renormalize``: TensorRT-LLM's RENORMALIZE) or
    #: by their share of the softmax over all experts; 0: a dense MLP
    moe_num_experts: int = 0
    moe_top_k: int = 0
    moe_renormalize: bool = True
    #: SPARSE_MIXER routing (Phi-3.5-MoE; reference/routing.py) with this epsilon; None: by ``moe_renormalize``
    moe_sparse_mixer_epsilon: float | None = None
    #: a shared expert beside the routed ones (Qwen2-MoE): ``+ sigmoid(shared_expert_gate(x)) * shared(x)``
    moe_shared_expert: bool = False
    #: the row-parallel layers' biases are added by every rank before one all-reduce (GPT-J): the checkpoint
    #: holds them on tp rank 0 and zeros on the others (``Split.FIRST_RANK``), and the executor sums them
    row_bias_every_rank: bool = False
