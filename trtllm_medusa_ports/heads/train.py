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
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from trtllm_medusa_ports.archs.registry import base_context
from trtllm_medusa_ports.errors import HeadsError, PortError
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES
from trtllm_medusa_ports.files.hf_model import progress_bars_off
from trtllm_medusa_ports.files.prompts import (
    Item,
    PromptInputs,
    check_ids,
    items_source,
    lazy_tokenizer,
    packaged_prompts,
    read_items,
)
from trtllm_medusa_ports.heads.corpus import (
    CORPUS_BATCH,
    HIDDEN_COPIES,
    Corpus,
    build_corpus,
    build_shard,
    corpus_key,
    heldout_rows,
    load_corpus,
    merge_shards,
    save_corpus,
)
from trtllm_medusa_ports.heads.distributed import DEFAULT_TIMEOUT_S, Group, join, share
from trtllm_medusa_ports.heads.fit import (
    FitOptions,
    HeadWeights,
    check_fit_dtype,
    fit_heads,
    heldout_accuracy,
)
from trtllm_medusa_ports.heads.saved import os_error_text
from trtllm_medusa_ports.huggingface.memory_mode import (
    LIBRARIES_BYTES,
    STREAMING_PER_UNIT,
    TRAIN_PER_FLOAT32,
    MemoryMode,
    check_max_memory,
    hf_sizes,
    ignored_max_memory,
    select,
)
from trtllm_medusa_ports.huggingface.model import (
    lm_head_of,
    load_base,
    release,
)
from trtllm_medusa_ports.huggingface.streaming import to_dtype
from trtllm_medusa_ports.machine import log
from trtllm_medusa_ports.machine.devices import check_device, choose_dtype

LOG = log.get("heads.train")


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
    #: memory (huggingface/memory_mode.py, as verify): True streams the base one decoder layer at a time for the corpus pass,
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
        check_fit_dtype(f.matmul_dtype)  # before the corpus is built, not minutes later
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


def _work_path(opts: TrainOptions, out: Path) -> Path:
    return Path(opts.work_dir) if opts.work_dir else out.parent / f"{out.name}.train"


def _work_dir(opts: TrainOptions, out: Path) -> Path:
    """The corpus and training state's folder, created: never an input, its parent, the output or a file."""
    from trtllm_medusa_ports.files.checkpoint import guard_output_dir

    work = _work_path(opts, out)
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
    existed = _work_path(opts, out).exists()
    work = _work_dir(opts, out)
    try:
        return _train_in(opts, out, work, device)
    except PortError as exc:
        note = _left_behind(work, existed)
        if note:  # said after the error (the CLI prints an error's __notes__ after it; PEP 678's attribute)
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]
        raise


def _left_behind(work: Path, existed: bool) -> str | None:
    """After a failed run: a work directory this run made and left empty (its lock alone) is removed; one holding a
    corpus or a training state is kept, and what it holds said (the note returned)."""
    try:
        kept = sorted(p.name for p in work.iterdir() if p.name != ".lock")
    except OSError:
        return None
    if not kept and not existed:
        shutil.rmtree(work, ignore_errors=True)
        return None
    return (f"{work} keeps {', '.join(kept)}: a rerun with the same inputs reuses the corpus (--resume continues a "
            "saved training state); remove the folder when it is not wanted") if kept else None


def _train_in(opts: TrainOptions, out: Path, work: Path, device: str) -> TrainResult:
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
        unused = ignored_max_memory(opts.streaming, opts.max_memory)
        for note in unused if group.main else ():
            LOG.warning(note)
        with progress_bars_off(opts.fit.quiet or not group.main):  # --quiet silences transformers' loading bars
            result = _train_locked(opts, out, work, device, group, memory, items)
        result.warnings = warnings + unused
        result.memory_mode, result.chat_template = memory.to_dict(), chat
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


def _check_item_ids(inputs: PromptInputs, items: list[Item], vocab: int) -> None:
    what, where = items_source(inputs)
    check_ids([it.ids for it in items], vocab, what, where=where)


def _read_items(opts: TrainOptions) -> tuple[list[Item], str]:
    """The prompts and sequences as token ids (before the base is loaded: the memory estimate counts them), each
    within the base's context with its continuation; and what was done with the chat template."""
    tokenize = lazy_tokenizer(opts.tokenizer_dir or opts.model_dir, opts.chat_template)  # loaded when text needs it
    items = read_items(opts.prompts, tokenize, default=packaged_prompts)
    dims = _base_dims(opts.model_dir)
    if dims is not None:  # before the base is loaded (and again after, from the loaded model)
        _check_item_ids(opts.prompts, items, dims[1])
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
    _check_item_ids(opts.prompts, items, vocab)
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
