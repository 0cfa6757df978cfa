"""tensorrt_llm/commands/build.py (1.x): ``parse_arguments``, ``main``, ``parallel_build``,
``build_and_save``, ``build_model``.

``main``: ``--model_cls_file``/``--model_cls_name`` load a class from a file; the config is
always read with ``PretrainedConfig.from_json_file`` (MODEL_MAP dispatch, KeyError for an
unknown architecture, even with a model class given); the BuildConfig comes from the flags;
``parallel_build(model_config, ckpt_dir, build_config, output_dir, workers, log_level,
model_cls, **kwargs)``. ``build_model``: ``MODEL_MAP[architecture]`` unless ``model_cls`` is
given ("Unsupported model architecture"), then ``model_cls.from_checkpoint(ckpt_dir,
config=rank_config)`` and ``builder.build``. With ``workers > 1`` upstream spawns processes,
which pickle the config and the class: the stand-in round-trips them through pickle instead
(CUDA device counting is not modelled: workers = ``--workers``).
"""

import argparse
import copy
import os
import pickle
from importlib.machinery import SourceFileLoader

from ..builder import BuildConfig, build
from ..models import MODEL_MAP
from ..models.modeling_utils import PretrainedConfig, SpeculativeDecodingMode
from ..plugin import PluginConfig


def parse_arguments():
    p = argparse.ArgumentParser(prog="trtllm-build")
    p.add_argument("--checkpoint_dir", type=str, default=None)
    p.add_argument("--model_config", type=str, default=None)
    p.add_argument("--build_config", type=str, default=None)
    p.add_argument("--model_cls_file", type=str, default=None)
    p.add_argument("--model_cls_name", type=str, default=None)
    p.add_argument("--output_dir", type=str, default="engine_outputs")
    p.add_argument("--max_batch_size", type=int, default=2048)
    p.add_argument("--max_input_len", type=int, default=1024)
    p.add_argument("--max_seq_len", type=int, default=None)
    p.add_argument("--max_beam_width", type=int, default=1)
    p.add_argument("--max_num_tokens", type=int, default=8192)
    p.add_argument("--kv_cache_type", default=argparse.SUPPRESS, choices=["paged", "continuous", "disabled"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--log_level", type=str, default="info")
    p.add_argument("--logits_dtype", type=str, default=None)
    p.add_argument("--speculative_decoding_mode", default=None,
                   choices=["draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens",
                            "eagle"])
    p.add_argument("--max_draft_len", type=int, default=0)
    p.add_argument("--opt_num_tokens", type=int, default=None)
    p.add_argument("--paged_kv_cache", type=str, default=argparse.SUPPRESS)  # deprecated upstream, still parsed
    p.add_argument("--fast_build", default=False, action="store_true")
    for gather in ("gather_context_logits", "gather_generation_logits", "gather_all_token_logits"):
        p.add_argument(f"--{gather}", default=False, action="store_true")
    # add_plugin_argument (tensorrt_llm/plugin/plugin.py): plugin fields take a dtype or "disable", boolean
    # fields "enable"/"disable", with PluginConfig's defaults
    p.add_argument("--gpt_attention_plugin", type=str, default="auto",
                   choices=["auto", "float16", "float32", "bfloat16", "int32", "disable"])
    p.add_argument("--gemm_plugin", type=str, default=None)
    p.add_argument("--moe_plugin", type=str, default="auto",
                   choices=["auto", "float16", "float32", "bfloat16", "int32", "disable"])
    p.add_argument("--tokens_per_block", type=int, default=32)
    for feature, default in (("remove_input_padding", "enable"), ("context_fmha", "enable"),
                             ("use_paged_context_fmha", "enable"), ("use_fp8_context_fmha", "enable"),
                             ("use_fused_mlp", "enable"), ("paged_state", "enable"),
                             ("multiple_profiles", "disable"), ("streamingllm", "disable"),
                             # the fused all-reduce flags that LLaMADecoderLayer.forward branches on
                             ("reduce_fusion", "disable"), ("norm_quant_fusion", "disable"),
                             ("user_buffer", "disable"), ("pp_reduce_scatter", "disable")):
        p.add_argument(f"--{feature}", type=str, default=default, choices=["enable", "disable"])
    return p


def build_model(build_config, rank=0, ckpt_dir=None, model_config=None, model_cls=None, dry_run=False,
                **kwargs):
    model_config = copy.deepcopy(model_config)
    # build_model's asserts (tensorrt_llm/commands/build.py)
    assert not build_config.plugin_config.streamingllm, "StreamingLLM is no longer supported"
    assert not build_config.plugin_config.pp_reduce_scatter or model_config.architecture == "MixtralForCausalLM"
    if kwargs.get("logits_dtype"):
        model_config.logits_dtype = kwargs["logits_dtype"]
    assert rank < model_config.mapping.world_size
    rank_config = copy.deepcopy(model_config)
    rank_config.set_rank(rank)
    if model_cls is None:
        assert model_config.architecture in MODEL_MAP, f"Unsupported model architecture: {model_config.architecture}"
        model_cls = MODEL_MAP[model_config.architecture]
    if ckpt_dir is None:
        model = model_cls(rank_config)
    else:
        model = model_cls.from_checkpoint(ckpt_dir, config=rank_config)
    return build(model, build_config)


def build_and_save(rank, gpu_id, ckpt_dir, build_config, output_dir, log_level, model_config, model_cls, **kwargs):
    engine = build_model(build_config, rank, ckpt_dir, model_config, model_cls, **kwargs)
    assert engine is not None
    engine.save(output_dir)
    return True


def parallel_build(model_config, ckpt_dir, build_config, output_dir, workers=1, log_level="info", model_cls=None,
                   **kwargs):
    world_size = model_config.mapping.world_size
    if workers > 1:
        model_config, model_cls, build_config = pickle.loads(pickle.dumps((model_config, model_cls, build_config)))
    for rank in range(world_size):
        build_and_save(rank, rank % max(workers, 1), ckpt_dir, build_config, output_dir, log_level, model_config,
                       model_cls, **kwargs)


def main():
    args = parse_arguments().parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    model_cls = None
    if args.model_cls_file is not None:
        assert args.model_cls_name is not None
        model_cls = getattr(SourceFileLoader("models", args.model_cls_file).load_module(), args.model_cls_name)
    if args.gather_all_token_logits:
        args.gather_context_logits = args.gather_generation_logits = True
    if args.gather_context_logits and args.max_draft_len > 0:
        raise RuntimeError("Gather context logits is not support with draft len > 0.")
    plugin_config = PluginConfig.from_arguments(args)
    plugin_config.validate()
    if args.fast_build:
        plugin_config.manage_weights = True
    if args.multiple_profiles == "enable" and args.opt_num_tokens is not None:
        raise RuntimeError("multiple_profiles is enabled, while opt_num_tokens is set.")
    kwargs = {"logits_dtype": args.logits_dtype}
    mode = SpeculativeDecodingMode.from_arguments(args)
    target = args.checkpoint_dir if args.checkpoint_dir is not None else args.model_config
    if target.lower().endswith(".json"):
        config_path, ckpt_dir = target, None
    else:
        config_path, ckpt_dir = os.path.join(target, "config.json"), target
    model_config = PretrainedConfig.from_json_file(config_path)
    build_config = BuildConfig.from_dict(
        {"max_input_len": args.max_input_len, "max_seq_len": args.max_seq_len, "max_batch_size": args.max_batch_size,
         "max_beam_width": args.max_beam_width, "max_num_tokens": args.max_num_tokens,
         "max_draft_len": args.max_draft_len, "speculative_decoding_mode": mode}, plugin_config=plugin_config)
    if hasattr(args, "kv_cache_type"):
        build_config.update_from_dict({"kv_cache_type": args.kv_cache_type})
    parallel_build(model_config, ckpt_dir, build_config, args.output_dir, args.workers, args.log_level, model_cls,
                   **kwargs)
