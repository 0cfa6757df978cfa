"""``trtllm-medusa``: the command line (parse the flags, call the library, print, exit code).

Exit codes: 0 success, 1 a problem with the input or a failed check, 2 usage errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from pathlib import Path

from trtllm_medusa_ports.errors import PortError

# -- convert (shared with convert/convert_checkpoint.py) -----------------------------------
#: upstream examples/medusa/convert_checkpoint.py flags we accept but do not implement
_NOT_SUPPORTED = {
    "--smoothquant": "SmoothQuant",
    "--per_channel": "SmoothQuant",
    "--per_token": "SmoothQuant",
    "--per_group": "group-wise quantization",
    "--meta_ckpt_dir": "Meta (params.json) checkpoints",
    "--group_size": "group-wise quantization",
    "--dataset-cache-dir": "calibration",
    "--storage-type": "a storage dtype other than --dtype",
    "--use_embedding_sharding": "sharing the embedding table with lm_head",
}
#: upstream flags that override config.json values; we always read config.json
_FROM_CONFIG = ("--vocab_size", "--n_positions", "--n_layer", "--hidden_act", "--rotary_base", "--rotary_scaling")


def _int_in(lo: int, hi: int | None = None):
    """An argparse type: an integer in [lo, hi] (hi None: no upper bound), named in the error."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo and hi is None:
            raise argparse.ArgumentTypeError(f"{v} must be at least {lo}")
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is outside {lo}..{hi}")
        return v
    return parse


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{v} must be a number >= 0")
    return v


def _fraction(text: str) -> float:
    v = _non_negative(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"{v} must be below 1")
    return v


def add_quant_format_args(p: argparse.ArgumentParser):
    q = p.add_argument_group("quantization (upstream's spellings; Medusa heads, lm_head, embedding and norms stay "
                             "in --dtype)")
    q.add_argument("--qformat", default=None, choices=["fp8", "int8_wo", "int4_wo", "full_prec"],
                   help="examples/quantization/quantize.py's formats: FP8 per tensor, or INT8/INT4 weight-only")
    q.add_argument("--use_weight_only", action="store_true", help="weight-only (examples/medusa/convert_checkpoint.py)")
    q.add_argument("--weight_only_precision", default=None, choices=["int8", "int4"],
                   help="with --use_weight_only (default int8)")
    q.add_argument("--kv_cache_dtype", default=None, choices=["fp8", "int8"], help="quantized KV cache")
    q.add_argument("--int8_kv_cache", action="store_true", help="= --kv_cache_dtype int8")
    return q


def add_convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model_dir", default=None, help="Hugging Face base model directory")
    p.add_argument("--base_checkpoint_dir", default=None,
                   help="instead of --model_dir: a TensorRT-LLM checkpoint quantized by NVIDIA's tools (FP8, "
                   "INT4-AWQ, W4A8-AWQ, INT8 SmoothQuant, weight-only); its tensors are kept as they are and the "
                   "heads added")
    p.add_argument("--medusa_model_dir", required=True, help="Medusa heads (any layout; see inspect-heads)")
    p.add_argument("--output_dir", default="tllm_checkpoint", help="TensorRT-LLM checkpoint to write")
    # default None, read as float16 (upstream's), so that a typed --dtype float16 can be told from the default
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "float16", "bfloat16"],
                   help="checkpoint dtype (default float16 as upstream's Medusa script; auto = the base's own; "
                        "with --base_checkpoint_dir: the base's own)")
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--moe_ep_size", type=int, default=-1,
                   help="MoE bases: expert parallelism within tp (upstream's flag; -1: none, or tp / --moe_tp_size)")
    p.add_argument("--moe_tp_size", type=int, default=-1,
                   help="MoE bases: tensor parallelism of each expert (-1: tp / --moe_ep_size)")
    p.add_argument("--num_medusa_heads", type=int, default=None, help="default: read from the heads")
    p.add_argument("--num_medusa_layers", type=int, default=None, help="default: read from the heads")
    p.add_argument("--max_draft_len", "--max_medusa_token_len", dest="max_medusa_token_len", type=int, default=63,
                   help="tree nodes per step, written as max_draft_len (upstream's convert script: "
                   "--max_medusa_token_len)")
    p.add_argument("--model_type", default=None, help="family (llama, mistral, qwen2, ...); default: from config.json")
    p.add_argument("--workers", type=int, default=1, help="threads converting tensors in parallel")
    p.add_argument("--use_parallel_embedding", action="store_true")
    p.add_argument("--embedding_sharding_dim", type=int, default=0, choices=[0, 1])
    p.add_argument("--medusa_hidden_act", default="silu", help="only silu (Medusa heads are trained with SiLU)")
    p.add_argument("--medusa_choices", default=None, help="tree to check against the heads and max_draft_len")
    p.add_argument("--share_lm_head", action="store_true", help="every head uses the base lm_head (stored once)")
    p.add_argument("--allow_unsupported", action="store_true",
                   help="write a checkpoint even when TensorRT-LLM cannot serve it correctly (ALiBi, attention "
                   "soft-capping), with a loud warning; for experiments and the reference executor")
    q = add_quant_format_args(p)
    q.add_argument("--calib_dataset", default=None,
                   help="calibration text (one sample per line) or JSON lines with text / input_ids; default: the "
                   "packaged prompts, tokenized with the base's tokenizer")
    q.add_argument("--calib_size", type=_int_in(1), default=512, help="calibration samples (default 512)")
    q.add_argument("--calib_max_seq_length", type=_int_in(1), default=512, help="tokens per sample at most (512)")
    q.add_argument("--tokenizer_dir", default=None, help="tokenizer for text calibration (default --model_dir)")
    q.add_argument("--device", default="cpu", help="torch device of the calibration pass (default cpu)")
    q.add_argument("--threads", type=_int_in(1), default=None,
                   help="torch threads of the calibration pass (default: the idle cores, measured at the start)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    p.add_argument("--fsync", action="store_true",
                   help="make the rank files durable (fsync) before the output appears; always done when an "
                   "existing --output_dir is replaced")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result (config, memory plan, moves) as JSON")
    p.add_argument("--load_by_shard", action="store_true", help="accepted; loading is always lazy and per tensor")
    p.add_argument("--load_model_on_cpu", "--load-model-on-cpu", "--convert-model-on-cpu", "--convert_model_on_cpu",
                   action="store_true", help="accepted; conversion always runs on the CPU")
    for flag in list(_NOT_SUPPORTED) + list(_FROM_CONFIG):
        p.add_argument(flag, nargs="*", default=None, help=argparse.SUPPRESS)


def run_convert(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import ConvertOptions, convert

    for flag, what in _NOT_SUPPORTED.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
            hint = ("quantize with TensorRT-LLM's own tools later" if "quant" in what or "calibration" in what
                    or "SmoothQuant" in what or "KV cache" in what else "lm_head and every tensor are written in --dtype")
            print(f"error: {flag}: {what} is not supported yet by trtllm-medusa-ports; convert without it ({hint})",
                  file=sys.stderr)
            return 2
    for flag in _FROM_CONFIG:
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
            print(f"error: {flag} is not supported: the value is read from "
                  f"{args.model_dir or args.base_checkpoint_dir}/config.json (edit that file if it is wrong)",
                  file=sys.stderr)
            return 2
    if (args.model_dir is None) == (args.base_checkpoint_dir is None):
        print("error: --model_dir and --base_checkpoint_dir: pass one of them\n  fix: --model_dir for a Hugging "
              "Face base, --base_checkpoint_dir for a TensorRT-LLM checkpoint NVIDIA's tools quantized",
              file=sys.stderr)
        return 2
    if args.medusa_hidden_act != "silu":
        print("error: --medusa_hidden_act: only silu is supported (Medusa ResBlocks are trained with SiLU)",
              file=sys.stderr)
        return 2
    if args.base_checkpoint_dir is not None:
        return _add_heads(args)
    ep = _moe_ep_size(args)
    if ep is None or not _calibration_device_ok(args):
        return 2
    opts = ConvertOptions(
        model_dir=Path(args.model_dir),
        medusa_model_dir=Path(args.medusa_model_dir),
        output_dir=Path(args.output_dir),
        dtype=args.dtype or "float16",
        tp_size=args.tp_size,
        pp_size=args.pp_size,
        moe_ep_size=ep,
        num_medusa_heads=args.num_medusa_heads,
        num_medusa_layers=args.num_medusa_layers,
        max_draft_len=args.max_medusa_token_len,
        model_type=args.model_type,
        workers=args.workers,
        use_parallel_embedding=args.use_parallel_embedding,
        embedding_sharding_dim=args.embedding_sharding_dim,
        share_lm_head=args.share_lm_head,
        overwrite=args.overwrite,
        fsync=args.fsync,
        quiet=args.quiet,
        allow_unsupported=args.allow_unsupported,
        medusa_choices=args.medusa_choices,
        qformat=args.qformat,
        use_weight_only=args.use_weight_only,
        weight_only_precision=args.weight_only_precision,
        kv_cache_dtype=args.kv_cache_dtype,
        int8_kv_cache=args.int8_kv_cache,
        calib_dataset=Path(args.calib_dataset) if args.calib_dataset else None,
        calib_size=args.calib_size,
        calib_max_seq_length=args.calib_max_seq_length,
        tokenizer_dir=Path(args.tokenizer_dir) if args.tokenizer_dir else None,
        device=args.device,
        threads=args.threads,
    )
    result = convert(opts)
    for f in result.findings:
        if f.severity != "info":
            print(f"{f.severity}: [{f.rule}] {f.message}", file=sys.stderr)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(result.to_dict(), indent=2) if getattr(args, "json", False) else result.summary())
    return 0


def _moe_ep_size(args: argparse.Namespace) -> int | None:
    """Expert parallelism from --moe_ep_size / --moe_tp_size (upstream's pair, -1 each: resolved as
    tensorrt_llm/mapping.py does); None (after the message) where they contradict --tp_size."""
    ep, tpm, tp = args.moe_ep_size, args.moe_tp_size, args.tp_size
    if ep == -1:
        ep = 1 if tpm == -1 else (tp // tpm if tpm > 0 and tp % tpm == 0 else 0)
    if ep < 1 or (tpm != -1 and tpm * ep != tp):
        print(f"error: --moe_tp_size {args.moe_tp_size} x --moe_ep_size {args.moe_ep_size} must equal --tp_size {tp}\n"
              "  fix: pass one of them (the other is tp_size divided by it)", file=sys.stderr)
        return None
    return ep


def _calibration_device_ok(args: argparse.Namespace) -> bool:
    """``--device`` where a calibration pass will compute on it, checked by doing so (devices.check_device: meta,
    cuda without CUDA, an ordinal past the GPUs, a bad name); False after the message (a usage error)."""
    from trtllm_medusa_ports.quant import spec_from_flags

    if not spec_from_flags(args).needs_calibration:
        return True  # a flag that does not apply: api.convert warns
    return _device_ok(args.device)


def _device_ok(device: str) -> bool:
    from trtllm_medusa_ports.devices import check_device

    try:
        check_device(device, "--device")
    except PortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


#: convert's flags (and their defaults) a base quantized by NVIDIA's tools cannot honour: it keeps its own
#: quantization, mapping and layout, and add-heads reads its family from its config.json and calibrates nothing
_ADD_HEADS_REFUSED = (
    ("--qformat", "qformat", None, "quantization"), ("--use_weight_only", "use_weight_only", False, "quantization"),
    ("--weight_only_precision", "weight_only_precision", None, "quantization"),
    ("--kv_cache_dtype", "kv_cache_dtype", None, "quantization"), ("--int8_kv_cache", "int8_kv_cache", False,
                                                                   "quantization"),
    ("--calib_dataset", "calib_dataset", None, "calibration"), ("--calib_size", "calib_size", 512, "calibration"),
    ("--calib_max_seq_length", "calib_max_seq_length", 512, "calibration"),
    ("--tokenizer_dir", "tokenizer_dir", None, "calibration"), ("--device", "device", "cpu", "calibration"),
    ("--threads", "threads", None, "calibration"),
    ("--tp_size", "tp_size", 1, "mapping"), ("--pp_size", "pp_size", 1, "mapping"),
    ("--moe_ep_size", "moe_ep_size", -1, "mapping"), ("--moe_tp_size", "moe_tp_size", -1, "mapping"),
    ("--use_parallel_embedding", "use_parallel_embedding", False, "layout"),
    ("--embedding_sharding_dim", "embedding_sharding_dim", 0, "layout"),
    ("--share_lm_head", "share_lm_head", False, "layout"),
    ("--model_type", "model_type", None, "family"),
    ("--allow_unsupported", "allow_unsupported", False, "override"),
)
_ADD_HEADS_WHY = {
    "quantization": "the base keeps its own quantization (its tensors are copied as they are)",
    "calibration": "nothing is calibrated: the base keeps the scales its tool wrote",
    "mapping": "the base keeps its own mapping (tensor/pipeline/expert parallelism: its rank files as they are)",
    "layout": "the base keeps its own embedding and lm_head layout",
    "family": "the family is read from the base checkpoint's config.json (architecture)",
    "override": "add-heads runs no check that --allow_unsupported overrides",
}


def _add_heads(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import AddHeadsOptions, add_heads
    from trtllm_medusa_ports.quant.prequantized import FlagConflict

    asked = [(flag, why) for flag, dest, default, why in _ADD_HEADS_REFUSED if getattr(args, dest) != default]
    if asked:
        reasons = dict.fromkeys(_ADD_HEADS_WHY[why] for _, why in asked)
        print(f"error: {', '.join(f for f, _ in asked)} with --base_checkpoint_dir: {'; '.join(reasons)}\n"
              "  fix: drop them (quantize and shard the base with NVIDIA's tools)", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"error: --workers {args.workers} must be at least 1\n  fix: use --workers 1 or more", file=sys.stderr)
        return 2
    # no --dtype: the base's own (a typed --dtype other than the base's is refused by add_heads, exit 2)
    dtype = args.dtype
    try:
        result = add_heads(AddHeadsOptions(
            Path(args.base_checkpoint_dir), Path(args.medusa_model_dir), Path(args.output_dir),
            max_draft_len=args.max_medusa_token_len, overwrite=args.overwrite, dtype=dtype,
            num_medusa_heads=args.num_medusa_heads, num_medusa_layers=args.num_medusa_layers,
            medusa_choices=args.medusa_choices, fsync=args.fsync))
    except FlagConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.render())
    return 0


# -- other subcommands --------------------------------------------------------------------
def _out(args: argparse.Namespace, result) -> None:
    """The command's result: ``to_dict()`` as JSON with --json, else its text."""
    print(json.dumps(result.to_dict(), indent=2) if getattr(args, "json", False) else result.render())


def run_inspect_heads(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import inspect_heads

    _out(args, inspect_heads(args.path, data_check=not args.no_data_check))
    return 0


def run_tree(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import TreeOptions, tree
    from trtllm_medusa_ports.tree import preset_names

    if args.list_presets:
        print("\n".join(preset_names()))
        return 0
    if not args.choices:
        print("error: --choices is required (a preset, @file, or a JSON list)", file=sys.stderr)
        return 2
    result = tree(TreeOptions(args.choices, num_heads=args.num_heads, max_draft_len=args.max_draft_len,
                              top_k=args.top_k))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    print(json.dumps(result.to_dict()) if args.json else result.render(draw=args.draw))
    return 0


def _prompt_inputs(args: argparse.Namespace):
    """--prompt / --prompts_file / --prompt_ids / --data, as every command reads them (files/prompts.py)."""
    from trtllm_medusa_ports.files.prompts import PromptInputs, parse_prompt_ids

    return PromptInputs(prompt=list(args.prompt or []),
                        prompts_file=Path(args.prompts_file) if args.prompts_file else None,
                        prompt_ids=parse_prompt_ids(args.prompt_ids) if args.prompt_ids else None,
                        data=Path(args.data) if args.data else None)


def _path(v) -> Path | None:
    return Path(v) if v else None


def run_train_heads(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import FitOptions, TrainOptions, train_heads
    from trtllm_medusa_ports.heads.train import TrainingInterrupted

    if args.device is not None and not _device_ok(args.device):  # computed on before the base is loaded
        return 2
    fit = FitOptions(num_heads=args.num_heads, num_layers=args.num_layers, steps=args.steps, lr=args.lr,
                     batch_size=args.batch_size or None, share_lm_head=args.share_lm_head, seed=args.seed,
                     full_vocab=args.full_vocab, distill=args.distill, save_every=args.save_every,
                     negatives=args.negatives, matmul_dtype=args.fit_dtype, heldout_fraction=args.heldout_fraction,
                     quiet=args.quiet)
    opts = TrainOptions(model_dir=Path(args.model_dir), output_dir=Path(args.output_dir),
                        prompts=_prompt_inputs(args), tokenizer_dir=_path(args.tokenizer_dir),
                        new_tokens=args.new_tokens, dtype=args.dtype, work_dir=_path(args.work_dir),
                        resume=args.resume, overwrite=args.overwrite, device=args.device, fit=fit,
                        threads=args.threads, device_map=args.device_map, dist_timeout=args.dist_timeout)
    main_rank = os.environ.get("RANK", "0") in ("", "0")  # under torchrun rank 0 speaks for the job
    try:
        result = train_heads(opts)
    except TrainingInterrupted as exc:
        code = 128 + int(exc.signum)
        if not main_rank:
            return code
        if exc.step is not None:
            print(f"interrupted after step {exc.step}; the training state holds exactly those steps: run the same "
                  "command with --resume to continue (the result equals an uninterrupted run's)", file=sys.stderr)
        else:
            print("interrupted; the last periodic training state (if any) stands: run the same command with "
                  "--resume to continue from it", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("interrupted before training began: no training state was saved (a finished corpus is cached); "
              "run the same command again", file=sys.stderr)
        return 130
    if main_rank:
        print(json.dumps(result.to_dict(), indent=2) if args.json else result.summary())
    return 0


def run_tune_tree(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import TuneOptions, tune_tree

    result = tune_tree(TuneOptions(
        model_dir=Path(args.model_dir), medusa_model_dir=Path(args.medusa_model_dir), output=Path(args.output),
        prompts=_prompt_inputs(args), tokenizer_dir=_path(args.tokenizer_dir), new_tokens=args.new_tokens,
        max_nodes=args.max_nodes, max_draft_len=args.max_draft_len, top_k=args.top_k, estimate=args.estimate,
        baseline=args.baseline or None, overwrite=args.overwrite, threads=args.threads, quiet=args.quiet))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    _out(args, result)
    return 0


def _add_prompt_args(s: argparse.ArgumentParser, what: str, file_aliases: tuple[str, ...] = ()) -> None:
    """The four spellings of text input, the same on every command (files/prompts.py)."""
    g = s.add_mutually_exclusive_group()
    g.add_argument("--prompt", action="append", default=None,
                   help=f"text {what} (needs a tokenizer); repeat for several prompts")
    g.add_argument("--prompts_file", *file_aliases, dest="prompts_file", default=None,
                   help="text file, one prompt per line (\\n for a line break)")
    g.add_argument("--prompt_ids", default=None, help="token ids: 1,2,3 (';' separates prompts)")
    g.add_argument("--data", default=None, help='JSON lines: {"prompt": ...} or {"prompt_ids": [...]} (prompts), '
                   '{"text": ...} or {"input_ids": [...]} (used as they are)')
    s.add_argument("--tokenizer_dir", default=None, help="for text prompts (default: --model_dir)")


def _add_threads_arg(s: argparse.ArgumentParser) -> None:
    s.add_argument("--threads", type=_int_in(1), default=None,
                   help="torch threads (default: the idle cores, measured at the start)")


def run_check(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import CheckOptions, check

    result = check(CheckOptions(
        model_dir=Path(args.model_dir), medusa_model_dir=_path(args.medusa_model_dir),
        medusa_choices=args.medusa_choices, tp_size=args.tp_size, pp_size=args.pp_size,
        max_draft_len=args.max_draft_len, num_medusa_heads=args.num_medusa_heads, dtype=args.dtype,
        share_lm_head=args.share_lm_head, qformat=args.qformat, use_weight_only=args.use_weight_only,
        weight_only_precision=args.weight_only_precision, kv_cache_dtype=args.kv_cache_dtype,
        int8_kv_cache=args.int8_kv_cache, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
        gpu_memory_gb=args.gpu_memory_gb, prompts=_prompt_inputs(args), tokenizer_dir=_path(args.tokenizer_dir),
        threads=args.threads, quiet=args.quiet))
    _out(args, result)
    return 0 if result.compatible else 1


def run_verify(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import VerifyOptions, verify

    device = getattr(args, "device", "cpu")
    if device != "cpu" and not _device_ok(device):  # computed on before anything is loaded
        return 2
    if args.calib_dataset is None:  # they say how to read --calib_dataset: alone, they change nothing
        given = [f for f, v, d in (("--calib_size", args.calib_size, None),
                                   ("--calib_max_seq_length", args.calib_max_seq_length, 512)) if v != d]
        if given:
            print(f"warning: {', '.join(given)}: ignored without --calib_dataset (a checkpoint converted here "
                  "re-derives its scales from its recorded calibration)", file=sys.stderr)
    report = verify(VerifyOptions(
        model_dir=Path(args.model_dir), checkpoint_dir=Path(args.checkpoint_dir), medusa_choices=args.medusa_choices,
        prompts=_prompt_inputs(args), tokenizer_dir=_path(args.tokenizer_dir), max_new_tokens=args.max_new_tokens,
        medusa_model_dir=_path(args.medusa_model_dir), max_quant_error=args.max_quant_error, threads=args.threads,
        quiet=args.quiet, skip_tree_proof=args.skip_tree_proof, gemm_plugin=args.gemm_plugin,
        calib_dataset=_path(args.calib_dataset), calib_size=args.calib_size,
        calib_max_seq_length=args.calib_max_seq_length, accept_unchecked_scales=args.accept_unchecked_scales,
        streaming=args.streaming, max_memory=args.max_memory, device=args.device, offload_dir=_path(args.offload_dir)))
    _out(args, report)
    return 0 if report.ok else 1


def run_build(args: argparse.Namespace, rest: list[str]) -> int:
    from trtllm_medusa_ports.api import BuildOptions, build

    return build(BuildOptions(Path(args.checkpoint_dir), list(rest), allow_unsupported=args.allow_unsupported)).returncode


def run_demo(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.demo import run_demo as demo

    return demo(Path(args.workdir), quiet=args.quiet, architecture=args.architecture)


USAGE = """Medusa speculative decoding in TensorRT-LLM 1.2 for base models other than Llama: check what the
engine can serve, convert a Hugging Face base and its Medusa heads (float, FP8, INT8/INT4 weight-only),
prove the checkpoint on CPU, and build it.

examples:
  trtllm-medusa check --model_dir ./Qwen2-7B --medusa_model_dir ./heads --tp_size 2 --qformat int4_wo \\
      --max_batch_size 8 --max_seq_len 4096 --gpu_memory_gb 24
  trtllm-medusa convert --model_dir ./Qwen2-7B --medusa_model_dir ./heads --output_dir ./ckpt --tp_size 2
  trtllm-medusa verify --model_dir ./Qwen2-7B --checkpoint_dir ./ckpt --prompt "Hello"
  trtllm-medusa build --checkpoint_dir ./ckpt --output_dir ./engine --max_batch_size 4
  trtllm-medusa train-heads --model_dir ./Qwen2-0.5B --output_dir ./heads --share_lm_head
  trtllm-medusa tune-tree --model_dir ./Qwen2-0.5B --medusa_model_dir ./heads --output tree.json
  trtllm-medusa tree --choices mc_sim_7b_63 --draw
  trtllm-medusa inspect-heads ./heads
  trtllm-medusa demo

exit codes: 0 success, 1 a problem with the input or a failed check, 2 a usage error.
docs: docs/user-guide.md (commands), docs/compatibility-rules.md (every check rule)."""


def _inspect_heads_parser(sub) -> None:
    """``trtllm-medusa inspect-heads``'s flags."""
    s = sub.add_parser("inspect-heads", help="read a Medusa head checkpoint of any layout")
    s.set_defaults(func=run_inspect_heads)
    s.add_argument("path")
    s.add_argument("--json", action="store_true")
    s.add_argument("--no_data_check", action="store_true", help="skip the NaN/Inf scan (headers only)")


def _tree_parser(sub) -> None:
    """``trtllm-medusa tree``'s flags."""
    s = sub.add_parser("tree", help="parse and validate medusa_choices; print TensorRT-LLM's buffers")
    s.set_defaults(func=run_tree)
    s.add_argument("--choices", "--medusa_choices", dest="choices", help="preset name, @file, or JSON list of paths")
    s.add_argument("--num_heads", "--num_medusa_heads", dest="num_heads", type=int, default=None,
                   help="head count: a deeper preset is pruned to it, a deeper written-out tree refused")
    s.add_argument("--max_draft_len", type=int, default=None)
    s.add_argument("--top_k", type=int, default=10)
    s.add_argument("--list_presets", action="store_true")
    s.add_argument("--json", action="store_true")
    s.add_argument("--draw", action="store_true", help="print the tree as text, one line per node")


def _check_parser(sub) -> None:
    """``trtllm-medusa check``'s flags."""
    s = sub.add_parser("check", help="can TensorRT-LLM serve Medusa on this base (and heads, tree, parallelism)?")
    s.set_defaults(func=run_check)
    s.add_argument("--model_dir", required=True)
    s.add_argument("--medusa_model_dir", default=None)
    s.add_argument("--medusa_choices", default=None)
    s.add_argument("--tp_size", type=int, default=1)
    s.add_argument("--pp_size", type=int, default=1)
    s.add_argument("--max_draft_len", type=int, default=63)
    s.add_argument("--num_medusa_heads", type=int, default=None)
    s.add_argument("--dtype", default=None, choices=["auto", "float32", "float16", "bfloat16"])
    s.add_argument("--share_lm_head", action="store_true", help="plan the heads sharing the base lm_head")
    add_quant_format_args(s)
    m = s.add_argument_group("memory plan (weights per rank, KV cache; does it fit?)")
    m.add_argument("--max_batch_size", type=_int_in(1), default=None, help="sequences served at once")
    m.add_argument("--max_seq_len", type=_int_in(1), default=None, help="tokens per sequence (prompt + output)")
    m.add_argument("--gpu_memory_gb", type=_non_negative, default=None, help="memory of one GPU, in GB")
    _add_prompt_args(s, "to measure the activation range on (rule float16-range)")
    _add_threads_arg(s)
    s.add_argument("--json", action="store_true")
    s.add_argument("--quiet", action="store_true", help="no status line")


def _convert_parser(sub) -> None:
    """``trtllm-medusa convert``'s flags."""
    s = sub.add_parser("convert", help="HF base + Medusa heads -> TensorRT-LLM checkpoint")
    s.set_defaults(func=run_convert)
    add_convert_args(s)


def _verify_parser(sub) -> None:
    """``trtllm-medusa verify``'s flags."""
    s = sub.add_parser("verify", help="prove parity and greedy equivalence of a checkpoint on CPU")
    s.set_defaults(func=run_verify)
    s.add_argument("--model_dir", required=True)
    s.add_argument("--checkpoint_dir", required=True)
    s.add_argument("--medusa_choices", default=None, help="default: mc_sim_7b_63 cut to the heads' depth")
    s.add_argument("--max_new_tokens", type=int, default=32)
    s.add_argument("--medusa_model_dir", default=None,
                   help="the heads the checkpoint was converted from (default: the path recorded at conversion)")
    _add_prompt_args(s, "to decode (default: a few prompts of token ids)")
    _add_threads_arg(s)
    s.add_argument("--max_quant_error", type=_non_negative, default=None,
                   help="quantized checkpoints: fail when the logits differ from the float base's by more "
                   "(default: the difference is reported, not judged)")
    s.add_argument("--gemm_plugin", choices=["auto", "fp8"], default="auto",
                   help="FP8 checkpoints: the trtllm-build --gemm_plugin to compute as (auto, also trtllm-build's "
                   "default and any float dtype: scales cast to the model dtype; fp8: the FP8 GEMM plugin)")
    s.add_argument("--calib_dataset", default=None,
                   help="a checkpoint NVIDIA's tools quantized: the samples it was calibrated on (text lines or JSON "
                   "lines with input_ids), to re-derive its activation / KV scales")
    s.add_argument("--calib_size", type=_int_in(1), default=None, help="samples of --calib_dataset (default: all)")
    s.add_argument("--calib_max_seq_length", type=_int_in(1), default=512, help="tokens per sample at most (512)")
    s.add_argument("--accept_unchecked_scales", action="store_true",
                   help="accept activation / KV scales that cannot be re-derived (the verdict says so); without it "
                   "they fail verify")
    s.add_argument("--skip_tree_proof", action="store_true",
                   help="leave out the tree proof (steps whose drafts are greedy's own tokens along each branch, so "
                   "that every tree node is accepted and checked; about one plain token per node of the tree)")
    memory = s.add_mutually_exclusive_group()
    memory.add_argument("--streaming", dest="streaming", action="store_true", default=None,
                        help="hold one decoder layer of each side at a time, read again from the files every forward "
                        "pass (bounded memory, slower; the same results)")
    memory.add_argument("--no_streaming", dest="streaming", action="store_false",
                        help="hold each side's whole model in float32 (about 0.73 GB + 0.95x its float32 size)")
    s.add_argument("--max_memory", type=_non_negative, default=None, metavar="GB",
                   help="without --streaming / --no_streaming: stream when the in-memory estimate exceeds this "
                   "(default: the memory available); the report says which mode ran")
    s.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where both sides compute (default cpu)")
    s.add_argument("--offload_dir", default=None,
                   help="streaming: a directory on a disk for transformers' weights while they wait (a temporary "
                   "file the size of the base in its dtype, removed at once; default: the temporary directory)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--quiet", action="store_true", help="no progress bars")


def _train_heads_parser(sub) -> None:
    """``trtllm-medusa train-heads``'s flags."""
    s = sub.add_parser("train-heads", help="train Medusa heads for a base on its own greedy continuations")
    s.set_defaults(func=run_train_heads)
    s.add_argument("--model_dir", required=True, help="Hugging Face base model directory")
    s.add_argument("--output_dir", required=True, help="where to write the heads (FasterDecoding layout)")
    s.add_argument("--num_heads", "--medusa_num_heads", dest="num_heads", type=_int_in(1, 64), default=4)
    s.add_argument("--num_layers", "--medusa_num_layers", dest="num_layers", type=_int_in(1, 64), default=1)
    _add_prompt_args(s, "to train on (continued by the base; default: the packaged prompts)", file_aliases=("--prompts",))
    s.add_argument("--heldout_fraction", type=_fraction, default=0.05,
                   help="share of the sequences kept out of training, to report each head's held-out top-1 accuracy "
                   "(default 0.05: every 20th; 0: none)")
    _add_threads_arg(s)
    s.add_argument("--json", action="store_true", help="print the result (accuracies, history) as JSON")
    s.add_argument("--new_tokens", type=_int_in(1, 1 << 16), default=64,
                   help="greedy tokens generated per prompt (cached)")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="dtype the base runs in to write the corpus (default auto: bfloat16 where a timed probe finds "
                   "the device computes it fast - AVX512-BF16/AMX CPUs, GPUs - else float32; an explicit bfloat16 "
                   "on a device without bfloat16 units warns: it can be 40x slower there)")
    s.add_argument("--steps", type=_int_in(1), default=1000)
    s.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (warm-up, then cosine decay)")
    s.add_argument("--batch_size", type=_int_in(0), default=256, help="positions per head per step (0: all)")
    s.add_argument("--share_lm_head", action="store_true",
                   help="heads use the base lm_head (FasterDecoding version 2): smaller, faster to train")
    s.add_argument("--full_vocab", action="store_true",
                   help="softmax over the whole vocabulary (default: over the tokens the corpus holds)")
    s.add_argument("--distill", type=float, default=0.5,
                   help="weight (0..1) of the soft target: each head also matches the base's own next-token "
                   "distribution at its position; 0: the greedy token only")
    s.add_argument("--negatives", type=int, default=8192,
                   help="without --full_vocab: tokens outside the corpus drawn afresh each step into the softmax, "
                   "so that the heads learn to rank them low too")
    s.add_argument("--fit_dtype", default="auto", choices=["auto", "float32", "bfloat16"],  # FIT_DTYPES + devices.py
                   help="dtype of the fit's products with the vocabulary (default auto, as --dtype): bfloat16 is "
                   "about twice as fast where the hardware has it; the loss, the heads and the optimiser stay float32")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--resume", action="store_true", help="continue the saved run (same flags)")
    s.add_argument("--save_every", type=_int_in(1), default=100, help="steps between saved training states")
    s.add_argument("--work_dir", default=None, help="cached corpus and training state (default: OUTPUT_DIR.train)")
    s.add_argument("--device", default=None, help="default: cuda when present, else cpu (under torchrun: "
                   "cuda:LOCAL_RANK)")
    s.add_argument("--device_map", default=None, choices=["auto"],
                   help="load the base across the GPUs this rank sees for the corpus pass (a base bigger than one "
                   "device; needs accelerate)")
    s.add_argument("--dist_timeout", type=_int_in(1), default=1800,
                   help="under torchrun: seconds a rank waits for the others at one exchange before it stops with "
                   "an error (a rank that dies is noticed at once on CPUs)")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    s.add_argument("--quiet", action="store_true", help="no progress bars")


def _tune_tree_parser(sub) -> None:
    """``trtllm-medusa tune-tree``'s flags."""
    s = sub.add_parser("tune-tree", help="build a medusa_choices tree from the heads' measured accuracy")
    s.set_defaults(func=run_tune_tree)
    s.add_argument("--model_dir", required=True)
    s.add_argument("--medusa_model_dir", required=True)
    _add_prompt_args(s, "to measure the heads on (default: the packaged held-out prompts)", file_aliases=("--prompts",))
    _add_threads_arg(s)
    s.add_argument("--new_tokens", type=_int_in(1, 1 << 16), default=64, help="greedy tokens generated per prompt")
    s.add_argument("--max_nodes", type=_int_in(1, 4096), default=63, help="node budget (the engine's max_draft_len)")
    s.add_argument("--max_draft_len", type=_int_in(1, 4096), default=63,
                   help="refuse a budget above this (check's limit)")
    s.add_argument("--top_k", type=_int_in(1, 1000), default=10, help="candidates per head considered")
    s.add_argument("--estimate", default="product", choices=["product", "joint"],
                   help="node value: product of per-head accuracies (Medusa paper), or joint counts")
    s.add_argument("--baseline", default="mc_sim_7b_63", help="tree to compare with ('' for none)")
    s.add_argument("--output", required=True, help="choices file to write (JSON list of paths)")
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--json", action="store_true")
    s.add_argument("--quiet", action="store_true")


def _build_command_parser(sub) -> None:
    """``trtllm-medusa build``'s flags."""
    s = sub.add_parser("build", help="trtllm-build with our architectures registered (needs tensorrt_llm)")
    s.set_defaults(func=run_build)
    s.add_argument("--checkpoint_dir", required=True)
    s.add_argument("--allow_unsupported", action="store_true",
                   help="build a float16 checkpoint whose base is known to overflow float16 (rule float16-range)")


def _demo_parser(sub) -> None:
    """``trtllm-medusa demo``'s flags."""
    s = sub.add_parser("demo", help="the end-to-end job on a small synthetic non-Llama base, offline")
    s.set_defaults(func=run_demo)
    s.add_argument("--workdir", default="demo-output")
    s.add_argument("--architecture", default="Qwen2ForCausalLM")
    s.add_argument("--quiet", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    from trtllm_medusa_ports import __version__

    p = argparse.ArgumentParser(prog="trtllm-medusa", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="command", required=True)

    _inspect_heads_parser(sub)
    _tree_parser(sub)
    _check_parser(sub)
    _convert_parser(sub)
    _verify_parser(sub)
    _train_heads_parser(sub)
    _tune_tree_parser(sub)
    _build_command_parser(sub)
    _demo_parser(sub)
    return p


def _terminate(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C: partial output is removed


def main(argv: list[str] | None = None) -> int:
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "build":
        args, rest = parser.parse_known_args(argv)
    else:
        args, rest = parser.parse_args(argv), []
    try:
        return args.func(args, rest) if args.command == "build" else args.func(args)
    except PortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing was left half-written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`... | head`): not an error of ours, and no traceback
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (Python flushes stdout again at exit)
        return 141
