"""Medusa heads added to a base already quantized by NVIDIA's tools (``convert --base_checkpoint_dir``).

A TensorRT-LLM checkpoint written by ``examples/quantization/quantize.py`` / ModelOpt
(``export_tensorrt_llm_checkpoint``: FP8, INT4-AWQ, W4A8-AWQ, INT8 SmoothQuant) or by a family's
``convert_checkpoint.py`` (weight-only) keeps its rank files and its quantization; this adds the heads as
``quantize_by_modelopt.py`` ``combine_medusa_weight`` does - each head tensor split on dim 0 per rank of
the last pipeline stage, in the checkpoint dtype, ``*medusa_heads*`` excluded from quantization - and
names the architecture our engine classes need (``MedusaPorts<class>``: upstream's MedusaForCausalLM
knows LLaMA and QWen bases only). The base's bytes are copied as they are, never rewritten.
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports import __version__
from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.deploy.commands import build_line
from trtllm_medusa_ports.errors import CheckpointError, ConversionError, HeadsError
from trtllm_medusa_ports.files.checkpoint import (
    Checkpoint,
    StreamingSafetensorsFile,
    atomic_output_dir,
    guard_output_dir,
    read_checkpoint,
    write_config,
)
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, is_floating, to_torch
from trtllm_medusa_ports.files.finite import all_finite
from trtllm_medusa_ports.files.jsonfile import is_int
from trtllm_medusa_ports.heads import load_heads
from trtllm_medusa_ports.heads.loader import expand_truncated
from trtllm_medusa_ports.quant import (
    QUANTIZED_LAYER_FIX,
    is_excluded,
    kv_scale_problems,
    quantized_layer_problems,
)
from trtllm_medusa_ports.quant.base_checks import scale_value_problems, tool_layer_problems
from trtllm_medusa_ports.quant.engine_load import load_problems
from trtllm_medusa_ports.quant.stored import KV_SCALE_FIX, kv_scale_message
from trtllm_medusa_ports.trees.tree import recorded_tree
from trtllm_medusa_ports.weights.sharding import Mapping, Split, shard

#: quant_algo values of NVIDIA's tools a Medusa port keeps (tensorrt_llm/quantization/mode.py QuantAlgo)
KEPT_ALGOS = (None, "FP8", "W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W4A16_GPTQ", "W8A16_GPTQ",
              "W8A8_SQ_PER_CHANNEL", "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
              "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN")
KEPT_KV = (None, "FP8", "INT8")
#: what tensorrt_llm/quantization/quantize_by_modelopt.py ``combine_medusa_weight`` writes as ``exclude_modules``
#: when it adds heads to a quantized base: this list replaces the base's (ModelOpt's explicit module names), with
#: ``*medusa_heads*`` unless ``--quant_medusa_head``. It names the embedding, so a weight-only build never makes
#: it a WeightOnlyQuantEmbedding the checkpoint has no scales for (tensorrt_llm/quantization/quantize.py)
COMBINED_EXCLUDE_MODULES = ("lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                            "*medusa_heads*")


def output_exclude_modules(quant: dict) -> list[str] | None:
    """The ``exclude_modules`` the output carries: :data:`COMBINED_EXCLUDE_MODULES`, then every entry of the base's
    own list no pattern of it covers. Upstream's ``combine_medusa_weight`` replaces the base's list; a linear the
    tool kept in float (its name in the base's list) would then become a quantized layer the engine cannot load
    (FP8Linear takes float8 weights and their scales), so the base's exclusions are kept. A base quantized by
    neither weights nor KV cache keeps its list as it is. Under W8A16 / W4A16 each kept module name is written with
    its weight's name too (``X`` and ``X.weight``), so the build's load leaves the weight float that the layer
    keeps float (quant/engine_load.py: the two matchers of exclude_modules)."""
    if not (quant.get("quant_algo") or quant.get("kv_cache_quant_algo")):
        return quant.get("exclude_modules")
    own = [e for e in quant.get("exclude_modules") or [] if isinstance(e, str)]
    kept = [e for e in dict.fromkeys(own) if not is_excluded(e, list(COMBINED_EXCLUDE_MODULES))]
    if quant.get("quant_algo") in ("W8A16", "W4A16"):
        kept = list(dict.fromkeys(x for e in kept for x in (e, e + ".weight")
                                  if x == e or not is_excluded(x, kept)))
    return list(COMBINED_EXCLUDE_MODULES) + kept


#: config.json sizes that must be positive integers
#: tensors always in the checkpoint dtype (quantization leaves them float): the embedding, lm_head and the norms
_MODEL_DTYPE_TENSORS = re.compile(r"transformer\.vocab_embedding\.weight|lm_head\.weight|.*(norm|ln_f)\.weight")


class FlagConflict(ConversionError):
    """A flag add-heads cannot honour: the base keeps its own dtype, quantization and mapping (the CLI exits 2)."""

    def __init__(self, what: str, **kw):
        super().__init__(what, usage=True, **kw)


@dataclass
class AddHeadsResult:
    output_dir: Path
    config: dict
    num_ranks: int
    seconds: float
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        q = self.config.get("quantization") or {}
        return (f"Wrote {self.output_dir}: {self.num_ranks} rank file(s), the base's tensors copied as they are "
                f"({q.get('quant_algo') or 'float'}, KV cache {q.get('kv_cache_quant_algo') or 'float'}) plus "
                f"{self.config['num_medusa_heads']} Medusa heads in {self.config['dtype']}, architecture "
                f"{self.config['architecture']}, in {self.seconds:.1f} s.\n"
                f"Build it with: {build_line(self.config, self.output_dir)}")


def _check_base(cfg: dict, where: str):
    """The quantized base's family adapter, its quantization block and dtype; what this route cannot keep refused."""
    if cfg.get("num_medusa_heads") or str(cfg.get("architecture", "")).startswith("Medusa"):
        raise ConversionError("the base checkpoint has Medusa heads already", where=where,
                              fix="pass the quantized base without heads")
    arch = str(cfg.get("base_architecture") or cfg["architecture"])
    adapter = adapter_for(arch)
    if adapter is None:
        raise ConversionError(f"architecture {arch!r} has no adapter", where=where,
                              fix="the base must be one of the supported families (`trtllm-medusa check`)")
    quant = dict(cfg.get("quantization") or {})
    algo, kv = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    if algo not in KEPT_ALGOS or kv not in KEPT_KV:
        raise ConversionError(f"quantization {algo} / KV {kv} is not one this route keeps", where=where,
                              fix="supported: " + ", ".join(a for a in KEPT_ALGOS if a) + "; KV FP8 or INT8")
    if algo == "MIXED_PRECISION":
        raise ConversionError("MIXED_PRECISION checkpoints (quant_cfg.json) are not handled", where=where,
                              fix="quantize with one format")
    dtype = cfg["dtype"]  # checked by read_checkpoint (files/checkpoint.py check_config)
    if algo and int((cfg.get("moe") or {}).get("num_experts") or 0) > 1:
        raise ConversionError(
            f"{algo} experts of a mixture-of-experts base: a tool stores them as MOE declares them (weight-only: "
            "int8 in the kernel's processed layout; FP8: one scale per expert, tensorrt_llm/layers/moe.py), which "
            "verify cannot read back yet", where=where,
            fix="convert the float base with `trtllm-medusa convert --qformat int8_wo` (or int4_wo), which writes "
                "float experts TensorRT-LLM quantizes at load")
    return arch, adapter, quant, dtype


def check_base_tensors(ckpt: Checkpoint, exclude: list[str] | None) -> None:
    """The rank files against config.json before anything is written: none empty, the float tensors that are
    always in the checkpoint dtype (embedding, lm_head, norms) in config.json's ``dtype`` (the heads are written in
    it), lm_head's shape against ``hidden_size`` and ``vocab_size``, every scale finite and of a value the engine can
    use (quant/base_checks.py), every quantized linear holding the weight and scales its ``quant_algo`` declares
    (``exclude``: the exclude_modules the output carries; a float weight where the layer takes a quantized one is
    refused, as the engine would not load it), AWQ / SmoothQuant layers of consistent shapes, a KV cache scale in
    every attention layer under a quantized KV cache, and what the build's load refuses (quant/engine_load.py: a float
    weight beside its per_channel_scale, a scale of another shape)."""
    cfg = ckpt.config
    dtype, hidden, vocab = cfg["dtype"], cfg["hidden_size"], cfg["vocab_size"]
    quant = cfg.get("quantization") or {}
    files = [ckpt.path / f"rank{r}.safetensors" for r in range(len(ckpt.ranks))]
    for r, tensors in enumerate(ckpt.ranks):
        for name, t in tensors.items():
            if _MODEL_DTYPE_TENSORS.fullmatch(name) and is_floating(t.dtype_name) and t.dtype_name != dtype:
                raise CheckpointError(
                    f"config.json says dtype {dtype}, but {name} is {t.dtype_name}: the heads would be written in "
                    "another dtype than the base's", where=str(files[r]),
                    fix=f"config.json's dtype must be the rank files' float dtype ({t.dtype_name} here)")
    mapping = Mapping(ckpt.tp_size, ckpt.pp_size)
    last = mapping.stage_ranks(mapping.pp_size - 1)
    parts = [ckpt.ranks[r]["lm_head.weight"].shape for r in last if "lm_head.weight" in ckpt.ranks[r]]
    if parts:
        rows = sum(p[0] for p in parts)
        if (any(len(p) != 2 or p[1] != hidden for p in parts)
                or (rows != mapping.padded_vocab(vocab) and any(p[0] != vocab for p in parts))):
            raise CheckpointError(
                f"lm_head.weight is {' + '.join(str(list(p)) for p in parts)} over the last stage's ranks, which "
                f"does not fit config.json's vocab_size {vocab} and hidden_size {hidden}", where=str(ckpt.path),
                fix="config.json must be the one the quantizing tool wrote beside these rank files")
    for p in scale_value_problems(ckpt.ranks, quant):
        raise CheckpointError(p.message, where=str(files[p.rank]), fix=p.fix)
    for p in quantized_layer_problems(ckpt.ranks, quant.get("quant_algo"), exclude):
        raise CheckpointError(p.message, where=str(files[p.rank]), fix=QUANTIZED_LAYER_FIX)
    for p in tool_layer_problems(ckpt.ranks, quant, hidden):
        raise CheckpointError(p.message, where=str(files[p.rank]), fix=p.fix)
    for r, att in kv_scale_problems(ckpt.ranks, quant.get("kv_cache_quant_algo")):
        raise CheckpointError(kv_scale_message(att, quant["kv_cache_quant_algo"]), where=str(files[r]),
                              fix=KV_SCALE_FIX)
    # what TensorRT-LLM's build does to these rank files before it loads them, under the list the output carries
    for p in load_problems(ckpt.ranks, {**cfg, "quantization": {**quant, "exclude_modules": exclude}}):
        raise CheckpointError(p.message, where=str(files[p.rank]), fix=p.fix)


def padded_rows_are_zero(ckpt, cfg: dict, real_vocab: int) -> bool:
    """Whether the base's vocabulary is padded past ``real_vocab`` with zero rows: ModelOpt pads the embedding and
    lm_head of an AWQ export to a multiple of 64 and writes the padded ``vocab_size``
    (modelopt/torch/export/postprocess.py ``pad_embedding_lm_head``). The lm_head rows of every last-stage rank
    and the embedding rows of every first-stage rank past ``real_vocab`` must be 0 (and no lm_head bias)."""
    import torch

    mapping = Mapping(ckpt.tp_size, ckpt.pp_size)
    for name, stage in (("lm_head.weight", mapping.pp_size - 1), ("transformer.vocab_embedding.weight", 0)):
        ranks = mapping.stage_ranks(stage)
        parts = [ckpt.tensor(r, name) for r in ranks if ckpt.has(r, name)]
        if not parts:
            continue
        rows = parts[0] if len(parts) == 1 or parts[0].shape[0] == int(cfg["vocab_size"]) else torch.cat(parts)
        if rows.shape[0] < real_vocab or bool(rows[real_vocab:].float().abs().sum() != 0):
            return False
    return not any(ckpt.has(r, "lm_head.bias") for r in mapping.stage_ranks(mapping.pp_size - 1))


def _check_heads(heads, cfg: dict, heads_dir: Path, ckpt) -> list[str]:
    """The heads fit the base's hidden size and vocabulary (a vocabulary the base pads with zero rows: the heads'
    lm_heads are padded the same way, see :func:`_head_tensors`); the warnings the layout brings."""
    hidden, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    padded = (heads.vocab_size is not None and heads.token_map is None and heads.vocab_size < vocab
              and padded_rows_are_zero(ckpt, cfg, heads.vocab_size))
    if heads.hidden_size != hidden or (heads.vocab_size is not None and heads.vocab_size != vocab
                                       and heads.token_map is None and not padded):
        why = ""
        if heads.vocab_size is not None and heads.vocab_size < vocab:
            why = (f"; the base's vocabulary rows {heads.vocab_size}..{vocab - 1} are not all zero, so they are not "
                   "padding (ModelOpt pads an AWQ export's embedding and lm_head with zero rows)")
        raise HeadsError(f"the heads (hidden {heads.hidden_size}, vocabulary {heads.vocab_size}) do not fit the base "
                         f"(hidden_size {hidden}, vocab_size {vocab}){why}", where=str(heads_dir),
                         fix="pass the heads trained for this base")
    warnings = list(heads.warnings)
    if padded:
        warnings.append(f"the base's vocabulary is padded from {heads.vocab_size} to {vocab} with zero rows (as "
                        "ModelOpt pads an AWQ export): the heads' lm_heads are padded with zero rows to match, as "
                        "MedusaHead's lm_head of pad_vocab_size(vocab_size) rows needs (tensorrt_llm/models/medusa/)")
    if heads.shared_lm_head is not None:
        warnings.append("the heads carry one shared lm_head (vLLM original_lm_head): the base checkpoint's lm_head "
                        "is used for every head, as that layout means")
    return warnings


def _finite_in(t, name: str, source, dtype: str, heads_dir: Path):
    """``t`` (a head tensor as stored) cast to the checkpoint dtype, refused where it holds NaN/Inf or a value the
    dtype cannot hold (plain convert's check of every head tensor, convert.py: the cast must stay finite)."""
    import torch

    src = f" (from {source.name})" if source is not None else ""
    if not all_finite(t):
        raise HeadsError(f"head tensor {name}{src} holds NaN/Inf", where=str(heads_dir),
                         fix="the heads are damaged: save them again (or retrain them)")
    out = t.to(to_torch(dtype))
    if not all_finite(out):
        top = float(t.float().abs().max())
        raise HeadsError(
            f"head tensor {name}{src} holds {top:g}, beyond {dtype}'s largest finite value "
            f"{torch.finfo(out.dtype).max:g}: it would be inf in the checkpoint", where=str(heads_dir),
            fix=f"the heads are written in the base's {dtype} (a base quantized by NVIDIA's tools keeps its dtype): "
                f"use heads whose values fit {dtype}, e.g. heads trained for a {dtype} base")
    return out


def _head_tensors(heads, hidden: int, vocab: int, dtype: str, heads_dir: Path):
    """(name, split, tensor in the checkpoint dtype) of every head tensor, each checked finite in that dtype."""
    import torch

    for h, blocks in enumerate(heads.blocks):
        for layer, block in enumerate(blocks):
            base = f"medusa_heads.{h}.medusa_layers.{layer}.linear"
            yield base + ".weight", Split.COLUMN, _finite_in(block.weight.load(), base + ".weight", block.weight,
                                                              dtype, heads_dir)
            bias = block.bias.load() if block.bias is not None else torch.zeros(hidden)
            yield base + ".bias", Split.COLUMN, _finite_in(bias, base + ".bias", block.bias, dtype, heads_dir)
        if heads.lm_heads is not None:
            name = f"medusa_heads.{h}.lm_head.weight"
            w = _finite_in(heads.lm_heads[h].load(), name, heads.lm_heads[h], dtype, heads_dir)
            if heads.token_map is not None:
                w = expand_truncated(w, heads.token_map.load(), vocab)
            if w.shape[0] < vocab:  # a padded base vocabulary (_check_heads): zero rows, as the base's
                w = torch.cat([w, torch.zeros(vocab - w.shape[0], w.shape[1], dtype=w.dtype)])
            yield name, Split.VOCAB, w


def _check_options(heads, heads_dir: Path, *, dtype: str, base_dtype: str, num_medusa_heads: int | None,
                   num_medusa_layers: int | None, max_draft_len: int, medusa_choices: str | None) -> list[str]:
    """The flags against the base and the heads, as plain convert checks them (convert.py ``_check_options``, the
    tree through compat.check_tree): the warnings of the tree. A ``dtype`` other than the base's is refused
    (:class:`FlagConflict`): the base keeps its own."""
    from trtllm_medusa_ports.compat import check_tree

    if dtype not in ("auto", *CHECKPOINT_DTYPES):
        raise ConversionError(f"--dtype {dtype!r} is not supported", fix="use auto, float32, float16 or bfloat16",
                              usage=True)
    if dtype not in ("auto", base_dtype):
        raise FlagConflict(
            f"--dtype {dtype} with --base_checkpoint_dir: the base is {base_dtype} and keeps its own dtype (its "
            "tensors are copied as they are, and the heads are written in the base's dtype)",
            fix=f"drop --dtype (or pass --dtype auto or {base_dtype}); for another dtype, quantize the base again "
                "with NVIDIA's tools in that dtype")
    if num_medusa_heads is not None and num_medusa_heads != heads.num_heads:
        raise ConversionError(f"--num_medusa_heads {num_medusa_heads} but the heads checkpoint holds {heads.num_heads}",
                              where=str(heads_dir),
                              fix="omit --num_medusa_heads (it is read from the heads) or pass the right directory")
    if num_medusa_layers is not None and num_medusa_layers != heads.num_layers:
        raise ConversionError(f"--num_medusa_layers {num_medusa_layers} but the heads have {heads.num_layers} "
                              "layer(s)", where=str(heads_dir), fix="omit --num_medusa_layers (it is read from the heads)")
    if not is_int(max_draft_len, 1):
        raise ConversionError(f"--max_medusa_token_len must be positive, got {max_draft_len}",
                              fix="use the number of nodes of your tree (63 for the presets)", usage=True)
    if not medusa_choices:
        return []
    findings = check_tree(medusa_choices, heads.num_heads, max_draft_len)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise ConversionError("the compatibility check failed; nothing was written:\n"
                              + "\n".join(f"  [{f.rule}] {f.message}\n    fix: {f.fix}" for f in errors),
                              fix="address the errors above (`trtllm-medusa tree --choices ... --num_heads "
                                  f"{heads.num_heads} --max_draft_len {max_draft_len}` shows them)", rules=[f.rule for f in errors])
    return [f"[{f.rule}] {f.message}" for f in findings if f.severity == "warning"]


def _output_config(cfg: dict, quant: dict, arch: str, adapter, heads, max_draft_len: int, provenance: dict) -> dict:
    """The base's config.json with the Medusa fields, and the heads kept out of the quantization."""
    out_cfg = dict(cfg)
    if quant.get("quant_algo") or quant.get("kv_cache_quant_algo"):
        quant["exclude_modules"] = output_exclude_modules(quant)
    out_cfg.update({
        "architecture": adapter.ported_architecture(), "quantization": quant, "max_draft_len": max_draft_len,
        "num_medusa_heads": heads.num_heads, "num_medusa_layers": heads.num_layers, "medusa_hidden_act": "silu",
        "medusa_shared_lm_head": heads.lm_heads is None, "base_architecture": adapter.base_architecture(arch),
        "trtllm_base_architecture": adapter.trtllm_base_class,
    })
    out_cfg.setdefault("head_size", int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    out_cfg["medusa_ports"] = {"version": __version__, "family": adapter.family, **provenance}
    return out_cfg


def _write_ranks(tmp: Path, ckpt, pieces: dict[int, list], dtype: str, world_size: int, durable: bool) -> None:
    """Every rank file: the base's tensors byte for byte, then the heads' pieces of that rank."""
    for r in range(world_size):
        base_tensors = ckpt.ranks[r]
        entries = [(n, t.dtype_name, tuple(t.shape)) for n, t in base_tensors.items()]
        entries += [(n, dtype, tuple(p.shape)) for n, p in pieces.get(r, [])]
        f = StreamingSafetensorsFile(tmp / f"rank{r}.safetensors", entries, durable=durable)
        try:
            source = base_tensors[next(iter(base_tensors))].file  # never empty: check_base_tensors
            try:
                src = open(source, "rb")  # noqa: SIM115  (closed by the with below)
            except OSError as exc:  # the input, not the output's disk
                raise ConversionError(f"cannot read the base rank file ({exc.strerror})", where=str(source),
                                      fix="the base checkpoint is unreadable: check the file and its disk") from None
            with src:
                for n, t in base_tensors.items():  # the base's bytes, as they are
                    _copy(src.fileno(), t.offset, f.fd, f.slots[n].offset, f.slots[n].nbytes, source)
                    f.written(n)
            for n, p in pieces.get(r, []):
                f.write(n, p)
            f.close()
        except BaseException:
            f.abort()
            raise


def add_heads(base_checkpoint_dir: Path, medusa_model_dir: Path, output_dir: Path, *, max_draft_len: int = 63,
              overwrite: bool = False, dtype: str | None = None, num_medusa_heads: int | None = None,
              num_medusa_layers: int | None = None, medusa_choices: str | None = None,
              fsync: bool = False) -> AddHeadsResult:
    """Heads added to a base NVIDIA's tools quantized, or a :class:`PortError` with nothing written: the base
    validated first (config.json, rank files, scales, quantized layers), then the flags and the heads as plain
    convert checks them, every head tensor made in memory, then the rank files written atomically.
    ``dtype`` None or ``"auto"``: the base's (another is refused, :class:`FlagConflict`)."""
    start = time.time()
    base_dir, heads_dir = Path(base_checkpoint_dir), Path(medusa_model_dir)
    inputs = {"--base_checkpoint_dir": base_dir, "--medusa_model_dir": heads_dir}
    guard_output_dir(Path(output_dir), inputs)  # before any work: never write into an input
    ckpt = read_checkpoint(base_dir)
    cfg = dict(ckpt.config)
    where = str(base_dir / "config.json")
    arch, adapter, quant, base_dtype = _check_base(cfg, where)
    exclude = output_exclude_modules(quant)
    check_base_tensors(ckpt, exclude)
    heads = load_heads(heads_dir)
    warnings = _check_options(heads, heads_dir, dtype=dtype or "auto", base_dtype=base_dtype,
                               num_medusa_heads=num_medusa_heads, num_medusa_layers=num_medusa_layers,
                               max_draft_len=max_draft_len, medusa_choices=medusa_choices)
    warnings += _check_heads(heads, cfg, heads_dir, ckpt)
    if not quant.get("quant_algo") and not quant.get("kv_cache_quant_algo"):
        warnings.append("the base checkpoint is not quantized (quantization.quant_algo and kv_cache_quant_algo are "
                        "null): --base_checkpoint_dir is meant for a base NVIDIA's tools quantized; the heads are "
                        "added all the same. For a float base, convert --model_dir with its Hugging Face directory "
                        "writes the checkpoint from the source")
    mapping = Mapping(ckpt.tp_size, ckpt.pp_size)
    last = mapping.stage_ranks(mapping.pp_size - 1)
    if heads.lm_heads is None and not ckpt.has(last[0], "lm_head.weight"):
        raise ConversionError("the heads share the base lm_head, which the checkpoint does not hold", where=where,
                              fix="use heads with their own lm_heads")
    pieces: dict[int, list] = {r: [] for r in last}
    for name, split, t in _head_tensors(heads, int(cfg["hidden_size"]), int(cfg["vocab_size"]), base_dtype,
                                        heads_dir):
        for r in last:
            part = shard(split, t, tp_size=mapping.tp_size, tp_rank=mapping.tp_rank(r), num_kv_heads=1,
                         use_parallel_embedding=False, embedding_sharding_dim=0).contiguous()
            pieces[r].append((name, part))
    out_cfg = _output_config(cfg, quant, arch, adapter, heads, max_draft_len, {
        "heads_layout": heads.layout, "heads_source": str(heads_dir.resolve()), "heads_dtype": heads.dtype_name,
        "base_checkpoint": str(base_dir.resolve()), "warnings": warnings,
        **(recorded_tree(medusa_choices, heads.num_heads) if medusa_choices else {})})
    durable = fsync or Path(output_dir).exists()
    try:
        with atomic_output_dir(Path(output_dir), overwrite=overwrite, inputs=inputs) as tmp:
            _write_ranks(tmp, ckpt, pieces, base_dtype, mapping.world_size, durable)
            write_config(tmp, out_cfg, durable)
    except OSError as exc:  # the disk, not the inputs: full, read-only, no permission, quota
        code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else "no errno"
        raise ConversionError(f"could not write the checkpoint: {exc.strerror or exc} (errno {exc.errno}, {code})",
                              where=str(output_dir),
                              fix="free space or choose a writable --output_dir; nothing was left behind") from None
    return AddHeadsResult(Path(output_dir), out_cfg, mapping.world_size, time.time() - start, warnings)


def _copy(src: int, src_off: int, dst: int, dst_off: int, n: int, source: Path) -> None:
    done = 0
    while done < n:
        try:
            chunk = os.pread(src, min(n - done, 1 << 24), src_off + done)
        except OSError as exc:  # the input, not the output's disk
            raise ConversionError(f"cannot read the base rank file ({exc.strerror})", where=str(source),
                                  fix="the base checkpoint is unreadable: check the file and its disk") from None
        if not chunk:
            raise ConversionError("a base rank file ended before its tensors", where=str(source),
                                  fix="the base checkpoint is damaged")
        view = memoryview(chunk)
        while len(view):
            w = os.pwrite(dst, view, dst_off + done)
            view = view[w:]
            done += w
