"""Compatibility rules: what TensorRT-LLM 1.2.x Medusa cannot serve, found before anyone builds.

Each rule yields :class:`Finding` values (stable rule id, severity, message, fix).
Only config files and tensor headers are read, so a check is fast on any size.
Every rule is documented with an example in docs/compatibility-rules.md.

Upstream facts behind the rules (TensorRT-LLM 1.2.x):
- with speculative decoding, generation attention runs on XQA kernels only
  (cpp/tensorrt_llm/common/attentionOp.cpp: "No available XQA kernels are found
  for speculative decoding mode"); XQA has no ALiBi, so an ALiBi base would get
  tree verification with wrong attention scores (the "very poor accuracy" Bloom reports);
- XQA head sizes: multiples of 16 up to 256; the precompiled Medusa (multi-query-token) kernels
  cover head size 128 only; which kernels run is decided per GPU (:func:`xqa_medusa_route`);
- Medusa matches draft tokens greedily only and has no beam search
  (tensorrt_llm/runtime/generation.py find_best_medusa_path).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import (
    adapter_for,
    adapter_for_model_type,
    supported_architectures,
)
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.hf_model import HFConfig, HFModel
from trtllm_medusa_ports.files.lazy_tensors import weight_files
from trtllm_medusa_ports.findings import ERROR, INFO, RULES, WARNING, Finding, errors_of  # noqa: F401  (re-exported)
from trtllm_medusa_ports.heads import MedusaHeads, load_heads
from trtllm_medusa_ports.sharding import Mapping
from trtllm_medusa_ports.tree import (
    DEFAULT_TOP_K,
    resolve_choices,
    upstream_quirks,
    validate_choices,
)
from trtllm_medusa_ports.xqa import (  # noqa: F401  (re-exported)
    XQA_HOPPER_JIT_MAX_GROUP,
    XQA_JIT_ENV,
    XQA_JIT_HMMA_TOKENS_PER_BLOCK,
    XQA_JIT_MAX_GROUP,
    XQA_JIT_QGMMA_TOKENS_PER_BLOCK,
    XQA_PRECOMPILED_MEDUSA_HEAD_SIZES,
    XQA_PRECOMPILED_TOKENS_PER_BLOCK,
    XQA_ROUTE_SMS,
    XqaRoute,
    describe_xqa_routes,
    sm_names,
    xqa_medusa_route,
)

#: rope scaling types TensorRT-LLM 1.2.x implements (tensorrt_llm/functional.py RotaryScalingType;
#: any other name raises ValueError). HF's "su" is Phi-3's old name for longrope, which the
#: Phi-3 converter maps itself.
TRTLLM_ROPE_SCALING = ("linear", "dynamic", "longrope", "llama3", "yarn", "mrope")
_ROPE_ALIASES = {"su": "longrope"}


# -- position embeddings -----------------------------------------------------------------
def alibi_reason(hf: HFConfig) -> str | None:
    """Why this base uses ALiBi, or None: the family's adapter says (Bloom, MPT, Falcon-ALiBi); for
    families without an adapter, Baichuan-13B and the generic flags."""
    mt = hf.model_type.lower()
    arch = (hf.get("architectures") or [""])[0]
    adapter = adapter_for(arch) or adapter_for_model_type(mt)
    if adapter is not None and adapter.alibi_reason(hf):
        return adapter.alibi_reason(hf)
    if mt == "baichuan" or arch in ("BaichuanForCausalLM", "BaiChuanForCausalLM"):
        # Baichuan-13B and Baichuan2-13B use ALiBi, the 7B models RoPE (modeling_baichuan.py
        # picks by hidden_size: 5120 -> ALiBi).
        if hf.get("hidden_size") == 5120 or hf.get("num_hidden_layers") == 40:
            return "Baichuan 13B (hidden_size 5120) uses ALiBi"
        return None
    for key in ("alibi", "use_alibi"):
        if hf.get(key) is True:
            return f"config.json sets {key} = true"
    pet = str(hf.get("position_embedding_type", "")).lower()
    if "alibi" in pet:
        return f"config.json sets position_embedding_type = {pet!r}"
    return None


def _alibi_finding(reason: str) -> Finding:
    return Finding(
        "alibi-position-embedding",
        ERROR,
        f"this base uses ALiBi ({reason}). With Medusa, TensorRT-LLM runs every generation "
        "step's attention on XQA kernels, which have no ALiBi: the 1.x JIT kernels refuse it "
        "(decoderXQAImplJIT supportConfigCommon takes RoPE and learned positions only), so the engine "
        "fails at run time with 'No available XQA kernels are found for speculative decoding mode' "
        "(attentionOp.cpp); only the precompiled kernels, chosen when the group size does not divide 64, "
        "run and drop the slopes silently - the 'very poor accuracy' Bloom reports.",
        f"use a RoPE or learned-position base ({_rope_families()} ...), serve this model without Medusa, or "
        "use a framework whose tree attention supports ALiBi. --allow_unsupported writes the checkpoint anyway "
        "for experiments.",
        overridable=True,
    )


# -- the rules ---------------------------------------------------------------------------
def _xqa_group_findings(group: int, head_size: int) -> list[Finding]:
    """Which XQA kernels serve a group size (query heads per KV head) with speculative decoding and a
    float16/bfloat16 KV cache (quantized caches: rule quant-kv-cache); :func:`xqa_medusa_route` has the facts."""
    routes = xqa_medusa_route(group, head_size)
    r = routes[XQA_ROUTE_SMS[-1]]  # a float cache takes the same route on every GPU read
    lead = f"{group} query heads per KV head (head size {head_size}, a float16/bfloat16 KV cache): "
    if all(x.served for x in routes.values()):
        if r.impl == "JIT":
            return []
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
    if r.impl == "JIT":
        text = (lead + "generation would run on the XQA JIT kernels (the group size divides 64), which take at "
                f"most {XQA_JIT_MAX_GROUP} (no available XQA kernel for speculative decoding)")
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


@dataclass(frozen=True)
class BaseFacts:
    """What every base-model rule reads: the config, its adapter and the attention shape."""

    hf: HFConfig
    adapter: ArchAdapter
    head_size: int
    heads: int
    kv: int


#: base-model rules in the order they report; each takes :class:`BaseFacts`
_BASE_RULES: list[Callable[[BaseFacts], list[Finding]]] = []


def base_rule(*ids: str) -> Callable:
    """Register a base-model rule function producing findings with these rule ids."""

    def deco(fn: Callable[[BaseFacts], list[Finding]]) -> Callable[[BaseFacts], list[Finding]]:
        for rule_id in ids:
            RULES.add(rule_id)
        _BASE_RULES.append(fn)
        return fn

    return deco


def _rope_families() -> str:
    """Supported architectures with rotary positions (derived from the adapters)."""
    from trtllm_medusa_ports.archs import registry

    return ", ".join(sorted({cls.hf_architectures[0] for cls in registry().values() if cls.position_embedding.is_rope}))


#: architectures a user may expect after GPT-2 and GPTBigCode, refused with their own reason
KNOWN_REFUSED = {
    "OPTForCausalLM": (
        "TensorRT-LLM's OPT class has no speculative-decoding plumbing (tensorrt_llm/models/opt/model.py: "
        "OPTDecoderLayer.forward takes no spec_decoding_params and OPTModel.forward swallows it in **kwargs), and its "
        "learned positions carry HF's offset of 2 (examples/models/contrib/opt/convert_checkpoint.py slices "
        "embed_positions[2:]); this port has no OPT adapter that adds the plumbing and the tree positions",
        "serve OPT without Medusa; docs/porting-guide.md shows how a family is added (the plumbing and the learned "
        "positions exist as capabilities)"),
}


def check_base(hf: HFConfig, adapter: ArchAdapter | None) -> list[Finding]:
    out: list[Finding] = []
    reason = alibi_reason(hf)
    if reason:
        out.append(_alibi_finding(reason))
    if adapter is None:
        arch = hf.get("architectures") or ["(none)"]
        if not reason and arch[0] in KNOWN_REFUSED:
            out.append(Finding("unsupported-architecture", ERROR, f"{arch[0]}: {KNOWN_REFUSED[arch[0]][0]}",
                               KNOWN_REFUSED[arch[0]][1]))
        elif not reason:
            out.append(
                Finding(
                    "unsupported-architecture",
                    ERROR,
                    f"no adapter for architecture {arch[0]!r}",
                    "supported: " + ", ".join(supported_architectures())
                    + "; docs/porting-guide.md shows how to add a family in one file",
                )
            )
        return out
    try:
        facts = BaseFacts(hf, adapter, adapter.head_size(hf), adapter.num_attention_heads(hf), adapter.num_kv_heads(hf))
    except PortError as exc:
        out.append(Finding("invalid-config", ERROR, exc.what, exc.fix or "fix config.json"))
        return out
    for rule_fn in _BASE_RULES:
        out += rule_fn(facts)
    return out


@base_rule("xqa-head-size", "xqa-head-size-jit")
def _xqa_head_size(f: BaseFacts) -> list[Finding]:
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


@base_rule("engine-class-limit")
def _engine_class_limit(f: BaseFacts) -> list[Finding]:
    return [Finding("engine-class-limit", ERROR, problem, fix) for problem, fix in f.adapter.engine_limits(f.hf)]


@base_rule("port-limit")
def _port_limit(f: BaseFacts) -> list[Finding]:
    return [Finding("port-limit", ERROR, problem, fix) for problem, fix in f.adapter.port_limits(f.hf)]


@base_rule("engine-divergence")
def _engine_divergence(f: BaseFacts) -> list[Finding]:
    return [Finding("engine-divergence", ERROR, problem, fix, overridable=True)
            for problem, fix in f.adapter.engine_divergences(f.hf)]


@base_rule("gqa-group-size")
def _gqa_group_size(f: BaseFacts) -> list[Finding]:
    if f.heads % f.kv:
        return [Finding("gqa-group-size", ERROR,
                        f"num_attention_heads {f.heads} is not a multiple of num_key_value_heads {f.kv}",
                        "the config is inconsistent; use the model's original config.json")]
    return _xqa_group_findings(f.heads // f.kv, f.head_size)


@base_rule("rope-scaling-unsupported", "rope-scaling-unverified")
def _rope_scaling(f: BaseFacts) -> list[Finding]:
    out: list[Finding] = []
    scaling = f.hf.rope_scaling
    if scaling:
        kind = _ROPE_ALIASES.get(scaling.get("type"), scaling.get("type"))
        if kind not in TRTLLM_ROPE_SCALING:
            out.append(
                Finding(
                    "rope-scaling-unsupported",
                    ERROR,
                    f"rope scaling type {kind!r} is not implemented by TensorRT-LLM 1.2.x",
                    "supported types: " + ", ".join(TRTLLM_ROPE_SCALING),
                )
            )
        elif kind not in ("linear", "llama3"):
            out.append(
                Finding(
                    "rope-scaling-unverified",
                    WARNING,
                    f"rope scaling type {kind!r} is converted whole, but the CPU reference "
                    "executor implements only linear and llama3, so `verify` cannot prove it",
                    "validate on GPU (scripts/validate_on_gpu.sh)",
                )
            )
    return out


@base_rule("attention-scale")
def _attention_scale(f: BaseFacts) -> list[Finding]:
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


@base_rule("sliding-window")
def _sliding_window(f: BaseFacts) -> list[Finding]:
    hf, out = f.hf, []
    window = hf.get("sliding_window")
    max_pos = hf.get("max_position_embeddings") or 0
    uses_window = window and (hf.get("use_sliding_window", True) is not False) and window < max_pos
    if uses_window:
        out.append(
            Finding(
                "sliding-window",
                WARNING,
                f"sliding-window attention (window {window} < max_position_embeddings {max_pos}); "
                "the precompiled XQA spec-decoding kernels refuse a cyclic KV cache "
                "(decoderXQAImplPrecompiled.cpp), and some 1.x JIT kernels refuse a window with Medusa",
                f"build with max_seq_len <= {window}: the window then never applies and the output "
                "equals the base model's (verify also runs within the window)",
            )
        )
    return out


def learned_position_range(hf: HFConfig, adapter: ArchAdapter | None, max_seq_len: int | None,
                           tree_depth: int) -> list[Finding]:
    """A base with learned absolute positions has no position past its table: each generation step puts tree
    tokens up to ``tree_depth`` past the root, so a sequence may reach ``max_seq_len - 1 + tree_depth``
    (tensorrt_llm/models/gpt/model.py looks ``position_ids`` up in ``position_embedding``; an id past its rows reads
    no row of the model). trtllm-build's default ``max_seq_len`` is ``max_position_embeddings``
    (tensorrt_llm/commands/build.py), so the default alone runs the last steps past the table."""
    if adapter is None or adapter.position_embedding is not PositionEmbedding.LEARNED_ABSOLUTE:
        return []
    table = adapter.max_positions(hf)
    limit = table - tree_depth
    if max_seq_len is not None and max_seq_len <= limit:
        return []
    given = max_seq_len is not None
    return [Finding(
        "learned-position-range", ERROR if given else WARNING,
        (f"--max_seq_len {max_seq_len}" if given else f"trtllm-build's default max_seq_len ({table}, the table)")
        + f" with a tree {tree_depth} deep puts tree tokens at positions up to "
        f"{(max_seq_len if given else table) - 1 + tree_depth}, past the learned position table's {table} rows "
        f"({adapter.max_positions_key}): those tokens would be embedded at no position of the model",
        f"build with --max_seq_len {limit} or less (trtllm-medusa build passes it through)")]


@base_rule("gelu-approximation")
def _gelu_approximation(f: BaseFacts) -> list[Finding]:
    out = []
    if f.adapter.exact_gelu(f.hf):
        out.append(
            Finding(
                "gelu-approximation",
                WARNING,
                "this base uses the exact (erf) GELU; TensorRT-LLM's gelu is the tanh approximation "
                "(tensorrt_llm/functional.py), so the engine's logits differ slightly from transformers' "
                "with or without Medusa",
                "nothing to convert differently; `verify` compares against transformers with the same "
                "approximation and reports the size of the effect",
            )
        )
    return out


@base_rule("attention-softcapping")
def _attention_softcapping(f: BaseFacts) -> list[Finding]:
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


@base_rule("spec-decoding-plumbing")
def _spec_decoding_plumbing(f: BaseFacts) -> list[Finding]:
    adapter, out = f.adapter, []
    if not adapter.upstream_spec_decoding_plumbing:
        out.append(
            Finding(
                "spec-decoding-plumbing",
                INFO,
                f"upstream {adapter.trtllm_base_class} does not pass spec_decoding_params to its "
                "attention layers; plain trtllm-build cannot build Medusa over it",
                "build with `trtllm-medusa build` (our engine adapter adds the plumbing)",
            )
        )
    return out


@base_rule("medusa-head-activation")
def _medusa_head_activation(f: BaseFacts) -> list[Finding]:
    hf, out = f.hf, []
    key = f.adapter.activation_key if f.adapter is not None else "hidden_act"  # GPT-2: activation_function
    act = hf.get(key) or hf.get("hidden_act")
    if act not in (None, "silu") or hf.get("hidden_activation"):
        out.append(
            Finding(
                "medusa-head-activation",
                INFO,
                f"the base's activation is {act or hf.get('hidden_activation')!r}; "
                "Medusa heads use SiLU, and upstream MedusaForCausalLM would give them the base's",
                "the converter writes medusa_hidden_act = silu; build with `trtllm-medusa build`",
            )
        )
    return out


def check_heads(hf: HFConfig, heads: MedusaHeads, num_medusa_heads: int | None = None, dtype: str | None = None) -> list[Finding]:
    out: list[Finding] = []
    hidden = hf.get("hidden_size", hf.get("d_model", hf.get("n_embd")))
    vocab = hf.get("vocab_size")
    if hidden is not None and heads.hidden_size != hidden:
        out.append(
            Finding(
                "heads-hidden-size",
                ERROR,
                f"the heads' hidden size is {heads.hidden_size}, the base's hidden_size is {hidden}",
                "these heads were trained for another base model; pass the matching --medusa_model_dir",
            )
        )
    if vocab is not None and heads.vocab_size is not None and heads.vocab_size != vocab:
        out.append(
            Finding(
                "heads-vocab-size",
                ERROR,
                f"the heads project to {heads.vocab_size} tokens, the base's vocab_size is {vocab}",
                "these heads were trained for another tokenizer; pass the matching heads",
            )
        )
    if heads.token_map is not None:
        out.append(
            Finding(
                "heads-truncated-vocab",
                WARNING,
                f"the heads guess only {heads.token_map.shape[0]} of {vocab} tokens (vLLM token_map); "
                "the converter scatters them into the full vocabulary with zero rows elsewhere",
                "nothing to do: greedy output stays the base's; acceptance is what the heads give",
            )
        )
    if num_medusa_heads is not None and num_medusa_heads != heads.num_heads:
        out.append(
            Finding(
                "heads-count",
                ERROR,
                f"--num_medusa_heads {num_medusa_heads} but the checkpoint holds {heads.num_heads} heads",
                "omit --num_medusa_heads: it is read from the heads",
            )
        )
    if dtype and dtype != "auto" and heads.dtype_name != dtype:
        out.append(
            Finding(
                "heads-dtype",
                INFO,
                f"the heads are stored as {heads.dtype_name} and will be cast to {dtype}",
                "nothing to do",
            )
        )
    for w in heads.warnings:
        out.append(Finding("heads-checkpoint", WARNING, w, "see docs/heads.md"))
    return out


#: the largest finite float16 value
FLOAT16_MAX = 65504.0


def activation_range_finding(max_activation: float, where: str, dtype: str | None) -> Finding:
    """What the measured activation range means for the serving dtype."""
    if max_activation <= FLOAT16_MAX:
        return Finding("float16-range", INFO, f"the largest activation on the prompts is {max_activation:.3g} "
                       f"({where}), within float16's range", "nothing to do")
    msg = (f"activations reach {max_activation:.3g} on the prompts ({where}), beyond float16's {FLOAT16_MAX:g}: "
           "a float16 engine computes inf/NaN there")
    if dtype in ("bfloat16", "float32"):
        return Finding("float16-range", INFO, msg, f"nothing to do in {dtype}")
    return Finding("float16-range", ERROR if dtype == "float16" else WARNING, msg,
                   "serve in bfloat16 (--dtype bfloat16)")


def check_tree(spec: str, num_heads: int | None, max_draft_len: int | None) -> list[Finding]:
    try:
        paths, pruned = resolve_choices(spec, num_heads)
    except PortError as exc:
        return [Finding("tree-invalid", ERROR, exc.what, exc.fix or "")]
    out: list[Finding] = []
    if pruned:
        out.append(Finding("tree-pruned", WARNING, pruned,
                           # examples/run.py parses --medusa_choices with ast.literal_eval: a literal list only
                           "give TensorRT-LLM's run.py the pruned tree as a literal list: --medusa_choices "
                           f"\"$(trtllm-medusa tree --choices {spec} --num_medusa_heads {num_heads} --json "
                           "| jq -c .paths)\" (run.py reads it with ast.literal_eval; a preset name fails there)"))
    for problem in validate_choices(paths, top_k=DEFAULT_TOP_K):
        out.append(Finding("tree-invalid" if "index" not in problem else "tree-index-range", ERROR, problem,
                           "fix the tree: every prefix must be a node, indices 0..9"))
    if num_heads is not None:
        deep = [p for p in paths if len(p) > num_heads]
        if deep:
            out.append(
                Finding(
                    "tree-deeper-than-heads",
                    ERROR,
                    f"path {deep[0]} has depth {len(deep[0])} but there are {num_heads} Medusa heads",
                    "drop the paths deeper than the heads (presets are pruned for you), or use more heads",
                )
            )
    unique = {tuple(p) for p in paths}
    if max_draft_len is not None and len(unique) > max_draft_len:
        out.append(
            Finding(
                "tree-too-many-nodes",
                ERROR,
                f"the tree has {len(unique)} nodes but max_draft_len is {max_draft_len}",
                f"convert with --max_medusa_token_len {len(unique)} or more, or prune the tree",
            )
        )
    for q in upstream_quirks(paths):
        out.append(Finding("tree-depth1-gaps", WARNING, q,
                           "serve with the default C++ runtime, or renumber the depth-1 indices 0..k-1"))
    return out


def _shape(hf: HFConfig, adapter: ArchAdapter | None) -> tuple[int, int, int, int, int]:
    """(heads, kv heads, intermediate, hidden, layers); zeros where unknown."""
    if adapter is not None:
        try:
            return (adapter.num_attention_heads(hf), adapter.num_kv_heads(hf), adapter.intermediate_size(hf),
                    adapter.hidden_size(hf), adapter.num_hf_layers(hf))
        except PortError:
            pass
    nh = hf.get("num_attention_heads") or 0
    return (nh, hf.get("num_key_value_heads") or nh, hf.get("intermediate_size") or 0,
            hf.get("hidden_size") or 0, hf.get("num_hidden_layers") or 0)


def check_parallel(
    hf: HFConfig,
    adapter: ArchAdapter | None,
    tp_size: int,
    pp_size: int,
    heads: MedusaHeads | None = None,
    use_parallel_embedding: bool = False,
    embedding_sharding_dim: int = 0,
) -> list[Finding]:
    out: list[Finding] = []
    if tp_size < 1 or pp_size < 1:
        return [Finding("parallel-size", ERROR, f"tp_size {tp_size} / pp_size {pp_size} must be >= 1", "use positive sizes")]
    nh, kv, inter, hidden, layers = _shape(hf, adapter)
    vocab = hf.get("vocab_size") or 0
    if nh and nh % tp_size:
        out.append(Finding("tp-attention-heads", ERROR, f"num_attention_heads {nh} is not divisible by tp_size {tp_size}",
                           f"use a tp_size that divides {nh}"))
    if kv and tp_size > 1:
        if kv >= tp_size and kv % tp_size:
            out.append(Finding("tp-kv-heads", ERROR, f"num_key_value_heads {kv} is not divisible by tp_size {tp_size}",
                               f"use a tp_size that divides {kv}, or a multiple of it"))
        elif kv < tp_size and tp_size % kv:
            out.append(Finding("tp-kv-heads", ERROR, f"tp_size {tp_size} is not a multiple of num_key_value_heads {kv}",
                               f"use a tp_size that is a multiple of {kv}"))
        elif kv < tp_size:
            out.append(Finding("tp-kv-replication", INFO,
                               f"{kv} KV head(s) for tp_size {tp_size}: each KV head is replicated on {tp_size // kv} ranks",
                               "nothing to do (TensorRT-LLM's dup_kv_weight behaviour)"))
    if inter and inter % tp_size:
        out.append(Finding("tp-intermediate-size", ERROR, f"intermediate_size {inter} is not divisible by tp_size {tp_size}",
                           f"use a tp_size that divides {inter}"))
    if hidden and hidden % tp_size:
        out.append(Finding("tp-hidden-size", ERROR, f"hidden_size {hidden} is not divisible by tp_size {tp_size} "
                           "(Medusa ResBlocks are column-parallel hidden -> hidden)", f"use a tp_size that divides {hidden}"))
    if use_parallel_embedding and embedding_sharding_dim == 1 and hidden and hidden % tp_size:
        out.append(Finding("tp-embedding", ERROR, f"embedding_sharding_dim 1 needs hidden_size {hidden} divisible by tp_size",
                           "use --embedding_sharding_dim 0"))
    if vocab and tp_size > 1 and vocab % tp_size:
        padded = Mapping(tp_size, pp_size).padded_vocab(vocab)
        out.append(Finding("vocab-padding", INFO, f"vocab_size {vocab} is padded to {padded} for tp_size {tp_size} "
                           "(zero rows in lm_head and the heads' lm_heads)", "nothing to do"))
    if pp_size > 1 and adapter is not None and not adapter.engine_pipeline_parallel:
        out.append(Finding(
            "engine-pipeline-parallel", ERROR,
            f"TensorRT-LLM's {adapter.trtllm_base_class} has no pipeline parallelism: it builds the embedding, "
            "ln_f and lm_head on every stage (or uses them there) and never sends hidden states between stages "
            f"(tensorrt_llm/models/{adapter.trtllm_module}/model.py), so pp_size {pp_size} cannot be built",
            "use --pp_size 1 (tensor parallelism works)"))
    if layers and pp_size > layers:
        out.append(Finding("pp-layers", ERROR, f"pp_size {pp_size} exceeds the {layers} layers", f"use pp_size <= {layers}"))
    elif layers and layers % pp_size:
        out.append(Finding("pp-layers", WARNING, f"{layers} layers do not divide by pp_size {pp_size}: the first "
                           f"{layers % pp_size} stage(s) take one extra layer (Mapping.pp_layers); TensorRT-LLM's "
                           "Python GenerationSession asserts an even split", "prefer a pp_size that divides the layer count"))
    if adapter is not None:
        out += [Finding("engine-tp-unconfirmed", WARNING, problem, fix)
                for problem, fix in adapter.parallel_warnings(hf, tp_size)]
    return out


def _quantized_float32(quantization, dtype: str | None) -> list[Finding]:
    """convert refuses a quantized float32 checkpoint (convert.py): a check must not say COMPATIBLE for it."""
    if dtype != "float32":
        return []
    return [Finding("dtype-float32", ERROR,
                    f"{quantization.quant_algo or quantization.kv_cache_quant_algo} from a float32 checkpoint: "
                    "TensorRT-LLM serves quantized Medusa engines in float16 or bfloat16 (and refuses float32 with "
                    "speculative decoding), so convert refuses it", "pass --dtype float16 or bfloat16")]


def check_conversion(
    hf: HFConfig,
    *,
    adapter: ArchAdapter | None,
    heads: MedusaHeads | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    max_draft_len: int | None = 63,
    medusa_choices: str | None = None,
    use_parallel_embedding: bool = False,
    embedding_sharding_dim: int = 0,
    num_medusa_heads: int | None = None,
    dtype: str | None = None,
    quantization=None,
) -> list[Finding]:
    out = check_base(hf, adapter)
    if quantization is not None and quantization.any and adapter is not None:
        from trtllm_medusa_ports.quant.rules import check_quantization

        out += check_quantization(hf, adapter, quantization, tp_size) + _quantized_float32(quantization, dtype)
    if adapter is not None or alibi_reason(hf) is None:
        out += check_parallel(hf, adapter, tp_size, pp_size, heads, use_parallel_embedding, embedding_sharding_dim)
    if heads is not None:
        out += check_heads(hf, heads, num_medusa_heads, dtype)
    if dtype == "float32":
        out.append(
            Finding(
                "dtype-float32",
                WARNING,
                "TensorRT-LLM refuses float32 with speculative decoding when the engine starts "
                "('Speculative decoding mode doesn't support the data type', attentionOp.cpp): a "
                "float32 checkpoint is good for CPU verification, not for serving",
                "convert with --dtype float16 or bfloat16 to serve",
            )
        )
    if dtype == "float16" and adapter is not None and adapter.float16_unsafe:
        out.append(Finding(
            "float16-range", WARNING,
            f"{adapter.family} models are published in bfloat16 and their hidden states exceed float16's range "
            "(65504): a float16 engine would compute inf/NaN",
            "convert with --dtype bfloat16; `verify` (or `check --prompt_ids ...`) measures the range"))
    if medusa_choices:
        out += check_tree(medusa_choices, heads.num_heads if heads else num_medusa_heads, max_draft_len)
    out.append(
        Finding(
            "decoding-greedy-only",
            INFO,
            # examples/run.py asserts temperature == 1.0 and num_beams == 1 with --medusa_choices; the C++
            # MedusaDecodingLayer (cpp/tensorrt_llm/layers/medusaDecodingLayer.cpp) draws root and draft tokens
            # with batched top-K sampling, K = 1 by default (argmax), and the Medusa decoding mode enables no
            # temperature or penalties
            "TensorRT-LLM's Medusa accepts draft tokens only where they equal the base's top-1 token (top-K "
            "sampling with K = 1, no temperature) and has no beam search; its output equals the base model's "
            "greedy output",
            "run with beam width 1, top_k 1 and --temperature 1.0 (run.py asserts 1.0 with --medusa_choices; "
            "Medusa ignores it)",
        )
    )
    return out


def check(
    model_dir: str | Path,
    medusa_model_dir: str | Path | None = None,
    *,
    medusa_choices: str | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    max_draft_len: int | None = 63,
    dtype: str | None = None,
    num_medusa_heads: int | None = None,
    quantization=None,
) -> tuple[str, list[Finding]]:
    """Python API: ``(architecture, findings)`` for a base model and optional heads."""
    hf = HFConfig.read(model_dir)
    arch = (hf.get("architectures") or ["(none)"])[0]
    adapter = adapter_for(arch)
    heads = None
    findings: list[Finding] = []
    problems: list[str] = []
    try:
        if adapter is not None:
            adapter.require_sizes(hf)  # a missing size named, not transformers' default compared with the weights
        if weight_files(Path(model_dir)):  # a config.json alone is checked without weights
            problems = HFModel(model_dir).weight_problems(adapter.ignored_hf_tensors if adapter else ())
    except PortError as exc:
        problems = [exc.what]
    if problems:
        findings.append(Finding("weights-config-mismatch", ERROR,
                                f"{len(problems)} base tensor(s) contradict config.json, e.g. " + "; ".join(problems[:3]),
                                "the weights and config.json belong to different models, or the weights are damaged"))
    if medusa_model_dir is not None:
        try:
            heads = load_heads(medusa_model_dir)
        except PortError as exc:
            findings.append(Finding("heads-unreadable", ERROR, str(exc.where or "") + ": " + exc.what, exc.fix or ""))
    findings = (
        check_conversion(
            hf,
            adapter=adapter,
            heads=heads,
            tp_size=tp_size,
            pp_size=pp_size,
            max_draft_len=max_draft_len,
            medusa_choices=medusa_choices,
            num_medusa_heads=num_medusa_heads,
            dtype=dtype,
            quantization=quantization,
        )
        + findings
    )
    return arch, findings
