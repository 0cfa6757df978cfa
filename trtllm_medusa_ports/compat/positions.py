"""Position rules: ALiBi (which no XQA kernel of a Medusa engine computes), RoPE scaling types, sliding
windows, and the learned position table's range against a tree's depth.

May import: ``compat.registry``, ``findings``, ``errors``, ``archs``, ``files.hf_model``, ``files.checkpoint_schema``.
"""

from __future__ import annotations

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import adapter_for, adapter_for_model_type
from trtllm_medusa_ports.archs.semantics import (
    PositionEmbedding,
    yarn_engine_mscale,
    yarn_get_mscale,
)
from trtllm_medusa_ports.compat.registry import BaseFacts, base_rule
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.checkpoint_schema import ROTARY_SCALING_TYPES, rotary_scaling_kind
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, WARNING, Finding

#: rope scaling types TensorRT-LLM 1.2.x implements: the names tensorrt_llm/functional.py RotaryScalingType.from_string
#: takes (a plain lookup: any other name, "su" and "default" included, raises ValueError when the model is built)
TRTLLM_ROPE_SCALING = tuple(t for t in ROTARY_SCALING_TYPES if t != "none")


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


def alibi_finding(reason: str, served: tuple[str, ...]) -> Finding:
    """The ALiBi refusal; ``served``: the rotary families check passes (compat/base.py served_rope_families)."""
    return Finding(
        "alibi-position-embedding",
        ERROR,
        f"this base uses ALiBi ({reason}). With Medusa, TensorRT-LLM runs every generation "
        "step's attention on XQA kernels, which have no ALiBi: the 1.x JIT kernels refuse it "
        "(decoderXQAImplJIT supportConfigCommon takes RoPE and learned positions only), so the engine "
        "fails at run time with 'No available XQA kernels are found for speculative decoding mode' "
        "(attentionOp.cpp); only the precompiled kernels, chosen when the group size does not divide 64, "
        "run and drop the slopes silently - the 'very poor accuracy' Bloom reports.",
        f"use a RoPE or learned-position base ({', '.join(served)} ...), serve this model without Medusa, or "
        "use a framework whose tree attention supports ALiBi. --allow_unsupported writes the checkpoint anyway "
        "for experiments.",
        overridable=True,
    )


#: the scaling types the reference executor computes (reference/rope.py), so that verify proves them
VERIFIED_ROPE_SCALING = ("linear", "llama3", "longrope", "yarn")


@base_rule("rope-scaling-unsupported", "rope-scaling-unverified", "longrope-table-per-request", "rope-scaling-yarn-option")
def rope_scaling(f: BaseFacts) -> list[Finding]:
    """Judges the scaling as the checkpoint's config.json will carry it (the family's converter may rename it, as
    Phi-3's writes "su" as long_rope, or drop it), parsed as the engine parses it."""
    scaling = f.hf.rope_scaling
    if not scaling or not f.adapter.position_embedding.is_rope:
        return []
    cfg = f.adapter.engine_config(f.hf)  # what the converter refuses is check_base's invalid-config
    if cfg.get("position_embedding_type") == "long_rope":
        return [_longrope_finding(f.hf)]
    written = cfg.get("rotary_scaling")
    if written is None:
        return []  # the family's engine class reads no scaling: its engine limits say so
    spelled = scaling.get("type")
    kind = rotary_scaling_kind(written)
    if kind not in TRTLLM_ROPE_SCALING:
        return [Finding(
            "rope-scaling-unsupported",
            ERROR,
            f"rope scaling type {spelled!r} (config.json's rope_scaling) is not a type TensorRT-LLM 1.2.x knows: "
            f"the checkpoint would carry rotary_scaling.type {kind!r}, and trtllm-build fails building the model "
            f"(tensorrt_llm/functional.py RotaryScalingType.from_string: 'Unsupported rotary scaling type: {kind}')",
            "supported types: " + ", ".join(TRTLLM_ROPE_SCALING) + " (spelled exactly so)",
        )]
    if kind == "longrope":
        return [Finding(
            "rope-scaling-unsupported",
            ERROR,
            f"rope scaling type 'longrope' on a {cfg.get('position_embedding_type')} base: TensorRT-LLM builds the "
            "two longrope tables only for a long_rope position embedding, which only its Phi-3 classes write "
            "(tensorrt_llm/layers/attention.py create_attention_const_params); this engine would rotate with "
            "unscaled tables where transformers uses the longrope factors",
            "serve this base without Medusa, or convert it as a Phi-3 family base",
        )]
    if kind == "yarn":
        return _yarn_findings(scaling, written)
    if kind not in VERIFIED_ROPE_SCALING:
        why = {"dynamic": " (dynamic NTK: the engine's attention kernels rescale RoPE's base by the sequence length "
                          "as they run, update_rotary_base_n_scale in cpp/tensorrt_llm/kernels/"
                          "decoderMaskedMultiheadAttention/decoderMaskedMultiheadAttentionUtils.h, which the "
                          "executor does not model)"}.get(kind, "")
        return [Finding(
            "rope-scaling-unverified",
            WARNING,
            f"rope scaling type {kind!r} is converted whole, but the CPU reference "
            f"executor implements only {', '.join(VERIFIED_ROPE_SCALING)}{why}, so `verify` refuses it",
            "validate on GPU (scripts/validate_on_gpu.sh)",
        )]
    return []


def _yarn_findings(read: dict, written: dict) -> list[Finding]:
    """YaRN options transformers reads otherwise than the engine (transformers' modeling_rope_utils.py
    ``_compute_yarn_parameters`` against tensorrt_llm/layers/attention.py ``create_attention_const_params`` and
    ``RopeEmbeddingUtils.create_sinusoidal_positions_yarn``): ``read`` is config.json's scaling, ``written`` the
    checkpoint's ``rotary_scaling``."""
    problems = []
    factor = read.get("factor")
    if factor is None:
        problems.append("factor is not given: transformers derives it as max_position_embeddings / "
                        "original_max_position_embeddings, the engine reads 1.0")
    if written.get("original_max_position_embeddings") is None:
        problems.append("original_max_position_embeddings is not given: the engine reads 4096")
    if read.get("truncate") is False:
        problems.append("truncate is false: transformers keeps the correction range unrounded, the engine floors and "
                        "ceils it")
    for beta, default in (("beta_fast", 32), ("beta_slow", 1)):
        if beta in read and read[beta] is not None and not read[beta]:
            problems.append(f"{beta} is {read[beta]!r}: transformers reads {default} in its place, the engine "
                            f"{read[beta]!r}")
    if factor is not None:
        engine = yarn_engine_mscale(written)
        if read.get("attention_factor") is not None:
            hf, source = float(read["attention_factor"]), f"attention_factor {read['attention_factor']}"
        elif read.get("mscale") and read.get("mscale_all_dim"):
            hf = yarn_get_mscale(float(factor), float(read["mscale"])) / yarn_get_mscale(
                float(factor), float(read["mscale_all_dim"]))
            source = "mscale / mscale_all_dim"
        else:
            hf = yarn_get_mscale(float(factor))
            source = "0.1 ln(factor) + 1" + (", mscale and mscale_all_dim unused unless both are given"
                                             if read.get("mscale") or read.get("mscale_all_dim") else "")
        if abs(hf - engine) > 1e-9 * max(1.0, abs(hf)):
            problems.append(f"the cos / sin scale: transformers {hf:.6g} ({source}), the engine {engine:.6g} "
                            "(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), mscale 1 and "
                            "mscale_all_dim 0 where not given)")
    if not problems:
        return []
    return [Finding(
        "rope-scaling-yarn-option",
        ERROR,
        "yarn: TensorRT-LLM computes this base's YaRN otherwise than transformers: " + "; ".join(problems),
        "write the options so that both read them alike (e.g. give factor and original_max_position_embeddings "
        "in rope_scaling, mscale and mscale_all_dim both or neither, no attention_factor the engine does not read), or "
        "serve this base without Medusa; --allow_unsupported writes the checkpoint anyway (verify, which computes "
        "the engine's YaRN, then fails where the two differ)",
        overridable=True,
    )]


#: the max draft length a Medusa checkpoint gets unless --max_draft_len says otherwise (convert's default, as
#: upstream's examples/medusa/convert_checkpoint.py --max_medusa_token_len): the generation steps' compared length
DEFAULT_MAX_DRAFT_LEN = 63


def _longrope_finding(hf: HFConfig) -> Finding:
    original = hf.rope_original_max_positions
    window = original - DEFAULT_MAX_DRAFT_LEN if isinstance(original, int) else None
    return Finding(
        "longrope-table-per-request",
        WARNING,
        f"longrope: the engine builds a short and a long RoPE table and its attention plugin picks one per phase of "
        f"each step, the long one when the longest length the batch manager gives it exceeds "
        f"original_max_position_embeddings ({original}) (gptAttentionPlugin.cpp useLongRoPECache): for a context "
        "step the tokens it computes (the whole prompt; with chunked context or KV cache block reuse, on by default, "
        "only the chunk computed), for a generation step the prompt plus the engine's max draft length (max_draft_len, "
        "whatever the tree; runtimeBuffers.cpp setFromInputs). So a prompt within original_max_position_embeddings - "
        "max_draft_len runs short throughout; a longer prompt within the original length writes its keys with the "
        "short table and generates on the long one (neither transformers' model nor one table); a prompt past it "
        "computed in chunks writes short keys; requests batched in one phase share the longest length",
        f"outputs equal transformers' while the prompt stays within original_max_position_embeddings - max_draft_len "
        f"({window} at the default max_draft_len {DEFAULT_MAX_DRAFT_LEN}) and the sequence within {original}; verify "
        f"runs there, every tree node proven. Build with --max_seq_len {original} where equality with transformers "
        "matters, and keep prompts within that window (a smaller --max_draft_len widens it)",
    )
@base_rule("sliding-window")
def sliding_window(f: BaseFacts) -> list[Finding]:
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
    return position_range(adapter.max_positions(hf), adapter.max_positions_key, max_seq_len, tree_depth,
                          ERROR if max_seq_len is not None else WARNING)


def rope_context_range(hf: HFConfig, adapter: ArchAdapter | None, max_seq_len: int | None,
                       tree_depth: int) -> list[Finding]:
    """A rotary base asked to serve sequences (their tree tokens included) past the context config.json gives
    (``max_position_embeddings``): the engine computes a rotation for any position, so it builds, but the base
    never saw those positions (the context a RoPE scaling extends is the one config.json states where the scaling
    is recorded with it, as transformers reads it). A warning: the verdict is the user's, the length is said."""
    if max_seq_len is None or adapter is None or not adapter.position_embedding.is_rope:
        return []
    try:
        context = adapter.max_positions(hf)
    except PortError:
        return []
    if max_seq_len - 1 + tree_depth < context:
        return []
    return [Finding("rope-context-range", WARNING,
                    f"--max_seq_len {max_seq_len} with a tree {tree_depth} deep reaches position "
                    f"{max_seq_len - 1 + tree_depth}, past the base's context ({adapter.max_positions_key} "
                    f"{context} in config.json): the engine builds, but the base was not trained on those positions "
                    "and may answer badly there",
                    f"serve with --max_seq_len {max(1, context - tree_depth)} or less, or a base (or RoPE scaling) "
                    "made for the longer context")]


def learned_seq_limit(table: int, tree_depth: int) -> int:
    """The largest ``max_seq_len`` whose tree tokens stay within a learned position table of ``table`` rows."""
    return table - tree_depth


def position_range(table: int, key: str, max_seq_len: int | None, tree_depth: int, severity: str) -> list[Finding]:
    """The learned-position-range finding (or none) for a table of ``table`` rows (config key ``key``): the rule
    check, deploy and build share; ``max_seq_len`` None is trtllm-build's default, the table."""
    limit = learned_seq_limit(table, tree_depth)
    if max_seq_len is not None and max_seq_len <= limit:
        return []
    given = max_seq_len is not None
    return [Finding(
        "learned-position-range", severity,
        (f"--max_seq_len {max_seq_len}" if given else f"trtllm-build's default max_seq_len ({table}, the table)")
        + f" with a tree {tree_depth} deep puts tree tokens at positions up to "
        f"{(max_seq_len if given else table) - 1 + tree_depth}, past the learned position table's {table} rows "
        f"({key}): those tokens would be embedded at no position of the model",
        f"build with --max_seq_len {limit} or less (trtllm-medusa build passes it through)")]


def _checkpoint_depth(cfg: dict) -> int:
    """The recorded tree's depth, else the heads' count (no tree with these heads is deeper)."""
    recorded = (cfg.get("medusa_ports") or {}).get("medusa_choices")
    return max(map(len, recorded)) if recorded else int(cfg.get("num_medusa_heads") or 0)


def _learned_table(cfg: dict) -> int | None:
    if cfg.get("position_embedding_type") != "learned_absolute" or not cfg.get("max_position_embeddings"):
        return None
    return int(cfg["max_position_embeddings"])


def checkpoint_seq_limit(cfg: dict) -> int | None:
    """The largest ``max_seq_len`` a converted learned-position checkpoint's tree stays within its table at, or None
    (no learned position table)."""
    table = _learned_table(cfg)
    return None if table is None else learned_seq_limit(table, _checkpoint_depth(cfg))


def checkpoint_position_range(cfg: dict, max_seq_len: int | None, tree_depth: int | None = None) -> list[Finding]:
    """:func:`position_range` from a converted checkpoint's config.json (``position_embedding_type``
    ``learned_absolute``, ``max_position_embeddings``), an error; ``tree_depth`` None: the recorded tree's depth,
    else the heads' count."""
    table = _learned_table(cfg)
    if table is None:
        return []
    return position_range(table, "max_position_embeddings", max_seq_len,
                          _checkpoint_depth(cfg) if tree_depth is None else tree_depth, ERROR)
