"""Give a TensorRT-LLM base model the ``spec_decoding_params`` plumbing it lacks.

Upstream 1.2.x passes ``spec_decoding_params`` from ``DecoderModelForCausalLM.forward``
to ``<Family>Model.forward`` and on to every attention layer only for some classes (each
adapter's ``upstream_spec_decoding_plumbing`` says which; docs/engine.md lists them). The others
have no such parameter, so a speculative-decoding build fails (or, with hand edits that drop
it, builds attention without the tree mask).

Rather than re-writing each family's decoder layer, the model instance is given:
* a ``forward`` that accepts ``spec_decoding_params`` and hands it to every
  attention module for the duration of the call, and
* attention modules whose ``forward`` adds that object to their call when the
  family's layer does not pass it.
Parameter names are untouched (the classes are swapped in place), so the weights
the converter wrote load as they are. Position handling stays the kernel's:
for RoPE families the attention op applies ``spec_decoding_position_offsets``
(past length + tree depth) itself, with the family's rotary dim and bases.
"""

from __future__ import annotations

from typing import Any

_ATTENTION_ATTRS = ("attention", "self_attn", "attn")
_SPEC_ATTR = "_medusa_ports_spec_params"


def attention_modules(transformer: Any) -> list[Any]:
    """The attention module of each decoder layer (named ``attention`` in every 1.2.x family)."""
    found = []
    for layer in transformer.layers:
        for attr in _ATTENTION_ATTRS:
            module = getattr(layer, attr, None)
            if module is not None:
                found.append(module)
                break
        else:
            raise TypeError(f"{type(layer).__name__} has no attention module ({', '.join(_ATTENTION_ATTRS)})")
    return found


def _subclass(cls: type, mixin: type) -> type:
    if issubclass(cls, mixin):
        return cls
    return type(f"SpecDecoding{cls.__name__}", (mixin, cls), {})


class _AttentionTakesSpecParams:
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        params = getattr(self, _SPEC_ATTR, None)
        if params is not None and kwargs.get("spec_decoding_params") is None:
            kwargs["spec_decoding_params"] = params
        return super().forward(*args, **kwargs)


class _ModelTakesSpecParams:
    def forward(self, *args: Any, spec_decoding_params: Any = None, **kwargs: Any) -> Any:
        modules = attention_modules(self)
        for m in modules:
            object.__setattr__(m, _SPEC_ATTR, spec_decoding_params)
        try:
            return super().forward(*args, **kwargs)
        finally:
            for m in modules:
                object.__setattr__(m, _SPEC_ATTR, None)


def add_spec_decoding_plumbing(transformer: Any) -> Any:
    """Make ``transformer`` (a family's ``<Family>Model`` instance) take and route the params."""
    for m in attention_modules(transformer):
        m.__class__ = _subclass(type(m), _AttentionTakesSpecParams)
        object.__setattr__(m, _SPEC_ATTR, None)
    transformer.__class__ = _subclass(type(transformer), _ModelTakesSpecParams)
    return transformer
