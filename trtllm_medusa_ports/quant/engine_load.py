"""What TensorRT-LLM's build does to a checkpoint's rank files before it builds, and whether the engine can load them.

``trtllm-build`` never takes the tensors as they are: every rank goes through ``PretrainedModel.from_checkpoint``,
which runs ``preprocess_weights(weights, config)`` and then ``model.load(weights)``
(tensorrt_llm/models/modeling_utils.py, 1.2). This module models both on the rank files' headers (names, shapes,
dtypes; no tensor is read), so that ``verify``, ``convert --base_checkpoint_dir`` and ``build`` refuse what the
engine would not load, naming the tensor:

* ``preprocess_weights``: ModelOpt's ``k_cache_scaling_factor`` needs its ``v_cache_scaling_factor`` (the two become
  one ``kv_cache_scaling_factor``) and every KV scale gets its reciprocal; FP8 views int8 weights as float8_e4m3fn;
  W8A16 / W4A16 re-quantize **every float weight** whose name holds ``qkv.weight``, ``dense.weight``, ``fc.weight``,
  ``proj.weight`` or ``gate.weight`` and no ``exclude_modules`` pattern matches (``fnmatchcase`` on the tensor name;
  none given: ``*shared_expert_gate.weight``), reading it as ``[out, in]`` and writing its ``per_channel_scale``
  (tensorrt_llm/models/convert_utils.py ``weight_only_quantize_dict``). So a float weight stored ``[in, out]`` beside a
  ``per_channel_scale`` - what a family's ``convert_checkpoint.py --disable_weight_only_quant_plugin`` writes - is
  re-quantized transposed and its scale replaced: the load fails on the shape, or, for a square weight, loads the
  transpose.
* the two matchers of ``exclude_modules`` under W8A16 / W4A16: ``quantize_layers`` matches a pattern against the
  *module* name (``transformer.layers.0.mlp.fc``) to keep a layer float, ``weight_only_quantize_dict`` against the
  *tensor* name (``transformer.layers.0.mlp.fc.weight``) to leave a weight float. A pattern only one of them
  matches (an exact module name, or one ending in ``.weight``) gives a float layer an int8 weight, or a quantized
  layer a float one: each such layer is refused, naming both.
* ``load``: each parameter takes a value of exactly its declared shape (tensorrt_llm/parameter.py ``Parameter.value``
  asserts ``v.shape == self._shape``). The quantized layers declare (tensorrt_llm/quantization/layers.py):
  ``WeightOnlyQuantColumnLinear`` / ``RowLinear`` pad in and out features up to a multiple of ``64 x tp_size``, then
  ``weight`` int8 ``[in, out x bits / 8]`` and ``per_channel_scale`` ``[out]`` of the rank's part; ``FP8Linear`` /
  ``FP8RowLinear`` ``weight`` float8 ``[out, in]``, ``weights_scaling_factor`` and ``activation_scaling_factor``
  float32 ``(1,)`` (a 0-D value loads too: ``Parameter.value`` reshapes a scalar to a declared shape of ones); a
  quantized KV cache gives every ``Attention`` ``kv_cache_scaling_factor`` and
  ``kv_cache_rcp_scaling_factor`` float32 ``(1,)`` (tensorrt_llm/quantization/quantize.py ``kv_cache_quantize``).

* INT4 AWQ (``W4A16_AWQ``): ``preprocess_perlayer_weights`` transposes each int8 weight (ModelOpt's ``[out / 2,
  in]``) and views the packed bytes as the model dtype, ``[in, out / 4]``; it transposes the groupwise scales to
  ``[in / group, out]`` and reshapes a pre-quant scale to ``[1, in]``. ``WeightOnlyGroupwiseQuant{Column,Row}Linear``
  pads in and out features up to a multiple of ``max(64, group_size) x tp_size`` and declares those shapes of the
  rank's part, a ``prequant_scaling_factor`` only with config.json's ``pre_quant_scale`` (without it a stored one
  is left unused: the engine would skip the AWQ smoothing) and a ``zero`` with ``has_zero_point``.
* SmoothQuant per channel: ``Int8SmoothQuant{Column,Row}Linear`` declares ``weight`` int8 ``[out, in]``,
  ``weights_scaling_factor`` float32 ``[out]``, ``prequant_scaling_factor`` ``[in]`` and
  ``activation_scaling_factor`` float32 ``(1,)`` of the rank's part; nothing is preprocessed.

Not modelled: the values ``preprocess_weights_for_mixed_gemm`` writes (they depend on the build's GPU), and experts
(3-D), whose quantized layouts have no padding rule to check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

from trtllm_medusa_ports.files.checkpoint import QUANTIZE_LAYERS_DEFAULT_EXCLUDE
from trtllm_medusa_ports.quant import (
    BITS,
    COLUMN_LINEARS,
    is_excluded,
    linear_of,
    weight_only_quantized,
)
from trtllm_medusa_ports.quant.base_checks import DEFAULT_GROUP_SIZE, smoothquant_shapes
from trtllm_medusa_ports.quant.tool_formats import AWQ, SQ

#: weight_only_quantize_dict's own exclusions when the checkpoint gives none (tensorrt_llm/models/convert_utils.py)
LOAD_QUANTIZER_DEFAULT_EXCLUDE = ("*shared_expert_gate.weight",)
#: the rank-local features the quantized layers pad to a multiple of (tensorrt_llm/quantization/layers.py; the
#: groupwise ones to max(this, group_size))
WEIGHT_ONLY_PAD = 64
AWQ_PAD_FIX = ("config.json's quantization (group_size) must be the export's own; if it is, quantize the base again "
               "with ModelOpt at a tp_size whose split widths are multiples of max(64, group_size) x tp_size (or with "
               "a smaller --awq_block_size)")
TOOL_LAYER_FIX = "pass the checkpoint as the quantizing tool wrote it (config.json and rank files from one export)"
SCALE_SHAPE_FIX = ("write each per-tensor scale as float32 [1], as ModelOpt's export does, or quantize the base again "
                   "with the tool that wrote it")
WEIGHT_ONLY_PAD_FIX = ("convert with a --tp_size that makes every width a multiple of 64 x tp_size (trtllm-medusa check "
                       "says which), or in a format without padding (float, FP8)")
STORED_FLOAT_WEIGHT_ONLY_FIX = (
    "convert the float base with trtllm-medusa convert --qformat int8_wo (or int4_wo): it writes float [out, in] "
    "weights without scales, which TensorRT-LLM quantizes at load as this rule describes; a checkpoint a family's "
    "convert_checkpoint.py wrote with --disable_weight_only_quant_plugin does not build with TensorRT-LLM 1.2")


#: the 2-D weights of layers quantize_layers rebuilds under weight-only (tensorrt_llm/quantization/quantize.py
#: ``weight_only_quantize``'s quant_map: ColumnLinear, RowLinear, Embedding): decoder and shared-expert linears,
#: lm_head and the embeddings; MoE experts (3-D) and the router (an MOE's own) follow the MOE layer
_WEIGHT_ONLY_LAYER = re.compile(
    r"(transformer\.layers\.\d+\.(attention\.(qkv|dense)|mlp\.(fc|gate|proj|shared_expert\.(fc|gate|proj)"
    r"|shared_expert_gate))|lm_head|transformer\.(vocab_embedding|position_embedding))\.weight")
EXCLUDE_BOTH_FIX = ("exclude_modules must keep a layer and its weight together: name the module and its weight (e.g. "
                    "\"transformer.layers.0.mlp.fc\" and \"transformer.layers.0.mlp.fc.weight\"), or use a pattern "
                    "both match (\"*layers.0.mlp.fc*\")")


def _matchers_disagree(rank: int, name: str, dtype_name: str, exclude: list[str] | None, algo: str
                       ) -> LoadProblem | None:
    """One 2-D weight of a layer weight-only rebuilds, against the two matchers (module doc)."""
    module = name.removesuffix(".weight")
    layer_float = is_excluded(module, list(QUANTIZE_LAYERS_DEFAULT_EXCLUDE) if exclude is None else exclude)
    said = "no exclude_modules (the defaults)" if exclude is None else f"exclude_modules {exclude}"
    if dtype_name == "int8":
        if not layer_float:
            return None
        what = (f"{name} is stored int8 (quantized), but {said} keeps {module} a float layer "
                "(tensorrt_llm/quantization/quantize.py quantize_layers matches the module name)")
    else:
        weight_quantized = load_quantized(name, exclude)
        if layer_float != weight_quantized:
            return None
        what = (f"{said} keeps {module} a float layer (quantize_layers matches the module name) while "
                f"weight_only_quantize_dict quantizes {name} at load (it matches the tensor name): a float layer "
                "would get an int8 weight" if layer_float else
                f"{said} leaves {name} float at load (weight_only_quantize_dict matches the tensor name) while "
                f"quantize_layers makes {module} a weight-only layer (it matches the module name): the layer "
                "takes int8 weights")
    return LoadProblem(rank, name, f"rank {rank}: under {algo}, {what}; the engine would not load it "
                       "(tensorrt_llm/models/convert_utils.py weight_only_quantize_dict, "
                       "tensorrt_llm/quantization/quantize.py)", EXCLUDE_BOTH_FIX)


@dataclass(frozen=True)
class Header:
    """A tensor as the build's load sees it after ``preprocess_weights``: its shape and dtype name."""

    shape: tuple[int, ...]
    dtype_name: str


@dataclass(frozen=True)
class LoadProblem:
    rank: int
    name: str
    message: str
    fix: str


def load_quantized(name: str, exclude: list[str] | None) -> bool:
    """Whether ``weight_only_quantize_dict`` re-quantizes this tensor at load (when it is not int8 already)."""
    return weight_only_quantized(name, list(LOAD_QUANTIZER_DEFAULT_EXCLUDE) if exclude is None else exclude)


def preprocessed(rank: int, tensors: dict, quantization: dict, dtype: str = "float16"
                 ) -> tuple[dict[str, Header], list[LoadProblem]]:
    """``preprocess_weights`` on one rank's headers (``tensors``: name -> anything with ``shape`` and ``dtype_name``):
    the tensors the load then sees, and what it refuses on the way (see the module doc)."""
    out = {n: Header(tuple(int(s) for s in t.shape), t.dtype_name) for n, t in tensors.items()}
    problems = []
    for name in [n for n in out if n.endswith(".k_cache_scaling_factor")]:
        v = name.replace("k_cache_scaling_factor", "v_cache_scaling_factor")
        if v not in out:
            problems.append(LoadProblem(rank, name, f"rank {rank}: {name} has no {v}: the build merges the two into "
                                        "kv_cache_scaling_factor and asserts both are there "
                                        "(tensorrt_llm/models/modeling_utils.py preprocess_weights)",
                                        "pass the checkpoint as the quantizing tool wrote it, both scales beside "
                                        "each other"))
            continue
        out[name.replace("k_cache_scaling_factor", "kv_cache_scaling_factor")] = out.pop(name)
        out.pop(v)
    for name in [n for n in out if n.endswith(".kv_cache_scaling_factor")]:
        out.setdefault(name.replace("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor"), out[name])
    algo = quantization.get("quant_algo")
    if algo == "FP8":
        for name, h in list(out.items()):
            if name.endswith("weight") and h.dtype_name == "int8":
                out[name] = Header(h.shape, "float8_e4m3fn")
        if "lm_head.weight" in out and out["lm_head.weight"].dtype_name != "float8_e4m3fn":
            out.pop("lm_head.weights_scaling_factor", None)
            out.pop("lm_head.activation_scaling_factor", None)
    elif algo == AWQ:
        for name, h in list(out.items()):
            if name.endswith("weight") and h.dtype_name == "int8" and len(h.shape) == 2:
                rows, cols = h.shape  # [out / 2, in] -> transposed, its bytes viewed as 16-bit elements
                if rows % 2:
                    problems.append(LoadProblem(rank, name, (
                        f"rank {rank}: {name} is int8 {list(h.shape)}: the build views its transposed bytes as "
                        f"{dtype} (tensorrt_llm/models/modeling_utils.py "
                        "preprocess_perlayer_weights), which needs an even number of rows"), TOOL_LAYER_FIX))
                    continue
                out[name] = Header((cols, rows // 2), dtype)
            elif name.endswith("weights_scaling_factor") and len(h.shape) == 2:
                out[name] = Header(h.shape[::-1], dtype)
            elif name.endswith("prequant_scaling_factor") and h.shape:
                out[name] = Header((1, h.shape[-1]) if len(h.shape) == 2 else (1, prod(h.shape)), h.dtype_name)
    elif algo in BITS:
        exclude = quantization.get("exclude_modules")
        for name, h in list(out.items()):
            if h.dtype_name == "int8" or not load_quantized(name, exclude) or len(h.shape) < 2:
                continue
            scale = name.removesuffix(".weight") + ".per_channel_scale"
            if scale in tensors:
                problems.append(LoadProblem(rank, name, (
                    f"rank {rank}: {name} is a {h.dtype_name} weight {list(h.shape)} stored beside its "
                    f"per_channel_scale under {algo}: TensorRT-LLM's build re-quantizes every float weight at load "
                    "(tensorrt_llm/models/modeling_utils.py preprocess_weights -> models/convert_utils.py "
                    "weight_only_quantize_dict), reading it as [out, in] and replacing the stored scale; a "
                    "--disable_weight_only_quant_plugin checkpoint stores it [in, out], so the engine would fail "
                    "to load it, or, for a square weight, load its transpose"), STORED_FLOAT_WEIGHT_ONLY_FIX))
            *batch, rows, cols = h.shape
            out[name] = Header((*batch, cols, rows * BITS[algo] // 8), "int8")
            out[scale] = Header((*batch, rows), h.dtype_name)
    return out, problems


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def declared_weight_only(linear: str, out_local: int, in_local: int, tp: int, bits: int) -> dict[str, tuple]:
    """The shapes ``WeightOnlyQuant{Column,Row}Linear`` declares for a rank's part of ``linear`` whose float weight is
    ``[out_local, in_local]``: features padded globally to a multiple of 64 x tp, then split."""
    multiple = WEIGHT_ONLY_PAD * tp
    if linear.endswith(COLUMN_LINEARS):
        out_l, in_l = _padded(out_local * tp, multiple) // tp, _padded(in_local, multiple)
    else:
        out_l, in_l = _padded(out_local, multiple), _padded(in_local * tp, multiple) // tp
    return {"weight": (in_l, out_l * bits // 8), "per_channel_scale": (out_l,)}


def declared_groupwise(linear: str, out_local: int, in_local: int, tp: int, group: int, pre_quant_scale: bool,
                       dtype: str) -> dict[str, Header]:
    """What ``WeightOnlyGroupwiseQuant{Column,Row}Linear`` declares for a rank's part of ``linear`` whose float weight
    would be ``[out_local, in_local]``: features padded globally to a multiple of max(64, group) x tp, then split."""
    multiple = max(WEIGHT_ONLY_PAD, group) * tp
    if linear.endswith(COLUMN_LINEARS):
        out_l, in_l = _padded(out_local * tp, multiple) // tp, _padded(in_local, multiple)
    else:
        out_l, in_l = _padded(out_local, multiple), _padded(in_local * tp, multiple) // tp
    want = {"weight": Header((in_l, out_l // 4), dtype),
            "weights_scaling_factor": Header((in_l // group, out_l), dtype)}
    if pre_quant_scale:
        want["prequant_scaling_factor"] = Header((1, in_l), dtype)
    return want


def _tool_layer(rank: int, linear: str, stored, loaded: dict[str, Header], quantization: dict, tp: int,
                dtype: str) -> list[LoadProblem]:
    """An AWQ or SmoothQuant linear stored int8 against what its quantized layer declares (module doc)."""
    algo = quantization.get("quant_algo")
    rows, cols = (int(x) for x in stored.shape)
    kind = "Column" if linear.endswith(COLUMN_LINEARS) else "Row"
    if algo == AWQ:
        group = quantization.get("group_size") or DEFAULT_GROUP_SIZE
        pre = bool(quantization.get("pre_quant_scale"))
        want = declared_groupwise(linear, rows * 2, cols, tp, group, pre, dtype)
        who = (f"WeightOnlyGroupwiseQuant{kind}Linear (features padded to a multiple of max(64, group_size {group})"
               f" x tp_size = {max(WEIGHT_ONLY_PAD, group) * tp}; tensorrt_llm/quantization/layers.py)")
        fix = AWQ_PAD_FIX
    else:
        dtypes = {"prequant_scaling_factor": dtype, "weights_scaling_factor": "float32",
                  "activation_scaling_factor": "float32"}
        want = {"weight": Header((rows, cols), "int8"),
                **{part: Header(shape, dtypes[part]) for part, shape in smoothquant_shapes(rows, cols).items()}}
        who = f"Int8SmoothQuant{kind}Linear (tensorrt_llm/quantization/layers.py)"
        fix = TOOL_LAYER_FIX
    out = []
    for part, w in want.items():
        got = loaded.get(f"{linear}.{part}")
        if got is None or got.shape == w.shape or (part == "activation_scaling_factor" and got.shape == ()):
            continue
        out.append(LoadProblem(rank, f"{linear}.{part}", (
            f"rank {rank}: {linear}.{part} loads as {list(got.shape)}, but the engine's {who} declares "
            f"{list(w.shape)}, and the load asserts the exact shape (tensorrt_llm/parameter.py)"), fix))
    if algo == AWQ and not quantization.get("pre_quant_scale") and f"{linear}.prequant_scaling_factor" in loaded:
        out.append(LoadProblem(rank, f"{linear}.prequant_scaling_factor", (
            f"rank {rank}: {linear}.prequant_scaling_factor is stored, but config.json's quantization.pre_quant_scale "
            f"is not true, so the engine's WeightOnlyGroupwiseQuant{kind}Linear declares none and leaves it unused: "
            "the engine would skip AWQ's smoothing of the input"), 'set "pre_quant_scale": true in config.json\'s '
            "quantization, as ModelOpt's export writes it"))
    if algo == AWQ and quantization.get("has_zero_point") and f"{linear}.zero" not in loaded:
        out.append(LoadProblem(rank, f"{linear}.zero", (
            f"rank {rank}: config.json's quantization.has_zero_point is true, so the engine's "
            f"WeightOnlyGroupwiseQuant{kind}Linear requires {linear}.zero, which the rank file does not hold"),
            TOOL_LAYER_FIX))
    return out


def load_problems(ranks: list[dict], config: dict) -> list[LoadProblem]:
    """Everything the build's load path (module doc) refuses in these rank files, in rank order."""
    quantization = config.get("quantization") or {}
    dtype = str(config.get("dtype", "float16"))
    algo, kv_algo = quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo")
    exclude = quantization.get("exclude_modules")
    tp = int((config.get("mapping") or {}).get("tp_size", 1))
    out: list[LoadProblem] = []
    for rank, tensors in enumerate(ranks):
        loaded, problems = preprocessed(rank, tensors, quantization, dtype)
        out += problems
        if algo in BITS:
            for name, t in tensors.items():
                if len(t.shape) == 2 and _WEIGHT_ONLY_LAYER.fullmatch(name) and (
                        p := _matchers_disagree(rank, name, t.dtype_name, exclude, algo)):
                    out.append(p)
        for name, h in loaded.items():
            linear = linear_of(name)
            if linear is None or name != linear + ".weight" or is_excluded(linear, exclude) or len(h.shape) != 2:
                continue
            if algo in BITS and h.dtype_name == "int8" and tensors[name].dtype_name != "int8":
                rows, cols = tensors[name].shape  # the float weight the load quantized: [out, in]
                want = declared_weight_only(linear, rows, cols, tp, BITS[algo])
                for part, shape in want.items():
                    got = loaded.get(f"{linear}.{part}")
                    if got is not None and got.shape != shape:
                        out.append(LoadProblem(rank, f"{linear}.{part}", (
                            f"rank {rank}: {linear}.{part} loads as {list(got.shape)}, but the engine's "
                            f"{'WeightOnlyQuantColumnLinear' if linear.endswith(COLUMN_LINEARS) else 'WeightOnlyQuantRowLinear'}"
                            f" declares {list(shape)}: its features are padded to a multiple of 64 x tp_size = "
                            f"{WEIGHT_ONLY_PAD * tp} (tensorrt_llm/quantization/layers.py) and the load asserts the "
                            "exact shape (tensorrt_llm/parameter.py)"), WEIGHT_ONLY_PAD_FIX))
            if algo in (AWQ, SQ) and tensors[name].dtype_name == "int8" and len(tensors[name].shape) == 2:
                out += _tool_layer(rank, linear, tensors[name], loaded, quantization, tp, dtype)
            if algo == "FP8":
                out += _exact(rank, loaded, linear, ("weights_scaling_factor", "activation_scaling_factor"),
                              "FP8Linear (tensorrt_llm/quantization/layers.py)")
        if kv_algo:
            for name in loaded:
                if name.endswith(".attention.qkv.weight"):
                    out += _exact(rank, loaded, name.removesuffix(".qkv.weight"),
                                  ("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor"),
                                  "a quantized KV cache's Attention (tensorrt_llm/quantization/quantize.py)")
    return out


def _exact(rank: int, loaded: dict[str, Header], module: str, scales: tuple[str, ...], who: str) -> list[LoadProblem]:
    """The per-tensor scales ``who`` declares float32 ``(1,)``, where given, against what loads."""
    out = []
    for s in scales:
        got = loaded.get(f"{module}.{s}")
        # Parameter.value reshapes a 0-D value to a declared shape of ones (tensorrt_llm/parameter.py, 1.x)
        if got is not None and (got.shape not in ((1,), ()) or got.dtype_name != "float32"):
            out.append(LoadProblem(rank, f"{module}.{s}", (
                f"rank {rank}: {module}.{s} is {got.dtype_name} {list(got.shape)}, but {who} declares it float32 "
                "[1], and the engine's load asserts the exact shape (tensorrt_llm/parameter.py Parameter.value)"),
                SCALE_SHAPE_FIX))
    return out
