"""Base-model family adapters; importing this package registers every family."""

import importlib
import pkgutil

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

# Every module of this package but base.py is a family; importing it registers it.
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")
