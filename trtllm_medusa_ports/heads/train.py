"""Train Medusa heads for any supported base by self-distillation (``trtllm-medusa train-heads``).

The recipe is FasterDecoding's (medusa/train/train_legacy.py with self-distilled data), sized
for small machines:

1. the base continues every prompt greedily, once; the token sequences and the base's
   final hidden states are cached in the work directory (``<output_dir>.train/corpus.pt``);
2. head ``k`` learns to predict, from the hidden state at position ``t``, the token at
   ``t + k + 2`` - the base's *own* greedy token, which is what the runtime accepts;
3. ResBlocks start at zero (a head starts as "the base's next-token guess"), the projection is
   the base lm_head (``--share_lm_head``, FasterDecoding "version 2") or a trainable copy of it
   per head; AdamW with a warm-up and a cosine decay, batches of ``--batch_size`` positions;
4. the heads are written in FasterDecoding's layout (``medusa_lm_head.safetensors`` +
   ``config.json``) atomically, and read back by the project's own head loader.

The hidden state is the one the engine's heads see: the output of the base's final norm
(``last_hidden_state`` of the family's decoder; TensorRT-LLM's ``DecoderModelForCausalLM``
hands that tensor to the heads). The heads' logits are ``ResBlocks(h) @ proj.T`` and nothing
more: TensorRT-LLM's ``MedusaHead.forward`` (tensorrt_llm/models/medusa/model.py in
NVIDIA/TensorRT-LLM) applies its lm_head to the ResBlock output and returns; the final logit
soft-capping of Gemma 2 / Gemma 3 (``final_logit_softcapping``) is applied by the base's own
``forward`` to the base logits only, and this project's engine class (engine/medusa.py) and CPU
reference (reference/executor.py ``medusa_logits``) do the same. So training uses uncapped logits
(capping is monotone: it would not change which token is ranked first, only the loss). When the
heads share the base lm_head and it has a bias (Phi-2), the bias is part of the heads' logits, as
in the reference executor.

Training is resumable: the state (step, weights, optimizer, options) is saved every
``save_every`` steps and on Ctrl-C; ``--resume`` continues from it and ends with the same weights
as an uninterrupted run (batches are drawn from a generator seeded by ``(seed, step)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from trtllm_medusa_ports import log
from trtllm_medusa_ports.archs.registry import base_context
from trtllm_medusa_ports.base_model import (  # noqa: F401  (also read from here)
    continue_greedily,
    end_token_ids,
    final_hidden,
    lm_head_of,
    load_base,
    model_device,
    release,
)
from trtllm_medusa_ports.base_streaming import to_dtype
from trtllm_medusa_ports.devices import check_device, choose_dtype
from trtllm_medusa_ports.errors import HeadsError, ModelError, PortError
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES
from trtllm_medusa_ports.files.hf_model import progress_bars_off
from trtllm_medusa_ports.files.prompts import (
    Item,
    PromptInputs,
    check_ids,
    lazy_tokenizer,
    packaged_prompts,
    read_items,
)
from trtllm_medusa_ports.heads.distributed import DEFAULT_TIMEOUT_S, Group, RankLost, join, share
from trtllm_medusa_ports.memory_mode import (
    LIBRARIES_BYTES,
    STREAMING_PER_UNIT,
    TRAIN_PER_FLOAT32,
    MemoryMode,
    check_max_memory,
    hf_sizes,
    select,
)

CORPUS_VERSION = 1

LOG = log.get("heads.train")


# -- heads in memory ------------------------------------------------------------------------
@dataclass
class HeadWeights:
    """Heads in memory: ``blocks[h][l] = (weight [H,H], bias [H])``, own ``lm_heads[h]`` or None."""

    blocks: list[list[tuple[torch.Tensor, torch.Tensor]]]
    lm_heads: list[torch.Tensor] | None

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    @property
    def num_layers(self) -> int:
        return len(self.blocks[0])

    def apply(self, hidden: torch.Tensor, base_lm_head: torch.Tensor,
              base_lm_bias: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[heads, ..., vocab]`` of every head for final-norm hidden states."""
        outs = []
        for h, blocks in enumerate(self.blocks):
            x = hidden
            for w, b in blocks:
                x = x + torch.nn.functional.silu(x @ w.T + b)
            if self.lm_heads is not None:
                outs.append(x @ self.lm_heads[h].T)
            else:
                y = x @ base_lm_head.T
                outs.append(y if base_lm_bias is None else y + base_lm_bias)
        return torch.stack(outs)












@dataclass
class Corpus:
    """Cached self-distillation data: token sequences, where each continuation starts, and the
    final-norm hidden states of the positions the heads learn from (flattened)."""

    seqs: list[list[int]]
    starts: list[int]  # first position whose hidden state is used (prompt length - 1; 0 for text)
    hidden: torch.Tensor  # [N, H] float32, positions of every sequence from its start to its end
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
    in ``items``' order, the rows of each kept sequence together."""
    to_continue = [i for i, it in enumerate(items) if it.continue_it]
    conts = continue_greedily(model, [items[i].ids for i in to_continue], new_tokens, quiet=quiet, batch=batch)
    seqs = [list(it.ids) for it in items]
    starts = [0] * len(items)
    for i, c in zip(to_continue, conts, strict=True):
        starts[i] = len(seqs[i]) - 1
        seqs[i] = seqs[i] + c
    device = model_device(model)
    keep = [i for i, s in enumerate(seqs) if len(s) - starts[i] >= 3]  # else nothing for a head to predict
    keep.sort(key=lambda i: len(seqs[i]))
    if not keep:
        return Corpus(seqs, starts, torch.zeros((0, 0)), torch.zeros((0, 2), dtype=torch.long), key)
    # the rows are written into one tensor as each batch comes (a batch's padded states are freed after it)
    n_rows = sum(len(seqs[i]) - starts[i] for i in keep)
    hidden: torch.Tensor | None = None  # [n_rows, H] float32, made when the first batch gives H
    index = torch.empty((n_rows, 2), dtype=torch.long)
    at = 0
    from tqdm import tqdm

    bar = tqdm(total=len(keep), desc="hidden states", unit="sequence", disable=quiet, file=sys.stderr)
    for b in range(0, len(keep), batch):  # right-padded batches: causal attention never sees the padding
        idx = keep[b:b + batch]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
            mask[r, :len(seqs[i])] = 1
        hs = final_hidden(model, ids.to(device), mask.to(device))
        if hidden is None:
            hidden = torch.empty((n_rows, hs.shape[-1]), dtype=torch.float32)
        for r, i in enumerate(idx):
            n = len(seqs[i]) - starts[i]
            hidden[at:at + n] = hs[r, starts[i]:len(seqs[i])]  # to float32 on the CPU (exact)
            index[at:at + n, 0] = i
            index[at:at + n, 1] = torch.arange(starts[i], len(seqs[i]))
            at += n
        del hs
        bar.update(len(idx))
    bar.close()
    return Corpus(seqs, starts, hidden, index, key)


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


@torch.no_grad()
def heldout_accuracy(heads: HeadWeights, hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.Tensor,
                     lm_bias: torch.Tensor | None, chunk: int = 1024) -> list[float]:
    """Each head's top-1 accuracy at the rows where it has a target (-1: none), in chunks of rows."""
    hits = torch.zeros(heads.num_heads)
    counts = torch.zeros(heads.num_heads)
    for a in range(0, hidden.shape[0], chunk):
        logits = heads.apply(hidden[a:a + chunk].float(), lm_head, lm_bias)  # [heads, rows, vocab]
        y = targets[a:a + chunk, : heads.num_heads].T
        ok = y >= 0
        hits += ((logits.argmax(-1) == y) & ok).sum(1).float()
        counts += ok.sum(1).float()
    return [round(float(h / c), 3) if c else 0.0 for h, c in zip(hits, counts, strict=True)]


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


# -- training -------------------------------------------------------------------------------
@dataclass
class FitOptions:
    num_heads: int = 3
    num_layers: int = 1
    steps: int = 1000
    lr: float = 3e-3
    batch_size: int | None = 256  # None: every position at every step
    share_lm_head: bool = False
    seed: int = 0
    schedule: str = "cosine"  # or "constant"
    warmup: float = 0.05  # fraction of the steps
    weight_decay: float = 0.0
    full_vocab: bool = False  # False: the softmax runs over the tokens the corpus holds (much faster)
    negatives: int = 8192  # without full_vocab: other tokens drawn afresh each step, pushed down too
    # weight of the soft target: head k at position t also matches the base's own distribution
    # at t + k + 1 (the one whose argmax is the hard target on greedy data); 0: hard targets only
    # (`train-heads --distill` defaults to 0.5; fit_heads then needs the corpus index)
    distill: float = 0.0
    #: dtype of the products with the vocabulary (the heads' logits, the soft targets, their gradient):
    #: "bfloat16" is about twice as fast on CPUs with AVX512-BF16/AMX and on GPUs; the softmax and the
    #: loss stay float32, the heads' weights and the optimiser too
    matmul_dtype: str = "float32"
    save_every: int = 100
    quiet: bool = True
    #: share of the corpus' sequences kept out of the fit (every round(1/f)-th sequence), on which each head's
    #: top-1 accuracy is measured at the end; 0: none held out
    heldout_fraction: float = 0.05
    #: the corpus the fit runs on, by its key (the base's files, the prompts, the new tokens, the corpus dtype):
    #: part of the resume signature, so that a state is never continued on another corpus ("" outside train-heads)
    corpus: str = ""

    def signature(self) -> dict:
        d = asdict(self)
        for k in ("save_every", "quiet"):
            d.pop(k)
        return d


@dataclass
class FitState:
    step: int
    blocks: list[list[tuple[torch.Tensor, torch.Tensor]]]
    lm_heads: list[torch.Tensor] | None
    optimizer: dict
    history: list[dict] = field(default_factory=list)


def lr_at(step: int, opts: FitOptions) -> float:
    if opts.schedule == "constant":
        return opts.lr
    warm = max(1, int(opts.warmup * opts.steps))
    if step < warm:
        return opts.lr * (step + 1) / warm
    progress = (step - warm) / max(1, opts.steps - warm)
    return opts.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


#: dtypes of the fit's products with the vocabulary (``train-heads --fit_dtype``)
FIT_DTYPES = ("float32", "bfloat16")


def _check_fit_dtype(name: str) -> None:
    if name not in FIT_DTYPES:
        raise PortError(f"--fit_dtype {name} is not one of {', '.join(FIT_DTYPES)}", fix="e.g. --fit_dtype bfloat16")


def _product(x: torch.Tensor, weight: torch.Tensor, low: torch.dtype | None) -> torch.Tensor:
    """``x @ weight.T`` in float32, computed in ``low`` precision where given (autograd sees the casts)."""
    if low is None:
        return x @ weight.T
    return (x.to(low) @ weight.to(low).T).float()


def _fit_vocab(targets: torch.Tensor, V: int, opts: FitOptions):
    """The softmax's columns: every token a head must predict (all of them with ``full_vocab``), the map from
    token to column, and the tokens the corpus never asks for with how many of them join each step."""
    vocab = torch.arange(V) if opts.full_vocab else torch.unique(targets[targets >= 0])
    remap = torch.full((V,), -1, dtype=torch.long)
    remap[vocab] = torch.arange(vocab.numel())
    # tokens the corpus never asks for still compete at run time (the heads' argmax is over the
    # whole vocabulary): a fresh sample of them joins every step's softmax
    others = torch.nonzero(remap < 0).squeeze(1)
    return vocab, remap, others, min(others.numel(), opts.negatives)


def _check_distill_rows(rows: list[torch.Tensor], index: torch.Tensor | None) -> None:
    """The soft target of row r for head k is the base's distribution at row r + k + 1: the rows must hold each
    sequence's positions in order (Corpus.hidden does)."""
    if index is None:
        raise ValueError("distillation needs the corpus index ([N, 2] sequence, position)")
    for k, r in enumerate(rows):
        ahead = (r + k + 1).clamp(max=index.shape[0] - 1)
        if not (bool((index[ahead, 0] == index[r, 0]).all()) and bool((index[ahead, 1] == index[r, 1] + k + 1).all())):
            raise ValueError("the corpus rows are not consecutive positions of each sequence")


def _start_params(state: FitState | None, opts: FitOptions, H: int, lm_head: torch.Tensor, device: str):
    """The heads' blocks and lm_heads, the first step and the history: fresh (zero blocks, copies of the base's
    lm_head) or those of a saved state."""
    if state is None:
        blocks = [[(torch.zeros(H, H, device=device), torch.zeros(H, device=device)) for _ in range(opts.num_layers)]
                  for _ in range(opts.num_heads)]
        lms = None if opts.share_lm_head else [lm_head.clone().to(device) for _ in range(opts.num_heads)]
        return blocks, lms, 0, []
    blocks = [[(w.to(device), b.to(device)) for w, b in row] for row in state.blocks]
    lms = None if state.lm_heads is None else [t.to(device) for t in state.lm_heads]
    return blocks, lms, state.step, state.history


@dataclass
class _Columns:
    """One step's softmax columns and the base's projection (and bias) gathered on them."""

    cols: torch.Tensor
    whole: bool  # every column, in order: the projections are used as they are, not copied
    teacher: torch.Tensor
    bias: torch.Tensor | None


def _step_columns(vocab, others, n_neg: int, g: torch.Generator, V: int, opts: FitOptions, lm_head_d, lm_bias_d,
                  low, device: str) -> _Columns:
    cols = vocab if not n_neg else torch.cat([vocab, others[torch.randperm(others.numel(), generator=g)[:n_neg]]])
    cols = cols.to(device)
    whole = cols.numel() == V and opts.full_vocab  # no copy of the whole projection
    teacher = lm_head_d if whole else lm_head_d[cols]  # the base's projection, gathered once a step
    if low:
        teacher = teacher.to(low)
    bias = (lm_bias_d if whole else lm_bias_d[cols]) if lm_bias_d is not None else None
    return _Columns(cols, whole, teacher, bias)


def _head_loss(k: int, r: torch.Tensor, hidden_d, targets_d, blocks, lms, c: _Columns, low, opts: FitOptions):
    """Head ``k``'s loss on rows ``r`` (cross-entropy, blended with the base's distribution ``distill`` times)
    and its logits."""
    x = hidden_d[r]
    y = targets_d[r, k]
    for w, b in blocks[k]:
        x = x + torch.nn.functional.silu(x @ w.T + b)
    if lms is None:
        logits = _product(x, c.teacher, low)
        if c.bias is not None:
            logits = logits + c.bias
    else:
        logits = _product(x, lms[k] if c.whole else lms[k][c.cols], low)
    loss = torch.nn.functional.cross_entropy(logits, y)
    if opts.distill:
        with torch.no_grad():  # the base's distribution over the same columns
            tp = _product(hidden_d[r + k + 1], c.teacher, low)
            if c.bias is not None:
                tp = tp + c.bias
            tp = torch.softmax(tp, dim=-1)
        soft = -(tp * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        loss = (1 - opts.distill) * loss + opts.distill * soft
    return loss, logits, y


@dataclass
class _Run:
    """One fit's fixed parts: what every step reads, the parameters it updates and the ranks it runs on."""

    opts: FitOptions
    group: Group
    rows: list[torch.Tensor]  # per head, the corpus rows with a target
    hidden: torch.Tensor
    targets: torch.Tensor  # remapped to the softmax's columns
    blocks: list
    lms: list | None
    opt: torch.optim.Optimizer
    vocab: torch.Tensor
    others: torch.Tensor
    n_neg: int
    lm_head: torch.Tensor
    lm_bias: torch.Tensor | None
    low: torch.dtype | None
    device: str


def _fit_step(run: _Run, step: int, report: bool) -> tuple[float, list[float]]:
    """One step on the global batch: the heads' mean loss and (``report``) each head's top-1 on the batch.

    Under torchrun every rank draws the same global batch (the step's generator) and computes its contiguous slice
    of it, its loss weighted by the slice's share of the batch; the gradients are summed over the ranks before the
    update, so every rank makes the update a one-process run makes (up to the order of the float sums)."""
    opts, group = run.opts, run.group
    g = torch.Generator().manual_seed(opts.seed * 1_000_003 + step)
    for param_group in run.opt.param_groups:
        param_group["lr"] = lr_at(step, opts)
    run.opt.zero_grad(set_to_none=True)
    columns = _step_columns(run.vocab, run.others, run.n_neg, g, run.lm_head.shape[0], opts, run.lm_head,
                            run.lm_bias, run.low, run.device)
    total, top1 = 0.0, []
    for k in range(opts.num_heads):
        r = run.rows[k]
        if opts.batch_size and opts.batch_size < r.numel():
            r = r[torch.randint(0, r.numel(), (opts.batch_size,), generator=g)]
        n = r.numel()
        if group.world > 1:
            lo, hi = group.span(n)
            r = r[lo:hi]
        if not r.numel():  # more ranks than rows: this rank's slice is empty
            top1.append(0.0)
            continue
        loss, logits, y = _head_loss(k, r.to(run.device), run.hidden, run.targets, run.blocks, run.lms, columns,
                                     run.low, opts)
        if group.world > 1:
            loss = loss * (r.numel() / n)
        total = total + loss
        if report:
            hit = (logits.detach().argmax(-1) == y).float()
            top1.append(float(hit.mean()) if group.world == 1 else float(hit.sum()) / n)
    if isinstance(total, torch.Tensor):
        total.backward()  # one backward for all heads
        total = float(total.detach())
    if group.world > 1:  # every collective of a step comes before its update: a failed one leaves the step undone
        _sum_gradients(run, columns)
        if report:
            sums = group.sum_(torch.tensor([total, *top1], dtype=torch.float64), f"the loss all-reduce of step {step + 1}")
            total, top1 = float(sums[0]), sums[1:].tolist()
    run.opt.step()
    return total / opts.num_heads, top1


def _sum_gradients(run: _Run, columns: _Columns) -> None:
    """Each parameter's gradient summed over the ranks (zero where a rank's slice gave it none); the heads' own
    projections on this step's columns only, the rows outside them having no gradient on any rank."""
    what = "the gradient all-reduce"
    blocks = [t for row in run.blocks for wb in row for t in wb]
    for t in blocks + (run.lms or []):
        if t.grad is None:
            t.grad = torch.zeros_like(t)
    flat = run.group.sum_(torch.cat([t.grad.reshape(-1) for t in blocks]), what)
    for t, part in zip(blocks, flat.split([t.numel() for t in blocks]), strict=True):
        t.grad.copy_(part.view_as(t))
    for t in run.lms or []:
        if columns.whole:
            run.group.sum_(t.grad, what)
        else:
            part = run.group.sum_(t.grad.index_select(0, columns.cols), what)
            t.grad.index_copy_(0, columns.cols, part)


def fit_heads(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.Tensor, lm_bias: torch.Tensor | None,
              opts: FitOptions, *, state_path: Path | None = None, resume: bool = False,
              stop_after: int | None = None, device: str = "cpu",
              index: torch.Tensor | None = None, group: Group | None = None) -> tuple[HeadWeights, list[dict]]:
    """Fit heads: ``hidden [N, H]`` final-norm states, ``targets [N, heads]`` (-1: none).

    ``stop_after`` ends the run after that many steps of this call, with the state saved, as an
    interrupted run would end (tests use it; a resumed run then continues from the saved step).
    Each step draws from its own generator (seeded by the step), so a resumed run takes exactly the
    steps an uninterrupted one would. ``group``: the ranks under torchrun (every rank calls this with the same
    corpus; each computes its slice of every batch, rank 0 alone saves the state); none: this process alone.
    """
    from tqdm import tqdm

    group = group or Group()
    H = hidden.shape[1]
    V = lm_head.shape[0]
    usable = [targets[:, k] >= 0 for k in range(opts.num_heads)]
    if any(int(u.sum()) == 0 for u in usable):
        raise ModelError(f"the corpus is too short for {opts.num_heads} heads (no token {opts.num_heads + 1} ahead)",
                         fix="use longer continuations (--new_tokens) or fewer heads")
    vocab, remap, others, n_neg = _fit_vocab(targets, V, opts)
    _check_fit_dtype(opts.matmul_dtype)
    low = None if opts.matmul_dtype == "float32" else getattr(torch, opts.matmul_dtype)
    rows = [torch.nonzero(u).squeeze(1) for u in usable]
    if opts.distill:
        _check_distill_rows(rows, index)

    state = load_state(state_path, opts) if resume and state_path is not None and state_path.is_file() else None
    group.same(state.step if state is not None else 0, "the step the saved training state resumes from")
    torch.manual_seed(opts.seed)
    blocks, lms, start, history = _start_params(state, opts, H, lm_head, device)
    params = [t.requires_grad_(True) for row in blocks for wb in row for t in wb]
    if lms is not None:
        params += [t.requires_grad_(True) for t in lms]
    opt = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    if state is not None:
        opt.load_state_dict(state.optimizer)
    run = _Run(opts, group, rows, hidden.to(device), remap[targets.clamp(min=0)].to(device), blocks, lms, opt, vocab,
               others, n_neg, lm_head.to(device), lm_bias.to(device) if lm_bias is not None else None, low, device)

    def save(step: int) -> None:
        if state_path is not None and group.main:  # the other ranks hold the same weights: rank 0 writes them
            save_state(state_path, opts, FitState(step, blocks, lms, opt.state_dict(), history))

    # As the heads grow confident most softmax probabilities fall into float32's subnormal range,
    # which x86 CPUs compute many times slower: flush them to zero while training.
    flushed = torch.set_flush_denormal(True)
    end = opts.steps if stop_after is None else min(opts.steps, start + stop_after)
    bar = tqdm(total=opts.steps, initial=start, desc="train heads", unit="step", disable=opts.quiet or not group.main,
               file=sys.stderr)
    step = start
    stop = _DeferredStop()
    try:
        stop.install()
        step = _fit_steps(run, start, end, stop, history, bar, save)
        try:  # a signal during the last step counts too
            signum = group.max_int(stop.signum or 0, "the stop check")
        except RankLost as exc:
            raise _StepsStopped(step, exc) from None
        if signum:  # the steps before `step` are done, none after: exactly what is saved
            save(step)
            bar.close()
            raise TrainingInterrupted(step, signum)
    except _StepsStopped as exc:  # a rank was lost during step exc.step + 1: the steps before it are whole
        bar.close()
        step = exc.step
        save(step)
        kept = (f"the training state holds exactly those {step} steps ({state_path})"
                if group.main and state_path is not None else "rank 0 keeps the training state")
        raise RankLost(f"{exc.lost.what}, after {step} whole steps; {kept}", where=exc.lost.where,
                       fix=exc.lost.fix) from None
    except KeyboardInterrupt as exc:  # not deferred (another thread, no handler): the last whole save stands
        bar.close()
        if isinstance(exc, TrainingInterrupted):
            raise
        raise TrainingInterrupted(None, signal.SIGINT) from None
    finally:
        stop.restore()
        if flushed:
            torch.set_flush_denormal(False)
    bar.close()
    save(step)
    heads = HeadWeights([[(w.detach().cpu().clone(), b.detach().cpu().clone()) for w, b in row] for row in blocks],
                        None if lms is None else [t.detach().cpu().clone() for t in lms])
    return heads, history


class _StepsStopped(Exception):
    """A collective failed during step ``step + 1`` (``lost``: the error); the steps before it are done."""

    def __init__(self, step: int, lost: RankLost):
        super().__init__(step)
        self.step, self.lost = step, lost


def _fit_steps(run: _Run, start: int, end: int, stop, history: list[dict], bar, save) -> int:
    """Steps ``start`` to ``end`` (exclusive) with their history, progress and periodic saves; returns the step
    the run stopped before (``end``, or the first step a stop signal any rank received came before)."""
    opts = run.opts
    for step in range(start, end):
        try:
            if run.group.max_int(stop.signum or 0, "the stop check"):
                return step
            report = not opts.quiet or step % 10 == 0 or step == end - 1
            mean, top1 = _fit_step(run, step, report)
        except RankLost as exc:
            raise _StepsStopped(step, exc) from None
        if report:
            if step % 10 == 0 or step == end - 1:
                history.append({"step": step + 1, "loss": round(mean, 4), "top1": [round(t, 3) for t in top1]})
            bar.set_postfix_str(f"loss {mean:.3f} top1 " + " ".join(f"{t:.2f}" for t in top1), refresh=False)
        bar.update(1)
        if opts.save_every and (step + 1) % opts.save_every == 0 and step + 1 < end:
            save(step + 1)
    return end


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by SIGINT / SIGTERM; ``step``: the steps the saved state holds (None: the last periodic
    save, if any, stands)."""

    def __init__(self, step: int | None, signum: int):
        super().__init__(step)
        self.step, self.signum = step, signum


class _DeferredStop:
    """SIGINT and SIGTERM recorded instead of raised, while installed (main thread only)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict = {}

    def _handler(self, signum, frame) -> None:  # noqa: ARG002
        self.signum = signum

    def install(self) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def save_state(path: Path, opts: FitOptions, state: FitState) -> None:
    save_whole({"options": opts.signature(), "step": state.step,
                "blocks": [[(w.detach().cpu(), b.detach().cpu()) for w, b in row] for row in state.blocks],
                "lm_heads": None if state.lm_heads is None else [t.detach().cpu() for t in state.lm_heads],
                "optimizer": state.optimizer, "history": state.history}, path, "the training state",
               fix="free space on the disk of --work_dir, or pass another --work_dir; the last whole state, if "
                   "any, is kept, and --resume continues from it")


def os_error_text(exc: OSError) -> str:
    """``ENOSPC: No space left on device``."""
    import errno

    name = errno.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno is not None else "OSError"
    return f"{name}: {exc.strerror or exc}"


class _Sink:
    """What ``torch.save`` writes through: every byte written, or the ``OSError`` kept. torch turns a failed
    write into a ``RuntimeError`` ("unexpected pos ..."), so the disk's own error is read from here."""

    def __init__(self, fd: int):
        self.fd = fd
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += os.write(self.fd, view[done:])
        except OSError as exc:
            self.error = self.error or exc
            raise
        return len(view)

    def flush(self) -> None:
        pass


def save_whole(obj, path: Path, what: str, *, fix: str) -> None:
    """``torch.save(obj)`` to ``path`` whole or not at all: written to ``<path>.tmp``, synced and renamed over it.
    A failed write (a full disk, a read-only one) removes the temporary file, leaves what ``path`` held, and is
    one :class:`HeadsError` naming the file and the errno."""
    tmp = path.with_suffix(".tmp")
    sink: _Sink | None = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            sink = _Sink(fd)
            torch.save(obj, sink)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, Exception):  # Ctrl-C: no temporary left, the last whole file stands
            raise
        err = exc if isinstance(exc, OSError) else sink.error if sink is not None else None
        if err is None:
            raise
        raise HeadsError(f"could not write {what} ({os_error_text(err)}); nothing half-written was left",
                         where=str(path), fix=fix) from None


def load_state(path: Path, opts: FitOptions) -> FitState:
    try:
        d = torch.load(path, weights_only=True)
    except Exception as exc:
        raise HeadsError(f"cannot read the saved training state ({type(exc).__name__})", where=str(path),
                         fix="remove the file and train without --resume") from None
    if d.get("options") != opts.signature():
        diff = sorted(k for k in opts.signature() if d.get("options", {}).get(k) != opts.signature()[k])
        why = ("; the corpus differs: another base, prompts, --new_tokens or corpus dtype (--dtype auto picks "
               "bfloat16 or float32 by the device)" if "corpus" in diff else "")
        raise HeadsError(f"the saved run used other settings ({', '.join(diff)}){why}", where=str(path),
                         fix="resume with the same flags (--dtype as the saved run resolved it), or train without "
                             "--resume to start over")
    try:
        state = FitState(int(d["step"]), [[tuple(wb) for wb in row] for row in d["blocks"]], d["lm_heads"],
                         d["optimizer"], d.get("history", []))
        if len(state.blocks) != opts.num_heads or any(len(row) != opts.num_layers for row in state.blocks):
            raise ValueError
    except (KeyError, TypeError, ValueError, AttributeError):
        raise HeadsError("the saved training state is incomplete or damaged (a key or a head missing)",
                         where=str(path), fix="remove the file and train without --resume") from None
    return state


# -- writing --------------------------------------------------------------------------------
def write_heads(heads: HeadWeights, output_dir: Path, *, overwrite: bool, base_dir: Path,
                extra: dict | None = None, inputs: dict[str, Path] | None = None) -> Path:
    """FasterDecoding's layout, written atomically: ``medusa_lm_head.safetensors`` + ``config.json``
    (``version: "2"`` when the heads share the base lm_head, as FasterDecoding marks it)."""
    import torch
    from safetensors.torch import save_file

    from trtllm_medusa_ports.files.checkpoint import atomic_output_dir

    sd = {}
    L = heads.num_layers
    for h, row in enumerate(heads.blocks):
        for layer, (w, b) in enumerate(row):
            sd[f"{h}.{layer}.linear.weight"] = w.contiguous()
            sd[f"{h}.{layer}.linear.bias"] = b.contiguous()
        if heads.lm_heads is not None:
            sd[f"{h}.{L}.weight"] = heads.lm_heads[h].contiguous()
    bad = [name for name, t in sd.items() if not bool(torch.isfinite(t).all())]
    if bad:  # a diverged fit is never written as heads
        raise HeadsError(f"the trained heads hold NaN/Inf ({', '.join(bad[:3])}): the fit diverged",
                         where=str(output_dir), fix="lower --lr (e.g. 3e-3) or --steps, and train again")
    cfg = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": L,
           "base_model_name_or_path": str(base_dir)}
    if heads.lm_heads is None:
        cfg["version"] = "2"
    if extra:
        cfg.update(extra)
    from safetensors import SafetensorError

    fix = ("free space or choose a writable --output_dir; the training state is kept, so --resume writes them "
           "without training again")
    try:
        with atomic_output_dir(output_dir, overwrite=overwrite, inputs=inputs or {"--model_dir": base_dir}) as tmp:
            save_file(sd, str(tmp / "medusa_lm_head.safetensors"))
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    except OSError as exc:  # a full disk, a read-only output: nothing half-written is left
        raise HeadsError(f"could not write the heads ({os_error_text(exc)})", where=str(output_dir), fix=fix) from None
    except SafetensorError as exc:  # safetensors' own error for a failed write: "... I/O error: ... (os error 28)"
        code = re.search(r"os error (\d+)", str(exc))
        if code is None:  # not the disk's: ours
            raise
        why = os_error_text(OSError(int(code[1]), os.strerror(int(code[1]))))
        raise HeadsError(f"could not write the heads ({why})", where=str(output_dir), fix=fix) from None
    return output_dir


# -- the command ----------------------------------------------------------------------------
@dataclass
class TrainOptions:
    model_dir: Path
    output_dir: Path
    #: what to train on (--prompt, --prompts_file, --prompt_ids, --data; files/prompts.py); none: the packaged prompts
    prompts: PromptInputs = field(default_factory=PromptInputs)
    tokenizer_dir: Path | None = None
    revision: str | None = None  # model_dir's on the Hub, where it is a Hub id (files/hub.py)
    #: "auto": text prompts go through the tokenizer's chat template where it has one (the base is served so);
    #: "none": as they are (files/tokenizer.py)
    chat_template: str = "auto"
    new_tokens: int = 64
    #: the dtype the base runs in to write the corpus (continuations, hidden states): bfloat16 is about
    #: twice as fast on CPUs with AVX512-BF16/AMX and on GPUs, and is how most bases are served; "auto":
    #: bfloat16 where the device computes it fast, float32 elsewhere (devices.choose_dtype)
    dtype: str = "float32"
    work_dir: Path | None = None  # default: <output_dir>.train
    resume: bool = False
    overwrite: bool = False
    device: str | None = None
    fit: FitOptions = field(default_factory=FitOptions)
    stop_after: int | None = None
    #: torch threads (None: the idle cores, api.default_threads)
    threads: int | None = None
    #: "auto": the base is loaded across the GPUs a rank sees (transformers' device_map, needs accelerate) for the
    #: corpus pass, for a base bigger than one device; None: on --device
    device_map: str | None = None
    #: seconds a rank waits for the others at one collective under torchrun (a dead rank is noticed at once on gloo)
    dist_timeout: int = DEFAULT_TIMEOUT_S
    #: memory (memory_mode.py, as verify): True streams the base one decoder layer at a time for the corpus pass,
    #: False holds it whole, None streams where the in-memory estimate exceeds max_memory (GB, per process; default:
    #: the available memory shared by this node's ranks); under torchrun each rank streams its own copy
    streaming: bool | None = None
    max_memory: float | None = None
    offload_dir: Path | None = None  # streaming: where the base's weights wait (default: the temporary directory)


@dataclass
class TrainResult:
    output_dir: Path | None
    steps: int
    positions: int
    sequences: int
    history: list[dict]
    heads: HeadWeights | None = None
    corpus_seconds: float = 0.0  # 0 when the cached corpus was used
    fit_seconds: float = 0.0
    #: each head's top-1 accuracy on the held-out sequences (None: none held out, or the run stopped early)
    heldout_top1: list[float] | None = None
    heldout_positions: int = 0
    heldout_sequences: int = 0
    #: the dtypes used (``auto`` resolved), the ranks the run had, and warnings (also printed when they arose)
    dtype: str = "float32"
    fit_dtype: str = "float32"
    world_size: int = 1
    rank: int = 0
    warnings: list[str] = field(default_factory=list)
    #: how the base was held for the corpus pass (memory_mode.MemoryMode as a dict: mode, reason, estimates)
    memory_mode: dict | None = None
    #: what was done with the tokenizer's chat template (files/tokenizer.py CHAT_*)
    chat_template: str = ""

    def to_dict(self) -> dict:
        last = self.history[-1] if self.history else {}
        return {"output_dir": str(self.output_dir) if self.output_dir else None, "steps": self.steps,
                "positions": self.positions, "sequences": self.sequences,
                "last_batch_loss": last.get("loss"), "last_batch_top1": last.get("top1"),
                "heldout_top1": self.heldout_top1, "heldout_positions": self.heldout_positions,
                "heldout_sequences": self.heldout_sequences, "dtype": self.dtype, "fit_dtype": self.fit_dtype,
                "world_size": self.world_size, "warnings": self.warnings, "memory_mode": self.memory_mode,
                "chat_template": self.chat_template,
                "corpus_seconds": self.corpus_seconds, "fit_seconds": self.fit_seconds, "history": self.history}

    def summary(self) -> str:
        last = self.history[-1] if self.history else {}
        where = f"wrote {self.output_dir}" if self.output_dir else "stopped (state saved; continue with --resume)"
        ranks = f" on {self.world_size} ranks" if self.world_size > 1 else ""
        text = (f"{where}: {self.steps} steps{ranks} on {self.positions} positions of {self.sequences} sequences; "
                f"last batch loss {last.get('loss')}, top-1 per head {last.get('top1')} (training batch)")
        if self.heldout_top1 is not None:
            text += (f"; held out ({self.heldout_sequences} sequences, {self.heldout_positions} positions): top-1 per "
                     f"head {self.heldout_top1}")
        if self.chat_template:
            text += f"; chat template {self.chat_template}"
        return text


def _tokenizer(tok_dir: Path):
    from trtllm_medusa_ports.files.prompts import tokenizer_for

    return tokenizer_for(tok_dir)


def _check_train_options(opts: TrainOptions) -> None:
    f = opts.fit
    for name, v, lo in (("--num_heads", f.num_heads, 1), ("--num_layers", f.num_layers, 1), ("--steps", f.steps, 1),
                        ("--new_tokens", opts.new_tokens, 1), ("--dist_timeout", opts.dist_timeout, 1)):
        if v < lo:
            raise PortError(f"{name} {v} must be at least {lo}", fix=f"pass {name} {lo} or more", usage=True)
    if not f.lr > 0:
        raise PortError(f"--lr {f.lr} must be positive", fix="e.g. --lr 3e-3", usage=True)
    if opts.dtype != "auto" and opts.dtype not in CHECKPOINT_DTYPES:
        raise PortError(f"--dtype {opts.dtype} is not auto or one of {', '.join(CHECKPOINT_DTYPES)}",
                        fix="e.g. --dtype auto", usage=True)
    if f.matmul_dtype != "auto":
        _check_fit_dtype(f.matmul_dtype)  # before the corpus is built, not minutes later
    if opts.device_map not in (None, "auto"):
        raise PortError(f"--device_map {opts.device_map!r} is not auto", fix="pass --device_map auto, or leave it out",
                        usage=True)
    if not 0 <= f.heldout_fraction < 1:
        raise PortError(f"--heldout_fraction {f.heldout_fraction} must be at least 0 and below 1",
                        fix="e.g. --heldout_fraction 0.05 (0: nothing held out)", usage=True)
    if not 0 <= f.distill <= 1:
        raise PortError(f"--distill {f.distill} must be between 0 and 1", fix="e.g. --distill 0.5 (0: hard targets only)",
                        usage=True)
    check_max_memory(opts.max_memory)
    if opts.device_map is not None and (opts.streaming or opts.max_memory is not None):
        flag = "--streaming" if opts.streaming else "--max_memory"
        raise PortError(f"--device_map auto holds the base in memory across the GPUs; {flag} streams it on one device",
                        fix="pass one of them")


def _train_device(device: str | None) -> str:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise PortError(f"--device {device!r} is not a torch device ({exc})", fix="use --device cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PortError(f"--device {device}: torch sees no CUDA device here", fix="use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise PortError(f"--device {device}: only cpu and cuda are supported", fix="use --device cpu")
    return check_device(device, "--device")  # a real allocation and product there (cuda:7 of 1 GPU, ...)


def _work_dir(opts: TrainOptions, out: Path) -> Path:
    """The corpus and training state's folder, created: never an input, its parent, the output or a file."""
    from trtllm_medusa_ports.files.checkpoint import guard_output_dir

    work = Path(opts.work_dir) if opts.work_dir else out.parent / f"{out.name}.train"
    inputs = {"--model_dir": Path(opts.model_dir)}
    inputs.update(opts.prompts.paths())
    if opts.tokenizer_dir:
        inputs["--tokenizer_dir"] = Path(opts.tokenizer_dir)
    try:
        guard_output_dir(work, inputs)
    except PortError as exc:
        raise PortError(exc.what.replace("--output_dir", "--work_dir"), where=exc.where,
                        fix=(exc.fix or "").replace("--output_dir", "--work_dir")) from None
    if work.resolve() == out.resolve():
        raise PortError("--work_dir is the --output_dir", where=str(work), fix="give the training state its own folder")
    if work.exists() and not work.is_dir():
        raise PortError("--work_dir exists and is not a directory", where=str(work), fix="choose another --work_dir")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PortError(f"cannot create --work_dir ({exc.strerror})", where=str(work),
                        fix="choose a writable --work_dir") from None
    return work


def train(opts: TrainOptions) -> TrainResult:
    """``trtllm-medusa train-heads``: corpus (cached) -> fit (resumable) -> FasterDecoding layout.

    Under torchrun (``WORLD_SIZE`` > 1) every rank runs this with the same options: each continues its share of the
    prompts, rank 0 merges the shares into the one corpus a single process writes, every rank fits its slice of each
    batch (heads/distributed.py), and rank 0 alone writes the training state and the heads."""
    from trtllm_medusa_ports.files.checkpoint import guard_output_dir

    _check_train_options(opts)
    out = guard_output_dir(Path(opts.output_dir), {"--model_dir": Path(opts.model_dir)})
    if (out.exists() or out.is_symlink()) and not out.is_dir():  # --overwrite replaces directories, never a file
        raise PortError("exists and is not a directory", where=str(out), fix="choose another --output_dir")
    if out.exists() and any(out.iterdir()) and not opts.overwrite:
        raise PortError("output directory is not empty", where=str(out),
                        fix="pass --overwrite to replace it, or choose another --output_dir")
    device = _train_device(opts.device)
    work = _work_dir(opts, out)
    group, device = join(device, opts.dist_timeout, spread=opts.device_map is not None)
    lock = None
    try:
        error = None
        if group.main:  # one run at a time per work dir: a second would overwrite the first's state
            try:
                lock = _lock_work_dir(work)
            except PortError as exc:
                error = exc
        group.agree(error, "the --work_dir lock")
        opts, warnings = _resolve_dtypes(opts, device, group)
        items, chat = _read_items(opts)
        memory = group.gather(choose_memory(opts, device, items) if group.main else None, "the memory mode")[0]
        with progress_bars_off(opts.fit.quiet or not group.main):  # --quiet silences transformers' loading bars
            result = _train_locked(opts, out, work, device, group, memory, items)
        result.warnings, result.memory_mode, result.chat_template = warnings, memory.to_dict(), chat
        return result
    finally:
        if lock is not None:
            os.close(lock)
        with contextlib.suppress(Exception):  # a lost rank's group may not leave cleanly; its error stands
            group.close()


def _base_dims(model_dir) -> tuple[int, int, int] | None:
    """(hidden size, vocabulary, KV cache values per token: keys and values of every layer) from config.json, or
    None where it cannot say (loading the base then says what is wrong with it)."""
    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.files.hf_model import HFConfig

    try:
        hf = HFConfig.read(model_dir)
        adapter = adapter_for(hf.architecture)
        return (int(adapter.hidden_size(hf)), int(hf.get("vocab_size")),
                2 * int(adapter.num_hf_layers(hf)) * int(adapter.num_kv_heads(hf)) * int(adapter.head_size(hf)))
    except (PortError, OSError, TypeError, ValueError, AttributeError):
        return None


def fit_bytes(opts: TrainOptions) -> int:
    """What the fit holds whichever way the base was held (float32): the base's lm_head copy, and each head's
    ResBlocks and own lm_head (``--share_lm_head``: none) with their gradients and AdamW's two moments (the cached
    hidden states: :func:`corpus_bytes`)."""
    dims = _base_dims(opts.model_dir)
    if dims is None:
        return 0
    H, V, _ = dims
    f = opts.fit
    per_head = f.num_layers * (H * H + H) + (0 if f.share_lm_head else V * H)
    return 4 * (V * H + 4 * f.num_heads * per_head)


def corpus_bytes(opts: TrainOptions, items: list[Item]) -> int:
    """The corpus's own memory beside the base and the fit: the KV cache of one batch of :data:`CORPUS_BATCH`
    continuations (the longest sequences: every layer's keys and values, 4 bytes each) and the hidden states of
    every position (positions x hidden size x 4 bytes) :data:`HIDDEN_COPIES` times."""
    dims = _base_dims(opts.model_dir)
    if dims is None:
        return 0
    H, _, kv_per_token = dims
    lengths = sorted(len(it.ids) + (opts.new_tokens if it.continue_it else 0) for it in items)
    return 4 * (HIDDEN_COPIES * sum(lengths) * H + sum(lengths[-CORPUS_BATCH:]) * kv_per_token)


def choose_memory(opts: TrainOptions, device: str, items: list[Item] | None = None) -> MemoryMode:
    """How the base is held for the corpus pass (memory_mode.select, the rule verify follows): the estimates are
    the libraries, the base (whole in float32, or its largest decoder layer), :func:`fit_bytes` and
    :func:`corpus_bytes` of ``items``."""
    total, unit = hf_sizes(opts.model_dir)
    fit = fit_bytes(opts) + corpus_bytes(opts, items or [])
    in_memory = LIBRARIES_BYTES + int(TRAIN_PER_FLOAT32 * total) + fit
    streamed = LIBRARIES_BYTES + int(STREAMING_PER_UNIT * unit) + fit
    if opts.device_map is not None:
        mode, reason = "in-memory", "--device_map auto: the base in memory across the GPUs"
    else:
        ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
        mode, reason = select(opts.streaming, opts.max_memory, in_memory,
                              ranks_here=int(ranks) if ranks.isdigit() else 1)
    return MemoryMode(mode, reason, device, total, unit, in_memory, streamed, check_max_memory(opts.max_memory))


def _resolve_dtypes(opts: TrainOptions, device: str, group: Group) -> tuple[TrainOptions, list[str]]:
    """``--dtype`` / ``--fit_dtype`` ``auto`` resolved (rank 0 probes its device once; every rank takes its
    choice), and a warning for an explicit bfloat16 the device computes slowly (printed at once)."""
    from dataclasses import replace

    chosen = None
    if group.main:
        dtype, w1 = choose_dtype(opts.dtype, device, "--dtype")
        fit_dtype, w2 = choose_dtype(opts.fit.matmul_dtype, device, "--fit_dtype")
        chosen = (dtype, fit_dtype, [w for w in (w1, w2) if w])
        for w in chosen[2]:
            LOG.warning(w)
    dtype, fit_dtype, warnings = group.gather(chosen, "the dtype choice")[0]
    return replace(opts, dtype=dtype, fit=replace(opts.fit, matmul_dtype=fit_dtype)), warnings


def _lock_work_dir(work: Path) -> int:
    import fcntl

    fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise PortError("another train-heads is running with this --work_dir", where=str(work),
                        fix="wait for it to finish, or give this run its own --output_dir / --work_dir") from None
    return fd


def _read_items(opts: TrainOptions) -> tuple[list[Item], str]:
    """The prompts and sequences as token ids (before the base is loaded: the memory estimate counts them), each
    within the base's context with its continuation; and what was done with the chat template."""
    tokenize = lazy_tokenizer(opts.tokenizer_dir or opts.model_dir, opts.chat_template)  # loaded when text needs it
    items = read_items(opts.prompts, tokenize, default=packaged_prompts)
    # the family's own context key (GPT-2's n_positions, MPT's max_seq_len: archs.registry base_context)
    max_pos, key = base_context(opts.model_dir) or (None, None)
    for n, it in enumerate(items):
        if max_pos and len(it.ids) + (opts.new_tokens if it.continue_it else 0) > max_pos:
            raise PortError(f"prompt {n} has {len(it.ids)} tokens; with --new_tokens {opts.new_tokens} it passes the "
                            f"base's {key} {max_pos}",
                            fix="shorten the prompt (one prompt per line) or lower --new_tokens")
    return items, tokenize.chat


def _train_locked(opts: TrainOptions, out: Path, work: Path, device: str, group: Group,
                  memory: MemoryMode, items: list[Item]) -> TrainResult:
    f = opts.fit
    quiet = f.quiet or not group.main  # one rank's bars and status lines (transformers' loading bars: train())
    if not quiet:
        LOG.info(f"train-heads: memory: {memory.summary()}")
        LOG.info(f"train-heads: loading the base from {opts.model_dir}" + (f" on {group.world} ranks"
                                                                           if group.world > 1 else ""))
    low = getattr(torch, opts.dtype)
    # streaming: the model's weights wait in a temporary file (one per rank under torchrun), read back a decoder
    # layer at a time by both passes of the corpus (continuations, hidden states); the same values and products
    model = load_base(opts.model_dir, device, device_map=opts.device_map, dtype=low if opts.device_map else None,
                      streaming=memory.streaming, offload_dir=opts.offload_dir)
    vocab = model.config.vocab_size if hasattr(model.config, "vocab_size") else lm_head_of(model)[0].shape[0]
    check_ids([it.ids for it in items], vocab, "item")
    key = corpus_key(Path(opts.model_dir), items, opts.new_tokens, opts.dtype)
    # float32 as loaded (of the --dtype weights with --device_map), on the CPU where the held-out check runs
    lm_head, lm_bias = (t.detach().float().to("cpu", copy=True) if t is not None else None for t in lm_head_of(model))
    t0 = time.monotonic()
    corpus, built = _shared_corpus(model, None if opts.device_map else low, items, opts.new_tokens, key, work, group,
                                   quiet)
    corpus_s = time.monotonic() - t0 if built else 0.0
    release(model)  # a streamed base's weight file; the fit needs the corpus and the lm_head only
    del model
    held = heldout_rows(corpus, f.heldout_fraction)
    fit_rows = ~held
    if not bool(fit_rows.any()):
        raise PortError("every sequence is held out: nothing is left to train on",
                        fix="pass more prompts or a smaller --heldout_fraction")
    targets = corpus.targets(f.num_heads)
    t1 = time.monotonic()
    f = replace(f, corpus=key)  # the resume signature covers the corpus the state was fitted on
    heads, history = fit_heads(corpus.hidden[fit_rows], targets[fit_rows], lm_head, lm_bias, f,
                               state_path=work / "state.pt", resume=opts.resume, stop_after=opts.stop_after,
                               device=device, index=corpus.index[fit_rows], group=group)
    result = TrainResult(None, history[-1]["step"] if history else 0, int(fit_rows.sum()), len(corpus.seqs),
                         history, heads, round(corpus_s, 1), round(time.monotonic() - t1, 1), dtype=opts.dtype,
                         fit_dtype=f.matmul_dtype, world_size=group.world, rank=group.rank)
    if history and history[-1]["step"] >= f.steps:
        _finish(result, opts, corpus, held, targets, lm_head, lm_bias, out, group)
    return result


def _finish(result: TrainResult, opts: TrainOptions, corpus: Corpus, held: torch.Tensor, targets: torch.Tensor,
            lm_head: torch.Tensor, lm_bias: torch.Tensor | None, out: Path, group: Group) -> None:
    """A finished run: the held-out accuracy, and the heads written by rank 0 (the others wait for its word)."""
    f = opts.fit
    if bool(held.any()):
        result.heldout_top1 = heldout_accuracy(result.heads, corpus.hidden[held], targets[held], lm_head, lm_bias)
        result.heldout_positions = int(held.sum())
        result.heldout_sequences = len(set(corpus.index[held, 0].tolist()))
    error = None
    if group.main:
        extra = {"medusa_ports_training": {"steps": f.steps, "lr": f.lr, "batch_size": f.batch_size,
                                           "positions": corpus.hidden.shape[0], "sequences": len(corpus.seqs),
                                           "new_tokens": opts.new_tokens, "final": result.history[-1]}}
        try:
            write_heads(result.heads, out, overwrite=opts.overwrite, base_dir=Path(opts.model_dir), extra=extra)
        except PortError as exc:
            error = exc
    group.agree(error, "writing the heads")
    result.output_dir = out


def _shared_corpus(model, dtype: torch.dtype | None, items: list[Item], new_tokens: int, key: str, work: Path,
                   group: Group, quiet: bool) -> tuple[Corpus, bool]:
    """The corpus (``work/corpus.pt``, cached) and whether it was built now, by the base cast to ``dtype`` (None:
    as loaded). Under torchrun each rank continues its
    contiguous share of the items into ``corpus.rank<R>-of-<N>.pt`` (kept for a rerun at the same world size if the
    job stops before the merge); rank 0 merges the shares into ``corpus.pt``, the file one process writes, so that a
    later run at any world size reads it."""
    path = work / "corpus.pt"
    corpus = load_corpus(path, key)
    cached = group.gather(corpus is not None, "the corpus cache check")
    if all(cached):
        if not quiet:
            LOG.info(f"train-heads: the cached corpus of {work} ({len(corpus.seqs)} sequences)")
        return corpus, False
    if dtype is not None:
        model = to_dtype(model, dtype)
    if group.world == 1:
        corpus = build_corpus(model, items, new_tokens, key, quiet=quiet)
        save_corpus(corpus, path)
        return corpus, True
    error = None
    try:
        lo, hi = group.span(len(items))
        shard_path, shard_key = work / f"corpus.rank{group.rank}-of-{group.world}.pt", f"{key}/{lo}-{hi}"
        if load_corpus(shard_path, shard_key) is None:
            save_corpus(build_shard(model, items[lo:hi], new_tokens, shard_key, quiet=quiet), shard_path)
    except PortError as exc:
        error = exc
    group.agree(error, "the corpus shares")
    error = None
    if group.main:
        try:
            save_corpus(_merged_shards(work, key, len(items), group.world), path)
        except PortError as exc:
            error = exc
        else:  # merged and saved: the shares are no longer needed
            for r in range(group.world):
                with contextlib.suppress(OSError):
                    os.unlink(work / f"corpus.rank{r}-of-{group.world}.pt")
    group.agree(error, "the corpus merge")
    corpus = load_corpus(path, key)
    group.agree(None if corpus is not None else HeadsError(
        "the merged corpus rank 0 wrote is not in --work_dir here", where=str(path),
        fix="give every rank the same --work_dir on one shared filesystem"), "reading the merged corpus")
    return corpus, True


def _merged_shards(work: Path, key: str, n: int, world: int) -> Corpus:
    shards = []
    for r in range(world):
        lo, hi = share(n, r, world)
        shard_path = work / f"corpus.rank{r}-of-{world}.pt"
        shard = load_corpus(shard_path, f"{key}/{lo}-{hi}")
        if shard is None:
            raise HeadsError(f"rank {r}'s share of the corpus is missing or not this run's", where=str(shard_path),
                             fix="give every rank the same --work_dir on one shared filesystem, and run again")
        shards.append(shard)
    return merge_shards(shards, key)
