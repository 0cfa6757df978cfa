"""Source-heads parity: the checkpoint's Medusa heads against the heads read from their source, on the same
hidden states (or why they were not compared).

May import: ``heads``, ``reference``, ``verify.limits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_medusa_ports.heads.logits import source_heads_logits
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.verify.limits import PARITY_RTOL


@dataclass
class SourceHeads:
    """The heads read from their source and their logits on the prompts' hidden states (or why not)."""

    directory: Path
    logits: list[torch.Tensor]  # per prompt: [heads, tokens, vocab]
    mismatch: str | None = None  # the source's heads do not have the checkpoint's shape


def source_heads_for(heads_dir: Path, hf, ref: ReferenceModel, hidden_states: list[torch.Tensor],
                     dtype: torch.dtype) -> SourceHeads:
    """What the checkpoint's heads must reproduce, computed with the transformers model's lm_head where
    the heads share it (so that the transformers model can be freed before the executor runs)."""
    from trtllm_medusa_ports.heads import load_heads

    heads = load_heads(heads_dir)
    if heads.num_heads != ref.num_medusa_heads or heads.num_layers != ref.num_medusa_layers:
        return SourceHeads(heads_dir, [], f"{heads_dir} holds {heads.num_heads} heads x {heads.num_layers} layers, "
                                          f"the checkpoint {ref.num_medusa_heads} x {ref.num_medusa_layers}")
    shared = bool(ref.config.get("medusa_shared_lm_head"))
    return SourceHeads(heads_dir, [source_heads_logits(heads, hidden, dtype, hf.get_output_embeddings(), shared,
                                                       ref.vocab) for hidden in hidden_states])


def heads_parity_of(source: SourceHeads, ref: ReferenceModel, hidden_states: list[torch.Tensor]) -> dict:
    """The checkpoint's Medusa heads against the source's logits, on the same hidden states."""
    if source.mismatch:
        return {"ok": False, "max_abs_diff": float("inf"), "tolerance": 0.0, "worst_head": None,
                "why": source.mismatch}
    worst, worst_head, scale = 0.0, None, 1.0
    for want, hidden in zip(source.logits, hidden_states, strict=True):
        got = ref.medusa_logits(hidden)
        diff = (want - got).abs().amax(dim=tuple(range(1, want.dim())))
        scale = max(scale, float(want.abs().max()))
        if float(diff.max()) > worst:
            worst, worst_head = float(diff.max()), int(diff.argmax())
    tol = PARITY_RTOL * scale
    return {"ok": worst <= tol, "max_abs_diff": worst, "tolerance": tol,
            "worst_head": worst_head if worst > tol else None, "why": None}


def heads_parity(heads_dir: Path, hf, ref: ReferenceModel, hidden_states: list[torch.Tensor],
                 dtype: torch.dtype) -> dict:
    """The checkpoint's Medusa heads against the heads read from ``heads_dir``, on the same hidden states."""
    return heads_parity_of(source_heads_for(heads_dir, hf, ref, hidden_states, dtype), ref, hidden_states)


def heads_check(heads_source, source, medusa_model_dir, ref: ReferenceModel, hf_runs: list) -> dict:
    """The checkpoint's heads against the heads read from their source, or why they were not compared."""
    heads = {"ok": None, "max_abs_diff": None, "tolerance": None, "why": None}
    if heads_source is not None:
        heads = heads_parity_of(heads_source, ref, [hs[-1] for _, hs in hf_runs])
        if heads["worst_head"] is not None:
            heads["why"] = f"head {heads['worst_head']} differs most"
    elif source:
        heads["why"] = (f"the heads' source {source} recorded at conversion is gone" if not medusa_model_dir else
                        f"{medusa_model_dir} does not exist") + "; pass --medusa_model_dir"
    else:
        heads["why"] = "the heads' source was not recorded; pass --medusa_model_dir to compare them"
    return heads
