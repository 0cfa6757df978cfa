"""Mixture-of-experts pieces the MoE families share: the stacked expert layouts, config.json's ``moe``
block, the expert weight rules and the routing semantics (tensorrt_llm/layers/moe.py)."""

from __future__ import annotations

import dataclasses

from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import WeightRule, layout_only
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.weights.sharding import Split

#: config.json's names of the routed experts per layer: Qwen's ``num_experts``, Mixtral's and Granite's
#: ``num_local_experts`` (which transformers 5 also writes for Qwen3-MoE)
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts")


def expert_count(hf: HFConfig, keys: tuple[str, ...] = EXPERT_COUNT_KEYS) -> int:
    """The routed experts per layer, an integer of at least 2: TensorRT-LLM builds its ``MOE`` layer only for
    ``moe.num_experts > 1`` (tensorrt_llm/layers/moe.py ``MoeConfig.has_moe``; a dense MLP otherwise, which the
    stacked expert tensors would not fit). ``keys``: the family's names for it (DBRX's
    ``ffn_config.moe_num_experts``)."""
    n = int(hf.require(keys[0], int, *keys[1:]))
    key = next(k for k in keys if hf.get(k) is not None)
    if n < 2:
        raise ModelError(f"field {key} is {n}; a mixture of experts routes among at least 2 experts (TensorRT-LLM "
                         "builds its MOE layer only for moe.num_experts > 1: tensorrt_llm/layers/moe.py "
                         "MoeConfig.has_moe)", where=str(hf.path),
                         fix=f"correct {key} in config.json (the original model's value)")
    return n


def experts_per_token(hf: HFConfig, experts: int, key: str = "num_experts_per_tok",
                      count_keys: tuple[str, ...] = EXPERT_COUNT_KEYS) -> int:
    """``num_experts_per_tok`` (the family's ``key``: DBRX's ``ffn_config.moe_top_k``): an integer from 1 to the
    number of experts (``MoeConfig.validate`` refuses a top-k of 0 beside experts; transformers' ``torch.topk`` fails
    on more than there are)."""
    top_k = int(hf.require(key, int))
    if not 1 <= top_k <= experts:
        count = next(k for k in count_keys if hf.get(k) is not None)
        raise ModelError(f"field {key} is {top_k}; expected 1 to {count} ({experts}): the experts each "
                         "token is routed to", where=str(hf.path),
                         fix=f"correct {key} in config.json (the original model's value)")
    return top_k


@layout_only
def stacked_expert_fc(ts):
    """MoE experts' fc from per-expert sources ``(up_0, gate_0, up_1, gate_1, ...)``, each ``[inter, hidden]``: per
    expert ``[up; gate]`` (the linear half, then the activated one: tensorrt_llm/layers/moe.py), experts stacked -
    ``[experts, 2 * inter, hidden]``. A pure layout (rows concatenated, then viewed per expert), so the byte
    path moves it."""
    from trtllm_medusa_ports.weights.arrays import cat

    rows, rest = ts[0].shape[0], tuple(ts[0].shape[1:])
    return cat(list(ts), dim=0).reshape((len(ts) // 2, 2 * rows) + rest)


@layout_only
def stacked_experts(ts):
    """MoE experts' tensors stacked on a new dim 0 (the experts' proj: ``[experts, hidden, inter]``); a pure layout."""
    from trtllm_medusa_ports.weights.arrays import cat

    return cat(list(ts), dim=0).reshape((len(ts),) + tuple(ts[0].shape))


def transposed_experts(experts: int):
    """A combine for per-expert matrices stored 2-D and transposed - DBRX's down-projection ``w2``
    ``[experts x inter, hidden]``, multiplied as ``x @ w2[e]`` - as ``MOE``'s ``[experts, hidden, inter]``. The
    transpose makes each output row a strided column of the source, so it is no pure layout; marked
    ``transposed_experts``, it still takes the byte path (conversion/plan.py ``move_plan``: traced untransposed, each expert
    block moved through a bounded tile, files/byte_moves.py ``TRANSPOSED``), and the tensor path where values
    change (weight-only)."""
    from trtllm_medusa_ports.weights.arrays import swap_last

    def combine(ts):
        t = ts[0]
        return swap_last(t.reshape((experts, -1, t.shape[-1])))

    combine.transposed_experts = True  # type: ignore[attr-defined]
    return combine


#: ``MoeConfig.normalization_mode`` (tensorrt_llm/layers/moe.py ``ExpertScaleNormalizationMode``)
MOE_NONE, MOE_RENORMALIZE, MOE_SPARSE_MIXER = 0, 1, 2


def moe_config(num_experts: int, top_k: int, normalization_mode: int, sparse_mixer_epsilon: float = 0.01) -> dict:
    """config.json's ``moe``: all nine ``MoeConfig`` fields as its ``to_dict`` writes them (``from_dict`` is
    ``cls(**d)``, so no other key); no shared expert, no device-limited routing (tensorrt_llm/layers/moe.py).
    ``sparse_mixer_epsilon``: SPARSE_MIXER's (``MoeConfig``'s default 0.01; Phi-3.5-MoE's router_jitter_noise)."""
    return {"num_experts": num_experts, "shared_expert_intermediate_size": 0, "top_k": top_k,
            "normalization_mode": normalization_mode, "sparse_mixer_epsilon": sparse_mixer_epsilon, "tp_mode": 0,
            "device_limited_n_group": 0, "device_limited_topk_group": 0, "device_limited_routed_scaling_factor": 1.0}


def expert_rules(router: str, fc: tuple[str, ...], proj: tuple[str, ...]) -> list[WeightRule]:
    """The MoE layer's tensors from per-expert sources: the router (float32), ``fc`` from ``(up_0, gate_0, ...)``,
    ``proj`` from ``(down_0, ...)``, stacked and split as ``MOE`` declares them."""
    return [
        WeightRule("mlp.router.weight", (router,), Split.REPLICATE, dtype="float32"),
        WeightRule("mlp.fc.weight", fc, Split.EXPERT_PAIR, stacked_expert_fc, experts=True),
        WeightRule("mlp.proj.weight", proj, Split.EXPERT_ROW, stacked_experts, experts=True),
    ]


def per_expert_rules(moe: str, experts: int, up: str, gate: str, down: str, router: str = "gate") -> list[WeightRule]:
    """:func:`expert_rules` for a layer holding one tensor per expert and projection, ``{moe}experts.{e}.{name}.weight``
    (``moe``: the layer's prefix, e.g. ``model.layers.{i}.block_sparse_moe.``), its router ``{moe}{router}.weight``:
    Mixtral's and Phi-3.5-MoE's ``w3`` (up) / ``w1`` (the activated gate) / ``w2``, Qwen's ``up_proj`` / ``gate_proj``
    / ``down_proj``."""
    fc = tuple(f"{moe}experts.{e}.{w}.weight" for e in range(experts) for w in (up, gate))
    proj = tuple(f"{moe}experts.{e}.{down}.weight" for e in range(experts))
    return expert_rules(f"{moe}{router}.weight", fc, proj)


def moe_semantics(sem: Semantics, cfg: dict, shared_expert: bool = False) -> Semantics:
    """``sem`` with the routing the checkpoint's ``moe`` block describes (the experts' gated SiLU)."""
    moe = cfg["moe"]
    mode = int(moe["normalization_mode"])
    return dataclasses.replace(sem, hidden_act="silu", moe_num_experts=int(moe["num_experts"]),
                               moe_top_k=int(moe["top_k"]), moe_renormalize=mode == MOE_RENORMALIZE,
                               moe_sparse_mixer_epsilon=float(moe["sparse_mixer_epsilon"])
                               if mode == MOE_SPARSE_MIXER else None,
                               moe_shared_expert=shared_expert)
