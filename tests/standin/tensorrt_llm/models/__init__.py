"""tensorrt_llm/models/__init__.py: the classes and the ``MODEL_MAP`` keys this project meets
(upstream's full map has many more; these names and targets are upstream's).

Upstream writes ``MODEL_MAP`` by hand; here it is assembled from each stand-in class's
``MODEL_MAP_KEYS`` (the names upstream maps to it), so that a family's stand-in is one folder
(``<upstream folder>/model.py``) and nothing else. Each class is also exported by name, as upstream's.
"""

import importlib
import pkgutil

from ..models.modeling_utils import PretrainedConfig, PretrainedModel

MODEL_MAP: dict = {}
__all__ = ["MODEL_MAP", "PretrainedConfig", "PretrainedModel"]

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.ispkg:
        continue
    _module = importlib.import_module(f"{__name__}.{_info.name}.model")
    for _obj in list(vars(_module).values()):
        _keys = _obj.__dict__.get("MODEL_MAP_KEYS") if isinstance(_obj, type) else None
        if not _keys or _obj.__module__ != _module.__name__:
            continue
        for _key in _keys:
            if _key in MODEL_MAP and MODEL_MAP[_key] is not _obj:
                raise AssertionError(f"MODEL_MAP key {_key} declared by {MODEL_MAP[_key].__name__} and {_obj.__name__}")
            MODEL_MAP[_key] = _obj
        globals()[_obj.__name__] = _obj
        __all__.append(_obj.__name__)
