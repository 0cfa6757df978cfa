"""XQA rules: which kernels serve a Medusa generation step for this base's head size, group size, q scaling
and attention soft-capping (the facts and the route are ``trtllm_medusa_ports.gpu.xqa``'s).

May import: ``xqa``, ``compat.registry``, ``findings``, ``files.hf_model``.
"""

from __future__ import annotations

import math

from trtllm_medusa_ports.compat.registry import BaseFacts, base_rule
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding
from trtllm_medusa_ports.gpu.xqa import (
    XQA_JIT_ENV,
    XQA_JIT_MAX_GROUP,
    XQA_JIT_ONLY,
    XQA_PRECOMPILED_MEDUSA_HEAD_SIZES,
    XQA_ROUTE_SMS,
    relies_on_precompiled,
    xqa_environment,
    xqa_medusa_route,
)


def _xqa_group_findings(group: int, head_size: int) -> list[Finding]:
    """Which XQA kernels serve a group size (query heads per KV head) with speculative decoding and a
    float16/bfloat16 KV cache (quantized caches: rule quant-kv-cache); :func:`xqa_medusa_route` has the facts."""
    routes = xqa_medusa_route(group, head_size)
    r = routes[XQA_ROUTE_SMS[-1]]  # a float cache takes the same route on every GPU read
    lead = f"{group} query heads per KV head (head size {head_size}, a float16/bfloat16 KV cache): "
    if all(x.served for x in routes.values()):
        if r.impl == "JIT":
            return []
        if relies_on_precompiled(routes):  # a group over 32: only the precompiled kernels take it
            return [Finding("gqa-group-size", WARNING,
                            lead + "XQA JIT kernels are chosen only when the group size divides 64, so generation runs "
                            "on the precompiled XQA kernels (head size 128; xqa_kernel_cubin.h), the only ones that "
                            f"take more than {XQA_JIT_MAX_GROUP} query heads per KV head. {XQA_JIT_ONLY}",
                            f"run the engine with {XQA_JIT_ENV}=0 (`trtllm-medusa deploy` writes it into its scripts) "
                            "on TensorRT-LLM 1.2, and validate on GPU (scripts/validate_on_gpu.sh)")]
        return [Finding("gqa-group-size", INFO,
                        lead + "XQA JIT kernels are chosen only when the group size divides 64, so generation runs on "
                        "the precompiled XQA kernels (head size 128; xqa_kernel_cubin.h)", "nothing to do")]
    if all(x.served_with_jit_env for x in routes.values()):
        return [Finding("gqa-group-size", WARNING,
                        lead + f"the group size does not divide 64, so with default settings decoderXQARunner picks "
                        f"the precompiled XQA kernels, and {r.precompiled.missing}: the engine fails at run time "
                        "(\"No available XQA kernels are found for speculative decoding mode\"). With "
                        f"{XQA_JIT_ENV}=1 the runner takes the JIT kernels instead (the 1.2 runner read checks the "
                        f"variable first), whose HMMA kernels take group sizes up to {XQA_JIT_MAX_GROUP}",
                        f"run the engine with {XQA_JIT_ENV}=1 in its environment (e.g. `{XQA_JIT_ENV}=1 python3 "
                        "run.py ...`) and validate on GPU (scripts/validate_on_gpu.sh)")]
    if xqa_environment(routes).get(XQA_JIT_ENV) == "0":
        return [Finding("gqa-group-size", WARNING,
                        lead + f"the group size divides 64, so with default settings decoderXQARunner picks the XQA "
                        f"JIT kernels, which take at most {XQA_JIT_MAX_GROUP} query heads per KV head: the engine "
                        "fails at run time (\"No available XQA kernels are found for speculative decoding mode\"). "
                        f"With {XQA_JIT_ENV}=0 the runner takes the precompiled XQA kernels outright (the 1.2 runner "
                        "read checks the variable first), whose Medusa cubins take head size 128 with any group "
                        f"(xqa_kernel_cubin.h). {XQA_JIT_ONLY}",
                        f"run the engine with {XQA_JIT_ENV}=0 in its environment (`trtllm-medusa deploy` writes it "
                        "into its scripts) and validate on GPU (scripts/validate_on_gpu.sh)")]
    if r.impl == "JIT":
        text = (lead + "generation would run on the XQA JIT kernels (the group size divides 64), which take at "
                f"most {XQA_JIT_MAX_GROUP}, and {r.precompiled.missing}, so {XQA_JIT_ENV}=0 does not help either "
                "(no available XQA kernel for speculative decoding)")
    else:
        text = (lead + f"the group size does not divide 64, so the runner picks the precompiled XQA kernels, and "
                f"{r.precompiled.missing}; {r.jit.missing}, so {XQA_JIT_ENV}=1 does not help either "
                "(no available XQA kernel for speculative decoding)")
    return [Finding("gqa-group-size", ERROR, text, "Medusa cannot be served on this base by TensorRT-LLM")]


def _custom_q_scaling(hf: HFConfig, head_size: int) -> str | None:
    """What in config.json gives the engine q_scaling != 1, or None."""
    scalar = hf.get("query_pre_attn_scalar")
    if scalar is not None and scalar != head_size:
        return f"query_pre_attn_scalar = {scalar} (head_size {head_size})"
    multiplier = hf.get("attention_multiplier")
    if multiplier is not None:
        # the engine's q_scaling is 1 / (attention_multiplier * sqrt(head_size)) (archs/granite.py writes the
        # multiplier times sqrt(head_size), as tensorrt_llm/models/llama/config.py does for values != 1;
        # llama/model.py builds Attention with q_scaling = 1 / that): 1 exactly when the multiplier is 1/sqrt(d)
        q_scaling = 1.0 / (float(multiplier) * math.sqrt(head_size)) if multiplier else float("inf")
        if abs(q_scaling - 1.0) > 1e-6:
            return f"attention_multiplier = {multiplier} (q_scaling = 1 / (m * sqrt({head_size})) = {q_scaling:.4g})"
    return None


@base_rule("xqa-head-size", "xqa-head-size-jit")
def xqa_head_size(f: BaseFacts) -> list[Finding]:
    head_size, out = f.head_size, []
    if head_size % 16 or head_size > 256:
        out.append(
            Finding(
                "xqa-head-size",
                ERROR,
                f"head size {head_size} is not supported by the XQA kernels that speculative "
                "decoding requires (multiples of 16, at most 256)",
                "Medusa cannot be served on this base by TensorRT-LLM; choose another base",
            )
        )
    elif head_size not in XQA_PRECOMPILED_MEDUSA_HEAD_SIZES:
        group = f.heads // f.kv if f.kv and f.heads % f.kv == 0 else None
        # a float cache takes the same route on every GPU read (FP8 on SM 9.0: rule quant-kv-cache)
        picked = xqa_medusa_route(group, head_size)[XQA_ROUTE_SMS[-1]].impl if group else None
        if picked is None:
            route = ""
        elif picked == "JIT":
            route = f", which the runner picks for {group} query heads per KV head (the group size divides 64)"
        else:
            route = (f", which the runner takes for {group} query heads per KV head only with {XQA_JIT_ENV}=1 "
                     "(see gqa-group-size)")
        out.append(
            Finding(
                "xqa-head-size-jit",
                WARNING,
                f"head size {head_size} is not among the precompiled Medusa XQA kernels (head size "
                f"{'/'.join(map(str, XQA_PRECOMPILED_MEDUSA_HEAD_SIZES))} only; xqa_kernel_cubin.h); the engine "
                f"needs the XQA JIT kernels{route}",
                f"keep the runner on the JIT kernels (never {XQA_JIT_ENV}=0"
                + (f"; set {XQA_JIT_ENV}=1" if picked == "precompiled" else "")
                + "); validate on GPU with scripts/validate_on_gpu.sh",
            )
        )
    return out


@base_rule("gqa-group-size")
def gqa_group_size(f: BaseFacts) -> list[Finding]:
    if f.heads % f.kv:
        return [Finding("gqa-group-size", ERROR,
                        f"num_attention_heads {f.heads} is not a multiple of num_key_value_heads {f.kv}",
                        "the config is inconsistent; use the model's original config.json")]
    return _xqa_group_findings(f.heads // f.kv, f.head_size)


@base_rule("attention-scale")
def attention_scale(f: BaseFacts) -> list[Finding]:
    heads, kv, out = f.heads, f.kv, []
    q_scaling = _custom_q_scaling(f.hf, f.head_size)
    if q_scaling and kv and heads % kv == 0:
        group = heads // kv
        routes = xqa_medusa_route(group, f.head_size, q_scaling_one=False)
        r = routes[XQA_ROUTE_SMS[-1]]  # float cache: the same route on every GPU read
        if all(x.served for x in routes.values()):
            severity, why, fix = (WARNING, "; the XQA JIT kernels the runner picks for this group size (it divides 64) "
                                  "take it, the precompiled ones do not",
                                  f"use TensorRT-LLM 1.2.x (never {XQA_JIT_ENV}=0) and validate on GPU")
        elif all(x.served_with_jit_env for x in routes.values()):
            severity, why, fix = (
                WARNING,
                f"; {r.why}, so with default settings generation runs on the precompiled XQA kernels, which require "
                "q_scaling == 1: there is no kernel for speculative decoding and the engine fails at run time. With "
                f"{XQA_JIT_ENV}=1 the runner takes the JIT kernels, which take it (the 1.2 runner read checks the "
                "variable first)",
                f"run the engine with {XQA_JIT_ENV}=1 in its environment and validate on GPU "
                "(scripts/validate_on_gpu.sh)")
        else:
            severity, why, fix = (
                ERROR,
                f"; {r.why}, so generation runs on the precompiled XQA kernels, which require q_scaling == 1, and "
                f"{r.jit.missing}: there is no kernel for speculative decoding",
                "Medusa cannot be served on this base by TensorRT-LLM's XQA kernels")
        out.append(Finding("attention-scale", severity, f"{q_scaling} sets q_scaling != 1" + why, fix))
    return out


@base_rule("attention-softcapping")
def attention_softcapping(f: BaseFacts) -> list[Finding]:
    hf, out = f.hf, []
    softcap = hf.get("attn_logit_softcapping")
    if softcap:
        out.append(
            Finding(
                "attention-softcapping",
                ERROR,
                f"attention logit soft-capping ({softcap}) is ignored by the XQA kernels that run "
                "every Medusa generation step (their parameters have no soft-capping field), so tree "
                "verification would use different attention scores than the base model",
                "serve this base without Medusa; --allow_unsupported writes the checkpoint for experiments",
                overridable=True,
            )
        )
    return out
