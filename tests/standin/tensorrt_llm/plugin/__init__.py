"""tensorrt_llm/plugin/plugin.py ``PluginConfig`` (the fields the build route reads)."""

from types import SimpleNamespace


class PluginConfig(SimpleNamespace):
    @classmethod
    def from_arguments(cls, args):
        return cls(gemm_plugin=getattr(args, "gemm_plugin", "auto"), gpt_attention_plugin="auto",
                   paged_kv_cache=True, remove_input_padding=True)

    def validate(self):
        return self
