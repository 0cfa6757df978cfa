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
import time
from pathlib import Path

from trtllm_medusa_ports import __version__
from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import adapter_for, adapter_for_model_type
from trtllm_medusa_ports.compat import Finding, check_conversion, errors_of
from trtllm_medusa_ports.conversion.options import ConvertOptions, ConvertResult
from trtllm_medusa_ports.conversion.plan import (
    Job as _Job,
)
from trtllm_medusa_ports.conversion.plan import (
    base_lm_head as _base_lm_head,
)
from trtllm_medusa_ports.conversion.plan import (
    check_tie as _check_tie,
)
from trtllm_medusa_ports.conversion.plan import (
    move_plan,
    planned_shape,
)
from trtllm_medusa_ports.conversion.plan import (
    plan_jobs as plan,
)
from trtllm_medusa_ports.conversion.plan import (
    same_values as _same_values,
)
from trtllm_medusa_ports.conversion.rank_writer import non_finite_error, write_checkpoint
from trtllm_medusa_ports.errors import ConversionError, ModelError
from trtllm_medusa_ports.files.byte_moves import (
    MoveKind,
    MovePlan,
)
from trtllm_medusa_ports.files.checkpoint import (
    guard_output_dir,
)
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, is_floating, itemsize
from trtllm_medusa_ports.files.hf_model import HFModel
from trtllm_medusa_ports.gpu.memory import memory_plan
from trtllm_medusa_ports.heads import MedusaHeads, load_heads
from trtllm_medusa_ports.quant import spec_from_flags
from trtllm_medusa_ports.trees.tree import recorded_tree
from trtllm_medusa_ports.weights.arrays import Array
from trtllm_medusa_ports.weights.sharding import Mapping

#: Activation of the Medusa ResBlocks. Medusa heads are trained with SiLU whatever the
#: base's activation (FasterDecoding medusa_model.py ResBlock); upstream TensorRT-LLM
#: takes the base's hidden_act instead (tensorrt_llm/models/medusa/model.py), which is
#: only right for SiLU bases, so we write it explicitly.
MEDUSA_HIDDEN_ACT = "silu"


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
            "base_architecture": adapter.base_architecture(model.config.architecture),
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
    file's layout and byte moves (:func:`_layout`), then write (rank_writer.py ``write_checkpoint``).
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
    spec = _quantization(opts, dtype)
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
                        on_non_finite=lambda job: non_finite_error(job, dtype))

    padded_vocab = mapping.padded_vocab(cfg["vocab_size"])
    saved = heads.num_heads * padded_vocab * heads.hidden_size * itemsize(dtype) if share else 0

    total_bytes = _written(opts, jobs, moves, entries, cfg, dtype, warnings, inputs)
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


def _quantization(opts: ConvertOptions, dtype: str):
    """The quantization the flags ask for (quant.spec_from_flags), refused from a float32 checkpoint."""
    spec = spec_from_flags(opts)
    if spec.any and dtype == "float32":
        raise ConversionError(f"{spec.quant_algo or spec.kv_cache_quant_algo} from a float32 checkpoint: TensorRT-LLM "
                              "serves quantized Medusa engines in float16 or bfloat16 (and refuses float32 with "
                              "speculative decoding)", fix="pass --dtype float16 or bfloat16")
    return spec


def _written(opts: ConvertOptions, jobs, moves, entries: dict, cfg: dict, dtype: str, warnings: list[str],
             inputs: dict[str, Path]) -> int:
    """The checkpoint written (rank_writer.py), its bytes; a disk error named (nothing is left behind)."""
    try:
        return write_checkpoint(Path(opts.output_dir), jobs, moves, entries, cfg, dtype, warnings, inputs,
                                overwrite=opts.overwrite, fsync=opts.fsync, workers=opts.workers, quiet=opts.quiet)
    except OSError as exc:  # the disk, not the inputs: full, read-only, no permission, busy
        raise ConversionError(f"could not write the checkpoint: {exc.strerror or exc}",
                              where=str(opts.output_dir),
                              fix="free space or choose a writable --output_dir; nothing was left behind") from None


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
            from trtllm_medusa_ports.machine.threads import torch_threads

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
