"""Base-model family adapters; importing this package registers every family.

May import: ``weights`` (the split rules), ``files`` (config reading), ``errors``; never a stage, the checks or
the executor (each of those reads the families).
"""

import importlib
import pkgutil

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import (
    adapter_for,
    adapter_for_model_type,
    families,
    register,
    registry,
    supported_architectures,
)
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.archs.weights import WeightRule

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

# Import every module of this package: a family module registers its adapters (``@register``); the
# vocabulary modules (base, weights, semantics, experts, registry) register nothing.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
