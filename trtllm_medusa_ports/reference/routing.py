"""Which experts a token goes to, and with what weight, as TensorRT-LLM's ``MOE`` routes it
(tensorrt_llm/layers/moe.py ``MoeConfig.ExpertScaleNormalizationMode``; the routing kernels of
cpp/tensorrt_llm/kernels/mixtureOfExperts/moe_kernels.cu):

* RENORMALIZE: the ``top_k`` largest logits, weighted by a softmax over those ``top_k``;
* NONE: the same experts, weighted by their share of the softmax over every expert;
* SPARSE_MIXER (Phi-3.5-MoE): ``top_k`` rounds; each masks the experts whose logit lies more than
  ``2 * epsilon`` below the round's largest, relative to ``max(|logit|, largest)`` (``sparseMixerMask``), and the
  expert chosen in the round before, then takes the softmax of what is left: its largest entry is the round's
  expert and its weight. transformers' ``sparsemixer`` (modeling_phimoe.py) is the same rule at ``top_k`` 2.
"""

from __future__ import annotations

import torch

from trtllm_medusa_ports.archs.semantics import Semantics


def route(logits: torch.Tensor, sem: Semantics) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, chosen)``, each ``[tokens, top_k]``, from the float32 router logits ``[tokens, experts]``."""
    if sem.moe_sparse_mixer_epsilon is not None:
        return sparse_mixer(logits, sem.moe_top_k, sem.moe_sparse_mixer_epsilon)
    top, chosen = logits.topk(sem.moe_top_k, dim=-1)
    if sem.moe_renormalize:
        return torch.softmax(top, dim=-1), chosen
    return torch.softmax(logits, dim=-1).gather(-1, chosen), chosen


def sparse_mixer(logits: torch.Tensor, top_k: int, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SPARSE_MIXER's rounds (module doc): only the expert of the round just before is excluded, as the kernel
    does (so ``top_k`` 2 is the only count where every chosen expert differs)."""
    weights, chosen = [], []
    last: torch.Tensor | None = None
    for _ in range(top_k):
        candidates = logits if last is None else logits.scatter(-1, last, float("-inf"))
        largest = candidates.max(dim=-1, keepdim=True).values
        far = (largest - logits) / torch.maximum(logits.abs(), largest) > 2 * epsilon
        if last is not None:
            far = far.scatter(-1, last, True)
        probs = torch.softmax(logits.masked_fill(far, float("-inf")), dim=-1)
        last = probs.argmax(dim=-1, keepdim=True)
        chosen.append(last)
        weights.append(probs.gather(-1, last))
    return torch.cat(weights, dim=-1), torch.cat(chosen, dim=-1)
