"""Values and shapes of a quantized base's scales and tool-format layers, checked before heads are added to it
(``convert --base_checkpoint_dir``): plain ``convert`` computes its own scales and never needs these checks; a base
written by another tool can hold anything.

* Every scale (``*scaling_factor``, ``*per_channel_scale``) is a finite floating-point tensor; a per-tensor scale (one
  value: FP8's weight and activation scales, SmoothQuant's activation scale, every KV cache scale) is above 0 (the
  engine divides by it: ``kv_cache_rcp_scaling_factor``, FP8's input quantization); a pre-quant scale is above 0 in
  every channel (it multiplies the input); a per-row or per-group scale is never negative, and 0 only where its codes
  are 0 (a zero row: ModelOpt's and upstream's quantizers give it scale 0 and codes 0, so the dequantized weight is
  the same; a zero scale over non-zero codes erases weights the codes hold).
* INT4 AWQ (``W4A16_AWQ``) and INT8 SmoothQuant (``W8A8_SQ_PER_CHANNEL``) layers have the shapes ModelOpt's export
  writes (quant/tool_formats.py): AWQ ``weight`` int8 ``[out / 2, in]``, ``weights_scaling_factor``
  ``[out, in / group_size]`` (``group_size`` from config.json's quantization, 128 when absent, as
  tensorrt_llm/models/modeling_utils.py ``QuantConfig`` defaults), ``prequant_scaling_factor`` ``[in]``; SmoothQuant
  ``weight`` int8 ``[out, in]``, ``weights_scaling_factor`` ``[out]``, ``prequant_scaling_factor`` ``[in]``,
  ``activation_scaling_factor`` ``[1]``. A column linear (qkv, fc, gate) reads ``hidden_size`` inputs, a row linear
  (dense, proj) writes ``hidden_size`` outputs, on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtllm_medusa_ports.files.dtypes import is_floating
from trtllm_medusa_ports.quant import COLUMN_LINEARS, is_scale_tensor, linear_of
from trtllm_medusa_ports.quant.tool_formats import AWQ, SQ, unpack_int4_rows

#: QuantConfig's group_size when config.json gives none (tensorrt_llm/models/modeling_utils.py)
DEFAULT_GROUP_SIZE = 128
#: scales whose values are one per output row or per group of a row (0 allowed over zero codes)
_PER_ROW = ("per_channel_scale", "weights_scaling_factor")
REQUANTIZE_FIX = "the base checkpoint is damaged: quantize it again with the tool that wrote it"


@dataclass(frozen=True)
class BaseProblem:
    rank: int
    name: str
    message: str
    fix: str = REQUANTIZE_FIX


def _codes(rank_tensors: dict, linear: str, algo: str | None) -> torch.Tensor | None:
    """The integer codes of a tool-format layer, ``[out, in]``, or None where they cannot be read here (weight-only
    bytes stored in the GPU kernel's processed layout, FP8)."""
    w = rank_tensors.get(linear + ".weight")
    if w is None or w.dtype_name != "int8" or len(w.shape) != 2:
        return None
    if algo == AWQ:
        return unpack_int4_rows(w.load())
    if algo == SQ:
        return w.load()
    return None


def scale_value_problems(ranks: list[dict], quant: dict) -> list[BaseProblem]:
    """Every scale whose dtype or values the engine cannot use (module doc), in rank order. ``ranks``: per rank,
    name -> a lazy tensor (``dtype_name``, ``shape``, ``load()``)."""
    algo = quant.get("quant_algo")
    out = []
    for r, tensors in enumerate(ranks):
        for name, t in tensors.items():
            if not is_scale_tensor(name):
                continue
            if not is_floating(t.dtype_name):
                out.append(BaseProblem(r, name, f"rank {r}: scale {name} is {t.dtype_name}: a scale is a "
                                                "floating-point tensor (float32, or the model dtype)"))
                continue
            scales = t.load().float()  # each scale read once
            v = scales.reshape(-1)
            if not bool(v.isfinite().all()):
                out.append(BaseProblem(r, name, f"rank {r}: scale {name} holds {float(v[~v.isfinite()][0])}: a "
                                                "scale must be finite"))
                continue
            kind = name.rsplit(".", 1)[-1]
            if int(v.numel()) == 1 or kind == "prequant_scaling_factor":
                if bool((v <= 0).any()):
                    bad = float(v[v <= 0][0])
                    out.append(BaseProblem(r, name, (
                        f"rank {r}: scale {name} holds {bad:g}; it must be above 0 (the engine divides by a per-tensor "
                        "scale and multiplies the input by a pre-quant scale: 0 or a sign flip changes every value "
                        "it touches)")))
                continue
            if kind not in _PER_ROW:
                continue
            if bool((v < 0).any()):
                out.append(BaseProblem(r, name, (
                    f"rank {r}: scale {name} holds {float(v[v < 0][0]):g}: a per-row or per-group scale is never "
                    "negative (it is the group's largest magnitude over the code range)")))
                continue
            if bool((v == 0).any()):
                codes = _codes(tensors, name.rsplit(".", 1)[0], algo)
                if codes is None:
                    continue
                groups = scales.reshape(codes.shape[0], -1) if scales.numel() % codes.shape[0] == 0 else None
                if groups is None or codes.shape[1] % groups.shape[1]:
                    continue  # a shape the shape check names
                per_group = codes.reshape(codes.shape[0], groups.shape[1], -1).ne(0).any(-1)
                lost = per_group & groups.eq(0)
                if bool(lost.any()):
                    row, g = (int(i) for i in lost.nonzero()[0])
                    out.append(BaseProblem(r, name, (
                        f"rank {r}: scale {name} is 0 for row {row}" + (f", group {g}" if groups.shape[1] > 1 else "")
                        + ", whose codes are not 0: the engine would multiply them by 0 and lose that part of "
                        "the weight")))
    return out


def smoothquant_shapes(rows: int, cols: int) -> dict[str, tuple[int, ...]]:
    """The scales of an INT8 SmoothQuant (per channel) linear whose int8 weight is ``[rows, cols]`` (``[out, in]``),
    as ModelOpt's export writes them and ``Int8SmoothQuant{Column,Row}Linear`` declares them
    (tensorrt_llm/quantization/layers.py): the input's smoothing scale per input feature, a weight scale per output
    row, one activation scale."""
    return {"prequant_scaling_factor": (cols,), "weights_scaling_factor": (rows,), "activation_scaling_factor": (1,)}


def tool_layer_problems(ranks: list[dict], quant: dict, hidden_size: int) -> list[BaseProblem]:
    """Every AWQ / SmoothQuant layer whose tensors do not have the shapes the module doc gives, in rank order."""
    algo = quant.get("quant_algo")
    if algo not in (AWQ, SQ):
        return []
    group = int(quant.get("group_size") or DEFAULT_GROUP_SIZE)
    out = []
    for r, tensors in enumerate(ranks):
        for name, t in tensors.items():
            linear = linear_of(name)
            if linear is None or name != linear + ".weight" or t.dtype_name != "int8" or \
                    f"{linear}.weights_scaling_factor" not in tensors:
                continue
            shapes = {n: list(tensors[f"{linear}.{n}"].shape) for n in
                      ("weights_scaling_factor", "prequant_scaling_factor", "activation_scaling_factor")
                      if f"{linear}.{n}" in tensors}
            if len(t.shape) != 2:
                out.append(BaseProblem(r, name, f"rank {r}: {name} is {list(t.shape)}; a {algo} weight is 2-D"))
                continue
            rows, cols = (int(s) for s in t.shape)
            out_f = rows * 2 if algo == AWQ else rows
            layout = "[out / 2, in] (two int4 codes a byte along the output rows)" if algo == AWQ else "[out, in]"
            if algo == AWQ:
                if cols % group:
                    out.append(BaseProblem(r, name, (
                        f"rank {r}: {name} has {cols} inputs, not a multiple of config.json's group_size {group}")))
                    continue
                want = {"prequant_scaling_factor": [cols], "weights_scaling_factor": [out_f, cols // group]}
            else:
                want = {part: list(shape) for part, shape in smoothquant_shapes(rows, cols).items()}
            for part, shape in want.items():
                got = shapes.get(part)
                exact = algo == AWQ and part == "weights_scaling_factor"  # 2-D: a transpose has the same size
                if got is None or got == shape or (not exact and math.prod(got) == math.prod(shape)):
                    continue  # a missing scale: quantized_layer_problems names it
                out.append(BaseProblem(r, f"{linear}.{part}", (
                    f"rank {r}: {linear}.{part} is {got}, but {name} {list(t.shape)} (stored {layout}) makes it "
                    f"{shape}" + (f" (group_size {group})" if part == "weights_scaling_factor" and algo == AWQ
                                  else ""))))
            if linear.endswith(COLUMN_LINEARS) and cols != hidden_size:
                out.append(BaseProblem(r, name, (
                    f"rank {r}: {name} {list(t.shape)} reads {cols} inputs, but {linear.rsplit('.', 1)[-1]} reads the "
                    f"hidden state: config.json's hidden_size is {hidden_size} (stored {layout})")))
            elif not linear.endswith(COLUMN_LINEARS) and out_f != hidden_size:
                out.append(BaseProblem(r, name, (
                    f"rank {r}: {name} {list(t.shape)} writes {out_f} outputs, but {linear.rsplit('.', 1)[-1]} writes "
                    f"the hidden state: config.json's hidden_size is {hidden_size} (stored {layout})")))
    return out

