"""The types of a TensorRT-LLM checkpoint's config.json fields the project reads, in one table, checked once by
``files.checkpoint.check_config`` for every reader (verify, deploy, add-heads, build), so that a wrong type is one
error naming config.json and the field, never a traceback where the value is first used.

A checkpoint is downloaded input. The fields follow tensorrt_llm/models/modeling_utils.py ``PretrainedConfig`` and
``QuantConfig`` (types of upstream's dataclass fields; ``dtype`` and ``mapping`` have checks of their own), tensorrt_llm/models/medusa/config.py ``MedusaConfig``
(``num_medusa_heads``, ``num_medusa_layers``, ``max_draft_len``) and this project's ``medusa_ports`` record. A value
upstream turns into an enum is judged as upstream parses it (exact member names: ``position_embedding_type``,
``rotary_scaling``'s type, ``hidden_act``, ``quant_algo`` / ``kv_cache_quant_algo``, ``moe.normalization_mode``), so a value the
engine would refuse, or silently read as another, is refused here for every reader. A field
that is absent or null is not judged here (readers apply their defaults); the required sizes are
``check_config``'s.

May import: ``errors`` only.
"""

from __future__ import annotations

import json
import math

from trtllm_medusa_ports.errors import CheckpointError
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES
from trtllm_medusa_ports.files.jsonfile import is_int, is_number

#: tensorrt_llm/functional.py RotaryScalingType's member names: ``from_string`` looks a ``rotary_scaling``'s type up by
#: name, exactly as spelled (tensorrt_llm/layers/attention.py ``Attention.__init__`` and
#: ``create_attention_const_params`` read ``type``, else ``rope_type``)
ROTARY_SCALING_TYPES = ("none", "linear", "dynamic", "longrope", "llama3", "yarn", "mrope")
#: tensorrt_llm/functional.py PositionEmbeddingType's member names (``from_string`` in ``PretrainedConfig.__init__``)
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope_gptj", "rope_gpt_neox", "long_rope", "alibi",
                            "alibi_with_scale", "relative", "chatglm", "yarn", "mrope", "deferred")


#: tensorrt_llm/quantization/mode.py QuantAlgo (a StrEnum: a config's string equals a member only spelled exactly);
#: ``QuantMode.from_quant_algo`` asserts ``quant_algo`` in QUANT_ALGO_LIST (every member but INT8) and
#: ``kv_cache_quant_algo`` in KV_CACHE_QUANT_ALGO_LIST when trtllm-build quantizes the model
QUANT_ALGOS = ("W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ", "W8A8_SQ_PER_CHANNEL",
               "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
               "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
               "W4A8_QSERVE_PER_GROUP", "W4A8_QSERVE_PER_CHANNEL", "FP8", "FP8_PER_CHANNEL_PER_TOKEN",
               "FP8_BLOCK_SCALES", "MIXED_PRECISION", "NVFP4", "W4A8_NVFP4_FP8", "W4A8_MXFP4_FP8",
               "W4A8_MXFP4_MXFP8", "W4A16_MXFP4", "NO_QUANT")
KV_CACHE_QUANT_ALGOS = ("FP8", "INT8", "NVFP4")
#: tensorrt_llm/functional.py ``ACT2FN``'s names: the MLPs and Medusa's ResBlocks look ``hidden_act`` /
#: ``medusa_hidden_act`` up there (tensorrt_llm/layers/mlp.py refuses any other: "unsupported activation")
ACTIVATIONS = ("relu", "tanh", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "openai-gelu", "geglu", "gegelu",
               "identity", "silu", "softplus", "relu2", "squared-relu", "swiglu", "fast-swiglu", "sigmoid",
               "quick_gelu")
#: tensorrt_llm/layers/moe.py MoeConfig.ExpertScaleNormalizationMode's values (NONE, RENORMALIZE, SPARSE_MIXER,
#: DEVICE_LIMITED, DEVICE_LIMITED_RENORM): ``MoeConfig.from_dict`` keeps config.json's value as it is and the MoE
#: layer compares it with the members, so another value (a string "1", a 7) matches no routing and is not refused
MOE_NORMALIZATION_MODES = (0, 1, 2, 3, 4)


def rotary_scaling_kind(scaling: dict):
    """The name the engine looks a ``rotary_scaling`` object's type up by: ``type``, else ``rope_type`` (None where
    neither is given: no member has that name either)."""
    return scaling.get("type", scaling.get("rope_type"))


def _rotary_scaling(v) -> bool:
    return isinstance(v, dict) and rotary_scaling_kind(v) in ROTARY_SCALING_TYPES


def _number(v) -> bool:
    return is_number(v) and math.isfinite(v)


def _str_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _tree(v) -> bool:
    return (isinstance(v, list) and bool(v)
            and all(isinstance(p, list) and bool(p) and all(is_int(i, 0) for i in p) for p in v))


#: rule -> (test, what it expects, in words)
RULES = {
    "positive int": (lambda v: is_int(v, 1), "a positive integer"),
    "non-negative int": (lambda v: is_int(v, 0), "a non-negative integer"),
    "number": (_number, "a finite number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "str list": (_str_list, "a list of strings"),
    "patterns": (_str_list, "a list of module patterns (strings)"),
    "tree": (_tree, "a non-empty list of paths, each a non-empty list of non-negative integers"),
    "position embedding": (lambda v: v in POSITION_EMBEDDING_TYPES,
                           "one of TensorRT-LLM's PositionEmbeddingType names (" + ", ".join(POSITION_EMBEDDING_TYPES)
                           + "): tensorrt_llm/functional.py PositionEmbeddingType.from_string raises on any other"),
    "float dtype": (lambda v: v in CHECKPOINT_DTYPES,
                    "one of " + ", ".join(CHECKPOINT_DTYPES) + " (tensorrt_llm/_utils.py str_dtype_to_trt looks it up "
                    "by that name when the logits are marked)"),
    "activation": (lambda v: v in ACTIVATIONS,
                   "one of TensorRT-LLM's ACT2FN names (" + ", ".join(ACTIVATIONS) + "), spelled exactly so: "
                   "tensorrt_llm/functional.py ACT2FN has no other"),
    "quant algo": (lambda v: v in QUANT_ALGOS,
                   "one of TensorRT-LLM's QuantAlgo names for weights (" + ", ".join(QUANT_ALGOS) + "), spelled "
                   "exactly so: tensorrt_llm/quantization/mode.py QuantMode.from_quant_algo asserts it"),
    "kv cache quant algo": (lambda v: v in KV_CACHE_QUANT_ALGOS,
                            "one of " + ", ".join(KV_CACHE_QUANT_ALGOS) + " (tensorrt_llm/quantization/mode.py "
                            "KV_CACHE_QUANT_ALGO_LIST, which QuantMode.from_quant_algo asserts)"),
    "moe normalization": (lambda v: is_int(v, 0) and v in MOE_NORMALIZATION_MODES,
                          "an integer of tensorrt_llm/layers/moe.py ExpertScaleNormalizationMode (0 NONE, 1 "
                          "RENORMALIZE, 2 SPARSE_MIXER, 3 DEVICE_LIMITED, 4 DEVICE_LIMITED_RENORM): the MoE layer "
                          "compares it with those members, and another value routes as none of them"),
    "rotary scaling": (_rotary_scaling,
                       "an object whose type (or rope_type) is one of TensorRT-LLM's RotaryScalingType names ("
                       + ", ".join(ROTARY_SCALING_TYPES) + "), spelled exactly so: trtllm-build fails on any other "
                       "(tensorrt_llm/functional.py RotaryScalingType.from_string)"),
}

#: top-level fields of config.json
FIELDS = {
    "architecture": "str", "logits_dtype": "float dtype", "hidden_act": "activation",
    "position_embedding_type": "position embedding", "rotary_scaling": "rotary scaling", "base_architecture": "str", "medusa_hidden_act": "activation",
    "num_key_value_heads": "positive int", "head_size": "positive int", "intermediate_size": "positive int",
    "max_position_embeddings": "positive int", "num_medusa_layers": "positive int",
    "num_medusa_heads": "non-negative int", "max_draft_len": "non-negative int",
    "norm_epsilon": "number", "rotary_base": "number", "rotary_pct": "number", "rotary_dim": "positive int",
    "medusa_shared_lm_head": "bool", "use_parallel_embedding": "bool", "share_embedding_table": "bool",
    "attn_bias": "bool", "mlp_bias": "bool", "bias": "bool",
    "quantization": "object", "mapping": "object", "medusa_ports": "object", "moe": "object",
}
#: fields of the ``quantization`` object
QUANTIZATION_FIELDS = {"quant_algo": "quant algo", "kv_cache_quant_algo": "kv cache quant algo", "exclude_modules": "patterns",
                       "group_size": "positive int", "has_zero_point": "bool", "pre_quant_scale": "bool"}
#: fields of the ``moe`` object (tensorrt_llm/layers/moe.py ``MoeConfig``)
MOE_FIELDS = {"num_experts": "non-negative int", "top_k": "non-negative int", "normalization_mode": "moe normalization",
              "sparse_mixer_epsilon": "number"}
#: fields of this project's ``medusa_ports`` record
RECORD_FIELDS = {"medusa_choices": "tree", "medusa_choices_from": "str", "heads_source": "str", "warnings": "str list",
                 "family": "str", "heads_layout": "str", "heads_dtype": "str"}


def check_types(cfg: dict, where: str) -> None:
    """Every field of :data:`FIELDS` (and of the ``quantization`` and ``medusa_ports`` objects) that is present and
    not null has its type; else a CheckpointError naming config.json's field, its value and what it must be."""
    fix = ("config.json must be the one the converter or the quantizing tool wrote; fix or drop the field, or convert "
           "again")
    for section, fields in ((None, FIELDS), ("quantization", QUANTIZATION_FIELDS), ("moe", MOE_FIELDS),
                            ("medusa_ports", RECORD_FIELDS)):
        holder = cfg if section is None else cfg.get(section)
        if not isinstance(holder, dict):
            continue  # absent or null (a wrong type is the top level's error, checked first)
        for key, rule in fields.items():
            value = holder.get(key)
            test, expected = RULES[rule]
            if value is not None and not test(value):
                name = key if section is None else f"{section}.{key}"
                shown = json.dumps(value)
                raise CheckpointError(f"{name} is {shown if len(shown) <= 80 else shown[:77] + '...'}, not "
                                      f"{expected}", where=where, fix=fix)
    problems = longrope_problems(cfg) if cfg.get("position_embedding_type") == "long_rope" else []
    if problems:
        raise CheckpointError("position_embedding_type is long_rope, but its tables cannot be built: "
                              + "; ".join(problems), where=where, fix="convert the base again")


#: long_rope's keys in a checkpoint's config.json (tensorrt_llm/models/phi3/config.py writes them; PhiMoE adds its
#: own scales)
LONGROPE_FACTOR_KEYS = ("longrope_scaling_short_factors", "longrope_scaling_long_factors")
LONGROPE_MSCALE_KEYS = ("longrope_short_mscale", "longrope_long_mscale")


def _rotary_dim(cfg: dict) -> int | None:
    """The rotated features of a head, as the engine reads them (``rotary_dim``, else the head size times
    ``rotary_pct``); None where the sizes are not there to tell."""
    if is_int(cfg.get("rotary_dim"), 1):
        return cfg["rotary_dim"]
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head = cfg.get("head_size") if is_int(cfg.get("head_size"), 1) else (
        hidden // heads if is_int(heads, 1) and is_int(hidden, 1) else None)
    pct = cfg.get("rotary_pct", 1.0)
    return int(head * pct) if head is not None and _number(pct) else None


def longrope_problems(cfg: dict) -> list[str]:
    """What keeps a long_rope config's two tables from being built as the engine builds them (one entry a key, each
    naming it; empty: usable): both factor lists of finite positive numbers, one per rotated frequency; the original
    length a positive int; PhiMoE's scales numbers, where given. The one judge of these facts, for convert (on what it
    would write), check, and every reader of a checkpoint."""
    out = []
    half = (_rotary_dim(cfg) or 0) // 2
    for key in LONGROPE_FACTOR_KEYS:
        v = cfg.get(key)
        if not (isinstance(v, list) and all(is_number(x) for x in v)):
            out.append(f"{key} is {json.dumps(v)[:60]}: long_rope's tables need lists of numbers")
        elif half and len(v) != half:
            out.append(f"{key} has {len(v)} factors per table, the rotary dimension {2 * half} needs {half} (one per "
                       "frequency)")
        elif not all(math.isfinite(x) and x > 0 for x in v):
            out.append(f"{key}: long_rope's factors must be finite and positive")
    original = cfg.get("original_max_position_embeddings")
    if not is_int(original, 1):
        out.append(f"original_max_position_embeddings is {json.dumps(original)}, not a positive int (the length the "
                   "engine compares to pick the table)")
    for key in LONGROPE_MSCALE_KEYS:
        v = cfg.get(key)
        if v is not None and not (_number(v) and v > 0):
            out.append(f"{key} is {json.dumps(v)}: long_rope's scales must be positive numbers, where given")
    return out
