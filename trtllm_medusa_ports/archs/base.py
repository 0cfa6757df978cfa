"""What a base-model family adapter declares, and the registry that finds it.

An adapter is mostly data: a config mapping (HF config.json -> TensorRT-LLM
config.json fields), a weight table (role -> HF name, over the shared ``ROLES``
table of TensorRT-LLM names and splits, plus the family's deviations: fused
layouts, value transforms, biases), a position embedding, and the semantics the CPU
reference executor needs (norm, MLP, residual layout, ...), which it derives
from the *TensorRT-LLM* config so that verification reads only the artifact.

A new family subclasses the closest existing adapter and overrides the few
hooks where it differs (see docs/porting-guide.md).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from trtllm_medusa_ports.arrays import Array
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.sharding import Split

if TYPE_CHECKING:
    import torch

#: Combine the loaded HF tensors of one rule into one tensor, or (q, k, v) for Split.QKV.
Combine = Callable[[list[Array]], "Array | tuple[Array, Array, Array]"]


def layout_only(combine: Callable) -> Callable:
    """Mark a combine that only rearranges rows and columns (no value changes).

    A marked combine must work on numpy arrays as well as torch tensors - slicing, ``reshape`` and
    the helpers of trtllm_medusa_ports/arrays.py - because files/byte_moves.py runs it on integer
    stand-ins to find which bytes go where, and then moves those bytes without making a tensor.
    Unmarked combines take the whole-tensor path.
    """
    combine.layout_only = True  # type: ignore[attr-defined]
    return combine


def is_layout_only(combine: Callable) -> bool:
    return getattr(combine, "layout_only", False) is True and not isinstance(combine, ValueTransform)


@layout_only
def _first(ts: list[Array]) -> Array:
    return ts[0]


@layout_only
def _as_qkv(ts: list[Array]) -> tuple[Array, Array, Array]:
    q, k, v = ts
    return q, k, v


@dataclass(frozen=True)
class WeightRule:
    """One TensorRT-LLM tensor: where it comes from and how it is cut.

    ``sources`` are HF tensor names; ``{i}`` stands for the HF layer index.
    ``alternatives`` are tried in order when the first names are absent (tied
    embeddings: ``lm_head.weight`` or else ``model.embed_tokens.weight``).
    """

    name: str
    sources: tuple[str, ...]
    split: Split = Split.REPLICATE
    combine: Combine = _first
    alternatives: tuple[tuple[str, ...], ...] = ()
    #: stored in this dtype whatever the checkpoint's (an MoE router: float32); None: the checkpoint dtype
    dtype: str | None = None
    #: the experts of an MoE layer stacked (``[experts, out, in]``): not one linear of one module
    experts: bool = False

    def candidates(self) -> tuple[tuple[str, ...], ...]:
        return (self.sources,) + self.alternatives


#: a bias follows its weight's split, except where the layer adds it once after the all-reduce
_BIAS_SPLIT = {Split.ROW: Split.REPLICATE, Split.EMBEDDING: Split.REPLICATE}


# -- fused qkv layouts: each returns a combine that yields (q, k, v) -------------------------
def fused_qkv(num_heads: int, num_kv: int, head_size: int) -> Combine:
    """``[q; k; v]`` stacked rows (Phi-3 ``qkv_proj``, MPT ``Wqkv``)."""

    @layout_only
    def combine(ts: list[Array]):
        t = ts[0]
        q, k = num_heads * head_size, num_kv * head_size
        return t[:q], t[q : q + k], t[q + k : q + 2 * k]

    return combine


def per_head_interleaved_qkv(num_heads: int, head_size: int) -> Combine:
    """Rows ordered ``(heads, 3, head_size)`` (GPT-NeoX, Bloom ``query_key_value``).

    TensorRT-LLM wants ``(3, heads * head_size)`` before the TP split
    (examples/models/contrib/{gptneox,bloom}/convert_checkpoint.py).
    """

    @layout_only
    def combine(ts: list[Array]):
        t = ts[0]
        rest = tuple(t.shape[1:])
        v = t.reshape((num_heads, 3, head_size) + rest)
        return tuple(v[:, i].reshape((num_heads * head_size,) + rest) for i in range(3))

    return combine


def grouped_qkv(num_heads: int, num_kv: int, head_size: int) -> Combine:
    """Rows ordered ``(kv_heads, heads/kv_heads + 2, head_size)``: each group's queries, then its k, v.

    Falcon's ``query_key_value`` in all three variants (multi-head: groups of one,
    multi-query: one group, new decoder architecture: grouped-query);
    tensorrt_llm/models/falcon/convert.py reorders the same way.
    """

    @layout_only
    def combine(ts: list[Array]):
        t = ts[0]
        rest = tuple(t.shape[1:])
        per = num_heads // num_kv
        g = t.reshape((num_kv, per + 2, head_size) + rest)
        q = g[:, :per].reshape((num_heads * head_size,) + rest)
        k = g[:, per].reshape((num_kv * head_size,) + rest)
        v = g[:, per + 1].reshape((num_kv * head_size,) + rest)
        return q, k, v

    return combine


@layout_only
def stacked_expert_fc(ts):
    """MoE experts' fc from per-expert sources ``(up_0, gate_0, up_1, gate_1, ...)``, each ``[inter, hidden]``: per
    expert ``[up; gate]`` (the linear half, then the activated one: tensorrt_llm/layers/moe.py), experts stacked -
    ``[experts, 2 * inter, hidden]``. A pure layout (rows concatenated, then viewed per expert), so the byte
    path moves it."""
    from trtllm_medusa_ports.arrays import cat

    rows, rest = ts[0].shape[0], tuple(ts[0].shape[1:])
    return cat(list(ts), dim=0).reshape((len(ts) // 2, 2 * rows) + rest)


@layout_only
def stacked_experts(ts):
    """MoE experts' tensors stacked on a new dim 0 (the experts' proj: ``[experts, hidden, inter]``); a pure layout."""
    from trtllm_medusa_ports.arrays import cat

    return cat(list(ts), dim=0).reshape((len(ts),) + tuple(ts[0].shape))


#: ``MoeConfig.normalization_mode`` (tensorrt_llm/layers/moe.py ``ExpertScaleNormalizationMode``)
MOE_NONE, MOE_RENORMALIZE = 0, 1


def moe_config(num_experts: int, top_k: int, normalization_mode: int) -> dict:
    """config.json's ``moe``: all nine ``MoeConfig`` fields as its ``to_dict`` writes them (``from_dict`` is
    ``cls(**d)``, so no other key); no shared expert, no device-limited routing (tensorrt_llm/layers/moe.py)."""
    return {"num_experts": num_experts, "shared_expert_intermediate_size": 0, "top_k": top_k,
            "normalization_mode": normalization_mode, "sparse_mixer_epsilon": 0.01, "tp_mode": 0,
            "device_limited_n_group": 0, "device_limited_topk_group": 0, "device_limited_routed_scaling_factor": 1.0}


def expert_rules(router: str, fc: tuple[str, ...], proj: tuple[str, ...]) -> list[WeightRule]:
    """The MoE layer's tensors from per-expert sources: the router (float32), ``fc`` from ``(up_0, gate_0, ...)``,
    ``proj`` from ``(down_0, ...)``, stacked and split as ``MOE`` declares them."""
    return [
        WeightRule("mlp.router.weight", (router,), Split.REPLICATE, dtype="float32"),
        WeightRule("mlp.fc.weight", fc, Split.EXPERT_PAIR, stacked_expert_fc, experts=True),
        WeightRule("mlp.proj.weight", proj, Split.EXPERT_ROW, stacked_experts, experts=True),
    ]


def moe_semantics(sem: Semantics, cfg: dict, shared_expert: bool = False) -> Semantics:
    """``sem`` with the routing the checkpoint's ``moe`` block describes (the experts' gated SiLU)."""
    moe = cfg["moe"]
    return dataclasses.replace(sem, hidden_act="silu", moe_num_experts=int(moe["num_experts"]),
                               moe_top_k=int(moe["top_k"]),
                               moe_renormalize=int(moe["normalization_mode"]) == MOE_RENORMALIZE,
                               moe_shared_expert=shared_expert)


@dataclass(frozen=True)
class ValueTransform:
    """A combine that changes values, not only their layout (one source tensor).

    Computed in float32 *before* the cast to the checkpoint dtype, as upstream's converters do,
    so the checkpoint holds ``round(f(w))``. ``verify`` gives the Hugging Face model
    ``inverse(round(f(w)))`` so that it computes with exactly the values the engine multiplies
    by: with Gemma's ``w + 1`` norms (weights of 1e3 in real checkpoints) ``1 + round(w)`` and
    ``round(w + 1)`` differ by up to a bfloat16 step.
    """

    forward: Callable[[torch.Tensor], torch.Tensor]
    inverse: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, ts: list[torch.Tensor]) -> torch.Tensor:
        return self.forward(ts[0].float())

    def as_stored(self, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The Hugging Face weight whose transform equals the stored, rounded tensor (float32)."""
        return self.inverse(self.forward(w.float()).to(dtype).float())


#: Gemma's RMSNorm computes ``x * (1 + w)``; TensorRT-LLM's multiplies by the stored weight, so its
#: converter stores ``w + 1``, added in float32 before the cast (tensorrt_llm/models/gemma/convert.py)
plus_one = ValueTransform(lambda w: w + 1.0, lambda w: w - 1.0)


class Place(str, enum.Enum):
    """Where a tensor lives: on the first pipeline stage, in every decoder layer, or on the last."""

    FIRST = "first"
    LAYER = "layer"
    LAST = "last"


@dataclass(frozen=True)
class RoleSpec:
    """A role's TensorRT-LLM name (without ``.weight``/``.bias``), its tensor-parallel split, its place."""

    trtllm_name: str
    split: Split = Split.REPLICATE
    place: Place = Place.LAYER


class Role(str, enum.Enum):
    """What a tensor does in a decoder-only base; the keys of an adapter's ``weights`` table."""

    EMBEDDING = "embedding"
    EMBEDDING_NORM = "embedding_norm"  # Bloom's word_embeddings_layernorm
    INPUT_NORM = "input_norm"
    QKV = "qkv"  # a fused HF tensor (str) or separate q, k, v projections (a 3-tuple)
    Q_NORM = "q_norm"
    K_NORM = "k_norm"
    DENSE = "dense"  # the attention output projection (o_proj)
    POST_ATTENTION_NORM = "post_attention_norm"  # in front of the MLP (Gemma 2/3: on the attention output)
    MLP_NORM = "mlp_norm"  # Falcon's second parallel norm (ln_mlp)
    PRE_FEEDFORWARD_NORM = "pre_feedforward_norm"  # Gemma 2/3
    POST_FEEDFORWARD_NORM = "post_feedforward_norm"  # Gemma 2/3
    FC = "fc"  # the activated up-projection (Llama gate_proj) or the only one (plain MLP)
    GATE = "gate"  # the multiplied branch of a gated MLP (Llama up_proj)
    PROJ = "proj"  # the down-projection
    FINAL_NORM = "final_norm"
    LM_HEAD = "lm_head"


#: The shared weight table: every role's TensorRT-LLM name and split, in the order rules are made.
#: Names follow the decoder classes of tensorrt_llm/models/{llama,gemma,qwen,gpt,phi,phi3,falcon,
#: gptneox,bloom,mpt}/model.py; splits follow their converters (column-parallel fc/gate, row-parallel
#: dense/proj, vocabulary-parallel lm_head).
ROLES: dict[Role, RoleSpec] = {
    Role.EMBEDDING: RoleSpec("transformer.vocab_embedding", Split.EMBEDDING, Place.FIRST),
    Role.EMBEDDING_NORM: RoleSpec("transformer.ln_embed", place=Place.FIRST),
    Role.INPUT_NORM: RoleSpec("input_layernorm"),
    Role.QKV: RoleSpec("attention.qkv", Split.QKV),
    Role.Q_NORM: RoleSpec("attention.q_layernorm"),
    Role.K_NORM: RoleSpec("attention.k_layernorm"),
    Role.DENSE: RoleSpec("attention.dense", Split.ROW),
    Role.POST_ATTENTION_NORM: RoleSpec("post_layernorm"),
    Role.MLP_NORM: RoleSpec("mlp_layernorm"),
    Role.PRE_FEEDFORWARD_NORM: RoleSpec("pre_feedforward_layernorm"),
    Role.POST_FEEDFORWARD_NORM: RoleSpec("post_feedforward_layernorm"),
    Role.FC: RoleSpec("mlp.fc", Split.COLUMN),
    Role.GATE: RoleSpec("mlp.gate", Split.COLUMN),
    Role.PROJ: RoleSpec("mlp.proj", Split.ROW),
    Role.FINAL_NORM: RoleSpec("transformer.ln_f", place=Place.LAST),
    Role.LM_HEAD: RoleSpec("lm_head", Split.VOCAB, Place.LAST),
}

#: config.json keys every TensorRT-LLM class reads: ``PretrainedConfig``'s fields, and the RoPE fields
#: ``Attention.create_attention_const_params`` reads from any config (tensorrt_llm/models/modeling_utils.py,
#: tensorrt_llm/layers/attention.py); ``model_type`` is this project's record of the family
COMMON_CONFIG_KEYS = frozenset({
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_size",
    "intermediate_size", "vocab_size", "max_position_embeddings", "hidden_act", "norm_epsilon",
    "position_embedding_type", "rotary_base", "rotary_scaling", "rotary_pct", "rotary_dim", "model_type",
})

#: The Hugging Face names of every role in a Llama decoder - the table a family overrides only where it
#: differs (``ArchAdapter.names``). Layer roles are relative to the family's ``layer_prefix``
#: (``model.layers.{i}.``); the others are whole names. ``.weight`` / ``.bias`` are appended.
LLAMA_NAMES: dict[Role, str | tuple[str, str, str]] = {
    Role.EMBEDDING: "model.embed_tokens",
    Role.INPUT_NORM: "input_layernorm",
    Role.QKV: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    Role.DENSE: "self_attn.o_proj",
    Role.POST_ATTENTION_NORM: "post_attention_layernorm",
    Role.FC: "mlp.gate_proj",  # the activated branch
    Role.GATE: "mlp.up_proj",
    Role.PROJ: "mlp.down_proj",
    Role.FINAL_NORM: "model.norm",
    Role.LM_HEAD: "lm_head",
}

NORMS = frozenset({Role.EMBEDDING_NORM, Role.INPUT_NORM, Role.Q_NORM, Role.K_NORM, Role.POST_ATTENTION_NORM,
                   Role.MLP_NORM, Role.PRE_FEEDFORWARD_NORM, Role.POST_FEEDFORWARD_NORM, Role.FINAL_NORM})
LINEARS = frozenset({Role.QKV, Role.DENSE, Role.FC, Role.GATE, Role.PROJ})

#: HF source of a role: one tensor name prefix (``{i}`` = layer index), or for ``Role.QKV`` the
#: three prefixes of separate q, k and v projections
Source = str | tuple[str, str, str]


@dataclass(frozen=True)
class Deviation:
    """How a family departs from the shared table for one role: another combine (fused layouts,
    value transforms), another split, another TensorRT-LLM name."""

    combine: Combine | None = None
    split: Split | None = None
    trtllm_name: str | None = None
    #: the bias's own split, where it is not the one that follows the weight's (``Split.FIRST_RANK``)
    bias_split: Split | None = None


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
    mlp_norm: str = "post_layernorm"  # name of the norm in front of the MLP (GPT-NeoX: post_attention_layernorm)
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
    #: a shared expert beside the routed ones (Qwen2-MoE): ``+ sigmoid(shared_expert_gate(x)) * shared(x)``
    moe_shared_expert: bool = False
    #: the row-parallel layers' biases are added by every rank before one all-reduce (GPT-J): the checkpoint
    #: holds them on tp rank 0 and zeros on the others (``Split.FIRST_RANK``), and the executor sums them
    row_bias_every_rank: bool = False


class ArchAdapter:
    """Base adapter: a Llama-shaped decoder. Families override class data and a few hooks."""

    #: HF ``architectures[0]`` names this adapter serves (the registry keys)
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    #: short family name, also ``--model_type`` and the HF ``model_type`` values it accepts
    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: the README family table (trtllm_medusa_ports/families.py renders it; every registered class
    #: declares its own): a note after the names, the position embedding in words, and what
    #: TensorRT-LLM 1.2.x can serve and how
    display_note: ClassVar[str] = ""
    position_summary: ClassVar[str] = ""
    medusa_status: ClassVar[str] = ""
    #: a tiny random model of the family (Hugging Face config kwargs with ``model_type``), declared by
    #: the class that serves ``hf_architectures[0]``; tests and the demo build it
    tiny_config: ClassVar[dict | None] = None
    #: what the class's own ``engine_limits`` refuses, in words with the upstream file (each class declares its
    #: own; docs/compatibility-rules.md lists them, rendered by trtllm_medusa_ports/families.py)
    engine_limits_summary: ClassVar[str] = ""
    #: the family's test data, read by every family-wide test (each class declares its own; see
    #: :func:`family_test_cases`): shapes beyond the tiny default (``tiny_config`` overrides: GQA/MQA,
    #: tied/untied, biases), each converted and verified at tp 1 and 2 in the test dtypes
    test_variants: ClassVar[tuple[dict, ...]] = ()
    #: non-default values of the config keys the adapter writes (HF names), which the tests read back from
    #: the reference semantics and from the engine class: a key written under another name fails.
    #: None: not checked that way
    key_cases: ClassVar[dict | None] = None
    #: verified at pp 2 too (a family whose layers depend on the global layer index, or whose class sends
    #: hidden states between stages); classes without pipeline parallelism are tested for the refusal
    pipeline_test: ClassVar[bool] = False
    #: the error rules ``check`` gives the family's tiny model (and so its tests convert it with
    #: ``--allow_unsupported``): ALiBi, attention soft-capping, ...; empty: servable
    expected_check_errors: ClassVar[frozenset[str]] = frozenset()
    #: TensorRT-LLM 1.2.x class the engine derives from (tensorrt_llm/models/__init__.py MODEL_MAP)
    trtllm_base_class: ClassVar[str] = ""
    #: True when upstream MedusaForCausalLM (tensorrt_llm/models/medusa/model.py) builds this base
    #: correctly as it is (it only knows LLaMAForCausalLM and QWenForCausalLM)
    upstream_medusa_base: ClassVar[bool] = False
    #: True when upstream's decoder layers pass spec_decoding_params to Attention
    upstream_spec_decoding_plumbing: ClassVar[bool] = False
    #: the config.json keys ``trtllm_base_class`` reads beyond :data:`COMMON_CONFIG_KEYS` (its config class's
    #: fields and the attributes its layers read): whatever else a family writes - a key its parent family's
    #: class reads, say - is dropped by ``engine_config`` (declared by the class that names a new engine class)
    engine_keys: ClassVar[frozenset[str]] = frozenset()
    #: folder of ``trtllm_base_class`` under tensorrt_llm/models/ (its 1.2.x module is ``.model``)
    trtllm_module: ClassVar[str] = ""
    #: False when the TensorRT-LLM class cannot run pipeline-parallel (no send/recv between stages)
    engine_pipeline_parallel: ClassVar[bool] = True
    #: TensorRT-LLM ``position_embedding_type`` the family writes (a config may still override it)
    position_embedding: ClassVar[PositionEmbedding] = PositionEmbedding.ROPE_GPT_NEOX
    #: the Hugging Face config class's defaults of the keys read with a fallback (``hf_value``): config.json
    #: written by ``save_pretrained`` leaves out values equal to them, so a missing ``tie_word_embeddings``
    #: means True for Cohere and False for Llama. Each family class declares its own (a test compares them
    #: with transformers' config class); a key read without a declared default fails loudly
    hf_defaults: ClassVar[dict] = {}
    #: the config.json key of the norms' epsilon
    norm_epsilon_key: ClassVar[str] = "rms_norm_eps"
    #: the prefix of the Hugging Face decoder layers' tensor names (``{i}``: the layer index), written once
    layer_prefix: ClassVar[str] = "model.layers.{i}."
    #: where the family's Hugging Face names differ from :data:`LLAMA_NAMES` (layer roles relative to
    #: ``layer_prefix``; None: the family has no such tensor). Merged down the class hierarchy: a family
    #: written as "X, except ..." lists only its exceptions
    names: ClassVar[dict[Role, Source | None]] = {}
    #: the family's weight table, role -> full HF source, made from ``LLAMA_NAMES``, ``names`` and
    #: ``layer_prefix`` when the class is defined (see ``Role`` and the shared ``ROLES``); the rules
    #: come from it, with the family's ``biased_roles`` and ``deviations``
    weights: ClassVar[dict[Role, Source]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        parent = cls.__mro__[1]
        if cls.trtllm_base_class != getattr(parent, "trtllm_base_class", "") and "engine_keys" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} builds on {cls.trtllm_base_class} (its parent on "
                            f"{getattr(parent, 'trtllm_base_class', '')}): declare the engine_keys that class reads")
        if "weights" in cls.__dict__:
            raise TypeError(f"{cls.__name__} defines weights: declare names (and layer_prefix) instead")
        merged: dict = dict(LLAMA_NAMES)
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("names", {}))
        cls.weights = {role: cls.layer_name(src) if ROLES[role].place is Place.LAYER else src
                       for role, src in merged.items() if src is not None}

    @classmethod
    def layer_name(cls, source: Source) -> Source:
        """A layer-relative name (or q/k/v triple) with the family's ``layer_prefix``."""
        return tuple(cls.layer_prefix + s for s in source) if isinstance(source, tuple) else cls.layer_prefix + source
    #: HF names tried for lm_head after ``weights[Role.LM_HEAD]`` (tied embeddings come last)
    lm_head_fallbacks: ClassVar[tuple[str, ...]] = ()
    #: True for families whose real models overflow float16 (check warns on --dtype float16)
    float16_unsafe: ClassVar[bool] = False
    #: regexes of transformers' parameter names the checkpoint stores in float32 whatever its dtype (a rule's
    #: ``dtype``): verify and calibration compute with them unrounded, as the engine does
    full_precision_parameters: ClassVar[tuple[str, ...]] = ()
    #: HF tensor names that are not weights (buffers some checkpoints carry)
    ignored_hf_tensors: ClassVar[tuple[str, ...]] = (r".*rotary_emb\.inv_freq", r"medusa_head\..*")

    # -- config ---------------------------------------------------------------------------
    def hf_value(self, hf: HFConfig, key: str):
        """``key`` of config.json, or the family's declared default for it (``hf_defaults``)."""
        value = hf.get(key)
        if value is not None:
            return value
        if key not in self.hf_defaults:
            raise AssertionError(f"{type(self).__name__} reads {key!r} with no default of its own: add it to its "
                                 "hf_defaults (the Hugging Face config class's default)")
        return self.hf_defaults[key]

    def require_sizes(self, hf: HFConfig) -> None:
        """The sizes every conversion reads, from config.json itself, naming a missing field; checked before
        the weights are compared with the shapes transformers builds (which would fill in its own defaults)."""
        self.hidden_size(hf)
        self.num_attention_heads(hf)
        self.num_hf_layers(hf)
        hf.require("vocab_size")

    def hidden_size(self, hf: HFConfig) -> int:
        return int(hf.require("hidden_size", int, "n_embd", "d_model"))

    def num_attention_heads(self, hf: HFConfig) -> int:
        return int(hf.require("num_attention_heads", int, "n_head", "n_heads"))

    def num_kv_heads(self, hf: HFConfig) -> int:
        return int(hf.get("num_key_value_heads") or self.num_attention_heads(hf))

    def head_size(self, hf: HFConfig) -> int:
        explicit = hf.get("head_dim")
        if isinstance(explicit, int) and explicit > 0:
            return explicit
        hidden = self.hidden_size(hf)
        heads = self.num_attention_heads(hf)
        if hidden % heads:
            raise ModelError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and no head_dim is given",
                where=str(hf.path),
                fix="add head_dim to config.json",
            )
        return hidden // heads

    def trtllm_config(self, hf: HFConfig) -> dict:
        """The family's fields of TensorRT-LLM's config.json (no Medusa, dtype or mapping keys)."""
        return {
            "num_hidden_layers": self.num_hf_layers(hf),
            "num_attention_heads": self.num_attention_heads(hf),
            "num_key_value_heads": self.num_kv_heads(hf),
            "hidden_size": self.hidden_size(hf),
            "head_size": self.head_size(hf),
            "intermediate_size": self.intermediate_size(hf),
            "vocab_size": hf.require("vocab_size"),
            "max_position_embeddings": hf.get("max_position_embeddings") or 2048,
            "hidden_act": self.hf_value(hf, "hidden_act"),
            "norm_epsilon": float(self.hf_value(hf, self.norm_epsilon_key)),
            "position_embedding_type": self.position_embedding.value,
            **({"rotary_base": hf.rope_theta, "rotary_scaling": hf.rope_scaling} if self.position_embedding.is_rope else {}),
            "model_type": self.family,
        }

    def engine_config(self, hf: HFConfig) -> dict:
        """:meth:`trtllm_config` restricted to the keys the engine class reads (:data:`COMMON_CONFIG_KEYS` and
        ``engine_keys``): what the checkpoint's config.json holds of the family."""
        keep = COMMON_CONFIG_KEYS | self.engine_keys
        return {k: v for k, v in self.trtllm_config(hf).items() if k in keep}

    def intermediate_size(self, hf: HFConfig) -> int:
        return int(hf.require("intermediate_size"))

    def num_experts(self, hf: HFConfig) -> int:
        """Routed experts per MoE layer; 0 for a dense family (one whose engine class reads no ``moe``).
        Qwen's MoE configs say ``num_experts``, Mixtral's and Granite's ``num_local_experts`` (which
        transformers 5 also writes for Qwen3-MoE)."""
        if "moe" not in self.engine_keys:
            return 0
        return int(hf.require("num_experts", int, "num_local_experts"))

    def top_k(self, hf: HFConfig) -> int:
        """Experts each token is routed to (``num_experts_per_tok``); 0 for a dense family."""
        return int(hf.require("num_experts_per_tok", int)) if self.num_experts(hf) else 0

    def moe_block(self, hf: HFConfig, normalization_mode: int) -> dict:
        """config.json's ``moe`` for this config's experts (:func:`moe_config`)."""
        return moe_config(self.num_experts(hf), self.top_k(hf), normalization_mode)

    def tied_embeddings(self, hf: HFConfig) -> bool:
        return bool(self.hf_value(hf, "tie_word_embeddings"))

    def engine_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for configs the family's TensorRT-LLM class cannot represent."""
        return []

    def port_limits(self, hf: HFConfig) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for configs TensorRT-LLM's class may serve but *this port* does not convert
        (yet): a feature the adapter, the converter or the reference executor lacks (rule ``port-limit``).
        Engine limits go to :meth:`engine_limits`."""
        return []

    def default_epsilon_limit(self, hf: HFConfig, key: str, norms: str) -> list[tuple[str, str]]:
        """A limit for classes that build ``norms`` with LayerNorm's default epsilon (1e-5)."""
        eps = float(self.hf_value(hf, key))
        if abs(eps - 1e-5) <= 1e-12:
            return []
        return [(f"{key} {eps} differs from the 1e-5 TensorRT-LLM's {self.trtllm_base_class} uses for {norms} "
                 f"(tensorrt_llm/models/{self.trtllm_module}/model.py passes no eps)",
                 f"this base cannot be built exactly by TensorRT-LLM's {self.trtllm_base_class}")]

    def parallel_warnings(self, hf: HFConfig, tp_size: int) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for a tensor-parallel layout whose engine behaviour could not be confirmed
        from the upstream source read (rule ``engine-tp-unconfirmed``, a warning)."""
        return []

    def engine_divergences(self, hf: HFConfig) -> list[tuple[str, str]]:
        """``(problem, fix)`` pairs for configs the engine class *can* build but computes differently
        from Hugging Face (rule ``engine-divergence``, overridable: the reference executor computes
        what the engine computes, so ``verify`` of such a checkpoint fails against transformers)."""
        return []

    def alibi_reason(self, hf: HFConfig) -> str | None:
        """Why this config of the family uses ALiBi (which TensorRT-LLM's XQA lacks), or None."""
        return None

    def exact_gelu(self, hf: HFConfig) -> bool:
        """True when the base computes the exact (erf) GELU, which TensorRT-LLM approximates."""
        return (hf.get("hidden_act") or hf.get("activation")) == "gelu"

    def forced_parallel_embedding(self, tp_size: int) -> bool | None:
        """``use_parallel_embedding`` the family's TensorRT-LLM config class imposes, or None."""
        return None

    # -- weights --------------------------------------------------------------------------
    def weight_sources(self, hf: HFConfig) -> dict[Role, Source]:
        """The weight table for this config (families whose names depend on the config override it)."""
        return dict(self.weights)

    def biased_roles(self, hf: HFConfig) -> frozenset[Role]:
        """Roles whose HF tensors carry a ``.bias`` next to ``.weight``."""
        return frozenset()

    def deviations(self, hf: HFConfig) -> dict[Role, Deviation]:
        """Where the family departs from ``ROLES`` (fused layouts, value transforms, names)."""
        return {}

    def rules_at(self, place: Place, hf: HFConfig) -> list[WeightRule]:
        """The weight rules of one place, made from the shared table and this family's entries."""
        sources, biased, deviations = self.weight_sources(hf), self.biased_roles(hf), self.deviations(hf)
        rules = []
        for role, spec in ROLES.items():
            if spec.place is not place or role not in sources:
                continue
            deviation = deviations.get(role, Deviation())
            name = deviation.trtllm_name or spec.trtllm_name
            split = deviation.split or spec.split
            source = sources[role]
            separate = isinstance(source, tuple)
            combine = deviation.combine or (_as_qkv if separate else _first)
            for kind in ("weight", "bias") if role in biased else ("weight",):
                names = tuple(f"{s}.{kind}" for s in source) if separate else (f"{source}.{kind}",)
                alternatives: tuple[tuple[str, ...], ...] = ()
                if role is Role.LM_HEAD and kind == "weight":
                    tied = (f"{sources[Role.EMBEDDING]}.weight",) if self.tied_embeddings(hf) else None
                    alternatives = tuple((f"{n}.weight",) for n in self.lm_head_fallbacks) + ((tied,) if tied else ())
                # a row-parallel layer's bias is added once after the all-reduce: replicated
                part = split if kind == "weight" else deviation.bias_split or _BIAS_SPLIT.get(split, split)
                rules.append(WeightRule(f"{name}.{kind}", names, part, combine, alternatives))
        return rules

    def layer_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Rules of one decoder layer; TensorRT-LLM names are relative to ``transformer.layers.{n}.``."""
        return self.rules_at(Place.LAYER, hf)

    def embedding_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Tensors of the first pipeline stage (vocab_embedding and friends)."""
        return self.rules_at(Place.FIRST, hf)

    def final_rules(self, hf: HFConfig) -> list[WeightRule]:
        """Tensors of the last pipeline stage (ln_f, lm_head)."""
        return self.rules_at(Place.LAST, hf)

    def num_hf_layers(self, hf: HFConfig) -> int:
        return int(hf.require("num_hidden_layers", int, "n_layer", "n_layers"))

    # -- semantics ------------------------------------------------------------------------
    def semantics(self, cfg: dict) -> Semantics:
        """Llama semantics read from the TensorRT-LLM config; families ``replace`` what differs.

        Keys the adapter writes are read without defaults: a key written under another name
        fails here instead of silently taking a default.
        """
        head = int(cfg["head_size"])
        pct = float(cfg.get("rotary_pct", 1.0))  # written by the partial-rotary families only
        position = PositionEmbedding(cfg["position_embedding_type"])
        return Semantics(
            norm=NormKind.RMS,
            norm_epsilon=float(cfg["norm_epsilon"]),
            mlp=MlpKind.GATED,
            hidden_act=cfg["hidden_act"],
            position_embedding=position,
            rotary_dim=int(cfg.get("rotary_dim") or int(head * pct)),
            rotary_base=float(cfg["rotary_base"]) if position.is_rope else 10000.0,
            rotary_scaling=cfg.get("rotary_scaling"),
            sliding_window=cfg.get("sliding_window"),
        )

    # -- naming ---------------------------------------------------------------------------
    def ported_architecture(self) -> str:
        """Our own ``architecture`` name for checkpoints upstream cannot build as they are.

        Deliberately absent from TensorRT-LLM's MODEL_MAP: plain ``trtllm-build``
        refuses it ("unsupported architecture") instead of building it wrong;
        ``trtllm-medusa build`` registers it first (engine/registry.py).
        """
        return f"MedusaPorts{self.trtllm_base_class}"


_REGISTRY: dict[str, type[ArchAdapter]] = {}


def register(cls: type[ArchAdapter]) -> type[ArchAdapter]:
    """Class decorator: make an adapter findable by its HF architecture names."""
    for name in cls.hf_architectures:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise AssertionError(f"{name} registered twice ({_REGISTRY[name].__name__}, {cls.__name__})")
        _REGISTRY[name] = cls
    return cls


def registry() -> dict[str, type[ArchAdapter]]:
    import trtllm_medusa_ports.archs  # noqa: F401  (registers every family)

    return dict(_REGISTRY)


def families() -> dict[str, type[ArchAdapter]]:
    return {cls.family: cls for cls in registry().values()}


def adapter_for(architecture: str) -> ArchAdapter | None:
    cls = registry().get(architecture)
    return cls() if cls else None


def adapter_for_model_type(model_type: str) -> ArchAdapter | None:
    for cls in registry().values():
        if model_type == cls.family or model_type in cls.model_types:
            return cls()
    return None


def supported_architectures() -> list[str]:
    return sorted(registry())


def own(cls: type, name: str, default=None):
    """A class attribute as ``cls`` itself declares it (not inherited from its parent family)."""
    return cls.__dict__.get(name, default)


def family_test_cases() -> dict[str, list]:
    """The family-wide test data, derived from the adapters (so adding a family adds its tests):

    * ``variants``: ``(architecture, overrides)`` of every class's own ``test_variants``;
    * ``key_cases``: ``(architecture, tiny architecture, values)`` for every architecture name of a class
      declaring ``key_cases`` (aliases such as ``RWForCausalLM`` use the class's tiny model);
    * ``pipeline``: architectures verified at pp 2; ``no_pipeline``: those whose engine class has none;
    * ``verdicts``: ``(architecture, error rules check gives its tiny model)``; ``unsupported``: those with any.
    """
    classes = list(dict.fromkeys(registry().values()))
    out: dict[str, list] = {"variants": [], "key_cases": [], "pipeline": [], "no_pipeline": [],
                            "verdicts": [], "unsupported": []}
    for cls in classes:
        primary = cls.hf_architectures[0]
        out["variants"] += [(primary, dict(v)) for v in own(cls, "test_variants", ())]
        keys = own(cls, "key_cases")
        if keys is not None:
            out["key_cases"] += [(arch, primary, dict(keys)) for arch in cls.hf_architectures]
        if own(cls, "pipeline_test", False):
            out["pipeline"].append(primary)
        if own(cls, "tiny_config") is not None:
            errors = own(cls, "expected_check_errors", frozenset())
            out["verdicts"].append((primary, set(errors)))
            if errors:
                out["unsupported"] += list(cls.hf_architectures)
        if not cls.engine_pipeline_parallel and own(cls, "tiny_config") is not None:
            out["no_pipeline"].append(primary)
    return out




def layer_sources(rules: Sequence[WeightRule], i: int) -> list[WeightRule]:
    """Rules of layer ``i`` with ``{i}`` filled in."""
    return [
        WeightRule(
            r.name,
            tuple(s.format(i=i) for s in r.sources),
            r.split,
            r.combine,
            tuple(tuple(s.format(i=i) for s in alt) for alt in r.alternatives),
            r.dtype,
            r.experts,
        )
        for r in rules
    ]
