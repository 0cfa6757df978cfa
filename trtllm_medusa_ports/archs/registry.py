"""The family registry: adapters register by their Hugging Face architecture names, and the family-wide
test data is derived from what they declare."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtllm_medusa_ports.archs.base import ArchAdapter

_REGISTRY: dict[str, type[ArchAdapter]] = {}


def register(cls: type[ArchAdapter]) -> type[ArchAdapter]:
    """Class decorator: make an adapter findable by its HF architecture names."""
    for name in cls.hf_architectures:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise AssertionError(f"{name} registered twice ({_REGISTRY[name].__name__}, {cls.__name__})")
        _REGISTRY[name] = cls
    return cls


def registry() -> dict[str, type[ArchAdapter]]:
    # every family is registered by then: importing this module runs its package's __init__ first, which imports
    # each module of archs/ (no import of the package from here: archs/__init__ imports this module)
    return dict(_REGISTRY)


def tiny_configs() -> dict[str, dict]:
    """The tiny config each family's adapter declares (``tiny_config``), by its first HF architecture: the demo's
    and the tests' small models."""
    return {cls.hf_architectures[0]: cls.tiny_config for cls in dict.fromkeys(registry().values())
            if cls.__dict__.get("tiny_config")}


def families() -> dict[str, type[ArchAdapter]]:
    return {cls.family: cls for cls in registry().values()}


def adapter_for(architecture: str) -> ArchAdapter | None:
    cls = registry().get(architecture)
    return cls() if cls else None


def base_context(model_dir: str | Path) -> tuple[int, str] | None:
    """The base's context in tokens and the config.json key it is read from (the family's
    ``ArchAdapter.max_positions``); None where ``model_dir`` holds no
    config.json (a folder with a tokenizer only) or names no family and no ``max_position_embeddings``."""
    from trtllm_medusa_ports.errors import ModelError
    from trtllm_medusa_ports.files.hf_model import HFConfig

    if not (Path(model_dir) / "config.json").is_file():
        return None
    hf = HFConfig.read(model_dir)
    try:
        adapter = adapter_for(hf.architecture)
    except ModelError:  # no architectures: convert --model_type names the family
        adapter = None
    if adapter is not None:
        return adapter.max_positions(hf), adapter.max_positions_key
    value = hf.get("max_position_embeddings")
    return (value, "max_position_embeddings") if isinstance(value, int) and value > 0 else None


def adapter_for_model_type(model_type: str) -> ArchAdapter | None:
    for cls in registry().values():
        if model_type == cls.family or model_type in cls.model_types:
            return cls()
    return None


def supported_architectures() -> list[str]:
    return sorted(registry())


def own(cls: type, name: str, default=None):
    """A class attribute as ``cls`` itself declares it (not inherited from its parent family)."""
    return cls.__dict__.get(name, default)


def family_test_cases() -> dict[str, list]:
    """The family-wide test data, derived from the adapters (so adding a family adds its tests):

    * ``variants``: ``(architecture, overrides)`` of every class's own ``test_variants``;
    * ``key_cases``: ``(architecture, tiny architecture, values)`` for every architecture name of a class
      declaring ``key_cases`` (aliases such as ``RWForCausalLM`` use the class's tiny model);
    * ``pipeline``: architectures verified at pp 2; ``no_pipeline``: those whose engine class has none;
    * ``verdicts``: ``(architecture, error rules check gives its tiny model)``; ``unsupported``: those with any;
    * ``moe``: the mixture-of-experts architectures (an engine class reading ``moe``) with a tiny model;
    * ``check_cases``: ``(architecture, overrides, error rule)`` of every class's own ``check_cases``.
    """
    classes = list(dict.fromkeys(registry().values()))
    out: dict[str, list] = {"variants": [], "key_cases": [], "pipeline": [], "no_pipeline": [],
                            "verdicts": [], "unsupported": [], "moe": [], "check_cases": []}
    for cls in classes:
        primary = cls.hf_architectures[0]
        out["variants"] += [(primary, dict(v)) for v in own(cls, "test_variants", ())]
        out["check_cases"] += [(primary, dict(o), rule) for o, rule in own(cls, "check_cases", ())]
        keys = own(cls, "key_cases")
        if keys is not None:
            out["key_cases"] += [(arch, primary, dict(keys)) for arch in cls.hf_architectures]
        if own(cls, "pipeline_test", False):
            out["pipeline"].append(primary)
        if own(cls, "tiny_config") is not None:
            errors = own(cls, "expected_check_errors", frozenset())
            out["verdicts"].append((primary, set(errors)))
            if errors:
                out["unsupported"] += list(cls.hf_architectures)
        if not cls.engine_pipeline_parallel and own(cls, "tiny_config") is not None:
            out["no_pipeline"].append(primary)
        if "moe" in cls.engine_keys and own(cls, "tiny_config") is not None:
            out["moe"].append(primary)
    return out
