"""``trtllm-medusa build``: TensorRT-LLM's own build route, given our class explicitly.

Upstream ``trtllm-build`` (tensorrt_llm/commands/build.py ``main``) reads config.json with
``PretrainedConfig.from_json_file``, which looks ``architecture`` up in ``MODEL_MAP`` and fails
for our ``MedusaPorts*`` names (on purpose: plain trtllm-build must not build these
checkpoints), and ``build_model`` would then take ``MODEL_MAP[architecture]`` anyway. So this
command parses the flags with upstream's own parser (``parse_arguments``), builds the config
with our class's ``config_class`` and the ``BuildConfig`` as ``main`` does, and calls
upstream's ``parallel_build(..., model_cls=<our class>)``. Nothing of TensorRT-LLM is patched:
not ``MODEL_MAP``, not ``sys.argv``. Checkpoints named ``MedusaForCausalLM`` (upstream's own
class builds them correctly) go the same way with ``model_cls=None``.
"""

from __future__ import annotations

import sys
from importlib import import_module
from pathlib import Path
from typing import Any

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.base import PositionEmbedding
from trtllm_medusa_ports.compat import ERROR, Finding
from trtllm_medusa_ports.engine import EngineUnavailable, require_tensorrt_llm, version_warning
from trtllm_medusa_ports.errors import CheckpointError, PortError
from trtllm_medusa_ports.files.jsonfile import read_json


def read_checkpoint_config(checkpoint_dir: Path) -> dict:
    path = checkpoint_dir / "config.json"
    if not path.is_file():
        raise CheckpointError("no config.json", where=str(checkpoint_dir),
                              fix="pass the --output_dir of trtllm-medusa convert")
    cfg = read_json(path, CheckpointError, fix="pass the --output_dir of trtllm-medusa convert")
    if not isinstance(cfg.get("architecture"), str):
        raise CheckpointError("config.json has no architecture string", where=str(path),
                              fix="pass the --output_dir of trtllm-medusa convert")
    return cfg


def _uses_alibi(cfg: dict) -> bool:
    """From the TensorRT-LLM config itself: its ``position_embedding_type``, or a base class that
    applies ALiBi whatever that field says (Bloom, MPT: tensorrt_llm/models/{bloom,mpt}/model.py)."""
    if str(cfg.get("position_embedding_type", "")).startswith("alibi"):
        return True
    adapter = adapter_for(str(cfg.get("base_architecture") or cfg.get("architecture")))
    return adapter is not None and adapter.position_embedding is PositionEmbedding.ALIBI


def checkpoint_findings(cfg: dict, path: Path) -> list[Finding]:
    """The rules that can be judged from a converted checkpoint's config.json."""
    out = []
    if _uses_alibi(cfg):
        out.append(Finding("alibi-position-embedding", ERROR,
                           "the checkpoint uses ALiBi, which the XQA spec-decoding kernels do not implement",
                           "use a RoPE base; this checkpoint was written with --allow_unsupported"))
    if not cfg.get("num_medusa_heads"):
        out.append(Finding("not-medusa", ERROR, "config.json has no num_medusa_heads",
                           "convert with trtllm-medusa convert --medusa_model_dir ..."))
    if cfg.get("dtype") == "float32":
        out.append(Finding("dtype-float32", ERROR, "TensorRT-LLM refuses float32 with speculative decoding",
                           "convert with --dtype float16 or bfloat16"))
    return out


#: trtllm-build plugin flags whose fused all-reduce paths in LLaMADecoderLayer.forward add the
#: attention / MLP output to the residual without ``residual_multiplier``
#: (tensorrt_llm/models/llama/model.py; flags from tensorrt_llm/plugin/plugin.py PluginConfig fields)
FUSIONS_WITHOUT_RESIDUAL_MULTIPLIER = ("reduce_fusion", "norm_quant_fusion", "user_buffer", "pp_reduce_scatter")


def flag_findings(cfg: dict, args: Any) -> list[Finding]:
    """The rules that need the checkpoint config and the parsed trtllm-build flags together."""
    multiplier = cfg.get("residual_multiplier", 1.0)
    enabled = [f"--{name}" for name in FUSIONS_WITHOUT_RESIDUAL_MULTIPLIER
               if getattr(args, name, "disable") in ("enable", True)]
    if multiplier == 1.0 or not enabled:
        return []
    return [Finding("engine-fusion-multiplier", ERROR,
                    f"{' '.join(enabled)} builds the fused all-reduce path of LLaMADecoderLayer, which adds the "
                    f"attention and MLP outputs without residual_multiplier ({multiplier}): the engine would "
                    "compute another model",
                    f"build without {' '.join(enabled)} (leave them at disable)")]


def build_config_from_args(args: Any, model_config: Any) -> Any:
    """The BuildConfig ``trtllm-build`` makes from its flags (tensorrt_llm/commands/build.py ``main``)."""
    builder = import_module("tensorrt_llm.builder")
    plugin_mod = import_module("tensorrt_llm.plugin")
    plugin_config = plugin_mod.PluginConfig.from_arguments(args)
    plugin_config.validate()
    # SpeculativeDecodingMode lives in tensorrt_llm/models/modeling_utils.py
    mode = import_module("tensorrt_llm.models.modeling_utils").SpeculativeDecodingMode.from_arguments(args)
    if getattr(args, "build_config", None):
        return builder.BuildConfig.from_json_file(args.build_config, plugin_config=plugin_config)
    fields = ("max_input_len", "max_seq_len", "max_batch_size", "max_beam_width", "max_num_tokens",
              "opt_num_tokens", "max_prompt_embedding_table_size", "gather_context_logits",
              "gather_generation_logits", "weight_sparsity", "profiling_verbosity", "enable_debug_output",
              "max_draft_len", "input_timing_cache", "output_timing_cache", "dry_run", "visualize_network",
              "max_encoder_input_len", "weight_streaming", "monitor_memory")
    values = {f: getattr(args, f) for f in fields if hasattr(args, f)}
    values.update(speculative_decoding_mode=mode, strongly_typed=True,
                  use_mrope=getattr(model_config, "qwen_type", None) == "qwen2_vl")
    build_config = builder.BuildConfig.from_dict(values, plugin_config=plugin_config)
    if hasattr(args, "kv_cache_type"):
        build_config.update_from_dict({"kv_cache_type": args.kv_cache_type})
    return build_config


def model_config_and_class(cfg: dict) -> tuple[Any, type | None]:
    """The config object and class ``parallel_build`` gets for a checkpoint config."""
    from trtllm_medusa_ports.engine.registry import ported_class

    cls = ported_class(cfg["architecture"])
    if cls is None:
        modeling_utils = import_module("tensorrt_llm.models.modeling_utils")
        return modeling_utils.PretrainedConfig.from_dict(dict(cfg)), None
    return cls.config_class(**cfg), cls


def main(checkpoint_dir: str, rest: list[str]) -> int:
    ckpt = Path(checkpoint_dir)
    try:
        cfg = read_checkpoint_config(ckpt)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    errors = [f for f in checkpoint_findings(cfg, ckpt / "config.json") if f.severity == ERROR]
    for f in errors:
        print(f"error: [{f.rule}] {f.message}\n  fix: {f.fix}", file=sys.stderr)
    if errors:
        return 1
    try:
        trtllm = require_tensorrt_llm()
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    warning = version_warning(trtllm)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    build_mod = import_module("tensorrt_llm.commands.build")
    argv = ["--checkpoint_dir", str(ckpt)] + list(rest)
    if "--speculative_decoding_mode" not in argv:
        argv += ["--speculative_decoding_mode", "medusa"]
    args = build_mod.parse_arguments().parse_args(argv)
    flag_errors = flag_findings(cfg, args)
    for f in flag_errors:
        print(f"error: [{f.rule}] {f.message}\n  fix: {f.fix}", file=sys.stderr)
    if flag_errors:
        return 1
    if getattr(args, "model_cls_file", None) or getattr(args, "model_cls_name", None):
        print("error: --model_cls_file/--model_cls_name: trtllm-medusa build chooses the class from the "
              "checkpoint's architecture\n  fix: drop these flags", file=sys.stderr)
        return 1
    try:
        model_config, model_cls = model_config_and_class(cfg)
        build_config = build_config_from_args(args, model_config)
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        kwargs = {k: getattr(args, k) for k in ("logits_dtype", "use_fused_mlp", "lora_dir", "lora_ckpt_source",
                                                "max_lora_rank", "lora_target_modules", "strip_plan")
                  if hasattr(args, k)}
        build_mod.parallel_build(model_config, str(ckpt), build_config, args.output_dir,
                                 _workers(args), getattr(args, "log_level", "info"), model_cls, **kwargs)
    except PortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # TensorRT-LLM's own failure: one line, not its traceback
        print(f"error: TensorRT-LLM could not build {ckpt}: {type(exc).__name__}: {exc}\n"
              "  fix: run `trtllm-medusa check` on the base, and convert and build with matching versions "
              "(docs/engine.md)", file=sys.stderr)
        return 1
    return 0


def _workers(args: Any) -> int:
    """``min(torch.cuda.device_count(), --workers)`` as upstream, at least 1."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else args.workers
    except ImportError:
        count = args.workers
    return max(1, min(count, args.workers))
