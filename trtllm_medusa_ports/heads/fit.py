"""Fitting Medusa heads on a corpus (``fit_heads``): the heads in memory (``HeadWeights``), the fit's options and
state, the steps (AdamW, warm-up then cosine decay, the softmax over the corpus' tokens and drawn negatives, the
soft targets), saved every ``save_every`` steps and on a signal (``TrainingInterrupted``), resumed to the weights an
uninterrupted run ends with; each head's held-out top-1 accuracy.
"""

from __future__ import annotations

import math
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import HeadsError, ModelError, PortError
from trtllm_medusa_ports.heads.distributed import Group, RankLost
from trtllm_medusa_ports.heads.rowadam import RowAdam
from trtllm_medusa_ports.heads.saved import save_whole


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
    #: own lm_heads: torch's AdamW over every row of every lm_head each step; default (False): each step's Adam
    #: update touches the rows of its softmax columns alone (heads/rowadam.py): on SmolLM2-135M a step is 1.38x
    #: faster and 300 steps reach the same tokens per step (benchmarks/results/heads_levers.json)
    dense_updates: bool = False
    #: own lm_heads: each step pulls them toward the base's lm_head (their start) by lr x anchor of the difference,
    #: as decoupled weight decay pulls toward 0 (the rows a step updates; every row with dense_updates); 0: none
    anchor: float = 0.0
    # weight of the soft target: head k at position t also matches the base's own distribution
    # at t + k + 1 (the one whose argmax is the hard target on greedy data); 0: hard targets only
    # (`train-heads --distill W`; fit_heads then needs the corpus index). 0 by default: on SmolLM2-135M 1.0
    # gave +0.01 tokens per step at 300 steps, inside the noise, for about twice a step's time
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


def check_fit_dtype(name: str) -> None:
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


def _head_loss(k: int, r: torch.Tensor, hidden_d, targets_d, blocks, lms, c: _Columns, low, opts: FitOptions,
               gathered: bool = False):
    """Head ``k``'s loss on rows ``r`` (cross-entropy, blended with the base's distribution ``distill`` times)
    and its logits; ``gathered``: ``lms`` hold the step's columns already (row-wise updates)."""
    x = hidden_d[r]
    y = targets_d[r, k]
    for w, b in blocks[k]:
        x = x + torch.nn.functional.silu(x @ w.T + b)
    if lms is None:
        logits = _product(x, c.teacher, low)
        if c.bias is not None:
            logits = logits + c.bias
    else:
        logits = _product(x, lms[k] if c.whole or gathered else lms[k][c.cols], low)
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
    row_opt: RowAdam | None = None  # the own lm_heads' optimiser (without dense_updates) (``opt`` has the blocks)

    def optimizer_state(self) -> dict:
        return self.opt.state_dict() if self.row_opt is None else {"adamw": self.opt.state_dict(),
                                                                   "rows": self.row_opt.state_dict()}


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
    lms = run.lms
    if run.row_opt is not None:  # the step's rows of each lm_head, a leaf of their own: the gradient has only them
        run.row_opt.lr = lr_at(step, opts)
        lms = [t.index_select(0, columns.cols).requires_grad_(True) for t in run.lms]
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
        loss, logits, y = _head_loss(k, r.to(run.device), run.hidden, run.targets, run.blocks, lms, columns,
                                     run.low, opts, gathered=run.row_opt is not None)
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
        _sum_gradients(run, columns, lms if run.row_opt is not None else None)
        if report:
            sums = group.sum_(torch.tensor([total, *top1], dtype=torch.float64), f"the loss all-reduce of step {step + 1}")
            total, top1 = float(sums[0]), sums[1:].tolist()
    run.opt.step()
    if opts.anchor and run.lms is not None and run.row_opt is None:  # every row (dense_updates)
        with torch.no_grad():
            for t in run.lms:
                t.sub_(t - run.lm_head, alpha=lr_at(step, opts) * opts.anchor)
    if run.row_opt is not None:
        run.row_opt.step(columns.cols, [t.grad if t.grad is not None else torch.zeros_like(t) for t in lms])
    return total / opts.num_heads, top1


def _sum_gradients(run: _Run, columns: _Columns, gathered: list[torch.Tensor] | None = None) -> None:
    """Each parameter's gradient summed over the ranks (zero where a rank's slice gave it none); the heads' own
    projections on this step's columns only, the rows outside them having no gradient on any rank (``gathered``:
    the step's rows of each, under row updates)."""
    what = "the gradient all-reduce"
    blocks = [t for row in run.blocks for wb in row for t in wb]
    lms = gathered if gathered is not None else run.lms or []
    for t in blocks + lms:
        if t.grad is None:
            t.grad = torch.zeros_like(t)
    flat = run.group.sum_(torch.cat([t.grad.reshape(-1) for t in blocks]), what)
    for t, part in zip(blocks, flat.split([t.numel() for t in blocks]), strict=True):
        t.grad.copy_(part.view_as(t))
    for t in lms:
        if columns.whole or gathered is not None:
            run.group.sum_(t.grad, what)
        else:
            part = run.group.sum_(t.grad.index_select(0, columns.cols), what)
            t.grad.index_copy_(0, columns.cols, part)


def _optimizers(blocks, lms, opts: FitOptions, state: FitState | None,
                anchor_to: torch.Tensor | None = None) -> tuple[torch.optim.AdamW, RowAdam | None]:
    """AdamW over the blocks and (``dense_updates``) the own lm_heads; else row-wise Adam over those;
    each with the saved state's moments where resuming."""
    params = [t.requires_grad_(True) for row in blocks for wb in row for t in wb]
    rowwise = not opts.dense_updates and lms is not None
    if lms is not None and not rowwise:
        params += [t.requires_grad_(True) for t in lms]
    opt = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    row_opt = RowAdam(lms, opts.lr, weight_decay=opts.weight_decay, anchor=opts.anchor,
                      anchor_to=anchor_to) if rowwise else None
    if state is not None:
        try:
            opt.load_state_dict(state.optimizer["adamw"] if rowwise else state.optimizer)
            if row_opt is not None:
                row_opt.load_state_dict(state.optimizer["rows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise HeadsError(f"the saved training state's optimiser does not fit these heads ({exc})",
                             fix="remove the file and train without --resume") from None
    return opt, row_opt


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
    check_fit_dtype(opts.matmul_dtype)
    low = None if opts.matmul_dtype == "float32" else getattr(torch, opts.matmul_dtype)
    rows = [torch.nonzero(u).squeeze(1) for u in usable]
    if opts.distill:
        _check_distill_rows(rows, index)

    state = load_state(state_path, opts) if resume and state_path is not None and state_path.is_file() else None
    group.same(state.step if state is not None else 0, "the step the saved training state resumes from")
    torch.manual_seed(opts.seed)
    blocks, lms, start, history = _start_params(state, opts, H, lm_head, device)
    lm_head_d = lm_head.to(device)
    opt, row_opt = _optimizers(blocks, lms, opts, state, lm_head_d)
    run = _Run(opts, group, rows, hidden.to(device), remap[targets.clamp(min=0)].to(device), blocks, lms, opt, vocab,
               others, n_neg, lm_head_d, lm_bias.to(device) if lm_bias is not None else None, low, device,
               row_opt)

    def save(step: int) -> None:
        if state_path is not None and group.main:  # the other ranks hold the same weights: rank 0 writes them
            save_state(state_path, opts, FitState(step, blocks, lms, run.optimizer_state(), history))

    end = opts.steps if stop_after is None else min(opts.steps, start + stop_after)
    bar = tqdm(total=opts.steps, initial=start, desc="train heads", unit="step", disable=opts.quiet or not group.main,
               file=sys.stderr)
    step = _fit_until(run, start, end, history, bar, save, state_path)
    bar.close()
    save(step)
    heads = HeadWeights([[(w.detach().cpu().clone(), b.detach().cpu().clone()) for w, b in row] for row in blocks],
                        None if lms is None else [t.detach().cpu().clone() for t in lms])
    return heads, history


def _fit_until(run: _Run, start: int, end: int, history: list[dict], bar, save, state_path: Path | None) -> int:
    """Steps ``start`` to ``end`` (the last step reached), a signal deferred to the end of its step: then the state
    holds exactly the steps done (``TrainingInterrupted``); a rank lost mid-step leaves the steps before it
    (``RankLost``). Subnormal floats are flushed to zero meanwhile: as the heads grow confident most softmax
    probabilities fall into float32's subnormal range, which x86 CPUs compute many times slower."""
    group = run.group
    flushed = torch.set_flush_denormal(True)
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
    return step


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
