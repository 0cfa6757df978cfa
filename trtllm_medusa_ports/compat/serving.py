"""Serving-size rules: the memory plan judged at ``--max_batch_size`` x ``--max_seq_len`` on a GPU of
``--gpu_memory_gb`` is part of the verdict (a plan that says DOES NOT FIT is not COMPATIBLE), and a
``--max_seq_len`` no engine can hold.

May import: ``findings`` only (the plan comes in as its ``to_dict()``).
"""

from __future__ import annotations

from trtllm_medusa_ports.findings import ERROR, WARNING, Finding

#: the runtime's sequence lengths and positions are int32 tensors (tensorrt_llm/runtime/generation.py:
#: ``sequence_length_buffer``, ``host_past_key_value_lengths``; the C++ runtime's SizeType32), and the engine
#: reserves max_draft_len tree slots past max_seq_len
INT32_MAX = 2**31 - 1


def serving_findings(plan: dict | None, max_seq_len: int | None, gpu_memory_gb: float | None) -> list[Finding]:
    """Findings of the serving sizes: ``plan`` is ``MemoryPlan.to_dict(batch, seq_len, gpu_memory_gb)`` or None."""
    out: list[Finding] = []
    draft = int(plan["max_draft_len"]) if plan else 0
    if max_seq_len is not None and max_seq_len + draft > INT32_MAX:
        out.append(Finding("serving-size", ERROR,
                           f"--max_seq_len {max_seq_len} (+{draft} tree slots) is past the int32 sequence lengths "
                           "and positions of TensorRT-LLM's runtime", f"pass --max_seq_len {INT32_MAX - draft} or "
                           "less (in practice the base's context: max_position_embeddings)"))
    if plan and plan.get("fits") is False and "total_bytes" in plan:
        worst = max(range(len(plan["total_bytes"])), key=lambda r: plan["total_bytes"][r])
        out.append(Finding("memory-does-not-fit", ERROR,
                           f"rank {worst} needs {plan['total_bytes'][worst] / 1e9:.3g} GB for weights and KV cache "
                           f"at batch {plan['batch']} x {plan['seq_len']} tokens, more than the "
                           f"{gpu_memory_gb:g} GB of --gpu_memory_gb (before activations and the runtime's workspace)",
                           "lower --max_batch_size or --max_seq_len, raise --tp_size / --pp_size, or quantize the "
                           "weights or the KV cache (--qformat, --kv_cache_dtype)"))
    elif plan and plan.get("fits") is False:  # --gpu_memory_gb without both serving sizes: the weights alone
        worst = max(range(len(plan["weight_bytes"])), key=lambda r: plan["weight_bytes"][r])
        out.append(Finding("memory-does-not-fit", ERROR,
                           f"rank {worst} needs {plan['weight_bytes'][worst] / 1e9:.3g} GB for its weights alone, "
                           f"more than the {gpu_memory_gb:g} GB of --gpu_memory_gb (the KV cache and activations "
                           "come on top)", "raise --tp_size / --pp_size, or quantize the weights (--qformat)"))
    elif plan and plan.get("fits") and "total_bytes" not in plan:
        out.append(Finding("memory-kv-not-judged", WARNING,
                           f"the weights fit {gpu_memory_gb:g} GB of --gpu_memory_gb, but the KV cache was not "
                           "judged (no --max_batch_size and --max_seq_len)",
                           "pass --max_batch_size and --max_seq_len to judge weights and KV cache together"))
    return out
