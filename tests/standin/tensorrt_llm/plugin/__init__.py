"""tensorrt_llm/plugin/plugin.py ``PluginConfig`` (the fields the build route reads).

Defaults as upstream's fields (``gpt_attention_plugin="auto"``, ``gemm_plugin=None``,
``remove_input_padding=True``, ``paged_kv_cache=None``, ``tokens_per_block=32``, ``context_fmha=True``,
``reduce_fusion=False``, ...). ``from_arguments`` takes every parsed flag whose name is a field;
the before-validator ``convert_enable_disable`` turns "enable" into True and "disable" into False for
boolean fields and into None (the plugin is off) for plugin fields.
"""

from types import SimpleNamespace

_PLUGINS = ("gpt_attention_plugin", "gemm_plugin", "moe_plugin")
_DEFAULTS = dict(
    dtype="float16", gpt_attention_plugin="auto", gemm_plugin=None, moe_plugin="auto", remove_input_padding=True,
    paged_kv_cache=None,
    tokens_per_block=32, context_fmha=True, use_paged_context_fmha=True, use_fp8_context_fmha=True,
    use_fused_mlp=True, multiple_profiles=False, paged_state=True, streamingllm=False, manage_weights=False,
    reduce_fusion=False, norm_quant_fusion=False, user_buffer=False, pp_reduce_scatter=False,
)


def _convert(name, value):
    if value == "enable":
        return True
    if value == "disable":
        return None if name in _PLUGINS else False
    return value


class PluginConfig(SimpleNamespace):
    def __init__(self, **kwargs):
        values = dict(_DEFAULTS)
        values.update({k: _convert(k, v) for k, v in kwargs.items() if k in _DEFAULTS})
        super().__init__(**values)

    @classmethod
    def from_arguments(cls, args):
        return cls(**vars(args))

    def validate(self):
        return self
