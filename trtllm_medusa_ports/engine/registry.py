"""Our engine classes, one per TensorRT-LLM base class, built lazily and importable by name.

The converter writes ``architecture: MedusaPorts<TRT class>`` for checkpoints that upstream
``trtllm-build`` would not build correctly; the name is absent from
``tensorrt_llm.models.MODEL_MAP`` (tensorrt_llm/models/__init__.py), so plain ``trtllm-build``
stops instead of building a wrong engine. ``trtllm-medusa build`` hands the class to
upstream's ``parallel_build(..., model_cls=...)`` (tensorrt_llm/commands/build.py) and leaves
``MODEL_MAP`` alone.

The classes live in :mod:`trtllm_medusa_ports.engine.classes` under their own names, so that
``trtllm-build --workers N`` (which spawns processes and pickles the class and its config)
finds them again in a new process.
"""

from __future__ import annotations

from importlib import import_module

from trtllm_medusa_ports.archs import ArchAdapter
from trtllm_medusa_ports.archs import registry as arch_registry
from trtllm_medusa_ports.engine.installed import require_tensorrt_llm

CLASSES_MODULE = "trtllm_medusa_ports.engine.classes"

# built once per process and per tensorrt_llm module object (tests swap the stand-in in and out)
_BUILT: dict[int, dict[str, type]] = {}


def base_class(adapter: ArchAdapter) -> type:
    """The TensorRT-LLM base class an adapter names (tensorrt_llm/models/<module>/model.py)."""
    return getattr(import_module(f"tensorrt_llm.models.{adapter.trtllm_module}.model"), adapter.trtllm_base_class)


def ported_classes() -> dict[str, type]:
    """``MedusaPorts<TRT class>`` -> model class, and ``MedusaPorts<...>Config`` -> its config class."""
    from trtllm_medusa_ports.engine.medusa import medusa_class

    trtllm = require_tensorrt_llm()
    built = _BUILT.get(id(trtllm))
    if built is not None:
        return built
    built = {}
    failed: dict[str, str] = {}
    for adapter_cls in arch_registry().values():
        adapter = adapter_cls()
        name = adapter.ported_architecture()
        if name in built or name in failed:
            continue
        try:  # one family whose upstream class moved or changed must not block the others' builds
            cls = medusa_class(base_class(adapter),
                               plumbing_needed=not adapter.upstream_spec_decoding_plumbing, name=name)
        except Exception as exc:  # an import or attribute error inside TensorRT-LLM: kept for that family
            failed[name] = (f"tensorrt_llm.models.{adapter.trtllm_module}.model.{adapter.trtllm_base_class}: "
                            f"{type(exc).__name__}: {exc}")
            continue
        for c in (cls, cls.config_class):
            c.__module__ = CLASSES_MODULE
            built[c.__name__] = c
    _BUILT.clear()
    _BUILT[id(trtllm)] = built
    _FAILED.clear()
    _FAILED.update(failed)
    return built


#: ported architecture -> why its class could not be built on this TensorRT-LLM
_FAILED: dict[str, str] = {}


def ported_class(architecture: str) -> type | None:
    """Our model class for a checkpoint ``architecture``, or None when upstream's own class serves it."""
    if not architecture.startswith("MedusaPorts"):
        return None
    cls = ported_classes().get(architecture)
    if cls is None and architecture in _FAILED:
        from trtllm_medusa_ports.errors import CheckpointError

        raise CheckpointError(f"the engine class for {architecture} could not be built on this TensorRT-LLM "
                              f"({_FAILED[architecture]})",
                              fix="use TensorRT-LLM 1.2.x, the line the engine adapters follow (docs/engine.md)")
    return cls
