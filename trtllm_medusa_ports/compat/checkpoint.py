"""The rules judged from a written checkpoint's config.json: what ``trtllm-medusa build`` refuses before TensorRT-LLM
is reached, and what ``verify`` counts against its verdict (float32 with speculative decoding, ALiBi, a float16
checkpoint of a base known to leave float16's range, no Medusa heads).

May import: ``archs``, ``findings``.
"""

from __future__ import annotations

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.findings import ERROR, Finding


def uses_alibi(cfg: dict) -> bool:
    """From the TensorRT-LLM config itself: its ``position_embedding_type``, or a base class that
    applies ALiBi whatever that field says (Bloom, MPT: tensorrt_llm/models/{bloom,mpt}/model.py)."""
    if str(cfg.get("position_embedding_type", "")).startswith("alibi"):
        return True
    adapter = adapter_for(str(cfg.get("base_architecture") or cfg.get("architecture")))
    return adapter is not None and adapter.position_embedding is PositionEmbedding.ALIBI


def checkpoint_findings(cfg: dict, allow_unsupported: bool = False) -> list[Finding]:
    """The rules that can be judged from a converted checkpoint's config.json: what ``build`` refuses and ``verify``
    counts against its verdict (a checkpoint no engine serves is not OK)."""
    out = []
    overflow = [w for w in (cfg.get("medusa_ports") or {}).get("warnings", []) if w.startswith("[float16-range]")]
    if overflow and cfg.get("dtype") == "float16" and not allow_unsupported:
        out.append(Finding("float16-range", ERROR,
                           "the checkpoint is float16 and its base is known to exceed float16's range: "
                           + overflow[0].removeprefix("[float16-range] "),
                           "convert again with --dtype bfloat16, or build anyway with --allow_unsupported"))
    if uses_alibi(cfg):
        out.append(Finding("alibi-position-embedding", ERROR,
                           "the checkpoint uses ALiBi, which the XQA spec-decoding kernels do not implement",
                           "use a RoPE base; this checkpoint was written with --allow_unsupported"))
    if not cfg.get("num_medusa_heads"):
        out.append(Finding("not-medusa", ERROR, "config.json has no num_medusa_heads",
                           "convert with trtllm-medusa convert --medusa_model_dir ..."))
    if cfg.get("dtype") == "float32":
        out.append(Finding("dtype-float32", ERROR, "TensorRT-LLM refuses float32 with speculative decoding",
                           "convert with --dtype float16 or bfloat16"))
    return out
