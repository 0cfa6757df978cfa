"""The checks a command runs: :func:`check_conversion` (every rule topic, in report order, as convert runs
them) and :func:`check` (``trtllm-medusa check``: the files read first).

May import: every compat module but the package's ``__init__``, ``quant.rules``, ``archs``, ``files``,
``heads``, ``findings``, ``errors``.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import adapter_for
from trtllm_medusa_ports.compat.base import check_base
from trtllm_medusa_ports.compat.dtypes import quantized_float32
from trtllm_medusa_ports.compat.heads import check_heads
from trtllm_medusa_ports.compat.parallelism import check_parallel
from trtllm_medusa_ports.compat.positions import alibi_reason
from trtllm_medusa_ports.compat.trees import check_tree
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.hf_model import HFConfig, HFModel
from trtllm_medusa_ports.files.lazy_tensors import weight_files
from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding
from trtllm_medusa_ports.heads import MedusaHeads, load_heads


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

        out += check_quantization(hf, adapter, quantization, tp_size) + quantized_float32(quantization, dtype)
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
    model = HFModel(model_dir) if weight_files(Path(model_dir)) else None  # a config.json alone: no weights
    if model is not None:
        # a weight file that cannot be read (missing, a link to nothing, a damaged header) is an input error
        # (exit 1) as in every other command, not a finding of the base: read before the judging
        model.tensors  # noqa: B018
    try:
        if adapter is not None:
            adapter.require_sizes(hf)  # a missing size named, not transformers' default compared with the weights
        if model is not None:
            problems = model.weight_problems(adapter.ignored_hf_tensors if adapter else (),
                                             adapter.expert_field_keys(hf) if adapter else None)
    except PortError as exc:  # config.json's own values against the weights: the finding below
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
