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

import os
from importlib import import_module
from pathlib import Path
from typing import Any

from trtllm_medusa_ports.compat import (
    ERROR,
    INFO,
    WARNING,
    XQA_JIT_ENV,
    Finding,
    sm_names,
    xqa_serving_routes,
)
from trtllm_medusa_ports.compat.checkpoint import checkpoint_findings
from trtllm_medusa_ports.engine.installed import (
    require_tensorrt_llm,
    version_warning,
)
from trtllm_medusa_ports.errors import CheckpointError, PortError
from trtllm_medusa_ports.files.checkpoint import no_config, read_checkpoint
from trtllm_medusa_ports.files.jsonfile import read_json
from trtllm_medusa_ports.machine import log
from trtllm_medusa_ports.quant import BITS, QUANTIZED_LAYER_FIX, quantized_layer_problems
from trtllm_medusa_ports.quant.base_checks import tool_layer_problems
from trtllm_medusa_ports.quant.engine_load import load_problems

LOG = log.get("engine.build")


def read_checkpoint_config(checkpoint_dir: Path) -> dict:
    path = checkpoint_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(no_config(checkpoint_dir), where=str(checkpoint_dir),
                              fix="pass the --output_dir of trtllm-medusa convert")
    cfg = read_json(path, CheckpointError, fix="pass the --output_dir of trtllm-medusa convert")
    if not isinstance(cfg.get("architecture"), str):
        raise CheckpointError("config.json has no architecture string", where=str(path),
                              fix="pass the --output_dir of trtllm-medusa convert")
    # the one validation every reader runs (files/checkpoint.py check_config: sizes, mapping against the rank
    # files, experts, the Medusa heads excluded from a quant_algo) and the quantized layers' stored dtypes and
    # scales (quant/__init__.py quantized_layer_problems, which verify and add-heads run): headers only
    ckpt = read_checkpoint(checkpoint_dir)
    q = cfg.get("quantization") or {}
    problems = [p for p in quantized_layer_problems(ckpt.ranks, q.get("quant_algo"), q.get("exclude_modules"))
                if q.get("quant_algo") not in BITS or p.stored_quantized]
    if problems:
        raise CheckpointError(problems[0].message, where=str(checkpoint_dir / f"rank{problems[0].rank}.safetensors"),
                              fix=QUANTIZED_LAYER_FIX)
    for p in tool_layer_problems(ckpt.ranks, q, int(cfg.get("hidden_size") or 0)):  # AWQ / SQ tensors as stored
        raise CheckpointError(p.message, where=str(checkpoint_dir / f"rank{p.rank}.safetensors"), fix=p.fix)
    for p in load_problems(ckpt.ranks, cfg):  # what upstream's preprocess_weights and load refuse (headers only)
        raise CheckpointError(p.message, where=str(checkpoint_dir / f"rank{p.rank}.safetensors"), fix=p.fix)
    return cfg


#: trtllm-build plugin flags whose fused all-reduce paths in LLaMADecoderLayer.forward add the
#: attention / MLP output to the residual without ``residual_multiplier``
#: (tensorrt_llm/models/llama/model.py; flags from tensorrt_llm/plugin/plugin.py PluginConfig fields)
FUSIONS_WITHOUT_RESIDUAL_MULTIPLIER = ("reduce_fusion", "norm_quant_fusion", "user_buffer", "pp_reduce_scatter")


def _flag(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def _disabled(value: Any) -> bool:
    return value in ("disable", False, None)


def _medusa_flag_findings(cfg: dict, args: Any) -> list[Finding]:
    """trtllm-build flags that build an engine without what Medusa needs (rule ``engine-build-flag``)."""
    out: list[Finding] = []

    def refuse(flag: str, why: str, fix: str) -> None:
        out.append(Finding("engine-build-flag", ERROR, f"{flag}: {why}", fix))

    if _disabled(_flag(args, "gpt_attention_plugin", "auto")):
        refuse("--gpt_attention_plugin disable",
               "the plain-TensorRT attention (tensorrt_llm/layers/attention.py Attention.forward, the branch without "
               "the plugin) never reads spec_decoding_params: tree tokens would attend causally, not by the tree",
               "leave --gpt_attention_plugin at auto (or a dtype)")
    kv_type = str(_flag(args, "kv_cache_type", "") or "").lower().rsplit(".", 1)[-1]
    if kv_type == "disabled":
        refuse("--kv_cache_type disabled",
               "without a KV cache the model's forward never unpacks the base outputs and computes no "
               "medusa_logits (tensorrt_llm/models/medusa/model.py forward reads them only with use_cache)",
               "build with the default paged KV cache")
    if str(_flag(args, "paged_kv_cache", "") or "") == "disable" and kv_type == "paged":
        refuse("--paged_kv_cache disable with --kv_cache_type paged",
               "the two disagree (tensorrt_llm/builder.py BuildConfig.update_kv_cache_type asserts they agree)",
               "drop --paged_kv_cache (deprecated upstream)")
    tokens = _flag(args, "tokens_per_block", 32)
    if tokens is not None:
        out += _tokens_per_block_findings(cfg, int(tokens))
    mode = _flag(args, "speculative_decoding_mode")
    if mode not in (None, "medusa"):
        refuse(f"--speculative_decoding_mode {mode}", "this checkpoint holds Medusa heads",
               "use --speculative_decoding_mode medusa (the default of trtllm-medusa build)")
    if int(_flag(args, "max_beam_width", 1) or 1) > 1:
        refuse(f"--max_beam_width {_flag(args, 'max_beam_width')}",
               "Medusa has no beam search (examples/run.py asserts num_beams == 1 with --medusa_choices)",
               "build with --max_beam_width 1")
    if _flag(args, "gather_context_logits") or _flag(args, "gather_all_token_logits"):
        refuse("--gather_context_logits" if _flag(args, "gather_context_logits") else "--gather_all_token_logits",
               "context logits cannot be gathered with draft tokens (tensorrt_llm/commands/build.py main raises "
               "\"Gather context logits is not support with draft len > 0\"; the checkpoint's max_draft_len is "
               f"{cfg.get('max_draft_len')})",
               "drop the flag (--gather_generation_logits alone is allowed)")
    if _flag(args, "pp_reduce_scatter") in ("enable", True) and cfg.get("architecture") != "MixtralForCausalLM":
        refuse("--pp_reduce_scatter enable", "tensorrt_llm/commands/build.py build_model asserts it is used for "
               "MixtralForCausalLM only", "drop the flag")
    if _flag(args, "streamingllm") in ("enable", True):
        refuse("--streamingllm enable", "tensorrt_llm/commands/build.py build_model asserts StreamingLLM is off",
               "drop the flag")
    if _flag(args, "multiple_profiles") in ("enable", True) and _flag(args, "opt_num_tokens") is not None:
        refuse("--multiple_profiles enable with --opt_num_tokens",
               "tensorrt_llm/commands/build.py main refuses the pair", "drop --opt_num_tokens")
    if cfg.get("position_embedding_type") == "learned_absolute" and _disabled(_flag(args, "remove_input_padding", True)):
        refuse("--remove_input_padding disable",
               "our engine class rebuilds a learned-position base's tree position ids from the packed 1-D "
               "position_ids of the runtime's remove-input-padding layout (engine/positions.py); padded [batch, T] "
               "ids are not that layout", "leave --remove_input_padding at enable (trtllm-build's default)")
    return out


def _tokens_per_block_findings(cfg: dict, tokens: int) -> list[Finding]:
    """``--tokens_per_block`` against the XQA kernels that would run Medusa generation (compat.xqa_medusa_route).

    The build cannot know the GPU, so per GPU read the kernels counted are the ones the runner picks, or, where
    those have none for this shape, the JIT kernels ``TRTLLM_ENABLE_XQA_JIT=1`` gives (the fix ``check`` names).
    A size none of them takes is refused; one that only some take builds, with a warning naming the others.
    """
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    if kv <= 0 or heads % kv:
        return []
    head_size = int(cfg.get("head_size") or int(cfg.get("hidden_size") or 0) // heads)
    kv_algo = (cfg.get("quantization") or {}).get("kv_cache_quant_algo")
    routes = xqa_serving_routes(heads // kv, head_size, kv_algo)  # an E4M3 cache: SM 8.9 on (rule quant-kv-cache)
    takes: dict[int, tuple[str, tuple[int, ...]]] = {}
    for sm, r in routes.items():
        if r.served:
            takes[sm] = (f"the {r.impl} XQA kernels the runner picks ({r.why})", r.picked.tokens_per_block)
        elif r.served_with_jit_env:
            takes[sm] = (f"the JIT XQA kernels {XQA_JIT_ENV}=1 gives ({r.why}: without it no kernel)",
                         r.jit.tokens_per_block)
        elif r.served_with_jit_off:
            takes[sm] = (f"the precompiled XQA kernels {XQA_JIT_ENV}=0 gives ({r.why}, and the JIT kernels do not "
                         "take it)", r.precompiled.tokens_per_block)
    if not takes:  # no kernel at all: check and convert report it (gqa-group-size, quant-kv-cache)
        return []
    no_kernel = "with no kernel the engine fails at run time (\"No available XQA kernels are found for speculative " \
                "decoding mode\", cpp/tensorrt_llm/common/attentionOp.cpp)"
    refusing = [sm for sm, (_, sizes) in takes.items() if tokens not in sizes]
    by_kernels: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for sm, what in takes.items():
        by_kernels.setdefault(what, []).append(sm)
    detail = "; ".join(f"on {sm_names(sms)} {what} take {', '.join(map(str, sizes))}"
                       for (what, sizes), sms in by_kernels.items())
    if len(refusing) < len(takes) and refusing:
        return [Finding("engine-build-flag", WARNING,
                        f"--tokens_per_block {tokens}: Medusa generation runs on XQA kernels, and not those of every "
                        f"GPU take {tokens} tokens per block ({detail}); on {sm_names(refusing)} {no_kernel}",
                        f"serve on a GPU whose kernels take it, or use --tokens_per_block "
                        f"{' or '.join(map(str, _common(takes)))}")]
    if refusing:
        allowed = sorted({t for _, sizes in takes.values() for t in sizes})
        return [Finding("engine-build-flag", ERROR,
                        f"--tokens_per_block {tokens}: generation with speculative decoding runs on XQA kernels, "
                        f"which take other tokens per block ({detail}); {no_kernel}",
                        f"use --tokens_per_block {' or '.join(map(str, _common(takes) or allowed))} (default 32)")]
    return []


def _common(takes: dict[int, tuple[str, tuple[int, ...]]]) -> list[int]:
    """Tokens per block every GPU's kernels take."""
    sets = [set(sizes) for _, sizes in takes.values()]
    return sorted(set.intersection(*sets)) if sets else []


def _moe_plugin_findings(cfg: dict, args: Any) -> list[Finding]:
    """``--moe_plugin disable`` on an MoE checkpoint.

    With the plugin off, tensorrt_llm/builder.py ``optimize_model_with_config`` passes ``use_ootb_moe`` and
    tensorrt_llm/models/modeling_utils.py ``to_ootb_moe`` turns every ``MOE`` layer into ``MoeOOTB`` through
    ``MixtureOfExperts.to`` (tensorrt_llm/layers/moe.py), which calls ``MoeOOTB(**get_init_params(layer))``
    (tensorrt_llm/_utils.py: every argument of the layer's own ``__init__``). A ``SharedMoE`` (Qwen2-MoE's shared
    expert) passes ``use_shared_gate`` and ``use_side_stream``, which ``MoeOOTB`` does not take: the build stops
    with a TypeError. ``MoeOOTB.init_experts`` refuses weight-only experts. Otherwise it builds, with one GEMM per
    expert, and refuses GPUs of SM 100 and newer.
    """
    moe = cfg.get("moe") or {}
    if not _disabled(_flag(args, "moe_plugin", "auto")) or int(moe.get("num_experts") or 0) <= 1:
        return []
    shared = int(cfg.get("moe_shared_expert_intermediate_size") or moe.get("shared_expert_intermediate_size") or 0)
    algo = (cfg.get("quantization") or {}).get("quant_algo")
    if algo in ("W8A16", "W4A16"):
        return [Finding("engine-build-flag", ERROR,
                        f"--moe_plugin disable with {algo} experts: the plugin-free MoE refuses weight-only "
                        "quantization (tensorrt_llm/layers/moe.py MoeOOTB.init_experts: \"OOTB MOE does not support "
                        "weight only quantization\")", "leave --moe_plugin at auto (the default) or a dtype")]
    if shared:
        return [Finding("engine-build-flag", ERROR,
                        "--moe_plugin disable: this base has a shared expert (a SharedMoE layer), which the "
                        "plugin-free MoE cannot take: tensorrt_llm/layers/moe.py MixtureOfExperts.to builds "
                        "MoeOOTB(**get_init_params(layer)) and MoeOOTB has no use_shared_gate / use_side_stream, "
                        "so the build stops with a TypeError",
                        "leave --moe_plugin at auto (the default) or a dtype")]
    return [Finding("engine-build-flag", WARNING,
                    "--moe_plugin disable builds the plugin-free MoE (tensorrt_llm/layers/moe.py MoeOOTB): one "
                    "GEMM per expert, much slower than the plugin, and refused on GPUs of SM 100 and newer "
                    "(MoeOOTB.init_experts)",
                    "leave --moe_plugin at auto (the default) unless you are comparing the two")]


def _fp8_arithmetic_findings(cfg: dict, args: Any) -> list[Finding]:
    """What an FP8 engine multiplies with depends on two build flags (tensorrt_llm/quantization/layers.py
    ``FP8Linear.forward``, models/modeling_utils.py ``fuse_gate_mlp``): say which ``verify`` must emulate."""
    if (cfg.get("quantization") or {}).get("quant_algo") != "FP8":
        return []
    gemm = "fp8" if str(_flag(args, "gemm_plugin", None) or "") == "fp8" else "auto"
    fused = _flag(args, "use_fused_mlp", "enable") not in ("disable", False)
    out = [Finding("engine-build-flag", INFO,
                   f"FP8 GEMMs built as --gemm_plugin {gemm} computes them "
                   + ("(the FP8 GEMM plugin: s_w * s_a in float32)" if gemm == "fp8" else
                      "(scales cast to the model dtype)") + "; `trtllm-medusa verify` proves this arithmetic with "
                   f"--gemm_plugin {gemm}", f"verify with `trtllm-medusa verify ... --gemm_plugin {gemm}`")]
    if not fused:
        out.append(Finding("engine-build-flag", WARNING,
                           "--use_fused_mlp disable keeps mlp.fc and mlp.gate as two FP8 linears with their own "
                           "scales, while verify computes the fused MLP trtllm-build makes by default (both moved to "
                           "the larger scale): for a checkpoint with separate fc / gate scales (ModelOpt's) the "
                           "engine computes what verify did not prove",
                           "leave --use_fused_mlp at its default (enable)"))
    return out


def flag_findings(cfg: dict, args: Any) -> list[Finding]:
    """The rules that need the checkpoint config and the parsed trtllm-build flags together."""
    out = _medusa_flag_findings(cfg, args) + _moe_plugin_findings(cfg, args) + _fp8_arithmetic_findings(cfg, args)
    multiplier = cfg.get("residual_multiplier", 1.0)
    enabled = [f"--{name}" for name in FUSIONS_WITHOUT_RESIDUAL_MULTIPLIER
               if getattr(args, name, "disable") in ("enable", True)]
    # tensorrt_llm/builder.py build() turns reduce_fusion (and with it user_buffer) off unless tp > 1 and the
    # architecture is LlamaForCausalLM, Gemma2ForCausalLM or MedusaForCausalLM, and norm_quant_fusion off but
    # for NVFP4 Llama: for our MedusaPorts* classes these never reach LLaMADecoderLayer; upstream's
    # MedusaForCausalLM (a Granite with its multipliers) at tp > 1 keeps reduce_fusion and user_buffer.
    # pp_reduce_scatter is refused by build_model for all but Mixtral (engine-build-flag above).
    tp = int((cfg.get("mapping") or {}).get("tp_size", 1))
    keeps_reduce_fusion = tp > 1 and cfg.get("architecture") in ("LlamaForCausalLM", "Gemma2ForCausalLM",
                                                                 "MedusaForCausalLM")
    enabled = [f for f in enabled if keeps_reduce_fusion and f in ("--reduce_fusion", "--user_buffer")]
    if multiplier == 1.0 or not enabled:
        return out
    return out + [Finding("engine-fusion-multiplier", ERROR,
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
    # as upstream main: --gather_all_token_logits sets both gathers; --fast_build manages weights;
    # BUILDER_FORCE_NUM_PROFILES caps the optimisation profiles
    if getattr(args, "gather_all_token_logits", False):
        values.update(gather_context_logits=True, gather_generation_logits=True)
    if getattr(args, "fast_build", False):
        plugin_config.manage_weights = True
    forced = os.environ.get("BUILDER_FORCE_NUM_PROFILES")
    if forced is not None:
        values["force_num_profiles"] = forced
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


def refusal(findings: list, where: str | None) -> CheckpointError:
    """One error for the ERROR findings that stop a build: each ``[rule] message``, their fixes, their rules (api.build
    raises it for the rules it judges first, main for the checkpoint's and the flags')."""
    return CheckpointError("; ".join(f"[{f.rule}] {f.message}" for f in findings), where=where,
                           fix="; ".join(dict.fromkeys(f.fix for f in findings)), rules=[f.rule for f in findings])


def main(checkpoint_dir: str, rest: list[str], allow_unsupported: bool = False) -> int:
    """trtllm-build of ``checkpoint_dir`` with ``rest`` (its own flags) and our classes registered; 0 where it
    built. Whatever stops it - the checkpoint, a rule, the flags, TensorRT-LLM missing or failing - is a
    :class:`~trtllm_medusa_ports.errors.PortError` naming it (the CLI prints it, and its JSON under --json)."""
    ckpt = Path(checkpoint_dir)
    cfg = read_checkpoint_config(ckpt)
    errors = [f for f in checkpoint_findings(cfg, allow_unsupported) if f.severity == ERROR]
    if errors:
        raise refusal(errors, str(ckpt / "config.json"))
    trtllm = require_tensorrt_llm()
    warning = version_warning(trtllm)
    if warning:
        LOG.warning(warning)
    build_mod = import_module("tensorrt_llm.commands.build")
    argv = ["--checkpoint_dir", str(ckpt)] + list(rest)
    if "--speculative_decoding_mode" not in argv:
        argv += ["--speculative_decoding_mode", "medusa"]
    args = build_mod.parse_arguments().parse_args(argv)
    flag_found = flag_findings(cfg, args)
    for f in flag_found:
        if f.severity == "warning":
            LOG.warning(f"[{f.rule}] {f.message}\n  fix: {f.fix}")
        elif f.severity != ERROR:
            LOG.info(f"{f.severity}: [{f.rule}] {f.message}\n  fix: {f.fix}")
    if any(f.severity == ERROR for f in flag_found):
        raise refusal([f for f in flag_found if f.severity == ERROR], None)  # each message names its flag
    if getattr(args, "model_cls_file", None) or getattr(args, "model_cls_name", None):
        raise PortError("trtllm-medusa build chooses the class from the checkpoint's architecture",
                        where="--model_cls_file/--model_cls_name", fix="drop these flags")
    try:
        model_config, model_cls = model_config_and_class(cfg)
        build_config = build_config_from_args(args, model_config)
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        kwargs = {k: getattr(args, k) for k in ("logits_dtype", "use_fused_mlp", "lora_dir", "lora_ckpt_source",
                                                "max_lora_rank", "lora_target_modules", "strip_plan")
                  if hasattr(args, k)}
        build_mod.parallel_build(model_config, str(ckpt), build_config, args.output_dir,
                                 _workers(args), getattr(args, "log_level", "info"), model_cls, **kwargs)
    except PortError:
        raise
    except Exception as exc:  # noqa: BLE001  (TensorRT-LLM's own failure: one line, not its traceback)
        raise PortError(f"TensorRT-LLM could not build {ckpt}: {type(exc).__name__}: {exc}", where=str(ckpt),
                        fix="run `trtllm-medusa check` on the base, and convert and build with matching versions "
                            "(docs/engine.md)") from None
    return 0


def _workers(args: Any) -> int:
    """``min(torch.cuda.device_count(), --workers)`` as upstream, at least 1."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else args.workers
    except ImportError:
        count = args.workers
    return max(1, min(count, args.workers))
