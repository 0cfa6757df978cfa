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

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports import __version__
from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.errors import ConversionError, HeadsError
from trtllm_medusa_ports.files.checkpoint import (
    StreamingSafetensorsFile,
    atomic_output_dir,
    read_checkpoint,
)
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, to_torch
from trtllm_medusa_ports.heads import load_heads
from trtllm_medusa_ports.heads.loader import expand_truncated
from trtllm_medusa_ports.sharding import Mapping, Split, shard

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
                f"{self.config['architecture']}, in {self.seconds:.1f} s.")


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
    dtype = cfg.get("dtype")
    if dtype not in CHECKPOINT_DTYPES:
        raise ConversionError(f"dtype {dtype!r} is not float16, bfloat16 or float32", where=where,
                              fix="pass a TensorRT-LLM checkpoint")
    if algo and int((cfg.get("moe") or {}).get("num_experts") or 0) > 1:
        raise ConversionError(
            f"{algo} experts of a mixture-of-experts base: a tool stores them as MOE declares them (weight-only: "
            "int8 in the kernel's processed layout; FP8: one scale per expert, tensorrt_llm/layers/moe.py), which "
            "verify cannot read back yet", where=where,
            fix="convert the float base with `trtllm-medusa convert --qformat int8_wo` (or int4_wo), which writes "
                "float experts TensorRT-LLM quantizes at load")
    return arch, adapter, quant, dtype


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


def _head_tensors(heads, hidden: int, vocab: int, target):
    """(name, split, tensor in the checkpoint dtype) of every head tensor."""
    import torch

    for h, blocks in enumerate(heads.blocks):
        for layer, block in enumerate(blocks):
            base = f"medusa_heads.{h}.medusa_layers.{layer}.linear"
            yield base + ".weight", Split.COLUMN, block.weight.load().to(target)
            bias = block.bias.load() if block.bias is not None else torch.zeros(hidden)
            yield base + ".bias", Split.COLUMN, bias.to(target)
        if heads.lm_heads is not None:
            w = heads.lm_heads[h].load()
            if heads.token_map is not None:
                w = expand_truncated(w, heads.token_map.load(), vocab)
            if w.shape[0] < vocab:  # a padded base vocabulary (_check_heads): zero rows, as the base's
                w = torch.cat([w, torch.zeros(vocab - w.shape[0], w.shape[1], dtype=w.dtype)])
            yield f"medusa_heads.{h}.lm_head.weight", Split.VOCAB, w.to(target)


def _output_config(cfg: dict, quant: dict, arch: str, adapter, heads, max_draft_len: int, provenance: dict) -> dict:
    """The base's config.json with the Medusa fields, and the heads kept out of the quantization."""
    out_cfg = dict(cfg)
    if quant.get("quant_algo") or quant.get("kv_cache_quant_algo"):
        quant["exclude_modules"] = list(COMBINED_EXCLUDE_MODULES)
    out_cfg.update({
        "architecture": adapter.ported_architecture(), "quantization": quant, "max_draft_len": max_draft_len,
        "num_medusa_heads": heads.num_heads, "num_medusa_layers": heads.num_layers, "medusa_hidden_act": "silu",
        "medusa_shared_lm_head": heads.lm_heads is None, "base_architecture": arch,
        "trtllm_base_architecture": adapter.trtllm_base_class,
    })
    out_cfg.setdefault("head_size", int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    out_cfg["medusa_ports"] = {"version": __version__, "family": adapter.family, **provenance}
    return out_cfg


def _write_ranks(tmp: Path, ckpt, pieces: dict[int, list], dtype: str, world_size: int) -> None:
    """Every rank file: the base's tensors byte for byte, then the heads' pieces of that rank."""
    for r in range(world_size):
        base_tensors = ckpt.ranks[r]
        entries = [(n, t.dtype_name, tuple(t.shape)) for n, t in base_tensors.items()]
        entries += [(n, dtype, tuple(p.shape)) for n, p in pieces.get(r, [])]
        f = StreamingSafetensorsFile(tmp / f"rank{r}.safetensors", entries, durable=False)
        try:
            with open(base_tensors[next(iter(base_tensors))].file, "rb") as src:
                for n, t in base_tensors.items():  # the base's bytes, as they are
                    _copy(src.fileno(), t.offset, f.fd, f.slots[n].offset, f.slots[n].nbytes)
                    f.written(n)
            for n, p in pieces.get(r, []):
                f.write(n, p)
            f.close()
        except BaseException:
            f.abort()
            raise


def add_heads(base_checkpoint_dir: Path, medusa_model_dir: Path, output_dir: Path, *, max_draft_len: int = 63,
              overwrite: bool = False) -> AddHeadsResult:
    start = time.time()
    base_dir, heads_dir = Path(base_checkpoint_dir), Path(medusa_model_dir)
    ckpt = read_checkpoint(base_dir)
    cfg = dict(ckpt.config)
    where = str(base_dir / "config.json")
    arch, adapter, quant, dtype = _check_base(cfg, where)
    heads = load_heads(heads_dir)
    warnings = _check_heads(heads, cfg, heads_dir, ckpt)
    mapping = Mapping(ckpt.tp_size, ckpt.pp_size)
    last = mapping.stage_ranks(mapping.pp_size - 1)
    if heads.lm_heads is None and not ckpt.has(last[0], "lm_head.weight"):
        raise ConversionError("the heads share the base lm_head, which the checkpoint does not hold", where=where,
                              fix="use heads with their own lm_heads")
    out_cfg = _output_config(cfg, quant, arch, adapter, heads, max_draft_len, {
        "heads_layout": heads.layout, "heads_source": str(heads_dir.resolve()), "heads_dtype": heads.dtype_name,
        "base_checkpoint": str(base_dir.resolve()), "warnings": warnings})
    pieces: dict[int, list] = {r: [] for r in last}
    for name, split, t in _head_tensors(heads, int(cfg["hidden_size"]), int(cfg["vocab_size"]), to_torch(dtype)):
        for r in last:
            part = shard(split, t, tp_size=mapping.tp_size, tp_rank=mapping.tp_rank(r), num_kv_heads=1,
                         use_parallel_embedding=False, embedding_sharding_dim=0).contiguous()
            pieces[r].append((name, part))
    inputs = {"--base_checkpoint_dir": base_dir, "--medusa_model_dir": heads_dir}
    with atomic_output_dir(Path(output_dir), overwrite=overwrite, inputs=inputs) as tmp:
        _write_ranks(tmp, ckpt, pieces, dtype, mapping.world_size)
        (tmp / "config.json").write_text(json.dumps(out_cfg, indent=4) + "\n")
    return AddHeadsResult(Path(output_dir), out_cfg, mapping.world_size, time.time() - start, warnings)


def _copy(src: int, src_off: int, dst: int, dst_off: int, n: int) -> None:
    done = 0
    while done < n:
        chunk = os.pread(src, min(n - done, 1 << 24), src_off + done)
        if not chunk:
            raise ConversionError("a base rank file ended before its tensors", fix="the base checkpoint is damaged")
        view = memoryview(chunk)
        while len(view):
            w = os.pwrite(dst, view, dst_off + done)
            view = view[w:]
            done += w
