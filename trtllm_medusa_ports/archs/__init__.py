"""Base-model family adapters; importing this package registers every family."""

from trtllm_medusa_ports.archs import llama, qwen2  # noqa: F401  (registration side effects)
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
