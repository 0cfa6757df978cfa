"""tensorrt_llm/llmapi/llm_args.py (1.2 line) as far as an engine served with Medusa meets it.

* ``MedusaDecodingConfig(DecodingBaseConfig)``: ``medusa_choices`` (list of int lists), ``num_medusa_heads``,
  ``max_draft_len`` (inherited); the base is a ``StrictBaseModel``: an unknown keyword is refused ("Extra inputs are
  not permitted"); ``decoding_type`` "Medusa"; ``supports_backend`` False for ``pytorch`` and ``_autodeploy``.
* ``DecodingBaseConfig.from_dict``: dispatches on ``decoding_type`` (exact case), pops it, builds the class.
* ``KvCacheConfig``: strict as well (``free_gpu_memory_fraction`` among its fields).
* ``BaseLlmArgs.validate_speculative_config``: the backend must be supported; Medusa asserts ``max_draft_len > 0``.
* ``update_llm_args_with_extra_dict``: the YAML's top-level keys *replace* the command line's (no deep merge);
  ``speculative_config`` goes through ``DecodingBaseConfig.from_dict``, ``kv_cache_config`` through its class.
"""


class _Strict:
    FIELDS: tuple = ()

    def __init__(self, **kwargs):
        extra = sorted(set(kwargs) - set(self.FIELDS))
        if extra:
            raise ValueError(f"{type(self).__name__}: Extra inputs are not permitted: {extra}")
        for name in self.FIELDS:
            setattr(self, name, kwargs.get(name))


class DecodingBaseConfig(_Strict):
    FIELDS = ("max_draft_len", "speculative_model_dir")
    decoding_type = None

    @staticmethod
    def from_dict(data: dict):
        data = dict(data)
        kind = data.pop("decoding_type", None)
        classes = {"Medusa": MedusaDecodingConfig}
        if kind not in classes:
            raise ValueError(f"Invalid decoding type: {kind}")
        return classes[kind](**data)

    def supports_backend(self, backend: str) -> bool:
        return True


class MedusaDecodingConfig(DecodingBaseConfig):
    FIELDS = ("medusa_choices", "num_medusa_heads", "max_draft_len", "speculative_model_dir")
    decoding_type = "Medusa"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        choices = self.medusa_choices
        if choices is not None and not (isinstance(choices, list) and all(
                isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in p)
                for p in choices)):
            raise ValueError(f"medusa_choices: Input should be a valid list of lists of integers: {choices!r}")
        self.max_total_draft_tokens = self.max_draft_len

    def supports_backend(self, backend: str) -> bool:
        return backend not in ("pytorch", "_autodeploy")


class KvCacheConfig(_Strict):
    FIELDS = ("free_gpu_memory_fraction", "max_tokens", "enable_block_reuse", "host_cache_size")


def validate_speculative_config(config, backend: str) -> None:
    if config is None:
        return
    if not config.supports_backend(backend):
        raise ValueError(f"Speculation type {config.decoding_type} does not support backend {backend}")
    if isinstance(config, MedusaDecodingConfig):
        assert config.max_draft_len is not None and config.max_draft_len > 0, "max_draft_len must be > 0 for Medusa"


def update_llm_args_with_extra_dict(llm_args: dict, extra: dict) -> dict:
    converted = dict(extra)
    if "speculative_config" in converted:
        converted["speculative_config"] = DecodingBaseConfig.from_dict(converted["speculative_config"])
    if "kv_cache_config" in converted:
        converted["kv_cache_config"] = KvCacheConfig(**converted["kv_cache_config"])
    return {**llm_args, **converted}
