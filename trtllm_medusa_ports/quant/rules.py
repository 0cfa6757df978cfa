"""``check`` rules for quantized Medusa ports (docs/compatibility-rules.md, "Quantization rules")."""

from __future__ import annotations

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.semantics import MlpKind
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding
from trtllm_medusa_ports.gpu.xqa import (
    XQA_JIT_ENV,
    describe_xqa_routes,
    sm_names,
    xqa_serving_routes,
)
from trtllm_medusa_ports.quant import QuantSpec
from trtllm_medusa_ports.weights.sharding import kv_heads_per_rank

#: tensorrt_llm/quantization/layers.py WeightOnlyQuantLinear / WeightOnlyQuantRowLinear pad in and out
#: features up to a multiple of 64 x tp_size
WEIGHT_ONLY_MULTIPLE = 64


def linear_shapes(hf: HFConfig, adapter: ArchAdapter, tp_size: int) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each quantized linear as the engine class declares them (whole, not per rank)."""
    hidden, hs = adapter.hidden_size(hf), adapter.head_size(hf)
    heads, kv = adapter.num_attention_heads(hf), adapter.num_kv_heads(hf)
    kv_local = kv_heads_per_rank(kv, tp_size)
    shapes = {"attention.qkv": (hidden, tp_size * (heads // tp_size + 2 * kv_local) * hs),
              "attention.dense": (heads * hs, hidden)}
    cfg = adapter.engine_config(hf)
    if adapter.num_experts(hf) > 1:
        # the experts are MOE's own weights (MOEWeightWrapper, not padded); a shared expert is an MLP of
        # weight-only linears (tensorrt_llm/layers/moe.py SharedMoE: swiglu, one fused fc)
        shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0)
        if shared:
            shapes.update({"mlp.shared_expert.fc": (hidden, 2 * shared), "mlp.shared_expert.proj": (shared, hidden)})
        return shapes
    inter = adapter.intermediate_size(hf)
    mlp = adapter.semantics({**cfg, "head_size": hs}).mlp
    shapes.update({"mlp.fc": (hidden, 2 * inter if mlp is MlpKind.SWIGLU else inter), "mlp.proj": (inter, hidden)})
    if mlp is MlpKind.GATED:
        shapes["mlp.gate"] = (hidden, inter)
    return shapes


def _weight_only_tp_sizes(hf: HFConfig, adapter: ArchAdapter, up_to: int = 64) -> list[int]:
    """The tp sizes (powers of two up to ``up_to``) at which every weight-only width is a multiple of 64 x tp."""
    fits = []
    tp = 1
    while tp <= up_to:
        try:
            shapes = linear_shapes(hf, adapter, tp)
        except Exception:  # noqa: BLE001 - a tp the heads cannot be split by: the parallel rules say so
            shapes = None
        m = WEIGHT_ONLY_MULTIPLE * tp
        if shapes and all(i % m == 0 and o % m == 0 for i, o in shapes.values()):
            fits.append(tp)
        tp *= 2
    return fits


def _weight_only_fix(hf: HFConfig, adapter: ArchAdapter, tp_size: int) -> str:
    other = "quantize the KV cache alone" if adapter.num_experts(hf) > 1 else "use FP8 (--qformat fp8)"
    fits = [t for t in _weight_only_tp_sizes(hf, adapter) if t != tp_size]
    if fits:
        return (f"use --tp_size {' or '.join(map(str, fits[:3]))} (every width is then a multiple of "
                f"{WEIGHT_ONLY_MULTIPLE} x tp_size), or {other}")
    return (f"no tp_size makes every width a multiple of {WEIGHT_ONLY_MULTIPLE} x tp_size (a width that is not a "
            f"multiple of {WEIGHT_ONLY_MULTIPLE} is not one at any): {other}, or keep the weights float")


def check_quantization(hf: HFConfig, adapter: ArchAdapter, spec: QuantSpec, tp_size: int) -> list[Finding]:
    out: list[Finding] = []
    if spec.quant_algo == "FP8" and adapter.num_experts(hf) > 1:
        out.append(Finding(
            "port-limit", ERROR,
            "FP8 of a mixture-of-experts base: the scales are established - one weight scale per expert ([experts, "
            "1]; fc's the larger of its gate and up halves'), one activation scale per layer, the largest over the "
            "experts (tensorrt_llm/layers/moe.py MOEWeightWrapper, ModelOpt build_stacked_experts) - but where the "
            "MoE plugin's FP8 GEMMs and fused activation round is not in the source read, so verify could not prove "
            "an emulation computes what the engine does; this port does not write FP8 experts",
            "convert the MoE base weight-only (--qformat int8_wo / int4_wo) or unquantized (a KV-cache dtype alone "
            "is fine)"))
    if spec.weight_only:
        multiple = WEIGHT_ONLY_MULTIPLE * tp_size
        try:
            shapes = linear_shapes(hf, adapter, tp_size)
        except Exception:  # the base rules already report an unreadable config
            shapes = {}
        bad = [f"{name} [{i} -> {o}]" for name, (i, o) in shapes.items() if i % multiple or o % multiple]
        if bad:
            out.append(Finding(
                "quant-weight-only-shape", ERROR,
                f"{spec.quant_algo}: TensorRT-LLM's weight-only layers pad in and out features to a multiple of "
                f"64 x tp_size = {multiple} (tensorrt_llm/quantization/layers.py WeightOnlyQuantLinear), but the "
                "float weights of the checkpoint are quantized at load unpadded (modeling_utils.py "
                f"preprocess_weights): the build fails on {', '.join(bad[:3])}",
                _weight_only_fix(hf, adapter, tp_size)))
    if spec.quant_algo == "FP8":
        out.append(Finding(
            "quant-fp8-gpu", INFO,
            "FP8 GEMMs run on SM 8.9 and later (Ada, Hopper, Blackwell; TensorRT-LLM's support matrix); FP8 context "
            "FMHA is switched off below SM 8.9 and, with paged context FMHA (the default), without an FP8 KV cache "
            "(tensorrt_llm/builder.py build)",
            "serve on an L4/L40/RTX 40xx, H100/H200 or newer; on Ampere use --qformat int8_wo or int4_wo"))
    if spec.weight_only or spec.kv_cache_quant_algo == "INT8":
        out.append(Finding(
            "quant-int8-blackwell", WARNING,
            "tensorrt_llm/builder.py build refuses INT8/INT4 weight-only and INT8 KV caches on SM 10.x-11.x "
            "(\"INT8/INT4 quantization is not supported on SM>=100\")",
            "on B200/GB200 use --qformat fp8 with --kv_cache_dtype fp8"))
    if spec.kv_cache_quant_algo:
        out.append(kv_cache_finding(hf, adapter, spec.kv_cache_quant_algo))
    return out


def kv_cache_finding(hf: HFConfig, adapter: ArchAdapter, kind: str) -> Finding:
    """Rule ``quant-kv-cache``: which XQA kernels read a quantized KV cache in Medusa generation, per GPU
    (compat.xqa_medusa_route has the upstream facts)."""
    group = adapter.num_attention_heads(hf) // max(adapter.num_kv_heads(hf), 1)
    head = adapter.head_size(hf)
    routes = xqa_serving_routes(group, head, kind)  # E4M3 caches are served from SM 8.9 on
    served = [sm for sm, r in routes.items() if r.served]
    with_env = [sm for sm, r in routes.items() if r.env_needed == "1"]
    forced = [sm for sm, r in routes.items() if r.env_needed == "0"]
    detail = (f"generation with speculative decoding runs on XQA kernels; with an {kind} KV cache, {group} query heads "
              f"per KV head and head size {head}: {describe_xqa_routes(routes)}")
    if kind == "FP8":
        detail += "; FP8 (E4M3) caches need SM 8.9 or later"
    else:
        detail += "; the builder switches paged context FMHA off with an INT8 KV cache (tensorrt_llm/builder.py)"
    if len(served) == len(routes):
        return Finding("quant-kv-cache", INFO, detail, "nothing to do; validate on GPU")
    if not served and not with_env and not forced:
        return Finding("quant-kv-cache", ERROR, detail,
                       "Medusa cannot be served with this KV-cache dtype on this base; drop --kv_cache_dtype")
    fix = []
    if served:
        fix.append(f"serve on {sm_names(served)}, where the kernels named take it")
    if with_env:
        fix.append(f"on {sm_names(with_env)} run the engine with {XQA_JIT_ENV}=1 in its "
                   "environment (the 1.2 runner read checks it first)")
    if forced:
        fix.append(f"on {sm_names(forced)} run the engine with {XQA_JIT_ENV}=0 in its environment: the runner then "
                   "takes the precompiled kernels outright, which take it (`trtllm-medusa deploy` writes the setting "
                   "into its scripts where every GPU is served with it)")
    return Finding("quant-kv-cache", WARNING, detail,
                   "; ".join(fix) + "; or drop --kv_cache_dtype; validate on GPU (scripts/validate_on_gpu.sh)")
