"""The weight-layout vocabulary of an adapter: roles and their TensorRT-LLM names and splits, the Llama
names a family overrides, the rules the converter runs, and the combines (fused q/k/v layouts, value
transforms) that turn Hugging Face tensors into TensorRT-LLM ones."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_medusa_ports.weights.arrays import Array
from trtllm_medusa_ports.weights.sharding import Split

if TYPE_CHECKING:
    import torch

#: Combine the loaded HF tensors of one rule into one tensor, or (q, k, v) for Split.QKV.
Combine = Callable[[list[Array]], "Array | tuple[Array, Array, Array]"]


def layout_only(combine: Callable) -> Callable:
    """Mark a combine that only rearranges rows and columns (no value changes).

    A marked combine must work on numpy arrays as well as torch tensors - slicing, ``reshape`` and
    the helpers of trtllm_medusa_ports/weights/arrays.py - because files/byte_moves.py runs it on integer
    stand-ins to find which bytes go where, and then moves those bytes without making a tensor.
    Unmarked combines take the whole-tensor path.
    """
    combine.layout_only = True  # type: ignore[attr-defined]
    return combine


def tensor_path(reason: str) -> Callable[[Callable], Callable]:
    """Mark a combine that rearranges values in a way the byte path cannot trace (a transpose makes every output
    row a strided column of the source): it takes the whole-tensor path, for the ``reason`` given."""
    def mark(combine: Callable) -> Callable:
        combine.tensor_path_reason = reason  # type: ignore[attr-defined]
        return combine
    return mark


def is_layout_only(combine: Callable) -> bool:
    return getattr(combine, "layout_only", False) is True and not isinstance(combine, ValueTransform)


@layout_only
def first_tensor(ts: list[Array]) -> Array:
    return ts[0]


@layout_only
def separate_qkv(ts: list[Array]) -> tuple[Array, Array, Array]:
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
    combine: Combine = first_tensor
    alternatives: tuple[tuple[str, ...], ...] = ()
    #: stored in this dtype whatever the checkpoint's (an MoE router: float32); None: the checkpoint dtype
    dtype: str | None = None
    #: the experts of an MoE layer stacked (``[experts, out, in]``): not one linear of one module
    experts: bool = False

    def candidates(self) -> tuple[tuple[str, ...], ...]:
        return (self.sources,) + self.alternatives


#: a bias follows its weight's split, except where the layer adds it once after the all-reduce
BIAS_SPLIT = {Split.ROW: Split.REPLICATE, Split.EMBEDDING: Split.REPLICATE}


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
    POSITION_EMBEDDING = "position_embedding"  # a learned absolute position table (GPT-2's wpe)
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
    # tensorrt_llm/models/gpt/model.py GPTModel: an Embedding(max_position_embeddings, hidden) on the first stage,
    # which optimize_model's parallelize_embedding splits as it splits the vocabulary (use_parallel_embedding)
    Role.POSITION_EMBEDDING: RoleSpec("transformer.position_embedding", Split.EMBEDDING, Place.FIRST),
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
    #: the bias's own combine, where it is not the weight's: a value transform of the weight alone (Nemotron's
    #: ``LayerNorm1P`` scales by ``w + 1`` but adds its bias as it is: ``bias_combine=first_tensor``)
    bias_combine: Combine | None = None


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
