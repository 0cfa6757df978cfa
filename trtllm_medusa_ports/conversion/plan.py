"""The conversion plan: what to write, computed without writing - the jobs (each checkpoint tensor's Hugging Face
sources, combine, split and target ranks), their shapes on every rank, and how each reaches the rank files (byte
moves or tensors).

Below ``convert`` (which orchestrates plan -> quantize -> write), ``quant`` (which turns jobs into FP8 jobs) and
``verify`` (which compares a checkpoint's tensors with what the plan makes of the base today). It may import the
adapters (archs/), the sharding rules, the heads and the file layer; nothing that runs a model or writes a
checkpoint.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.weights import (
    ValueTransform,
    WeightRule,
    is_layout_only,
    layer_sources,
    layout_only,
)
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.byte_moves import (
    MoveKind,
    MovePlan,
    Source,
    as_transposed,
    same_bytes,
    trace,
)
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, to_torch
from trtllm_medusa_ports.files.hf_model import HFModel
from trtllm_medusa_ports.files.lazy_tensors import LazyTensor
from trtllm_medusa_ports.heads import MedusaHeads
from trtllm_medusa_ports.heads.loader import expand_truncated
from trtllm_medusa_ports.weights.arrays import Array, contiguous, swap_last
from trtllm_medusa_ports.weights.sharding import Mapping, Split, shard

if TYPE_CHECKING:
    import torch

@layout_only
def first_input(ts: list[Array]) -> Array:
    return ts[0]


@dataclass
class Job:
    """One group of source tensors, read once, written to every rank that needs a piece."""

    label: str
    load: Callable[[], list[torch.Tensor]]
    shapes: list[tuple[int, ...]]  # of the sources
    combine: Callable
    split: Split
    targets: list[tuple[int, str]]  # (rank, checkpoint name)
    sources: tuple[str, ...] = ()  # "file [tensor]" of each source, for messages
    lazy: tuple[LazyTensor, ...] = ()  # the source tensors, when ``load`` reads exactly these
    #: dtype the sources are cast to (None: the checkpoint dtype) and stored as (None: the same)
    cast_to: str | None = None
    stored_dtype: str | None = None
    #: applied to each rank's shard before it is written (FP8: the cast with the tensor's scale)
    post: Callable | None = None
    #: FP8 weights: the (layer, scale group) whose measured scale the cast uses (quant/jobs.py)
    fp8_group: tuple[int, str] | None = None


def same_values(a: LazyTensor, b: LazyTensor) -> bool:
    """Whether two tensors hold the same values: equal bytes (same dtype) settle it without a tensor
    (NaN aside, which the conversion refuses anyway); otherwise they are compared in float32
    (another dtype, +0 against -0, a pickle)."""
    if a.offset is not None and b.offset is not None:
        sa = Source(a.file, a.offset, tuple(a.shape), a.dtype_name)
        if same_bytes(sa, Source(b.file, b.offset, tuple(b.shape), b.dtype_name)):
            return True
    import torch

    return bool(torch.equal(a.load().float(), b.load().float()))


def check_tie(model: HFModel, adapter: ArchAdapter) -> None:
    """``tie_word_embeddings: true`` beside an lm_head that differs from the embedding: which one the base
    computes with depends on the loader; converting either would be a guess."""
    if not adapter.tied_embeddings(model.config) or "lm_head.weight" not in model.tensors:
        return
    embed_rule = adapter.embedding_rules(model.config)[0]
    embed = next((model.tensors[n] for n in embed_rule.sources if n in model.tensors), None)
    lm = model.tensors["lm_head.weight"]
    if embed is not None and (tuple(embed.shape) != tuple(lm.shape) or not same_values(embed, lm)):
        raise ModelError("config.json says tie_word_embeddings: true, but the weights hold an lm_head.weight that "
                         f"differs from {embed.name}", where=str(model.path),
                         fix="set tie_word_embeddings to false if the lm_head is trained on its own, or drop "
                             "lm_head.weight from the weights")


def base_lm_head(model: HFModel, adapter: ArchAdapter) -> LazyTensor | None:
    rule = next(r for r in adapter.final_rules(model.config) if r.name == "lm_head.weight")
    for names in rule.candidates():
        if all(n in model.tensors for n in names):
            return model.tensors[names[0]]
    return None


def plan_jobs(
    adapter: ArchAdapter,
    model: HFModel,
    heads: MedusaHeads,
    cfg: dict,
    dtype: str,
    share_lm_head: bool,
) -> list[Job]:
    """Every job, with its targets; raises before anything is written when a tensor is missing."""
    hf = model.config
    tensors = model.tensors
    mapping = Mapping.from_config(cfg)
    jobs: list[Job] = []
    used: set[str] = set()

    def resolve(rule: WeightRule) -> list[LazyTensor]:
        for names in rule.candidates():
            if all(n in tensors for n in names):
                used.update(names)
                return [tensors[n] for n in names]
        missing = [n for n in rule.sources if n not in tensors]
        raise ModelError(
            f"tensor(s) {', '.join(missing)} not found (needed for {rule.name})",
            where=str(model.path),
            fix="the weights do not match config.json; check the architecture, "
            "attention_bias / tie_word_embeddings, or pass the right --model_dir",
        )

    def add(rule: WeightRule, targets: list[tuple[int, str]], label: str) -> None:
        srcs = resolve(rule)
        jobs.append(
            Job(
                label=label,
                load=lambda srcs=srcs: [s.load() for s in srcs],
                shapes=[tuple(s.shape) for s in srcs],
                combine=rule.combine,
                split=rule.split,
                targets=targets,
                sources=tuple(s.where() for s in srcs),
                lazy=tuple(srcs),
                cast_to=rule.dtype,
                stored_dtype=rule.dtype,
            )
        )

    first, last = mapping.stage_ranks(0), mapping.stage_ranks(mapping.pp_size - 1)
    for rule in adapter.embedding_rules(hf):
        add(rule, [(r, rule.name) for r in first], rule.name)
    layer_rules = adapter.layer_rules(hf)
    n_layers = adapter.num_hf_layers(hf)
    for pp_rank in range(mapping.pp_size):
        layers = mapping.layers_of_stage(n_layers, pp_rank)
        for local, i in enumerate(layers):
            for rule in layer_sources(layer_rules, i):
                name = f"transformer.layers.{local}.{rule.name}"
                add(rule, [(r, name) for r in mapping.stage_ranks(pp_rank)], f"layers.{i}.{rule.name}")
    for rule in adapter.final_rules(hf):
        add(rule, [(r, rule.name) for r in last], rule.name)

    jobs += head_jobs(heads, cfg, share_lm_head, last)

    ignored = [re.compile(p) for p in adapter.ignored_hf_tensors]
    unused = sorted(n for n in tensors if n not in used and not any(p.fullmatch(n) for p in ignored))
    if unused:
        raise ModelError(
            f"{len(unused)} tensor(s) of the base model have no place in the {adapter.family} "
            f"checkpoint, e.g. {', '.join(unused[:4])}",
            where=str(model.path),
            fix="the weights and config.json disagree (a bias the config does not declare, "
            "another architecture); converting would silently drop them",
        )
    return jobs


def head_jobs(heads: MedusaHeads, cfg: dict, share_lm_head: bool, last: list[int]) -> list[Job]:
    """The Medusa heads' jobs: their ResBlocks, and their own lm_heads unless they share the base's."""
    jobs: list[Job] = []
    # Medusa heads live on the last pipeline stage, every tensor split on dim 0
    # (tensorrt_llm/models/medusa/weight.py load_medusa_hf).
    hidden = heads.hidden_size
    for h, blocks in enumerate(heads.blocks):
        for layer, block in enumerate(blocks):
            base = f"medusa_heads.{h}.medusa_layers.{layer}.linear"
            for part, ref in (("weight", block.weight), ("bias", block.bias)):
                if ref is None:  # missing bias: zeros (the loader warned)
                    loader, shape, lazy = zeros_loader(hidden), (hidden,), ()
                else:
                    loader, shape, lazy = (lambda ref=ref: [ref.load()]), ref.shape, (ref,)
                jobs.append(
                    Job(
                        f"{base}.{part}",
                        loader,
                        [tuple(shape)],
                        first_input,
                        Split.COLUMN,
                        [(r, f"{base}.{part}") for r in last],
                        sources=(ref.where(),) if ref is not None else (),
                        lazy=lazy,
                    )
                )
        if not share_lm_head:
            assert heads.lm_heads is not None
            ref = heads.lm_heads[h]
            vocab = cfg["vocab_size"]
            if heads.token_map is not None:
                tm = heads.token_map

                def load_proj(ref=ref, tm=tm, vocab=vocab):
                    return [expand_truncated(ref.load(), tm.load(), vocab)]

                meta_shape, lazy = (vocab, ref.shape[1]), ()
            else:
                load_proj, meta_shape, lazy = (lambda ref=ref: [ref.load()]), ref.shape, (ref,)
            jobs.append(
                Job(
                    f"medusa_heads.{h}.lm_head.weight",
                    load_proj,
                    [tuple(meta_shape)],
                    first_input,
                    Split.VOCAB,
                    [(r, f"medusa_heads.{h}.lm_head.weight") for r in last],
                    sources=(ref.where(),),
                    lazy=lazy,
                )
            )
    return jobs


def zeros_loader(n: int) -> Callable[[], list[torch.Tensor]]:
    def load() -> list[torch.Tensor]:
        import torch

        return [torch.zeros(n)]

    return load


def shard_for(job: Job, inputs: list[Array], cfg: dict, rank: int) -> Array:
    """One rank's piece of ``job``: torch tensors give a tensor, numpy stand-ins an array."""
    mapping = Mapping.from_config(cfg)
    return contiguous(shard(
        job.split,
        job.combine(inputs),
        tp_size=mapping.tp_size,
        tp_rank=mapping.tp_rank(rank),
        num_kv_heads=cfg["num_key_value_heads"],
        use_parallel_embedding=cfg["use_parallel_embedding"],
        embedding_sharding_dim=cfg["embedding_sharding_dim"],
        moe_ep_size=mapping.moe_ep_size,
    ))


def _swapped(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape with its last two dimensions swapped (a transposed per-expert layout's, untransposed)."""
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def planned_shape(job: Job, cfg: dict, rank: int, traced: dict[int, Array] | None = None) -> tuple[int, ...]:
    """The shape of ``job``'s tensor on ``rank``, from its source shapes alone (nothing is read).

    The job's own combine and split run on one small integer per source row and column chunk
    (numpy: a value transform keeps shapes, so the layout alone is traced); other jobs, and dim-1
    splits of widths that do not divide, run on torch's ``meta`` device, which raises the split's
    own error. ``traced`` (one dict per job) keeps the sharded stand-ins by rank for
    :func:`move_plan`, which would otherwise run the same combine and split again.
    """
    shapes = job.shapes
    tp = Mapping.from_config(cfg).tp_size
    # a transposed per-expert layout is traced untransposed (its last two dimensions swapped back), torch-free
    transposed = getattr(job.combine, "transposed_experts", False)
    traceable = isinstance(job.combine, ValueTransform) or is_layout_only(job.combine) or transposed
    if traceable and len({len(s) for s in shapes}) == 1 and len(shapes[0]) in (1, 2, 3):
        from trtllm_medusa_ports.files.byte_moves import standin

        traced_job = job if not isinstance(job.combine, ValueTransform) else dataclasses.replace(job, combine=first_input)
        out = shard_for(traced_job, [standin(i, s, tp) for i, s in enumerate(shapes)], cfg, rank)
        if transposed:
            out = swap_last(out)
        elif traced is not None and traced_job is job:
            traced[rank] = out
        if out.ndim == 1:
            return (out.shape[0],)
        width = shapes[0][-1]
        # 3-D: stacked experts (from matrices per expert, or one fused 3-D source)
        if out.ndim in (2, 3) and all(len(s) in (2, 3) and s[-1] == width for s in shapes):
            lead = tuple(out.shape[:-1])
            if out.shape[-1] == tp:
                return _swapped(lead + (width,)) if transposed else lead + (width,)
            if width % tp == 0:
                shape = lead + (out.shape[-1] * (width // tp),)
                return _swapped(shape) if transposed else shape
    import torch

    meta = [torch.empty(s, device="meta") for s in shapes]
    return tuple(shard_for(job, meta, cfg, rank).shape)


def move_plan(job: Job, cfg: dict, dtype: str,
              planned: dict[tuple[int, str], tuple[int, ...]], traced: dict[int, Array] | None = None) -> MovePlan:
    """How ``job`` reaches the rank files: byte copies, strided or converting chunks, or tensors.

    ``traced``: the stand-ins :func:`planned_shape` already sharded for this job (same stand-ins)."""
    def tensor(why: str) -> MovePlan:
        return MovePlan(MoveKind.TENSOR, targets=list(job.targets), dtype=dtype, why=why)

    if not job.lazy:
        return tensor("made in memory (zeros, an expanded vocabulary)")
    if any(t.offset is None for t in job.lazy):
        return tensor("a source is not a byte range of a file (a pickle)")
    # per-expert matrices written transposed (archs/experts.py transposed_experts): traced untransposed, then moved
    # block by block through a bounded tile (files/byte_moves.py TRANSPOSED)
    transposed = getattr(job.combine, "transposed_experts", False)
    if not transposed and not is_layout_only(job.combine):
        return tensor("the combine changes values or is not marked as a pure layout (archs/weights.py layout_only)")
    if any(t.dtype_name not in CHECKPOINT_DTYPES for t in job.lazy):
        return tensor("a source dtype the checkpoint does not use")
    sources = [Source(t.file, t.offset, tuple(t.shape), t.dtype_name) for t in job.lazy]

    def shard_standins(standins, rank: int):
        got = traced.pop(rank, None) if traced is not None else None
        got = got if got is not None else shard_for(job, standins, cfg, rank)
        return contiguous(swap_last(got)) if transposed else got

    def shape(rank: int, name: str) -> tuple[int, ...]:
        return _swapped(planned[(rank, name)]) if transposed else planned[(rank, name)]

    traced_plan = trace(sources, job.targets, shard_standins, shape, dtype, Mapping.from_config(cfg).tp_size)
    if not transposed:
        return traced_plan
    blocks = {shape(rank, name)[-2] for rank, name in job.targets}
    if len(blocks) != 1 or len(shape(*job.targets[0])) != 3:
        return tensor("a transposed layout whose ranks hold blocks of different sizes")
    return as_transposed(traced_plan, blocks.pop())


def job_inputs(job: Job, dtype: str) -> tuple[Job, list[torch.Tensor]]:
    """The job's source tensors in the checkpoint dtype (by name), and the job to shard them with.

    A :class:`ValueTransform` is applied in float32 before the cast, as upstream's converters do.
    """
    target = to_torch(job.cast_to or dtype)
    if isinstance(job.combine, ValueTransform):
        return dataclasses.replace(job, combine=first_input), [job.combine(job.load()).to(target)]
    return job, [t.to(target) for t in job.load()]


def base_jobs(model: HFModel, adapter: ArchAdapter, cfg: dict, dtype: str) -> list[Job]:
    """The jobs of the base model alone (no Medusa heads), for a checkpoint config ``cfg``."""
    none = MedusaHeads(layout="none", source=model.path, num_heads=0, num_layers=0, hidden_size=0, vocab_size=None,
                       dtype_name=dtype, blocks=[], lm_heads=None)
    return plan_jobs(adapter, model, none, cfg, dtype, share_lm_head=True)
