"""The corpus ``train-heads`` fits on: the base's greedy continuation of every prompt and the final-norm hidden
states of its positions (``Corpus``), built on one process or sharded over torchrun's ranks and merged, cached in
the work directory (``corpus.pt``, keyed by the base's files, the prompts, the new tokens and the dtype) and read
back; the held-out rows the heads' accuracy is measured on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.prompts import Item
from trtllm_medusa_ports.heads.saved import save_whole
from trtllm_medusa_ports.huggingface.model import (
    continuations,
    final_hidden,
    model_device,
)

CORPUS_VERSION = 2  # 2: no row for a sequence's last position; states from the generation


@dataclass
class Corpus:
    """Cached self-distillation data: token sequences, where each continuation starts, and the
    final-norm hidden states of the positions the heads learn from (flattened)."""

    seqs: list[list[int]]
    starts: list[int]  # first position whose hidden state is used (prompt length - 1; 0 for text)
    hidden: torch.Tensor  # [N, H] float32, positions of every sequence from its start to the one before its last
    index: torch.Tensor  # [N, 2] (sequence, position) of each row of hidden
    key: str

    def targets(self, num_heads: int) -> torch.Tensor:
        """``[N, num_heads]``: the token at ``t + k + 2`` for head k, -1 past a sequence's end."""
        lengths = torch.tensor([len(s) for s in self.seqs])
        flat = torch.tensor([t for s in self.seqs for t in s], dtype=torch.long)
        offsets = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), lengths[:-1]]), 0)
        seq, pos = self.index[:, 0], self.index[:, 1]
        out = torch.full((self.index.shape[0], num_heads), -1, dtype=torch.long)
        for k in range(num_heads):
            at = pos + k + 2
            ok = at < lengths[seq]
            out[ok, k] = flat[offsets[seq[ok]] + at[ok]]
        return out


def corpus_key(model_dir: Path, items: list[Item], new_tokens: int, dtype: str = "float32") -> str:
    h = hashlib.sha256()
    if dtype != "float32":  # the float32 key is the one earlier versions wrote
        h.update(dtype.encode())
    cfg = (Path(model_dir) / "config.json").read_bytes()
    h.update(cfg)
    h.update(json.dumps([[it.ids, it.continue_it] for it in items]).encode())
    h.update(str(new_tokens).encode())
    return h.hexdigest()[:16]


#: sequences the corpus pass continues (and runs through the base for their hidden states) at once
CORPUS_BATCH = 64
#: copies of the corpus's hidden states the estimate counts: the corpus and the fit's copy of its rows, and one for
#: the rest the run was measured to hold (benchmarks/train_memory.py --smollm2, train-heads' defaults on SmolLM2-135M:
#: peak 4.49 GB; two copies estimate 4.44 GB, three 4.84 GB)
HIDDEN_COPIES = 3


@torch.no_grad()
def build_corpus(model, items: list[Item], new_tokens: int, key: str = "", *, quiet: bool = True,
                 batch: int = CORPUS_BATCH) -> Corpus:
    return merge_shards([build_shard(model, items, new_tokens, key, quiet=quiet, batch=batch)], key)


@torch.no_grad()
def build_shard(model, items: list[Item], new_tokens: int, key: str = "", *, quiet: bool = True,
                batch: int = CORPUS_BATCH) -> Corpus:
    """The corpus of ``items`` alone (one rank's share of them under torchrun; it may hold no rows): the sequences
    in ``items``' order, the rows of each kept sequence together. A continuation's hidden states are those its
    generation computed (one pass of the base, not two); a text item's (and any the generation did not give) come
    from one more pass over the whole sequence."""
    to_continue = [i for i, it in enumerate(items) if it.continue_it]
    got = continuations(model, [items[i].ids for i in to_continue], new_tokens, quiet=quiet, batch=batch,
                        hidden=True)
    seqs = [list(it.ids) for it in items]
    starts = [0] * len(items)
    states: dict[int, torch.Tensor] = {}
    for i, (cont, hs) in zip(to_continue, got, strict=True):
        starts[i] = len(seqs[i]) - 1
        seqs[i] = seqs[i] + cont
        if hs is not None:
            states[i] = hs
    del got
    keep = [i for i, s in enumerate(seqs) if len(s) - starts[i] >= 3]  # else nothing for a head to predict
    keep.sort(key=lambda i: len(seqs[i]))
    if not keep:
        return Corpus(seqs, starts, torch.zeros((0, 0)), torch.zeros((0, 2), dtype=torch.long), key)
    # rows: each position from the start to the one before the last token (the last has no token after it to learn
    # from, nor does a soft target read it), written into one tensor as they come
    n_rows = sum(len(seqs[i]) - 1 - starts[i] for i in keep)
    index = torch.empty((n_rows, 2), dtype=torch.long)
    hidden: torch.Tensor | None = None  # [n_rows, H] float32, made when the first states give H
    at = {}
    offset = 0
    for i in keep:
        at[i] = offset
        n = len(seqs[i]) - 1 - starts[i]
        index[offset:offset + n, 0] = i
        index[offset:offset + n, 1] = torch.arange(starts[i], len(seqs[i]) - 1)
        offset += n

    def put(i: int, rows: torch.Tensor) -> None:
        nonlocal hidden
        if hidden is None:
            hidden = torch.empty((n_rows, rows.shape[-1]), dtype=torch.float32)
        hidden[at[i]:at[i] + rows.shape[0]] = rows  # to float32 on the CPU (exact)

    pending = [i for i in keep if i not in states]
    for i in keep:
        if i in states:
            put(i, states.pop(i))
    _pass_rows(model, seqs, starts, pending, put, batch=batch, quiet=quiet)
    return Corpus(seqs, starts, hidden, index, key)


def _pass_rows(model, seqs: list[list[int]], starts: list[int], todo: list[int], put, *, batch: int,
               quiet: bool) -> None:
    """The rows of sequences ``todo`` from one pass of the base over each whole sequence (right-padded batches:
    causal attention never sees the padding), each handed to ``put(sequence, rows)``."""
    if not todo:
        return
    from tqdm import tqdm

    device = model_device(model)
    bar = tqdm(total=len(todo), desc="hidden states", unit="sequence", disable=quiet, file=sys.stderr)
    for b in range(0, len(todo), batch):
        idx = todo[b:b + batch]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
            mask[r, :len(seqs[i])] = 1
        hs = final_hidden(model, ids.to(device), mask.to(device))
        for r, i in enumerate(idx):
            put(i, hs[r, starts[i]:len(seqs[i]) - 1])
        del hs
        bar.update(len(idx))
    bar.close()


def merge_shards(shards: list[Corpus], key: str) -> Corpus:
    """One corpus of consecutive shards' items, laid out as one build of all of them lays it out: the sequences
    in order, the rows of each sequence together, the sequences from the shortest to the longest (ties in order),
    so that a run on N ranks trains on the rows of a one-process run, in its order."""
    seqs: list[list[int]] = []
    starts: list[int] = []
    rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for shard in shards:
        offset = len(seqs)
        seqs += shard.seqs
        starts += shard.starts
        if not shard.index.shape[0]:
            continue
        index = shard.index.clone()
        index[:, 0] += offset
        counts = torch.unique_consecutive(index[:, 0], return_counts=True)[1].tolist()
        for h, i in zip(shard.hidden.split(counts), index.split(counts), strict=True):
            rows[int(i[0, 0])] = (h, i)
    if not rows:
        raise ModelError("the prompts gave no text to learn from (every sequence is shorter than 3 tokens)",
                         fix="pass longer prompts or raise --new_tokens")
    order = sorted(rows, key=lambda i: (len(seqs[i]), i))
    if len(shards) == 1 and order == list(rows):  # one build's own layout already (build_corpus): no copy
        return Corpus(seqs, starts, shards[0].hidden, shards[0].index, key)
    return Corpus(seqs, starts, torch.cat([rows[i][0] for i in order]), torch.cat([rows[i][1] for i in order]), key)


def heldout_rows(corpus: Corpus, fraction: float) -> torch.Tensor:
    """``[N]`` bool: the corpus rows of the held-out sequences (every ``round(1 / fraction)``-th sequence, the
    last of each run of that many; none when there are fewer sequences than that)."""
    if not fraction > 0:
        return torch.zeros(corpus.index.shape[0], dtype=torch.bool)
    every = max(2, round(1 / fraction))
    return (corpus.index[:, 0] % every) == every - 1


def save_corpus(corpus: Corpus, path: Path) -> None:
    save_whole({"version": CORPUS_VERSION, **asdict(corpus)}, path, "the corpus cache",
               fix="free space on the disk of --work_dir, or pass another --work_dir (the corpus is a cache, "
                   "built again by the next run)")


def load_corpus(path: Path, key: str) -> Corpus | None:
    if not path.is_file():
        return None
    try:
        d = torch.load(path, weights_only=True)
    except Exception:  # a damaged cache is rebuilt, never trusted
        return None
    if d.get("version") != CORPUS_VERSION or d.get("key") != key:
        return None
    d.pop("version")
    return Corpus(**d)
