"""Base-model family adapters; importing this package registers every family."""

from trtllm_medusa_ports.archs import (  # noqa: F401  (registration side effects)
    bloom,
    falcon,
    gemma,
    gptneox,
    llama,
    mpt,
    phi,
    phi3,
    qwen2,
    qwen3,
    starcoder2,
)
from trtllm_medusa_ports.archs.base import (
    ArchAdapter,
    Semantics,
    WeightRule,
    adapter_for,
    adapter_for_model_type,
    families,
    register,
    registry,
    supported_architectures,
)

__all__ = [
    "ArchAdapter",
    "Semantics",
    "WeightRule",
    "adapter_for",
    "adapter_for_model_type",
    "families",
    "register",
    "registry",
    "supported_architectures",
]
