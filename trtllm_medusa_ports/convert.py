"""Orchestration: HF base + Medusa heads -> sharded TensorRT-LLM checkpoint.

Data flows one way: lazy HF tensors -> family adapter's weight table ->
shared split rules (sharding.py) -> streaming, atomic checkpoint writer
(checkpoint.py). Every source tensor is read once, whatever the number of
ranks that need a piece of it; shapes are planned from the file headers before
anything is read, so the rank files' headers are written first and tensors are
streamed into place.

Dtypes are handled by name (files/dtypes.py) and the plan is traced on numpy stand-ins, so a
conversion whose every job moves bytes (same dtype, safetensors inputs) never imports torch;
torch is imported the moment a job needs a tensor or a cast.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_medusa_ports import __version__
from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import adapter_for, adapter_for_model_type
from trtllm_medusa_ports.arrays import Array
from trtllm_medusa_ports.compat import Finding, check_conversion, errors_of
from trtllm_medusa_ports.deploy.commands import build_line
from trtllm_medusa_ports.errors import ConversionError, HeadsError, ModelError
from trtllm_medusa_ports.files import byte_moves
from trtllm_medusa_ports.files.byte_moves import (
    ByteMover,
    MoveKind,
    MovePlan,
    NonFinite,
)
from trtllm_medusa_ports.files.checkpoint import (
    StreamingSafetensorsFile,
    atomic_output_dir,
    guard_output_dir,
    write_config,
)
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, is_floating, itemsize
from trtllm_medusa_ports.files.hf_model import HFModel
from trtllm_medusa_ports.heads import MedusaHeads, load_heads
from trtllm_medusa_ports.memory import memory_plan
from trtllm_medusa_ports.plan import (
    Job as _Job,
)
from trtllm_medusa_ports.plan import (
    base_lm_head as _base_lm_head,
)
from trtllm_medusa_ports.plan import (
    check_tie as _check_tie,
)
from trtllm_medusa_ports.plan import (
    job_inputs,
    move_plan,
    planned_shape,
)
from trtllm_medusa_ports.plan import (
    plan_jobs as plan,
)
from trtllm_medusa_ports.plan import (
    same_values as _same_values,
)
from trtllm_medusa_ports.plan import (
    shard_for as _shard_for,
)
from trtllm_medusa_ports.progress import progress as _progress
from trtllm_medusa_ports.quant import spec_from_flags
from trtllm_medusa_ports.sharding import Mapping
from trtllm_medusa_ports.tree import recorded_tree

if TYPE_CHECKING:
    pass

#: Activation of the Medusa ResBlocks. Medusa heads are trained with SiLU whatever the
#: base's activation (FasterDecoding medusa_model.py ResBlock); upstream TensorRT-LLM
#: takes the base's hidden_act instead (tensorrt_llm/models/medusa/model.py), which is
#: only right for SiLU bases, so we write it explicitly.
MEDUSA_HIDDEN_ACT = "silu"


@dataclass
class ConvertOptions:
    model_dir: Path
    medusa_model_dir: Path
    output_dir: Path
    dtype: str = "auto"
    tp_size: int = 1
    pp_size: int = 1
    num_medusa_heads: int | None = None
    num_medusa_layers: int | None = None
    max_draft_len: int = 63
    model_type: str | None = None
    workers: int = 1
    use_parallel_embedding: bool = False
    embedding_sharding_dim: int = 0
    share_lm_head: bool = False
    overwrite: bool = False
    quiet: bool = False
    allow_unsupported: bool = False
    medusa_choices: str | None = None
    #: move bytes where no value changes (files/byte_moves.py); False: every tensor through torch
    #: (the reference the fast path is tested against)
    fast_path: bool = True
    #: the rank files reach the disk (fsync) before the output directory appears. Always done when
    #: an existing --output_dir is replaced (a power loss must not take the old checkpoint with
    #: the new one); for a new directory only on request, as ``cp``, ``save_pretrained`` and
    #: TensorRT-LLM's own convert scripts leave the data to the system's writeback
    fsync: bool = False
    #: quantization, upstream's spellings (trtllm_medusa_ports/quant): examples/quantization/quantize.py's
    #: --qformat / --kv_cache_dtype and examples/medusa/convert_checkpoint.py's --use_weight_only
    #: --weight_only_precision / --int8_kv_cache
    qformat: str | None = None
    use_weight_only: bool = False
    weight_only_precision: str | None = None
    kv_cache_dtype: str | None = None
    int8_kv_cache: bool = False
    calib_dataset: Path | None = None
    calib_size: int = 512
    calib_max_seq_length: int = 512
    tokenizer_dir: Path | None = None
    #: "auto": calibration prompts through the tokenizer's chat template where it has one; "none": as they are
    chat_template: str = "auto"
    revision: str | None = None  # model_dir's on the Hub, where it is a Hub id (files/hub.py)
    device: str = "cpu"
    #: torch threads of the calibration pass (None: the idle cores, threads.default_threads, as verify and
    #: train-heads: a busy machine's cores make every small operation wait for a descheduled thread)
    threads: int | None = None
    #: expert parallelism of MoE bases (upstream's convert_checkpoint.py --moe_ep_size): it divides tp_size, the
    #: experts split over it and their intermediate dim over tp_size / moe_ep_size
    moe_ep_size: int = 1
    #: a calibration already run on this base and dtype (quant/calibrate.py ``calibrate``): a pipeline that
    #: converts one base at several tp sizes calibrates once
    calibration: object = None


@dataclass
class ConvertResult:
    output_dir: Path
    config: dict
    findings: list[Finding]
    num_ranks: int
    num_tensors: int
    bytes_written: int
    seconds: float
    shared_lm_head_bytes_saved: int
    warnings: list[str] = field(default_factory=list)
    #: job label -> how its bytes reached the rank files (a MoveKind value)
    moves: dict[str, str] = field(default_factory=dict)
    #: GPU memory of the engine per rank (trtllm_medusa_ports/memory.py)
    memory: object = None

    def to_dict(self) -> dict:
        return {"output_dir": str(self.output_dir), "num_ranks": self.num_ranks, "num_tensors": self.num_tensors,
                "bytes_written": self.bytes_written, "seconds": round(self.seconds, 3),
                "shared_lm_head_bytes_saved": self.shared_lm_head_bytes_saved, "warnings": self.warnings,
                "findings": [f.to_dict() for f in self.findings], "config": self.config,
                "memory": self.memory.to_dict() if self.memory is not None else None, "moves": self.moves,
                "build_command": self.build_command}

    @property
    def build_command(self) -> str:
        """The build command this checkpoint needs (deploy/commands.py), engine directory left to fill."""
        return build_line(self.config, self.output_dir)

    def summary(self) -> str:
        s = (
            f"Wrote {self.output_dir}: {self.num_ranks} rank file(s) "
            f"(tp={self.config['mapping']['tp_size']}, pp={self.config['mapping']['pp_size']}), "
            f"{self.num_tensors} tensors, {self.bytes_written / 1e6:.1f} MB, "
            f"architecture {self.config['architecture']}, dtype {self.config['dtype']}, "
            f"{self.config['num_medusa_heads']} Medusa heads x {self.config['num_medusa_layers']} layer(s), "
            f"in {self.seconds:.1f} s."
        )
        q = self.config.get("quantization") or {}
        if q.get("quant_algo") or q.get("kv_cache_quant_algo"):
            s += f" Quantization: {q.get('quant_algo') or 'none'}, KV cache {q.get('kv_cache_quant_algo') or 'float'}"
            s += (" (weights stay float: TensorRT-LLM quantizes them at load)."
                  if q.get("quant_algo") in ("W8A16", "W4A16") else ".")
        if self.config.get("medusa_shared_lm_head"):
            s += (
                f" The heads share the base lm_head: {self.shared_lm_head_bytes_saved / 1e6:.1f} MB "
                "saved against one copy per head."
            )
        if self.memory is not None:
            s += "\n" + self.memory.render()
        return s + f"\nBuild it with: {self.build_command}"


def resolve_adapter(model: HFModel, model_type: str | None) -> ArchAdapter:
    if model_type:
        adapter = adapter_for_model_type(model_type)
        if adapter is None:
            from trtllm_medusa_ports.archs.registry import families

            raise ConversionError(
                f"--model_type {model_type!r} is not a supported family",
                fix="use one of: " + ", ".join(sorted(families())),
            )
        return adapter
    adapter = adapter_for(model.config.architecture)
    if adapter is None:
        raise ConversionError(
            f"no adapter for architecture {model.config.architecture!r}",
            where=str(model.config.path),
            fix="see `trtllm-medusa check`; docs/porting-guide.md shows how to add a family",
        )
    return adapter


def _target_dtype(opts: ConvertOptions, model: HFModel) -> str:
    """The checkpoint dtype, by name."""
    if opts.dtype != "auto":
        if opts.dtype not in CHECKPOINT_DTYPES:
            raise ConversionError(
                f"--dtype {opts.dtype!r} is not supported", fix="use auto, float32, float16 or bfloat16"
            )
        return opts.dtype
    auto = model.config.dtype_name
    if auto is None:
        floats = [t.dtype_name for t in model.tensors.values() if is_floating(t.dtype_name)]
        auto = floats[0] if floats else "float32"
    if auto not in CHECKPOINT_DTYPES:
        raise ConversionError(
            f"--dtype auto gives {auto}, which TensorRT-LLM checkpoints do not use",
            where=str(model.path),
            fix="pass --dtype float16, bfloat16 or float32",
        )
    return auto


def build_config(
    adapter: ArchAdapter,
    model: HFModel,
    heads: MedusaHeads,
    opts: ConvertOptions,
    dtype: str,
    share_lm_head: bool,
) -> dict:
    mapping = Mapping(opts.tp_size, opts.pp_size, opts.moe_ep_size)
    fam = adapter.engine_config(model.config)
    # Upstream MedusaForCausalLM gives the heads the base's hidden_act: right only for SiLU bases.
    silu_base = fam.get("hidden_act") == MEDUSA_HIDDEN_ACT
    # Upstream MedusaForCausalLm also builds its heads on every pipeline stage, where the checkpoint
    # has none (tensorrt_llm/models/medusa/model.py): pp > 1 goes through our class.
    upstream_ok = adapter.upstream_medusa_base and not share_lm_head and silu_base and opts.pp_size == 1
    cfg: dict = {
        "architecture": "MedusaForCausalLM" if upstream_ok else adapter.ported_architecture(),
        "dtype": dtype,
        "logits_dtype": "float32",
    }
    cfg.update(fam)
    cfg.update(
        {
            "quantization": spec_from_flags(opts).config(),
            "mapping": mapping.to_dict(moe="moe" in fam),
            "use_parallel_embedding": opts.use_parallel_embedding,
            "embedding_sharding_dim": opts.embedding_sharding_dim,
            "max_draft_len": opts.max_draft_len,
            "num_medusa_heads": heads.num_heads,
            "num_medusa_layers": heads.num_layers,
            "medusa_hidden_act": MEDUSA_HIDDEN_ACT,
            "medusa_shared_lm_head": share_lm_head,
            "base_architecture": model.config.architecture,
            "trtllm_base_architecture": adapter.trtllm_base_class,
            "medusa_ports": {
                "version": __version__,
                "family": adapter.family,
                "heads_layout": heads.layout,
                "heads_source": str(Path(opts.medusa_model_dir).resolve()) if opts.medusa_model_dir else None,
                "heads_dtype": heads.dtype_name,
                **(recorded_tree(opts.medusa_choices, heads.num_heads) if opts.medusa_choices else {}),
            },
        }
    )
    return cfg


def _choose_sharing(heads: MedusaHeads, opts: ConvertOptions, warnings: list[str], model: HFModel,
                    adapter: ArchAdapter) -> bool:
    if heads.shared_lm_head is not None:
        # vLLM original_lm_head: one lm_head.weight for all heads, meant to be the base's.
        base = _base_lm_head(model, adapter)
        same = base is not None and base.shape == heads.shared_lm_head.shape and _same_values(
            base, heads.shared_lm_head)
        if not same:
            warnings.append(
                "the heads' shared lm_head.weight differs from the base model's lm_head: every head "
                "gets a copy of the heads' own (no memory saved, output as the heads were trained)"
            )
            heads.lm_heads = [heads.shared_lm_head] * heads.num_heads
            return False
        return True
    if heads.shares_base_lm_head:
        return True
    if opts.share_lm_head:
        warnings.append(
            "--share_lm_head: the heads' own lm_heads are dropped and every head uses the base "
            "lm_head (greedy output is unchanged; acceptance may drop if the heads' lm_heads were trained)"
        )
        return True
    return False


def convert(opts: ConvertOptions) -> ConvertResult:
    """Convert, or raise a :class:`PortError` with nothing written at ``output_dir``.

    The steps: check the options and the inputs (:func:`_check_options`, :func:`_check_model`), apply what the
    family's TensorRT-LLM class imposes (:func:`_imposed_options`), run the compatibility check
    (:func:`_check_compatibility`), plan the jobs, quantize them (:func:`_quantized_jobs`), plan every rank
    file's layout and byte moves (:func:`_layout`), then write (:func:`_write`).
    """
    start = time.time()
    inputs = {"--model_dir": Path(opts.model_dir), "--medusa_model_dir": Path(opts.medusa_model_dir)}
    guard_output_dir(Path(opts.output_dir), inputs)  # before any work: never write into an input
    model = HFModel(opts.model_dir)
    adapter = resolve_adapter(model, opts.model_type)
    heads = load_heads(opts.medusa_model_dir)
    warnings = list(heads.warnings)
    _check_options(opts, heads)
    _check_model(model, adapter)
    _check_expert_parallelism(opts, model, adapter)
    opts = _imposed_options(opts, adapter, warnings)
    dtype = _target_dtype(opts, model)
    spec = spec_from_flags(opts)
    if spec.any and dtype == "float32":
        raise ConversionError(f"{spec.quant_algo or spec.kv_cache_quant_algo} from a float32 checkpoint: TensorRT-LLM "
                              "serves quantized Medusa engines in float16 or bfloat16 (and refuses float32 with "
                              "speculative decoding)", fix="pass --dtype float16 or bfloat16")
    findings = _check_compatibility(opts, model, adapter, heads, dtype, spec, warnings)
    # a float16 checkpoint of a base known to overflow float16 carries the finding, so that `build` refuses it
    warnings += [f"[float16-range] {f.message}" for f in findings
                 if f.rule == "float16-range" and f.severity != "info" and dtype == "float16"]
    share = _choose_sharing(heads, opts, warnings, model, adapter)
    cfg = build_config(adapter, model, heads, opts, dtype, share)
    jobs = plan(adapter, model, heads, cfg, dtype, share)
    mapping = Mapping(opts.tp_size, opts.pp_size, opts.moe_ep_size)
    jobs, fp8_scales = _quantized_jobs(opts, jobs, cfg, spec, dtype, adapter, model)
    entries, moves = _layout(opts, jobs, cfg, dtype)
    if spec.quant_algo == "FP8":  # pass 1 of 2, before anything is written: every FP8 weight's amax
        from trtllm_medusa_ports.quant.jobs import measure_weights

        measure_weights(jobs, moves, fp8_scales, dtype, threads=max(opts.workers, 2), quiet=opts.quiet,
                        on_non_finite=lambda job: _non_finite_error(job, dtype))

    padded_vocab = mapping.padded_vocab(cfg["vocab_size"])
    saved = heads.num_heads * padded_vocab * heads.hidden_size * itemsize(dtype) if share else 0

    try:
        total_bytes = _write(opts, jobs, moves, entries, cfg, dtype, warnings, inputs)
    except OSError as exc:  # the disk, not the inputs: full, read-only, no permission, busy
        raise ConversionError(f"could not write the checkpoint: {exc.strerror or exc}",
                              where=str(opts.output_dir),
                              fix="free space or choose a writable --output_dir; nothing was left behind") from None
    return ConvertResult(
        output_dir=Path(opts.output_dir),
        config=cfg,
        findings=findings,
        num_ranks=mapping.world_size,
        num_tensors=sum(len(e) for e in entries.values()),
        bytes_written=total_bytes,
        seconds=time.time() - start,
        shared_lm_head_bytes_saved=saved,
        warnings=warnings,
        moves={job.label: m.kind.value for job, m in zip(jobs, moves, strict=True)},
        memory=memory_plan(cfg, entries),
    )


def _check_options(opts: ConvertOptions, heads: MedusaHeads) -> None:
    """The flags against each other and against the heads."""
    if opts.num_medusa_heads is not None and opts.num_medusa_heads != heads.num_heads:
        raise ConversionError(
            f"--num_medusa_heads {opts.num_medusa_heads} but the heads checkpoint holds {heads.num_heads}",
            where=str(opts.medusa_model_dir),
            fix="omit --num_medusa_heads (it is read from the heads) or pass the right directory",
        )
    if opts.num_medusa_layers is not None and opts.num_medusa_layers != heads.num_layers:
        raise ConversionError(
            f"--num_medusa_layers {opts.num_medusa_layers} but the heads have {heads.num_layers} layer(s)",
            where=str(opts.medusa_model_dir),
            fix="omit --num_medusa_layers (it is read from the heads)",
        )
    if opts.workers < 1:
        raise ConversionError(f"--workers {opts.workers} must be at least 1", fix="use --workers 1 or more", usage=True)
    if opts.max_draft_len <= 0:
        raise ConversionError(
            f"--max_medusa_token_len must be positive, got {opts.max_draft_len}",
            fix="use the number of nodes of your tree (63 for the presets)",
            usage=True,
        )


def _check_expert_parallelism(opts: ConvertOptions, model: HFModel, adapter: ArchAdapter) -> None:
    """``--moe_ep_size``: a divisor of tp_size and of the expert count, on an MoE base only."""
    ep = opts.moe_ep_size
    if ep == 1:
        return
    experts = adapter.num_experts(model.config)
    if experts <= 1:
        raise ConversionError(f"--moe_ep_size {ep} on a base without experts", fix="drop --moe_ep_size")
    if ep < 1 or opts.tp_size % ep or experts % ep:
        raise ConversionError(f"--moe_ep_size {ep} must divide --tp_size {opts.tp_size} and the {experts} experts "
                              "(tensorrt_llm/mapping.py: moe_tp_size x moe_ep_size = tp_size)",
                              fix=f"use a --moe_ep_size that divides both, e.g. {math.gcd(opts.tp_size, experts)}")


def _check_model(model: HFModel, adapter: ArchAdapter) -> None:
    """config.json's sizes, the weights against them, and the tie of lm_head and embedding."""
    adapter.require_sizes(model.config)
    problems = model.weight_problems(adapter.ignored_hf_tensors, adapter.expert_field_keys(model.config))
    if problems:
        raise ModelError(
            f"{len(problems)} base tensor(s) contradict config.json, e.g. " + "; ".join(problems[:3]),
            where=str(model.path),
            fix="the weights and config.json belong to different models, or the weights are damaged",
        )
    _check_tie(model, adapter)


def _imposed_options(opts: ConvertOptions, adapter: ArchAdapter, warnings: list[str]) -> ConvertOptions:
    """``opts`` with what the family's TensorRT-LLM config class imposes (``use_parallel_embedding``)."""
    forced = adapter.forced_parallel_embedding(opts.tp_size)
    if forced is not None and forced != opts.use_parallel_embedding:
        warnings.append(
            f"use_parallel_embedding={forced}: {adapter.trtllm_base_class}'s config imposes it for "
            f"tp_size {opts.tp_size} (the flag was {opts.use_parallel_embedding})"
        )
        opts = dataclasses.replace(opts, use_parallel_embedding=forced, embedding_sharding_dim=0)
    return opts


def _check_compatibility(opts: ConvertOptions, model: HFModel, adapter: ArchAdapter, heads: MedusaHeads,
                         dtype: str, spec, warnings: list[str]) -> list[Finding]:
    """The compatibility findings; errors refuse the conversion unless every one is overridable and
    ``--allow_unsupported`` is given (then a loud warning is recorded)."""
    findings = check_conversion(
        model.config,
        adapter=adapter,
        heads=heads,
        tp_size=opts.tp_size,
        pp_size=opts.pp_size,
        max_draft_len=opts.max_draft_len,
        medusa_choices=opts.medusa_choices,
        use_parallel_embedding=opts.use_parallel_embedding,
        embedding_sharding_dim=opts.embedding_sharding_dim,
        dtype=dtype,
        quantization=spec,
    )
    errors = errors_of(findings)
    if errors and opts.allow_unsupported and all(f.overridable for f in errors):
        warnings.append(
            "WRITING A CHECKPOINT TENSORRT-LLM CANNOT SERVE CORRECTLY (--allow_unsupported): "
            + "; ".join(f.rule for f in errors)
        )
    elif errors:
        raise ConversionError(
            "the compatibility check failed; nothing was written:\n"
            + "\n".join(f"  [{f.rule}] {f.message}\n    fix: {f.fix}" for f in errors),
            fix="address the errors above (`trtllm-medusa check` shows every finding)",
            rules=[f.rule for f in errors],
        )

    return findings


def _quantized_jobs(opts: ConvertOptions, jobs: list[_Job], cfg: dict, spec, dtype: str, adapter: ArchAdapter,
                    model: HFModel) -> tuple[list[_Job], object]:
    """The jobs with FP8 casts and scale tensors (calibrating first where no calibration is given), and the
    weight scales they read; weight-only alone changes no job (TensorRT-LLM quantizes at load)."""
    fp8_scales = None
    if spec.needs_calibration:  # weight-only alone changes no job: TensorRT-LLM quantizes at load
        from trtllm_medusa_ports.quant.jobs import quantize_jobs

        calibration = opts.calibration
        if calibration is None:  # before anything is written: bad calibration input leaves nothing behind
            from trtllm_medusa_ports.quant.calibrate import calibrate, read_calibration_samples

            samples, source = read_calibration_samples(
                opts.calib_dataset, opts.model_dir, size=opts.calib_size, max_seq_length=opts.calib_max_seq_length,
                tokenizer_dir=opts.tokenizer_dir, chat_template=opts.chat_template)
            from trtllm_medusa_ports.threads import torch_threads

            with torch_threads(opts.threads):
                calibration = calibrate(opts.model_dir, adapter, dtype, samples, source=source, device=opts.device,
                                        quiet=opts.quiet)
        cfg["medusa_ports"]["calibration"] = {**calibration.record(), "max_seq_length": opts.calib_max_seq_length}
        jobs, fp8_scales = quantize_jobs(jobs, cfg, spec, dtype, calibration, adapter.num_hf_layers(model.config))
    return jobs, fp8_scales


def _layout(opts: ConvertOptions, jobs: list[_Job], cfg: dict, dtype: str
            ) -> tuple[dict[int, list[tuple[str, str, tuple[int, ...]]]], list[MovePlan]]:
    """Every rank file's planned tensors ``(name, dtype, shape)`` from the source shapes (no data read), and
    each job's byte moves."""
    mapping = Mapping(opts.tp_size, opts.pp_size, opts.moe_ep_size)
    entries: dict[int, list[tuple[str, str, tuple[int, ...]]]] = {r: [] for r in range(mapping.world_size)}
    planned: dict[tuple[int, str], tuple[int, ...]] = {}
    moves: list[MovePlan] = []
    for job in jobs:
        traced: dict[int, Array] = {}  # this job's sharded stand-ins by rank, shared by its shapes and its byte plan
        for rank, name in job.targets:
            planned[rank, name] = planned_shape(job, cfg, rank, traced)
            entries[rank].append((name, job.stored_dtype or dtype, planned[rank, name]))
        if not opts.fast_path:
            moves.append(MovePlan(MoveKind.TENSOR, why="fast path off"))
        elif job.fp8_group is not None:  # FP8 weight: the same pieces, cast chunk by chunk with its scale
            moves.append(move_plan(job, cfg, "float8_e4m3fn", planned, traced).as_fp8(dtype))
        elif job.post is None and job.cast_to is not None and job.cast_to == job.stored_dtype and job.lazy:
            moves.append(move_plan(job, cfg, job.cast_to, planned, traced))  # a dtype of its own (an MoE router)
        elif job.post is not None or job.cast_to is not None:
            moves.append(MovePlan(MoveKind.TENSOR, why="a generated float32 scale"))
        else:
            moves.append(move_plan(job, cfg, dtype, planned, traced))
    return entries, moves


def plan_layout(opts: ConvertOptions) -> tuple[dict, dict[int, list[tuple[str, str, tuple[int, ...]]]]]:
    """The config and every rank file's planned tensors ``(name, dtype, shape)`` of a conversion, from the
    headers alone (nothing is read or written; no calibration): what `check` bases its memory plan on.
    ``opts.medusa_model_dir`` may be None (the base alone)."""
    model = HFModel(opts.model_dir)
    adapter = resolve_adapter(model, opts.model_type)
    if opts.medusa_model_dir is not None:
        heads = load_heads(opts.medusa_model_dir)
    else:
        heads = MedusaHeads(layout="none", source=model.path, num_heads=0, num_layers=0, hidden_size=0,
                            vocab_size=None, dtype_name="float32", blocks=[], lm_heads=None)
    opts = _imposed_options(opts, adapter, [])
    dtype = _target_dtype(opts, model)
    share = True if opts.medusa_model_dir is None else _choose_sharing(heads, opts, [], model, adapter)
    cfg = build_config(adapter, model, heads, opts, dtype, share)
    entries, _ = _layout(dataclasses.replace(opts, fast_path=False), plan(adapter, model, heads, cfg, dtype, share),
                         cfg, dtype)
    return cfg, entries


def _lanes(fast: list[tuple[_Job, MovePlan]], ranks: list[int], threads: int
           ) -> list[list[tuple[_Job, MovePlan, int | None]]]:
    """Split the byte-moving jobs into ``threads`` task lists that run side by side.

    With several rank files, rank r's pieces of every job go to lane ``r % threads`` (one writer per
    file). With one rank file, whole jobs are dealt out to balance the bytes.
    """
    if not fast:
        return []
    if len(ranks) > 1:
        n = min(threads, len(ranks))
        lanes: list[list] = [[] for _ in range(n)]
        for job, move in fast:
            for rank in sorted({r for r, _ in job.targets}):
                lanes[ranks.index(rank) % n].append((job, move, rank))
        return lanes
    lanes = [[] for _ in range(threads)]
    load = [0] * threads
    for job, move in sorted(fast, key=lambda jm: -sum(s.nbytes for s in jm[1].sources)):
        i = load.index(min(load))
        lanes[i].append((job, move, None))
        load[i] += sum(s.nbytes for s in move.sources)
    return [lane for lane in lanes if lane]


def _non_finite_error(job: _Job, dtype: str) -> Exception:
    """The error for a job whose values hold NaN/Inf in the checkpoint dtype."""
    err = HeadsError if job.label.startswith("medusa_heads") else ModelError
    return err(
        f"tensor for {job.label} holds NaN/Inf after casting to {dtype}"
        + (f" (from {', '.join(job.sources)})" if job.sources else ""),
        fix="the source holds NaN/Inf (damaged weights: save them again)" if dtype == "float32" else
            f"the source holds NaN/Inf, or its values overflow {dtype}: try --dtype bfloat16 or float32",
    )


class _RankWriter:
    """The jobs' tensors streamed into open rank files: byte moves in lanes (one thread per rank file), whole
    tensors beside them, at most ``workers`` of those in memory; the first failure stops every lane."""

    def __init__(self, files: dict, mover: ByteMover, cfg: dict, dtype: str, workers: int, bar):
        self.files, self.mover, self.cfg, self.dtype, self.bar = files, mover, cfg, dtype, bar
        self.workers = workers
        self.whole_tensors = threading.Semaphore(workers)
        self.failed = threading.Event()

    def run_tensor(self, job: _Job) -> None:
        from trtllm_medusa_ports.files.finite import all_finite

        with self.whole_tensors:  # at most --workers whole tensors in memory
            job, inputs = job_inputs(job, self.dtype)
            for t in inputs:
                if not all_finite(t):
                    raise _non_finite_error(job, self.dtype)
            for rank, name in job.targets:
                shard = _shard_for(job, inputs, self.cfg, rank)
                self.files[rank].write(name, job.post(shard) if job.post is not None else shard)
        self.bar.update(len(job.targets))

    def run_lane(self, tasks: list[tuple[_Job, MovePlan, int | None]]) -> None:
        for job, move, rank in tasks:
            if self.failed.is_set():
                return
            try:
                self.mover.run(move, rank)
            except NonFinite:
                self.failed.set()
                raise _non_finite_error(job, self.dtype) from None
            except BaseException:
                self.failed.set()  # the other lanes stop at their next tensor
                raise
            done = [(r, name) for r, name in job.targets if rank is None or r == rank]
            for r, name in done:
                self.files[r].written(name)
            self.bar.update(len(done))

    def run(self, jobs: list[_Job], moves: list[MovePlan], ranks: list[int]) -> None:
        # Byte moves spend their time in the kernel and in numpy (the GIL released), so even with
        # --workers 1 two threads run them. Each rank file is written by one thread (a "lane"):
        # copies into one file serialise on its lock, copies into two files run side by side.
        fast = [(j, m) for j, m in zip(jobs, moves, strict=True) if m.kind is not MoveKind.TENSOR]
        tensor_jobs = [j for j, m in zip(jobs, moves, strict=True) if m.kind is MoveKind.TENSOR]
        threads = max(self.workers, 2 if fast else 1)
        lanes = _lanes(fast, ranks, threads)
        if threads == 1:
            for lane in lanes:
                self.run_lane(lane)
            for j in tensor_jobs:
                self.run_tensor(j)
            return
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(self.run_lane, lane) for lane in lanes]
            futures += [pool.submit(self.run_tensor, j) for j in tensor_jobs]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                self.failed.set()
                for f in futures:
                    f.cancel()
                raise


def _write_config(tmp: Path, cfg: dict, warnings: list[str], durable: bool) -> None:
    """config.json (with the conversion's warnings); with ``durable``, it and the directory's entries are on
    disk before the directory is swapped in."""
    cfg["medusa_ports"]["warnings"] = warnings
    write_config(tmp, cfg, durable)


def _write(opts: ConvertOptions, jobs: list[_Job], moves: list[MovePlan], entries: dict, cfg: dict,
           dtype: str, warnings: list[str], inputs: dict[str, Path]) -> int:
    """Stream every job into the rank files of a new output directory; the bytes written."""
    replacing = Path(opts.output_dir).exists()
    with atomic_output_dir(Path(opts.output_dir), overwrite=opts.overwrite, inputs=inputs) as tmp:
        durable = opts.fsync or replacing
        files = {r: StreamingSafetensorsFile(tmp / f"rank{r}.safetensors", entries[r], durable=durable)
                 for r in entries}
        torch_casts = byte_moves.torch_casts_pay(moves, lanes=min(len(entries), max(opts.workers, 2)))
        mover = ByteMover(lambda rank, name: files[rank].slots[name].offset, lambda rank: files[rank].fd,
                          torch_casts=torch_casts)
        try:
            bar = _progress(sum(len(j.targets) for j in jobs), opts.quiet)
            if torch_casts or any(m.kind is MoveKind.TENSOR or m.needs_torch for m in moves):
                import torch  # noqa: F401  (tensors or casts ahead: imported once, before the threads start)
            _RankWriter(files, mover, cfg, dtype, opts.workers, bar).run(jobs, moves, sorted(entries))
            bar.close()
            for f in files.values():
                f.close()
        except BaseException:
            for f in files.values():
                f.abort()
            raise
        finally:
            mover.close()
        _write_config(tmp, cfg, warnings, durable)
    return sum(f.total for f in files.values())
