"""Tensor- and pipeline-parallel split rules, written once for every family.

Facts from TensorRT-LLM 1.2.x: ``tensorrt_llm/models/llama/convert.py``
(``split``, ``split_qkv_tp``, ``dup_kv_weight``), ``tensorrt_llm/mapping.py``
(``Mapping.pp_layers``) and ``tensorrt_llm/_utils.py`` (``pad_vocab_size``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trtllm_medusa_ports.weights.arrays import Array, cat, chunk, zeros_like_rows


class Split(enum.Enum):
    """How one checkpoint tensor is cut across tensor-parallel ranks."""

    REPLICATE = "replicate"  # norms, biases of row-parallel layers
    COLUMN = "column"  # ColumnLinear weight/bias: output features, dim 0
    ROW = "row"  # RowLinear weight: input features, dim 1
    QKV = "qkv"  # q, k, v each split by heads (KV heads replicated if < tp), then [q;k;v]
    VOCAB = "vocab"  # lm_head: rows padded to a multiple of tp, then dim 0
    EMBEDDING = "embedding"  # vocab_embedding: replicated, or split per embedding_sharding_dim
    COLUMN_PAIR = "column_pair"  # two stacked column-parallel halves (fused swiglu fc): each split, re-stacked
    #: the bias of a row-parallel layer that every rank adds before one all-reduce of the layer's sum
    #: (GPT-J, tensorrt_llm/models/gptj/model.py): whole on tp rank 0, zeros on the others
    #: (tensorrt_llm/models/gptj/convert.py "Only rank0 will get bias"), so that it is added once
    FIRST_RANK = "first_rank"
    #: MoE expert fc ``[experts, 2 * inter, hidden]``: the rank's experts (expert parallelism), each half (up,
    #: then gate) split ``moe_tp_size`` ways on the intermediate dim, re-stacked (tensorrt_llm/layers/moe.py
    #: ``MOEWeightWrapper`` ``tp_dim=0`` of each expert)
    EXPERT_PAIR = "expert_pair"
    #: MoE expert proj ``[experts, hidden, inter]``: the rank's experts, the intermediate dim split ``moe_tp_size`` ways
    EXPERT_ROW = "expert_row"


@dataclass(frozen=True)
class Mapping:
    """World layout as TensorRT-LLM's ``Mapping``: rank = pp_rank * tp_size + tp_rank."""

    tp_size: int = 1
    pp_size: int = 1
    #: expert parallelism within the tensor-parallel group (MoE bases): ``moe_ep_size`` ranks each hold
    #: ``experts / moe_ep_size`` experts, split ``moe_tp_size = tp_size / moe_ep_size`` ways
    #: (tensorrt_llm/mapping.py: ``moe_ep_rank = tp_rank % moe_ep_size``, ``moe_tp_rank = tp_rank // moe_ep_size``)
    moe_ep_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def moe_tp_size(self) -> int:
        return self.tp_size // self.moe_ep_size

    def moe_ep_rank(self, rank: int) -> int:
        return self.tp_rank(rank) % self.moe_ep_size

    def moe_tp_rank(self, rank: int) -> int:
        return self.tp_rank(rank) // self.moe_ep_size

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size

    def pp_rank(self, rank: int) -> int:
        return rank // self.tp_size

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """The ranks of one pipeline stage, in tensor-parallel order."""
        return [pp_rank * self.tp_size + t for t in range(self.tp_size)]

    def layers_of_stage(self, num_layers: int, pp_rank: int) -> list[int]:
        return pp_layers(num_layers, self.pp_size, pp_rank)

    def padded_vocab(self, vocab_size: int) -> int:
        """Vocabulary rows of lm_head and the heads' lm_heads: a multiple of tp."""
        return pad_vocab_size(vocab_size, self.tp_size)

    @classmethod
    def from_config(cls, cfg: dict) -> Mapping:
        """The layout of a TensorRT-LLM config.json's ``mapping``."""
        m = cfg["mapping"]
        return cls(int(m["tp_size"]), int(m["pp_size"]), int(m.get("moe_ep_size") or 1))

    def to_dict(self, moe: bool = False) -> dict:
        """config.json's ``mapping``; with ``moe``, the resolved ``moe_tp_size`` / ``moe_ep_size`` too (as
        ``PretrainedConfig.to_dict`` writes them)."""
        out = {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size}
        if moe:
            out.update(moe_tp_size=self.moe_tp_size, moe_ep_size=self.moe_ep_size)
        return out


def pp_layers(num_layers: int, pp_size: int, pp_rank: int) -> list[int]:
    """Layers held by one pipeline stage: contiguous, the first stages take the remainder.

    TensorRT-LLM's ``Mapping.pp_layers`` splits ``range(num_layers)`` into
    ``pp_size`` nearly equal contiguous chunks (``torch.tensor_split`` semantics).
    """
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    count = base + (1 if pp_rank < extra else 0)
    return list(range(start, start + count))


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    return -(-vocab_size // tp_size) * tp_size


def split(t: Array, tp_size: int, tp_rank: int, dim: int) -> Array:
    if tp_size == 1:
        return t
    if t.shape[dim] % tp_size:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not divide by tp_size {tp_size}")
    return chunk(t, tp_size, dim)[tp_rank]


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: at least one (replicated when fewer than tp)."""
    return max(1, num_kv_heads // tp_size)


def split_qkv(
    q: Array,
    k: Array,
    v: Array,
    *,
    num_kv_heads: int,
    tp_size: int,
    tp_rank: int,
) -> Array:
    """One rank's fused qkv: its query heads, then its KV heads, concatenated on dim 0.

    Works for weights ``[heads*head_dim, in]`` and biases ``[heads*head_dim]``.
    When ``num_kv_heads < tp_size`` each KV head is repeated so every rank holds
    one (TensorRT-LLM's ``dup_kv_weight``): rank r takes KV head ``r * nkv // tp``.
    """
    q_r = split(q, tp_size, tp_rank, 0)
    if num_kv_heads >= tp_size:
        k_r = split(k, tp_size, tp_rank, 0)
        v_r = split(v, tp_size, tp_rank, 0)
    else:
        head_dim = k.shape[0] // num_kv_heads
        head = tp_rank * num_kv_heads // tp_size
        k_r = k[head * head_dim : (head + 1) * head_dim]
        v_r = v[head * head_dim : (head + 1) * head_dim]
    return cat([q_r, k_r, v_r], dim=0)


def pad_rows(t: Array, rows: int) -> Array:
    if t.shape[0] == rows:
        return t
    return cat([t, zeros_like_rows(t, rows - t.shape[0])], dim=0)


def shard(
    rule: Split,
    tensor: Array | tuple[Array, Array, Array],
    *,
    tp_size: int,
    tp_rank: int,
    num_kv_heads: int = 0,
    use_parallel_embedding: bool = False,
    embedding_sharding_dim: int = 0,
    moe_ep_size: int = 1,
) -> Array:
    """Apply one split rule for one rank. ``tensor`` is (q, k, v) for :attr:`Split.QKV`.

    Works on torch tensors and on numpy arrays (the byte path's stand-ins; see arrays.py).
    """
    if rule is Split.QKV:
        q, k, v = tensor  # type: ignore[misc]
        return split_qkv(q, k, v, num_kv_heads=num_kv_heads, tp_size=tp_size, tp_rank=tp_rank)
    assert not isinstance(tensor, tuple), f"{rule} takes one tensor"
    if rule is Split.REPLICATE:
        return tensor
    if rule is Split.FIRST_RANK:
        return tensor if tp_rank == 0 else zeros_like_rows(tensor, tensor.shape[0])
    if rule is Split.COLUMN:
        return split(tensor, tp_size, tp_rank, 0)
    if rule in (Split.EXPERT_PAIR, Split.EXPERT_ROW):
        ep, ep_rank = moe_ep_size, tp_rank % moe_ep_size
        tpm, tpm_rank = tp_size // moe_ep_size, tp_rank // moe_ep_size
        experts = split(tensor, ep, ep_rank, 0)
        if rule is Split.EXPERT_ROW:
            return split(experts, tpm, tpm_rank, experts.ndim - 1)
        a, b = chunk(experts, 2, 1)
        return cat([split(a, tpm, tpm_rank, 1), split(b, tpm, tpm_rank, 1)], dim=1)
    if rule is Split.COLUMN_PAIR:
        a, b = chunk(tensor, 2, 0)
        return cat([split(a, tp_size, tp_rank, 0), split(b, tp_size, tp_rank, 0)], dim=0)
    if rule is Split.ROW:
        return split(tensor, tp_size, tp_rank, tensor.ndim - 1)
    if rule is Split.VOCAB:
        padded = pad_rows(tensor, pad_vocab_size(tensor.shape[0], tp_size))
        return split(padded, tp_size, tp_rank, 0)
    if rule is Split.EMBEDDING:
        if not use_parallel_embedding or tp_size == 1:
            return tensor
        if embedding_sharding_dim == 0:
            padded = pad_rows(tensor, pad_vocab_size(tensor.shape[0], tp_size))
            return split(padded, tp_size, tp_rank, 0)
        return split(tensor, tp_size, tp_rank, 1)
    raise AssertionError(rule)
