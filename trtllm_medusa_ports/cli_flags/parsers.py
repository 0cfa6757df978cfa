"""Every command's flags: the argparse parser of each ``trtllm-medusa`` command and the flag groups they share.

Parsing only: what a command does with its flags is cli.py's run_<command>, passed in to ``build_parser``.
May import: the standard library and cli_flags.types / cli_flags.refused (the package's version lazily);
never cli or api.
"""

from __future__ import annotations

import argparse

from trtllm_medusa_ports.cli_flags.refused import FROM_CONFIG, NOT_SUPPORTED
from trtllm_medusa_ports.cli_flags.types import fraction, int_in, non_negative, number_in, positive
from trtllm_medusa_ports.files.tokenizer import CHAT_TEMPLATE_MODES
from trtllm_medusa_ports.log import DEFAULT_LEVEL, LEVELS


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


def add_revision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--revision", default=None,
                   help="where --model_dir is a Hub id: the branch, tag or commit to read (default main); other Hub "
                   "ids are read at main. Hub ids are fetched into the Hugging Face cache (HF_HOME; HF_HUB_OFFLINE "
                   "reads the cache alone)")


def add_chat_template_arg(p, what: str) -> None:
    """``--chat_template``: ``what`` through the tokenizer's chat template (files/tokenizer.py), or as it is."""
    p.add_argument("--chat_template", default="auto", choices=list(CHAT_TEMPLATE_MODES),
                   help=f"auto: {what} go through the tokenizer's chat template where it has one (an instruct base is "
                   "served so), said in the result; none: as they are")


def _add_calibration_args(q) -> None:
    """convert's calibration flags, in the quantization group ``q`` (upstream's spellings)."""
    q.add_argument("--calib_dataset", default=None,
                   help="calibration text (one sample per line) or JSON lines with text / input_ids; default: the "
                   "packaged prompts, tokenized with the base's tokenizer")
    q.add_argument("--calib_size", type=int_in(1), default=512, help="calibration samples (default 512)")
    q.add_argument("--calib_max_seq_length", type=int_in(1), default=512, help="tokens per sample at most (512)")
    add_chat_template_arg(q, "calibration prompts (the packaged ones, text lines, JSON prompt)")
    q.add_argument("--tokenizer_dir", default=None, help="tokenizer for text calibration (default --model_dir)")
    q.add_argument("--device", default="cpu", help="torch device of the calibration pass (default cpu)")
    q.add_argument("--threads", type=int_in(1), default=None,
                   help="torch threads of the calibration pass (default: the idle cores, measured at the start)")


def add_convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model_dir", default=None, help="Hugging Face base model directory, or its Hub id (owner/name)")
    add_revision_arg(p)
    p.add_argument("--base_checkpoint_dir", default=None,
                   help="instead of --model_dir: a TensorRT-LLM checkpoint quantized by NVIDIA's tools (FP8, "
                   "INT4-AWQ, W4A8-AWQ, INT8 SmoothQuant, weight-only); its tensors are kept as they are and the "
                   "heads added")
    p.add_argument("--medusa_model_dir", required=True,
                   help="Medusa heads (any layout; see inspect-heads): a directory or a Hub id")
    p.add_argument("--output_dir", default="tllm_checkpoint", help="TensorRT-LLM checkpoint to write")
    # default None, read as float16 (upstream's), so that a typed --dtype float16 can be told from the default
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "float16", "bfloat16"],
                   help="checkpoint dtype (default float16 as upstream's Medusa script, except for a family whose "
                        "hidden states exceed float16's range - Gemma 2/3 - which keeps the base's own; from another "
                        "bfloat16 base a note says verify checks the range; auto = the base's own; with "
                        "--base_checkpoint_dir: the base's own)")
    p.add_argument("--tp_size", type=int, default=1, help="tensor parallelism: rank files split each weight")
    p.add_argument("--pp_size", type=int, default=1, help="pipeline parallelism: each stage holds its layers")
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
    p.add_argument("--use_parallel_embedding", action="store_true", help="split vocab_embedding across the tp ranks")
    p.add_argument("--embedding_sharding_dim", type=int, default=0, choices=[0, 1],
                   help="with --use_parallel_embedding: 0 splits the vocabulary, 1 the hidden size")
    p.add_argument("--medusa_hidden_act", default="silu", help="only silu (Medusa heads are trained with SiLU)")
    p.add_argument("--medusa_choices", default=None, help="tree to check against the heads and max_draft_len")
    p.add_argument("--share_lm_head", action="store_true", help="every head uses the base lm_head (stored once)")
    p.add_argument("--allow_unsupported", action="store_true",
                   help="write a checkpoint even when TensorRT-LLM cannot serve it correctly (ALiBi, attention "
                   "soft-capping), with a loud warning; for experiments and the reference executor")
    _add_calibration_args(add_quant_format_args(p))
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    p.add_argument("--fsync", action="store_true",
                   help="make the rank files durable (fsync) before the output appears; always done when an "
                   "existing --output_dir is replaced")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result (config, memory plan, moves) as JSON")
    p.add_argument("--load_by_shard", action="store_true", help="accepted; loading is always lazy and per tensor")
    p.add_argument("--load_model_on_cpu", "--load-model-on-cpu", "--convert-model-on-cpu", "--convert_model_on_cpu",
                   action="store_true", help="accepted; conversion always runs on the CPU")
    for flag in list(NOT_SUPPORTED) + list(FROM_CONFIG):
        p.add_argument(flag, nargs="*", default=None, help=argparse.SUPPRESS)


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
    s.add_argument("--threads", type=int_in(1), default=None,
                   help="torch threads (default: the idle cores, measured at the start)")


USAGE = """Medusa speculative decoding in TensorRT-LLM 1.2 for base models other than Llama: check what the
engine can serve, convert a Hugging Face base and its Medusa heads (float, FP8, INT8/INT4 weight-only),
prove the checkpoint on CPU, and build it.

examples:
  trtllm-medusa check --model_dir ./Qwen2-7B --medusa_model_dir ./heads --tp_size 2 --qformat int4_wo \\
      --max_batch_size 8 --max_seq_len 4096 --gpu_memory_gb 24
  trtllm-medusa convert --model_dir ./Qwen2-7B --medusa_model_dir ./heads --output_dir ./ckpt --tp_size 2
  trtllm-medusa verify --model_dir ./Qwen2-7B --checkpoint_dir ./ckpt --prompt "Hello"
  trtllm-medusa build --checkpoint_dir ./ckpt --output_dir ./engine --max_batch_size 4
  trtllm-medusa deploy --checkpoint_dir ./ckpt --tokenizer_dir ./Qwen2-7B --output_dir ./serve
  trtllm-medusa train-heads --model_dir ./Qwen2-0.5B --output_dir ./heads --share_lm_head
  trtllm-medusa tune-tree --model_dir ./Qwen2-0.5B --medusa_model_dir ./heads --output tree.json
  trtllm-medusa tree --choices mc_sim_7b_63 --draw
  trtllm-medusa inspect-heads ./heads
  trtllm-medusa demo

exit codes: 0 success, 1 a problem with the input or a failed check, 2 a usage error.
docs: docs/user-guide.md (commands), docs/compatibility-rules.md (every check rule)."""


def _inspect_heads_parser(sub, run) -> None:
    """``trtllm-medusa inspect-heads``'s flags."""
    s = sub.add_parser("inspect-heads", help="read a Medusa head checkpoint of any layout")
    s.set_defaults(func=run)
    s.add_argument("path", help="a heads directory or file, in any layout")
    s.add_argument("--json", action="store_true", help="print what the heads hold as JSON")
    s.add_argument("--no_data_check", action="store_true", help="skip the NaN/Inf scan (headers only)")


def _tree_parser(sub, run) -> None:
    """``trtllm-medusa tree``'s flags."""
    s = sub.add_parser("tree", help="parse and validate medusa_choices; print TensorRT-LLM's buffers")
    s.set_defaults(func=run)
    s.add_argument("--choices", "--medusa_choices", dest="choices", help="preset name, @file, or JSON list of paths")
    s.add_argument("--num_heads", "--num_medusa_heads", dest="num_heads", type=int, default=None,
                   help="head count: a deeper preset is pruned to it, a deeper written-out tree refused")
    s.add_argument("--max_draft_len", type=int, default=None, help="refuse a tree of more nodes than this")
    s.add_argument("--top_k", type=int, default=10, help="refuse a path index of top_k or more")
    s.add_argument("--list_presets", action="store_true", help="print the preset names")
    s.add_argument("--json", action="store_true", help="print the tree and its buffers as JSON")
    s.add_argument("--draw", action="store_true", help="print the tree as text, one line per node")


def _check_parser(sub, run) -> None:
    """``trtllm-medusa check``'s flags."""
    s = sub.add_parser("check", help="can TensorRT-LLM serve Medusa on this base (and heads, tree, parallelism)?")
    s.set_defaults(func=run)
    s.add_argument("--model_dir", required=True, help="Hugging Face base model directory, or its Hub id (owner/name)")
    add_revision_arg(s)
    s.add_argument("--medusa_model_dir", default=None, help="Medusa heads to check against the base (or a Hub id)")
    s.add_argument("--medusa_choices", default=None, help="tree to check against the heads and max_draft_len")
    s.add_argument("--tp_size", type=int, default=1, help="tensor parallelism to check")
    s.add_argument("--pp_size", type=int, default=1, help="pipeline parallelism to check")
    s.add_argument("--max_draft_len", type=int, default=63, help="the engine's tree budget (tree slots per sequence)")
    s.add_argument("--num_medusa_heads", type=int, default=None, help="default: read from the heads")
    s.add_argument("--dtype", default=None, choices=["auto", "float32", "float16", "bfloat16"],
                   help="the checkpoint dtype to judge (float16's range, float32 with speculative decoding)")
    s.add_argument("--share_lm_head", action="store_true", help="plan the heads sharing the base lm_head")
    add_quant_format_args(s)
    m = s.add_argument_group("memory plan (weights per rank, KV cache; does it fit?)")
    m.add_argument("--max_batch_size", type=int_in(1), default=None, help="sequences served at once")
    m.add_argument("--max_seq_len", type=int_in(1), default=None, help="tokens per sequence (prompt + output)")
    m.add_argument("--gpu_memory_gb", type=non_negative, default=None, help="memory of one GPU, in GB")
    _add_prompt_args(s, "to measure the activation range on (rule float16-range)")
    _add_threads_arg(s)
    s.add_argument("--json", action="store_true", help="print the findings and the memory plan as JSON")
    s.add_argument("--quiet", action="store_true", help="no status line")


def _convert_parser(sub, run) -> None:
    """``trtllm-medusa convert``'s flags."""
    s = sub.add_parser("convert", help="HF base + Medusa heads -> TensorRT-LLM checkpoint")
    s.set_defaults(func=run)
    add_convert_args(s)


def _verify_parser(sub, run) -> None:
    """``trtllm-medusa verify``'s flags."""
    s = sub.add_parser("verify", help="prove parity and greedy equivalence of a checkpoint on CPU")
    s.set_defaults(func=run)
    s.add_argument("--model_dir", required=True,
                   help="the base model the checkpoint was converted from: a directory or its Hub id (owner/name)")
    add_revision_arg(s)
    s.add_argument("--checkpoint_dir", required=True, help="a checkpoint written by convert")
    s.add_argument("--medusa_choices", default=None,
                   help="default: the tree the checkpoint was converted for (else mc_sim_7b_63 cut to the heads' depth)")
    s.add_argument("--override_medusa_choices", action="store_true",
                   help="verify a --medusa_choices other than the tree the checkpoint records (refused otherwise)")
    s.add_argument("--max_new_tokens", type=int, default=32, help="greedy tokens per prompt")
    s.add_argument("--medusa_model_dir", default=None,
                   help="the heads the checkpoint was converted from (default: the path recorded at conversion)")
    _add_prompt_args(s, "to decode (default: a few prompts of token ids)")
    _add_threads_arg(s)
    s.add_argument("--max_quant_error", type=non_negative, default=None,
                   help="quantized checkpoints: fail when the logits differ from the float base's by more "
                   "(default: the difference is reported, not judged)")
    s.add_argument("--min_quant_agreement", type=number_in(0, 1), default=None,
                   help="quantized checkpoints: fail when, reading the float base's greedy text, the model predicts "
                   "less than this fraction of its tokens (default 0.75, verify/limits.py MIN_QUANT_AGREEMENT; 0: not "
                   "judged)")
    s.add_argument("--gemm_plugin", choices=["auto", "fp8"], default="auto",
                   help="FP8 checkpoints: the trtllm-build --gemm_plugin to compute as (auto, also trtllm-build's "
                   "default and any float dtype: scales cast to the model dtype; fp8: the FP8 GEMM plugin)")
    s.add_argument("--calib_dataset", default=None,
                   help="a checkpoint NVIDIA's tools quantized: the samples it was calibrated on (text lines or JSON "
                   "lines with input_ids), to re-derive its activation / KV scales")
    s.add_argument("--calib_size", type=int_in(1), default=None, help="samples of --calib_dataset (default: all)")
    s.add_argument("--calib_max_seq_length", type=int_in(1), default=512, help="tokens per sample at most (512)")
    s.add_argument("--accept_unchecked_scales", action="store_true",
                   help="accept activation / KV scales that cannot be re-derived (the verdict says so); without it "
                   "they fail verify")
    s.add_argument("--skip_tree_proof", action="store_true",
                   help="leave out the tree proof (steps whose drafts are greedy's own tokens along each branch, so "
                   "that every tree node is accepted and checked; about one plain token per node of the tree)")
    _add_memory_args(s, "of each side", "the same results",
                     "hold each side's whole model in float32 (the estimate: user guide, \"Large bases\")",
                     "(default: the memory available)", "transformers' weights while they wait (a temporary file")
    s.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where both sides compute (default cpu)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_memory_args(s, held: str, same: str, whole: str, default: str, waiting: str) -> None:
    """The memory-mode flags of verify and train-heads (memory_mode.py chooses by them for both)."""
    memory = s.add_mutually_exclusive_group()
    memory.add_argument("--streaming", dest="streaming", action="store_true", default=None,
                        help=f"hold one decoder layer {held} at a time, read again from the files every forward "
                        f"pass (bounded memory, slower; {same})")
    memory.add_argument("--no_streaming", dest="streaming", action="store_false", help=whole)
    s.add_argument("--max_memory", type=positive, default=None, metavar="GB",
                   help=f"without --streaming / --no_streaming: stream when the in-memory estimate exceeds this "
                   f"{default}; the report says which mode ran")
    s.add_argument("--offload_dir", default=None,
                   help=f"streaming: a directory on a disk for {waiting} the size of the base in its dtype, removed "
                   "at once; default: the temporary directory)")


def _add_train_memory_args(s) -> None:
    """train-heads' memory flags: how the base is held for the corpus pass (memory_mode.py, as verify chooses)."""
    _add_memory_args(s, "of the base for the corpus pass", "the same corpus and heads",
                     "hold the whole base in float32 for the corpus pass",
                     "per process (default: the memory available, shared by this node's ranks)",
                     "the base's weights while they wait (a temporary file per rank,")


def _train_heads_parser(sub, run) -> None:
    """``trtllm-medusa train-heads``'s flags."""
    s = sub.add_parser("train-heads", help="train Medusa heads for a base on its own greedy continuations")
    s.set_defaults(func=run)
    s.add_argument("--model_dir", required=True, help="Hugging Face base model directory, or its Hub id (owner/name)")
    add_revision_arg(s)
    s.add_argument("--output_dir", required=True, help="where to write the heads (FasterDecoding layout)")
    s.add_argument("--num_heads", "--medusa_num_heads", dest="num_heads", type=int_in(1, 64), default=4,
                   help="Medusa heads to train (head k guesses the token k + 2 ahead)")
    s.add_argument("--num_layers", "--medusa_num_layers", dest="num_layers", type=int_in(1, 64), default=1,
                   help="ResBlocks per head")
    _add_prompt_args(s, "to train on (continued by the base; default: the packaged prompts)", file_aliases=("--prompts",))
    add_chat_template_arg(s, "text prompts")
    s.add_argument("--heldout_fraction", type=fraction, default=0.05,
                   help="share of the sequences kept out of training, to report each head's held-out top-1 accuracy "
                   "(default 0.05: every 20th; 0: none)")
    _add_threads_arg(s)
    s.add_argument("--json", action="store_true", help="print the result (accuracies, history) as JSON")
    s.add_argument("--new_tokens", type=int_in(1, 1 << 16), default=64,
                   help="greedy tokens generated per prompt (cached)")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="dtype the base runs in to write the corpus (default auto: bfloat16 where a timed probe finds "
                   "the device computes it fast - AVX512-BF16/AMX CPUs, GPUs - else float32; an explicit bfloat16 "
                   "on a device without bfloat16 units warns: it can be 40x slower there)")
    s.add_argument("--steps", type=int_in(1), default=1000, help="optimizer steps of the fit")
    s.add_argument("--lr", type=positive, default=3e-3, help="peak learning rate (warm-up, then cosine decay)")
    s.add_argument("--batch_size", type=int_in(0), default=256, help="positions per head per step (0: all)")
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
    s.add_argument("--seed", type=int, default=0, help="the heads' initialisation and the batches' order")
    s.add_argument("--resume", action="store_true", help="continue the saved run (same flags)")
    s.add_argument("--save_every", type=int_in(1), default=100, help="steps between saved training states")
    s.add_argument("--work_dir", default=None, help="cached corpus and training state (default: OUTPUT_DIR.train)")
    s.add_argument("--device", default=None, help="default: cuda when present, else cpu (under torchrun: "
                   "cuda:LOCAL_RANK)")
    s.add_argument("--device_map", default=None, choices=["auto"],
                   help="load the base across the GPUs this rank sees for the corpus pass (a base bigger than one "
                   "device; needs accelerate)")
    _add_train_memory_args(s)
    s.add_argument("--dist_timeout", type=int_in(1), default=1800,
                   help="under torchrun: seconds a rank waits for the others at one exchange before it stops with "
                   "an error (a rank that dies is noticed at once on CPUs)")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    s.add_argument("--quiet", action="store_true", help="no progress bars")


def _tune_tree_parser(sub, run) -> None:
    """``trtllm-medusa tune-tree``'s flags."""
    s = sub.add_parser("tune-tree", help="build a medusa_choices tree from the heads' measured accuracy")
    s.set_defaults(func=run)
    s.add_argument("--model_dir", required=True, help="Hugging Face base model directory, or its Hub id (owner/name)")
    add_revision_arg(s)
    s.add_argument("--medusa_model_dir", required=True, help="the heads to measure (a directory or a Hub id)")
    _add_prompt_args(s, "to measure the heads on (default: the packaged held-out prompts)", file_aliases=("--prompts",))
    add_chat_template_arg(s, "text prompts")
    _add_threads_arg(s)
    s.add_argument("--new_tokens", type=int_in(1, 1 << 16), default=64, help="greedy tokens generated per prompt")
    s.add_argument("--max_nodes", type=int_in(1, 4096), default=63, help="node budget (the engine's max_draft_len)")
    s.add_argument("--max_draft_len", type=int_in(1, 4096), default=63,
                   help="refuse a budget above this (check's limit)")
    s.add_argument("--top_k", type=int_in(1, 1000), default=10, help="candidates per head considered")
    s.add_argument("--estimate", default="product", choices=["product", "joint"],
                   help="node value: product of per-head accuracies (Medusa paper), or joint counts")
    s.add_argument("--baseline", default="mc_sim_7b_63", help="tree to compare with ('' for none)")
    s.add_argument("--output", required=True, help="choices file to write (JSON list of paths)")
    s.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    s.add_argument("--json", action="store_true", help="print the tree and its measures as JSON")
    s.add_argument("--quiet", action="store_true", help="no progress bars")


def _build_command_parser(sub, run) -> None:
    """``trtllm-medusa build``'s flags."""
    s = sub.add_parser("build", help="trtllm-build with our architectures registered (needs tensorrt_llm)")
    s.set_defaults(func=run)
    s.add_argument("--checkpoint_dir", required=True, help="a checkpoint written by convert")
    s.add_argument("--allow_unsupported", action="store_true",
                   help="build a float16 checkpoint whose base is known to overflow float16 (rule float16-range)")


def _deploy_parser(sub, run) -> None:
    """``trtllm-medusa deploy``'s flags."""
    s = sub.add_parser("deploy", help="the serving bundle of a checkpoint: build.sh, run.sh, deploy.json")
    s.set_defaults(func=run)
    s.add_argument("--checkpoint_dir", required=True, help="a checkpoint written by convert")
    s.add_argument("--tokenizer_dir", required=True,
                   help="the Hugging Face base (or its tokenizer's) directory, or its Hub id (owner/name)")
    s.add_argument("--output_dir", required=True, help="where the bundle is written")
    s.add_argument("--engine_dir", default=None,
                   help="where build.sh builds the engine, written as an absolute path (so one on the machine that "
                   "builds); default: engine/ in the bundle, beside the scripts")
    s.add_argument("--medusa_choices", default=None,
                   help="default: the tree the checkpoint was converted for (else mc_sim_7b_63 cut to the heads)")
    s.add_argument("--override_medusa_choices", action="store_true",
                   help="serve a --medusa_choices other than the tree the checkpoint records (refused otherwise)")
    s.add_argument("--max_batch_size", type=int_in(1), default=None, help="default 8")
    s.add_argument("--max_input_len", type=int_in(1), default=None, help="default: half of --max_seq_len")
    s.add_argument("--max_seq_len", type=int_in(1), default=None,
                   help="default: the base's max_position_embeddings (learned positions: less the tree's depth; a "
                   "larger one is refused, rule learned-position-range)")
    s.add_argument("--gpu_memory_gb", type=non_negative, default=None,
                   help="one GPU's memory: refuse a bundle whose weights and KV cache do not fit it per rank, and "
                   "give the KV cache the share of it left after the weights that it needs (at most 0.9, "
                   "TensorRT-LLM's default, which every route gets without this flag)")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    s.add_argument("--json", action="store_true", help="print deploy.json")


def _demo_parser(sub, run) -> None:
    """``trtllm-medusa demo``'s flags."""
    s = sub.add_parser("demo", help="the end-to-end job on a small synthetic non-Llama base, offline")
    s.set_defaults(func=run)
    s.add_argument("--workdir", default="demo-output", help="where the demo writes (it replaces only what it made)")
    s.add_argument("--architecture", default="Qwen2ForCausalLM", help="the tiny base's family")
    s.add_argument("--quiet", action="store_true", help="no progress lines (the results are printed)")


#: each command's parser, in the order ``--help`` lists them
COMMAND_PARSERS = {
    "inspect-heads": _inspect_heads_parser, "tree": _tree_parser, "check": _check_parser,
    "convert": _convert_parser, "verify": _verify_parser, "train-heads": _train_heads_parser,
    "tune-tree": _tune_tree_parser, "build": _build_command_parser, "deploy": _deploy_parser, "demo": _demo_parser,
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, its last usage error kept (``Parser.last_error``) for the CLI's ``--json`` failure object;
    what argparse prints and its exit 2 are unchanged. Subparsers are of the same class (argparse's default)."""

    last_error: str | None = None

    def error(self, message: str):
        Parser.last_error = f"{self.prog}: {message}"
        super().error(message)


def build_parser(commands: dict, only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; ``commands`` maps each command's name to the function its ``func`` calls
    (cli.py's run_<command>). ``only``: that command's parser alone (what parsing a command line that starts
    with it reaches: the same namespace and messages, without building the other eight, ~10 ms)."""
    from trtllm_medusa_ports import __version__

    Parser.last_error = None
    p = Parser(prog="trtllm-medusa", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=__version__)
    # the usage line names every command whichever parsers are built (argparse's own spelling of the choices)
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMAND_PARSERS) + "}")
    for name, add in COMMAND_PARSERS.items():
        if only is None or name == only:
            add(sub, commands[name])
            sub.choices[name].add_argument(
                "--log_level", default=None, choices=list(LEVELS),
                help=f"what the log on stderr shows: TensorRT-LLM's level names (default {DEFAULT_LEVEL}, as "
                     "trtllm-build's; build passes it on to trtllm-build); --quiet still turns progress bars off")
    return p
