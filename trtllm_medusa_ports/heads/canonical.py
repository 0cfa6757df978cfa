"""The canonical form every head layout is read into."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import HeadsError
from trtllm_medusa_ports.files.dtypes import to_torch
from trtllm_medusa_ports.files.lazy_tensors import LazyTensor

if TYPE_CHECKING:
    import torch


@dataclass
class ResBlockRef:
    """``x + SiLU(x @ weight.T + bias)``; ``bias`` None means zeros (a warning says so)."""

    weight: LazyTensor
    bias: LazyTensor | None


@dataclass
class MedusaHeads:
    """Heads as stored: nothing is read until a tensor's ``load()``.

    ``lm_heads[h]`` is head h's own vocabulary projection. When the heads share
    one projection, ``lm_heads`` is None and ``shared_lm_head`` is that tensor,
    or None to mean "the base model's lm_head" (FasterDecoding version 2).
    ``token_map`` (vLLM truncated vocabularies) maps each row of a head's
    projection to a token id of the full vocabulary.
    """

    layout: str
    source: Path
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int | None
    dtype_name: str  # e.g. "float16" (files/dtypes.py)
    blocks: list[list[ResBlockRef]]
    lm_heads: list[LazyTensor] | None
    shared_lm_head: LazyTensor | None = None
    token_map: LazyTensor | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (imports torch)."""
        return to_torch(self.dtype_name)

    @property
    def shares_base_lm_head(self) -> bool:
        """True when the heads have no projection of their own per head."""
        return self.lm_heads is None

    def tensors(self) -> list[LazyTensor]:
        out: list[LazyTensor] = []
        for head in self.blocks:
            for b in head:
                out.append(b.weight)
                if b.bias is not None:
                    out.append(b.bias)
        if self.lm_heads:
            out.extend(self.lm_heads)
        if self.shared_lm_head is not None:
            out.append(self.shared_lm_head)
        return out

    def check_finite(self) -> None:
        """Read every tensor once and refuse NaN / Inf (names the tensor)."""
        from trtllm_medusa_ports.files.finite import all_finite, count_non_finite

        for t in self.tensors():
            data = t.load()
            if not all_finite(data):
                bad = count_non_finite(data)
                raise HeadsError(
                    f"tensor {t.name!r} holds {bad} NaN/Inf value(s)",
                    where=str(t.file),
                    fix="the heads diverged in training or the file is damaged; use another checkpoint",
                )

    def summary(self) -> dict:
        return {
            "layout": self.layout,
            "source": str(self.source),
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            # heads projecting with the base lm_head have no vocabulary of their own: they take the base's
            "vocab_size": self.vocab_size if self.vocab_size is not None else
            ("the base's (the heads use its lm_head)" if self.shares_base_lm_head else None),
            "shares_base_lm_head": self.shares_base_lm_head,
            "has_own_shared_lm_head": self.shared_lm_head is not None,
            "truncated_vocab": self.token_map is not None,
            "dtype": self.dtype_name,
            "warnings": list(self.warnings),
        }
