"""Importable home of the engine classes (see registry.py): ``from ...classes import MedusaPortsGemmaForCausalLM``.

Attributes are built on first access, which imports TensorRT-LLM; importing this module alone
does not.
"""

from __future__ import annotations


def __getattr__(name: str) -> type:
    if name.startswith("MedusaPorts"):
        from trtllm_medusa_ports.engine.registry import ported_classes

        classes = ported_classes()
        if name in classes:
            return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
