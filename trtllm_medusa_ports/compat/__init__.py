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

The package, one module per topic: ``positions`` (ALiBi, RoPE scaling, sliding windows, learned positions),
``xqa_kernels`` (head size, group size, q scaling, soft-capping), ``engine_class`` (what the family's TensorRT-LLM
class builds), ``heads``, ``parallelism``, ``trees``, ``dtypes``, ``serving`` (the memory plan's verdict),
``pytorch_backend`` (``check --backend pytorch``: EAGLE-3 on the PyTorch backend); ``registry`` (``@base_rule``) below them,
``base`` (the architecture and the base rules in report order) and ``conversion`` (``check_conversion``,
``check``) above them. The quantization rules are ``trtllm_medusa_ports/quant/rules.py``; the rules ``build``
re-checks live in ``engine/build.py``. Every rule id is registered in ``findings.RULES``, the one registry
docs/compatibility-rules.md is checked against (tests/test_compat.py).

May import: its own modules, ``findings`` and ``xqa`` (this file re-exports their public names; no compat module
imports it).
"""

from trtllm_medusa_ports.compat.base import BASE_RULES, check_base
from trtllm_medusa_ports.compat.conversion import check, check_conversion
from trtllm_medusa_ports.compat.dtypes import FLOAT16_MAX, activation_range_finding
from trtllm_medusa_ports.compat.heads import check_heads
from trtllm_medusa_ports.compat.parallelism import check_parallel
from trtllm_medusa_ports.compat.positions import (
    TRTLLM_ROPE_SCALING,
    alibi_reason,
    checkpoint_position_range,
    checkpoint_seq_limit,
    learned_position_range,
    learned_seq_limit,
    rope_context_range,
)
from trtllm_medusa_ports.compat.pytorch_backend import check_pytorch
from trtllm_medusa_ports.compat.registry import BaseFacts, base_rule
from trtllm_medusa_ports.compat.serving import serving_findings
from trtllm_medusa_ports.compat.trees import check_tree
from trtllm_medusa_ports.findings import ERROR, INFO, RULES, WARNING, Finding, errors_of
from trtllm_medusa_ports.gpu.xqa import (
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
    xqa_environment,
    xqa_medusa_route,
    xqa_serving_routes,
)

__all__ = [
    "BASE_RULES", "ERROR", "FLOAT16_MAX", "INFO", "RULES", "TRTLLM_ROPE_SCALING", "WARNING",
    "XQA_HOPPER_JIT_MAX_GROUP", "XQA_JIT_ENV", "XQA_JIT_HMMA_TOKENS_PER_BLOCK", "XQA_JIT_MAX_GROUP",
    "XQA_JIT_QGMMA_TOKENS_PER_BLOCK", "XQA_PRECOMPILED_MEDUSA_HEAD_SIZES", "XQA_PRECOMPILED_TOKENS_PER_BLOCK",
    "XQA_ROUTE_SMS", "BaseFacts", "Finding", "XqaRoute", "activation_range_finding", "alibi_reason", "base_rule",
    "check", "check_base", "check_pytorch", "check_conversion", "check_heads", "check_parallel", "check_tree", "describe_xqa_routes",
    "errors_of", "checkpoint_position_range", "checkpoint_seq_limit", "learned_position_range", "learned_seq_limit", "rope_context_range", "serving_findings", "sm_names", "xqa_environment", "xqa_medusa_route",
    "xqa_serving_routes",
]
