"""tensorrt_llm/builder.py: ``BuildConfig``, ``build(model, build_config)``, ``Engine`` and
``EngineConfig`` (1.x), as far as the build route goes.

``build``: the model config's ``max_draft_len`` is taken when the build's is 0; with a
speculative-decoding mode, ``max_seq_len`` grows by ``max_draft_len``; then
``model.prepare_inputs(...)`` (keyword arguments, ``max_draft_len`` and
``speculative_decoding_draft_tokens_external``) and ``model(**inputs)`` under a network whose
plugin config says whether the KV cache is paged. The stand-in's "engine" records the marked
outputs and the parameters instead of a TensorRT plan. ``EngineConfig.from_json_file`` is how
the runtime reads an engine's config.json: ``PretrainedConfig.from_dict`` on its
``pretrained_config`` (so the architecture must be in MODEL_MAP).
"""

import copy
import json
import os

from . import CALLS
from .functional import _Network, reset_default_net, set_default_net
from .models.modeling_utils import SpeculativeDecodingMode, to_ootb_moe


class KVCacheType:
    PAGED = "paged"
    CONTINUOUS = "continuous"
    DISABLED = "disabled"


class BuildConfig:
    def __init__(self, max_input_len=1024, max_seq_len=None, max_batch_size=2048, max_beam_width=1,
                 max_num_tokens=8192, max_draft_len=0, speculative_decoding_mode=SpeculativeDecodingMode.NONE,
                 kv_cache_type=None, plugin_config=None, **kwargs):
        self.max_input_len, self.max_seq_len, self.max_batch_size = max_input_len, max_seq_len, max_batch_size
        self.max_beam_width, self.max_num_tokens, self.max_draft_len = max_beam_width, max_num_tokens, max_draft_len
        self.speculative_decoding_mode, self.kv_cache_type = speculative_decoding_mode, kv_cache_type
        self.plugin_config = plugin_config

    @classmethod
    def from_dict(cls, config, plugin_config=None):
        return cls(plugin_config=plugin_config, **{k: v for k, v in config.items() if v is not None})

    def update_from_dict(self, config):
        for k, v in config.items():
            setattr(self, k, v)

    def to_dict(self):
        out = {k: v for k, v in self.__dict__.items() if k != "plugin_config"}
        out["plugin_config"] = dict(vars(self.plugin_config))
        return out


class Engine:
    def __init__(self, config, rank, outputs, parameters, model_class):
        self.config, self.rank, self.outputs, self.parameters, self.model_class = (
            config, rank, outputs, parameters, model_class)

    def save(self, engine_dir):
        os.makedirs(engine_dir, exist_ok=True)
        with open(os.path.join(engine_dir, "config.json"), "w") as f:
            json.dump(self.config, f, indent=2, default=str)
        with open(os.path.join(engine_dir, f"rank{self.rank}.engine"), "w") as f:
            json.dump({"model_class": self.model_class, "outputs": self.outputs, "parameters": self.parameters}, f)


def _init_max_seq_len(model_config, build_config):
    """BuildConfig._init_max_seq_len: max_position_embeddings (2048 when absent) times the rotary factor
    rounded up (1 for su / longrope / llama3); max_input_len clipped to it."""
    import math

    scaling = getattr(model_config, "rotary_scaling", None) or {}
    kind = scaling.get("type", scaling.get("rope_type"))
    factor = 1.0 if kind in ("su", "longrope", "llama3") else float(scaling.get("factor", 1.0))
    if build_config.max_seq_len is None:
        max_pos = getattr(model_config, "max_position_embeddings", None) or 2048
        build_config.max_seq_len = int(max_pos * math.ceil(factor))
    build_config.max_input_len = min(build_config.max_input_len, build_config.max_seq_len)


def _update_kv_cache_type(build_config):
    """BuildConfig.update_kv_cache_type: an explicit kv_cache_type must agree with --paged_kv_cache; without
    one, paged unless --paged_kv_cache disable."""
    paged = getattr(build_config.plugin_config, "paged_kv_cache", None)
    if build_config.kv_cache_type is not None and paged is not None:
        assert (build_config.kv_cache_type == KVCacheType.PAGED) == paged, "kv_cache_type and paged_kv_cache disagree"
    elif build_config.kv_cache_type is None:
        build_config.kv_cache_type = KVCacheType.CONTINUOUS if paged is False else KVCacheType.PAGED


def build(model, build_config):
    build_config = copy.deepcopy(build_config)
    _update_kv_cache_type(build_config)
    _init_max_seq_len(model.config, build_config)
    # build(): reduce_fusion only for tp > 1 Llama / Gemma2 / Medusa, user_buffer only with it; norm_quant_fusion
    # only for NVFP4 Llama (not modelled: always off here)
    plugin_in = build_config.plugin_config
    arch = model.config.architecture
    if model.config.mapping.tp_size == 1 or arch not in ("LlamaForCausalLM", "Gemma2ForCausalLM", "MedusaForCausalLM"):
        plugin_in.reduce_fusion = False
    if not getattr(plugin_in, "reduce_fusion", False):
        plugin_in.user_buffer = False
    plugin_in.norm_quant_fusion = False
    if hasattr(model.config, "max_draft_len") and build_config.max_draft_len == 0:
        build_config.max_draft_len = model.config.max_draft_len
    if build_config.speculative_decoding_mode != SpeculativeDecodingMode.NONE:
        build_config.max_seq_len += build_config.max_draft_len
        build_config.max_num_tokens = max(build_config.max_num_tokens,
                                          build_config.max_batch_size * (build_config.max_draft_len + 1))
    plugin = copy.copy(build_config.plugin_config)
    plugin.paged_kv_cache = build_config.kv_cache_type == KVCacheType.PAGED
    build_config.plugin_config = plugin
    if plugin.moe_plugin is None:  # optimize_model_with_config: use_ootb_moe = moe_plugin is None
        to_ootb_moe(model)
    net = _Network(plugin)
    set_default_net(net)
    try:
        inputs = model.prepare_inputs(
            max_batch_size=build_config.max_batch_size, max_input_len=build_config.max_input_len,
            max_seq_len=build_config.max_seq_len, max_num_tokens=build_config.max_num_tokens,
            use_cache=build_config.kv_cache_type != KVCacheType.DISABLED, max_beam_width=build_config.max_beam_width,
            max_draft_len=build_config.max_draft_len,
            speculative_decoding_draft_tokens_external=(
                build_config.speculative_decoding_mode == SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL))
        model(**inputs)
    finally:
        reset_default_net()
    rank = model.config.mapping.rank
    CALLS.append(("build", model.config.architecture, type(model).__name__, rank))
    config = {"version": "1.2.0-standin", "pretrained_config": model.config.to_dict(),
              "build_config": build_config.to_dict()}
    return Engine(config, rank, sorted(net.outputs), sorted(n for n, _ in model.named_parameters()),
                  type(model).__name__)


class EngineConfig:
    def __init__(self, pretrained_config, build_config, version):
        self.pretrained_config, self.build_config, self.version = pretrained_config, build_config, version

    @classmethod
    def from_json_file(cls, config_file):
        from .models.modeling_utils import PretrainedConfig

        with open(config_file) as f:
            config = json.load(f)
        return cls(PretrainedConfig.from_dict(config["pretrained_config"]), config["build_config"],
                   config["version"])
