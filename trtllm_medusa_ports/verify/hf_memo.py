"""The transformers side of the last verify, kept for the next verify of the same base in this process.

Verifying several checkpoints of one base (tp 1 and tp 2, a precision sweep, a copy with a damaged tensor) loads
the base and runs it on the same prompts every time, for the same logits, hidden states, greedy text and source
heads' logits. The last run's results are kept (one base's, and only while small: :data:`KEEP_BYTES`) under a key
holding everything they are computed from:

* the base: its directory and, for every file in it, its name, size, modification time and inode (a base
  rewritten in place is a new base);
* what the model is made of: the dtype its weights are rounded to, the architecture whose value transforms apply,
  the parameters kept in float32, the device and the torch thread count (summation order);
* what it runs: the engine arithmetic (the GELU form, the q/k norm epsilon), the prompts, the new-token count, the
  checkpoint's vocabulary and the heads' source (its files, as for the base) with the heads' count, layers,
  shared lm_head and dtype.

A change to any of them computes the side afresh. Streaming runs (they bound memory) and quantized checkpoints
(their transformers model is quantized in place) never keep or reuse one. :func:`forget` drops what is kept.

May import: ``files.identity`` (the files' identity, which port keys its stages by too).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_medusa_ports.files.identity import file_identity  # noqa: F401  (verify.run and tests read it here)

#: the most tensor bytes kept (logits, hidden states, source heads' logits): a tiny base's side is kilobytes, a
#: 7B base's tens of megabytes, which a second verify of it recomputes in seconds beside minutes of executor work
KEEP_BYTES = 64 * 2**20


@dataclass
class TransformersSide:
    """What verify learns from the transformers model before freeing it (run.py, phase 1). ``key[0]`` is the base's
    part of the key: its vocabulary and end tokens hold for any prompts."""

    key: tuple
    vocab_size: int
    ends: set[int]
    adjustments: list[str]
    hf_runs: list  # per prompt: (logits [T, vocab], hidden states)
    activation_max: float
    activation_at: str
    effect: float | None
    expected_tokens: list[list[int]]
    heads_source: object | None  # verify.heads.SourceHeads
    model_bytes: int

    def tensor_bytes(self) -> int:
        def size(t) -> int:
            return t.numel() * t.element_size()

        total = sum(size(logits) + sum(size(h) for h in states) for logits, states in self.hf_runs)
        logits = getattr(self.heads_source, "logits", None) or []
        return total + sum(size(t) for t in logits)


_kept: list[TransformersSide] = []  # the last verify's, or nothing


def recall_base(base_key: tuple | None) -> TransformersSide | None:
    """The kept side of this base (its ``vocab_size`` and ``ends``), whatever it was run on."""
    return _kept[0] if base_key is not None and _kept and _kept[0].key[0] == base_key else None


def recall(key: tuple | None) -> TransformersSide | None:
    """The kept side, where it was computed under exactly ``key``."""
    return _kept[0] if key is not None and _kept and _kept[0].key == key else None


def keep(side: TransformersSide) -> None:
    """Keep ``side`` in place of what was kept, if it is small enough."""
    forget()
    if side.tensor_bytes() <= KEEP_BYTES:
        _kept.append(side)


def forget() -> None:
    _kept.clear()
