"""What the reference executor refuses in a checkpoint before it computes anything (``check_loaded``): weight-only
bytes stored for one GPU, quantized layers without their declared tensors, anything the engine's own load would
refuse, tensor-parallel replicas that differ, NaN/Inf anywhere. Each check takes the ``ReferenceModel`` being
built (its checkpoint, mapping, quantization and semantics).
"""

from __future__ import annotations

import re

import torch

from trtllm_medusa_ports.errors import CheckpointError
from trtllm_medusa_ports.quant import (
    QUANTIZED_LAYER_FIX,
    STORED_WEIGHT_ONLY_FIX,
    quantized_layer_problems,
    stored_weight_only_refusal,
)
from trtllm_medusa_ports.quant.base_checks import tool_layer_problems
from trtllm_medusa_ports.quant.engine_load import load_problems
from trtllm_medusa_ports.quant.stored import KV_SCALE_FIX, kv_scale_message, kv_scale_problems

#: the biases of row-parallel layers
ROW_BIAS = r".*\.(attention\.dense|mlp\.proj)\.bias"
#: checkpoint tensors that TensorRT-LLM keeps whole on every tensor-parallel rank: norms, and
#: the biases of row-parallel layers (added once, after the all-reduce)
REPLICATED = tuple(
    re.compile(p)
    for p in (
        r".*layernorm\.(weight|bias)",
        r"transformer\.(ln_f|ln_embed)\.(weight|bias)",
        ROW_BIAS,
        r".*\.mlp\.(router|shared_expert_gate)\.weight",  # the MoE router and shared gate: every rank, every token
        r".*_scaling_factor",  # FP8 and KV-cache scales: those of the unsplit tensor, on every rank
    )
)


def check_loaded(model) -> None:
    """Every check, the stored form first (its messages speak of the rank files as written)."""
    check_stored_weight_only(model)
    check_quantized_layers(model)
    check_kv_scales(model)
    check_engine_load(model)
    check_replicas(model)
    check_finite(model)


def check_quantized_layers(model) -> None:
    """Every linear ``quant_algo`` quantizes (not excluded) holds the weights and scales its quantized layer
    declares (quant/__init__.py ``quantized_layer_problems``, which add-heads runs too): a float weight there
    would not load into the engine, and computing it as float would prove the wrong model."""
    if model.quant.weight_only:  # stored weight-only bytes: check_stored_weight_only says why they are refused
        return
    problems = quantized_layer_problems(model.ckpt.ranks, model.quant.quant_algo, model.exclude)
    if problems:
        p = problems[0]
        raise CheckpointError(p.message, where=str(model.ckpt.path / f"rank{p.rank}.safetensors"),
                              fix=QUANTIZED_LAYER_FIX)
    # AWQ / SmoothQuant tensors of shapes that disagree cannot be multiplied (quant/base_checks.py)
    for p in tool_layer_problems(model.ckpt.ranks, model.config.get("quantization") or {},
                                 int(model.config["hidden_size"])):
        raise CheckpointError(p.message, where=str(model.ckpt.path / f"rank{p.rank}.safetensors"), fix=p.fix)

def check_kv_scales(model) -> None:
    """Under a quantized KV cache, every attention layer holds its scale (quant/stored.py, as deploy and add-heads
    judge it): named as missing, not as the k / v split scale the executor would look for next."""
    algo = (model.config.get("quantization") or {}).get("kv_cache_quant_algo")
    for r, att in kv_scale_problems(model.ckpt.ranks, algo):
        raise CheckpointError(kv_scale_message(att, algo), where=str(model.ckpt.path / f"rank{r}.safetensors"),
                              fix=KV_SCALE_FIX)


def check_stored_weight_only(model) -> None:
    """Weight-only bytes a family's converter stored for one GPU's mixed GEMM are refused before any work."""
    if not model.quant.weight_only:
        return
    for r in range(model.mapping.world_size):
        for name, t in model.ckpt.ranks[r].items():
            scale = name[: -len("weight")] + "per_channel_scale"
            if name.endswith(".weight") and model.has(r, scale) and t.dtype_name == "int8":
                raise CheckpointError(stored_weight_only_refusal(name), where=str(model.ckpt.path),
                                      fix=STORED_WEIGHT_ONLY_FIX)

def check_engine_load(model) -> None:
    """What TensorRT-LLM's build does to the rank files before it builds - ``preprocess_weights``, then every
    parameter's exact declared shape (quant/engine_load.py) - refuses nothing here: verify proves only what the
    engine would load."""
    problems = load_problems(model.ckpt.ranks, model.config)
    if problems:
        p = problems[0]
        raise CheckpointError(p.message, where=str(model.ckpt.path / f"rank{p.rank}.safetensors"), fix=p.fix)

def check_finite(model) -> None:
    """Every floating tensor of every rank is finite, rows no prompt reaches included (an engine would serve
    them): refused naming the rank file and tensor."""
    for r, tensors in enumerate(model.ckpt.ranks):
        for name, lazy in tensors.items():
            if lazy.dtype_name not in ("float32", "float16", "bfloat16", "float8_e4m3fn"):
                continue
            t = lazy.load().reshape(-1)
            if not all(bool(torch.isfinite(c.float() if c.dtype == torch.float8_e4m3fn else c).all())
                       for c in t.split(1 << 20)):  # a million values at a time: no tensor-sized temporaries
                raise CheckpointError(f"tensor {name!r} holds NaN/Inf",
                                      where=str(model.ckpt.path / f"rank{r}.safetensors"),
                                      fix="the checkpoint is damaged: convert again")
            del t

def check_replicas(model) -> None:
    """Every rank of a stage holds the same tensor names and shapes, and the replicated
    tensors (norms, biases added after an all-reduce, an unsplit embedding) are equal.

    The executor computes those once, with rank 0's copy; the engine computes them on
    every rank with that rank's own copy, so a replica that differs would make the
    engine's ranks disagree. It is refused here instead. Copies are compared as stored
    (bit for bit), one at a time.
    """
    replicated = REPLICATED
    if model.semantics.row_bias_every_rank:  # whole on rank 0, zeros elsewhere: not replicas
        replicated = tuple(p for p in replicated if p.pattern != ROW_BIAS)
    if not (model.config.get("use_parallel_embedding") and model.tp > 1):
        replicated = replicated + (re.compile(r"transformer\.vocab_embedding\.weight"),)
    for stage in range(model.pp):
        ranks = model.stage_ranks(stage)
        for name in model.ckpt.ranks[ranks[0]]:
            shapes = [model.ckpt.ranks[r][name].shape if name in model.ckpt.ranks[r] else None for r in ranks]
            if len(set(shapes)) != 1:
                raise CheckpointError(
                    f"tensor {name!r} has shapes {shapes} on the ranks of stage {stage}",
                    where=str(model.ckpt.path),
                    fix="the checkpoint's tensor-parallel split is inconsistent; convert again",
                )
            if len(ranks) > 1 and any(p.fullmatch(name) for p in replicated):
                first = model.ckpt.tensor(ranks[0], name)
                for r in ranks[1:]:
                    other = model.ckpt.tensor(r, name)
                    if first.dtype != other.dtype or not torch.equal(first.view(-1).view(torch.uint8),
                                                                    other.view(-1).view(torch.uint8)):
                        raise CheckpointError(
                            f"replicated tensor {name!r} differs between rank {ranks[0]} and rank {r}",
                            where=str(model.ckpt.path),
                            fix="every tensor-parallel rank must hold the same copy; convert again",
                        )
                    del other
