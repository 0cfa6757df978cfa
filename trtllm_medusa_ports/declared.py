"""Every option of every ``trtllm-medusa`` command, declared once: its field name, flag spellings, type and range,
default, help text and flag group (``COMMANDS``). Made from this one table:

* each command's argparse parser (cli_flags/parsers.py ``add_declared``), and from the parsers the flag tables of
  docs/user-guide.md (cli_flags/tables.py);
* the API's options dataclasses (api.py, through :func:`options_class`): their fields, types and defaults;
* the API's validation specs (options/validation.py ``SPECS``, through :func:`specs`).

So a default, a range or a spelling changes in one place, and the command line and the API cannot differ.

May import: the standard library, files.dtypes and files.tokenizer (the dtypes and chat-template modes); a nested type
is named by
a string that options/validation.py resolves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES
from trtllm_medusa_ports.files.tokenizer import CHAT_TEMPLATE_MODES

#: the default of a field the API requires (the command line may still have a default or an alternative)
REQUIRED = dataclasses.MISSING
#: a flag whose default is the API field's
SAME = object()


@dataclass(frozen=True)
class Spec:
    """What an option accepts: the API's validation (options/validation.py) and the flag's argparse type."""

    kind: str  # path, int, float, bool, str, tree, list, ids, of, nested
    lo: float | None = None
    hi: float | None = None
    below: float | None = None  # exclusive upper bound
    lo_excluded: bool = False  # ``lo`` itself refused (a number above it)
    choices: tuple | None = None
    none: bool = False  # None accepted although the default is not None
    flag: str | None = ""  # the flag spelling in messages ("": --<field>; None: no flag)
    of: str | None = None  # kind "of" / "nested": the accepted type's name (options/validation.py resolves it)


@dataclass(frozen=True)
class Option:
    """One option: the API field ``name`` (owned by ``owner``: "" the command's class, None the command line's
    alone) and its flag (``flags``; None: the API's alone)."""

    name: str
    spec: Spec
    default: object = None  # the API field's (REQUIRED: none)
    help: str = ""
    flags: tuple[str, ...] | None = ()  # (): ("--<name>",)
    dest: str = ""  # the parser's dest where it is not ``name``
    cli_default: object = SAME  # the flag's default where it spells the API's otherwise
    required: bool = False  # on the command line
    group: str = ""  # the flag group's title ("": the command's own)
    exclusive: str = ""  # a mutually exclusive group's key
    owner: str | None = ""
    cli_spec: Spec | None = None  # the flag's own range where it spells a value otherwise (--batch_size 0)
    factory: str | None = None  # the API field's default factory, by type name
    extra: tuple = ()  # further argparse keywords, as (key, value) pairs

    @property
    def spellings(self) -> tuple[str, ...]:
        return (f"--{self.name}",) if self.flags == () else tuple(self.flags or ())

    @property
    def parsed_dest(self) -> str:
        """Where argparse puts the flag's value: ``dest``, or the first spelling's (as argparse derives it)."""
        return self.dest or self.spellings[0].lstrip("-").replace("-", "_")

    @property
    def flag_default(self):
        v = self.default if self.cli_default is SAME else self.cli_default
        return None if v is REQUIRED else str(v) if isinstance(v, Path) else v


def _P(name, help="", **kw) -> Option:
    return Option(name, Spec("path"), help=help, **kw)


def _S(name, help="", choices=None, none=False, **kw) -> Option:
    return Option(name, Spec("str", choices=tuple(choices) if choices else None, none=none), help=help, **kw)


def _I(name, help="", lo=None, hi=None, choices=None, none=False, **kw) -> Option:
    return Option(name, Spec("int", lo=lo, hi=hi, choices=choices, none=none), help=help, **kw)


def _F(name, help="", lo=None, hi=None, lo_excluded=False, below=None, none=False, **kw) -> Option:
    return Option(name, Spec("float", lo=lo, hi=hi, lo_excluded=lo_excluded, below=below, none=none), help=help, **kw)


def _B(name, help="", **kw) -> Option:
    return Option(name, Spec("bool"), default=False, help=help, **kw)


def _T(name, help="", **kw) -> Option:
    return Option(name, Spec("tree"), help=help, **kw)


def _cli(option: Option) -> Option:
    """A flag of the command line alone (no API field)."""
    return dataclasses.replace(option, owner=None)


def _api(option: Option) -> Option:
    """An API field with no flag."""
    return dataclasses.replace(option, flags=None)


# -- the shared groups ---------------------------------------------------------------------------------------
FLOAT_DTYPES = ("auto", *CHECKPOINT_DTYPES)
_QUANT_GROUP = ("quantization (upstream's spellings; Medusa heads, lm_head, embedding and norms stay in --dtype)")


def _json(what: str) -> Option:
    return _cli(_B("json", what))


def _quiet(what: str = "no progress bars") -> Option:
    return _B("quiet", what)


def _quant(group: str = _QUANT_GROUP) -> tuple[Option, ...]:
    return (
        _S("qformat", "examples/quantization/quantize.py's formats: FP8 per tensor, or INT8/INT4 weight-only",
           choices=("fp8", "int8_wo", "int4_wo", "full_prec"), group=group),
        _B("use_weight_only", "weight-only (examples/medusa/convert_checkpoint.py)", group=group),
        _S("weight_only_precision", "with --use_weight_only (default int8)", choices=("int8", "int4"), group=group),
        _S("kv_cache_dtype", "quantized KV cache", choices=("fp8", "int8"), group=group),
        _B("int8_kv_cache", "= --kv_cache_dtype int8", group=group),
    )


def _revision() -> Option:
    return _S("revision", "where --model_dir is a Hub id: the branch, tag or commit to read (default main); other Hub "
              "ids are read at main. Hub ids are fetched into the Hugging Face cache (HF_HOME; HF_HUB_OFFLINE reads "
              "the cache alone)")


def _chat_template(what: str, **kw) -> Option:
    return _S("chat_template", f"auto: {what} go through the tokenizer's chat template where it has one (an instruct "
              "base is served so), said in the result; none: as they are", choices=CHAT_TEMPLATE_MODES,
              default="auto", **kw)


def _threads(help: str = "torch threads (default: the idle cores, measured at the start)", **kw) -> Option:
    return _I("threads", help, lo=1, **kw)


def _prompts(what: str, file_aliases: tuple[str, ...] = ()) -> tuple[Option, ...]:
    """The four spellings of text input, the same on every command (files/prompts.py ``PromptInputs``)."""
    owner, x = "PromptInputs", "prompts"
    return (
        Option("prompt", Spec("list"), help=f"text {what} (needs a tokenizer); repeat for several prompts",
               owner=owner, exclusive=x, extra=(("action", "append"),)),
        _P("prompts_file", "text file, one prompt per line (\\n for a line break)", owner=owner, exclusive=x,
           flags=("--prompts_file", *file_aliases)),
        Option("prompt_ids", Spec("ids"), help="token ids: 1,2,3 (';' separates prompts)", owner=owner, exclusive=x),
        _P("data", 'JSON lines: {"prompt": ...} or {"prompt_ids": [...]} (prompts), {"text": ...} or {"input_ids": '
           '[...]} (used as they are)', owner=owner, exclusive=x),
        _api(Option("prompts", Spec("nested", flag=None, of="PromptInputs"), factory="PromptInputs")),
        _P("tokenizer_dir", "for text prompts (default: --model_dir)"),
    )


def _memory(held: str, same: str, whole: str, default: str, waiting: str) -> tuple[Option, ...]:
    """The memory-mode flags of verify and train-heads (huggingface/memory_mode.py chooses by them for both)."""
    return (
        Option("streaming", Spec("bool", none=True), exclusive="memory", cli_default=None,
               help=f"hold one decoder layer {held} at a time, read again from the files every forward pass "
               f"(bounded memory, slower; {same})", extra=(("action", "store_true"),)),
        _cli(Option("no_streaming", Spec("bool"), dest="streaming", exclusive="memory", help=whole,
                    extra=(("action", "store_false"),), cli_default=SAME, default=None)),
        _F("max_memory", f"without --streaming / --no_streaming: stream when the in-memory estimate exceeds this "
           f"{default}; the report says which mode ran", lo=0, lo_excluded=True, extra=(("metavar", "GB"),)),
        _P("offload_dir", f"streaming: a directory on a disk for {waiting} the size of the base in its dtype, removed "
           "at once; default: the temporary directory)"),
    )


# -- the commands ------------------------------------------------------------------------------------------
_CONVERT = (
    _P("model_dir", "Hugging Face base model directory, or its Hub id (owner/name)", default=REQUIRED,
       cli_default=None),
    _revision(),
    _P("base_checkpoint_dir", "instead of --model_dir: a TensorRT-LLM checkpoint quantized by NVIDIA's tools (FP8, "
       "INT4-AWQ, W4A8-AWQ, INT8 SmoothQuant, weight-only); its tensors are kept as they are and the heads added",
       owner="AddHeadsOptions"),
    _P("medusa_model_dir", "Medusa heads (any layout; see inspect-heads): a directory or a Hub id", default=REQUIRED,
       required=True),
    _P("output_dir", "TensorRT-LLM checkpoint to write", default=Path("tllm_checkpoint")),
    # default None on the command line, read as float16 (upstream's), so that a typed --dtype float16 is told apart
    _S("dtype", "checkpoint dtype (default float16 as upstream's Medusa script, except for a family whose hidden "
       "states exceed float16's range - Gemma 2/3 - which keeps the base's own; from another bfloat16 base a note "
       "says verify checks the range; auto = the base's own; with --base_checkpoint_dir: the base's own)",
       choices=FLOAT_DTYPES, default="float16", cli_default=None),
    _I("tp_size", "tensor parallelism: rank files split each weight", default=1),
    _I("pp_size", "pipeline parallelism: each stage holds its layers", default=1),
    _I("moe_ep_size", "MoE bases: expert parallelism within tp (upstream's flag; -1: none, or tp / --moe_tp_size)",
       default=1, cli_default=-1),
    _cli(_I("moe_tp_size", "MoE bases: tensor parallelism of each expert (-1: tp / --moe_ep_size)", default=-1)),
    _I("num_medusa_heads", "default: read from the heads"),
    _I("num_medusa_layers", "default: read from the heads"),
    _I("max_draft_len", "tree nodes per step, written as max_draft_len (upstream's convert script: "
       "--max_medusa_token_len)", default=63, flags=("--max_draft_len", "--max_medusa_token_len"),
       dest="max_medusa_token_len"),
    _S("model_type", "family (llama, mistral, qwen2, ...); default: from config.json"),
    _I("workers", "threads converting tensors in parallel", default=1),
    _B("use_parallel_embedding", "split vocab_embedding across the tp ranks"),
    _I("embedding_sharding_dim", "with --use_parallel_embedding: 0 splits the vocabulary, 1 the hidden size",
       default=0, choices=(0, 1)),
    _cli(_S("medusa_hidden_act", "only silu (Medusa heads are trained with SiLU)", default="silu")),
    _T("medusa_choices", "tree to check against the heads and max_draft_len"),
    _B("share_lm_head", "every head uses the base lm_head (stored once)"),
    _B("allow_unsupported", "write a checkpoint even when TensorRT-LLM cannot serve it correctly (ALiBi, attention "
       "soft-capping), with a loud warning; for experiments and the reference executor"),
    *_quant(),
    _P("calib_dataset", "calibration text (one sample per line) or JSON lines with text / input_ids; default: the "
       "packaged prompts, tokenized with the base's tokenizer", group=_QUANT_GROUP),
    _I("calib_size", "calibration samples (default 512)", lo=1, default=512, group=_QUANT_GROUP),
    _I("calib_max_seq_length", "tokens per sample at most (512)", lo=1, default=512, group=_QUANT_GROUP),
    _chat_template("calibration prompts (the packaged ones, text lines, JSON prompt)", group=_QUANT_GROUP),
    _P("tokenizer_dir", "tokenizer for text calibration (default --model_dir)", group=_QUANT_GROUP),
    _S("device", "torch device of the calibration pass (default cpu)", default="cpu", group=_QUANT_GROUP),
    _threads("torch threads of the calibration pass (default: the idle cores, measured at the start)",
             group=_QUANT_GROUP),
    _B("overwrite", "replace a non-empty --output_dir"),
    _B("fsync", "make the rank files durable (fsync) before the output appears; always done when an existing "
       "--output_dir is replaced"),
    _quiet("no progress bar"),
    _json("print the result (config, memory plan, moves) as JSON"),
    _cli(_B("load_by_shard", "accepted; loading is always lazy and per tensor")),
    _cli(_B("load_model_on_cpu", "accepted; conversion always runs on the CPU",
            flags=("--load_model_on_cpu", "--load-model-on-cpu", "--convert-model-on-cpu", "--convert_model_on_cpu"))),
    _api(Option("fast_path", Spec("bool", flag=None), default=True)),
    _api(Option("calibration", Spec("of", flag=None, of="Calibration"))),
)

_CHECK = (
    _P("model_dir", "Hugging Face base model directory, or its Hub id (owner/name)", default=REQUIRED, required=True),
    _revision(),
    _S("backend", "the TensorRT-LLM backend to judge the base for: tensorrt (1.2.x's engines, Medusa) or pytorch "
       "(1.3 and later, EAGLE-3 drafts; the base's model class alone is judged)", choices=("tensorrt", "pytorch"),
       default="tensorrt"),
    _P("medusa_model_dir", "Medusa heads to check against the base (or a Hub id)"),
    _T("medusa_choices", "tree to check against the heads and max_draft_len"),
    _I("tp_size", "tensor parallelism to check", default=1),
    _I("pp_size", "pipeline parallelism to check", default=1),
    _I("max_draft_len", "the engine's tree budget (tree slots per sequence)", default=63),
    _I("num_medusa_heads", "default: read from the heads"),
    _S("dtype", "the checkpoint dtype to judge (float16's range, float32 with speculative decoding)",
       choices=FLOAT_DTYPES),
    _B("share_lm_head", "plan the heads sharing the base lm_head"),
    *_quant(),
    *(dataclasses.replace(o, group="memory plan (weights per rank, KV cache; does it fit?)") for o in (
        _I("max_batch_size", "sequences served at once", lo=1),
        _I("max_seq_len", "tokens per sequence (prompt + output)", lo=1),
        _F("gpu_memory_gb", "memory of one GPU, in GB", lo=0))),
    *_prompts("to measure the activation range on (rule float16-range)"),
    _threads(),
    _json("print the findings and the memory plan as JSON"),
    _quiet("no status line"),
)

_VERIFY = (
    _P("model_dir", "the base model the checkpoint was converted from: a directory or its Hub id (owner/name)",
       default=REQUIRED, required=True),
    _revision(),
    _P("checkpoint_dir", "a checkpoint written by convert", default=REQUIRED, required=True),
    _T("medusa_choices", "default: the tree the checkpoint was converted for (else mc_sim_7b_63 cut to the heads' "
       "depth)"),
    _B("override_medusa_choices", "verify a --medusa_choices other than the tree the checkpoint records (refused "
       "otherwise)"),
    _I("max_new_tokens", "greedy tokens per prompt", default=32),
    _P("medusa_model_dir", "the heads the checkpoint was converted from (default: the path recorded at conversion)"),
    *_prompts("to decode (default: a few prompts of token ids)"),
    _chat_template("text prompts"),
    _threads(),
    _F("max_quant_error", "quantized checkpoints: fail when the logits differ from the float base's by more "
       "(default: the difference is reported, not judged)", lo=0),
    _F("min_quant_agreement", "quantized checkpoints: pass only when, reading the float base's greedy text, the "
       "model is shown (95 percent interval, measured on longer text while undecided) to predict at least this fraction of "
       "its tokens (default 0.75, verify/limits.py MIN_QUANT_AGREEMENT; 0: not judged)", lo=0, hi=1, none=True),
    _S("gemm_plugin", "FP8 checkpoints: the trtllm-build --gemm_plugin to compute as (auto, also trtllm-build's "
       "default and any float dtype: scales cast to the model dtype; fp8: the FP8 GEMM plugin)",
       choices=("auto", "fp8"), default="auto"),
    _P("calib_dataset", "a checkpoint NVIDIA's tools quantized: the samples it was calibrated on (text lines or JSON "
       "lines with input_ids), to re-derive its activation / KV scales"),
    _I("calib_size", "samples of --calib_dataset (default: all)", lo=1),
    _I("calib_max_seq_length", "tokens per sample at most (512)", lo=1, default=512),
    _B("accept_unchecked_scales", "accept activation / KV scales that cannot be re-derived (the verdict says so); "
       "without it they fail verify"),
    _B("skip_tree_proof", "leave out the tree proof (steps whose drafts are greedy's own tokens along each branch, "
       "so that every tree node is accepted and checked; about one plain token per node of the tree)"),
    *_memory("of each side", "the same results",
             "hold each side's whole model in float32 (the estimate: user guide, \"Large bases\")",
             "(default: the memory available)", "transformers' weights while they wait (a temporary file"),
    _S("device", "cpu, cuda or cuda:N: where both sides compute (default cpu)", default="cpu"),
    _json("print the report as JSON"),
    _quiet(),
)

_FIT = "FitOptions"
_TRAIN = (
    _P("model_dir", "Hugging Face base model directory, or its Hub id (owner/name)", default=REQUIRED, required=True),
    _revision(),
    _P("output_dir", "where to write the heads (FasterDecoding layout)", default=REQUIRED, required=True),
    _I("num_heads", "Medusa heads to train (head k guesses the token k + 2 ahead)", lo=1, hi=64, default=4,
       flags=("--num_heads", "--medusa_num_heads"), owner=_FIT),
    _I("num_layers", "ResBlocks per head", lo=1, hi=64, default=1, flags=("--num_layers", "--medusa_num_layers"),
       owner=_FIT),
    *_prompts("to train on (continued by the base; default: the packaged prompts)", file_aliases=("--prompts",)),
    _chat_template("text prompts"),
    _F("heldout_fraction", "share of the sequences kept out of training, to report each head's held-out top-1 "
       "accuracy (default 0.05: every 20th; 0: none)", lo=0, below=1, default=0.05, owner=_FIT),
    _threads(),
    _json("print the result (accuracies, history) as JSON"),
    _I("new_tokens", "greedy tokens generated per prompt (cached)", lo=1, hi=1 << 16, default=64),
    _S("dtype", "dtype the base runs in to write the corpus (default auto: bfloat16 where a timed probe finds the "
       "device computes it fast - AVX512-BF16/AMX CPUs, GPUs - else float32; an explicit bfloat16 on a device "
       "without bfloat16 units warns: it can be 40x slower there)", choices=("auto", "float32", "bfloat16", "float16"),
       default="auto"),
    _I("steps", "optimizer steps of the fit", lo=1, default=1000, owner=_FIT),
    _F("lr", "peak learning rate (warm-up, then cosine decay)", lo=0, lo_excluded=True, default=3e-3, owner=_FIT),
    # --batch_size 0 (every position) is FitOptions.batch_size None
    _I("batch_size", "positions per head per step (0: all)", lo=1, none=True, default=256, owner=_FIT,
       cli_spec=Spec("int", lo=0)),
    _B("share_lm_head", "heads use the base lm_head (FasterDecoding version 2): smaller, faster to train", owner=_FIT),
    _B("full_vocab", "softmax over the whole vocabulary (default: over the tokens the corpus holds)", owner=_FIT),
    _B("dense_updates", "own lm_heads: AdamW updates every row of every lm_head each step (default: only the rows of "
       "the step's softmax, about 1.4x faster a step, as accurate)", owner=_FIT),
    _F("distill", "weight (0..1) of the soft target: each head also matches the base's own next-token distribution "
       "at its position (about 2x a step's time); 0: the greedy token only", default=0.0, owner=_FIT),
    _I("negatives", "without --full_vocab: tokens outside the corpus drawn afresh each step into the softmax, so "
       "that the heads learn to rank them low too", default=8192, owner=_FIT),
    # the choices: heads/train.py's FIT_DTYPES, "auto" chosen by devices.py
    _S("matmul_dtype", "dtype of the fit's products with the vocabulary (default auto, as --dtype): bfloat16 is "
       "about twice as fast where the hardware has it; the loss, the heads and the optimiser stay float32",
       choices=("auto", "float32", "bfloat16"), default="auto", flags=("--fit_dtype",), owner=_FIT),
    _I("seed", "the heads' initialisation and the batches' order", default=0, owner=_FIT),
    _B("resume", "continue the saved run (same flags)"),
    _I("save_every", "steps between saved training states", lo=1, default=100, owner=_FIT),
    _P("work_dir", "cached corpus and training state (default: OUTPUT_DIR.train)"),
    _S("device", "default: cuda when present, else cpu (under torchrun: cuda:LOCAL_RANK)"),
    _S("device_map", "load the base across the GPUs this rank sees for the corpus pass (a base bigger than one "
       "device; needs accelerate)", choices=("auto",)),
    *_memory("of the base for the corpus pass", "the same corpus and heads",
             "hold the whole base in float32 for the corpus pass",
             "per process (default: the memory available, shared by this node's ranks)",
             "the base's weights while they wait (a temporary file per rank,"),
    _I("dist_timeout", "under torchrun: seconds a rank waits for the others at one exchange before it stops with an "
       "error (a rank that dies is noticed at once on CPUs)", lo=1, default=1800),
    _B("overwrite", "replace a non-empty --output_dir"),
    dataclasses.replace(_quiet(), owner=_FIT),
    _api(Option("fit", Spec("nested", flag=None, of="FitOptions"), factory="FitOptions")),
    _api(_I("stop_after")),
    _api(_S("schedule", choices=("cosine", "constant"), default="cosine", owner=_FIT)),
    _api(_F("warmup", lo=0, default=0.05, owner=_FIT)),
    _api(_F("weight_decay", lo=0, default=0.0, owner=_FIT)),
    _api(_F("anchor", lo=0, default=0.0, owner=_FIT)),
    _api(_S("corpus", default="", owner=_FIT)),
)

_TUNE = (
    _P("model_dir", "Hugging Face base model directory, or its Hub id (owner/name)", default=REQUIRED, required=True),
    _revision(),
    _P("medusa_model_dir", "the heads to measure (a directory or a Hub id)", default=REQUIRED, required=True),
    *_prompts("to measure the heads on (default: the packaged held-out prompts)", file_aliases=("--prompts",)),
    _chat_template("text prompts"),
    _threads(),
    _I("new_tokens", "greedy tokens generated per prompt", lo=1, hi=1 << 16, default=64),
    _I("max_nodes", "node budget (the engine's max_draft_len)", lo=1, hi=4096, default=63),
    _I("max_draft_len", "refuse a budget above this (check's limit)", lo=1, hi=4096, default=63),
    _I("top_k", "candidates per head considered", lo=1, hi=1000, default=10),
    _S("estimate", "node value: product of per-head accuracies (Medusa paper), or joint counts",
       choices=("product", "joint"), default="product"),
    _S("baseline", "tree to compare with ('' for none)", default="mc_sim_7b_63", none=True),
    _P("output", "choices file to write (JSON list of paths)", required=True),
    _B("overwrite", "replace an existing --output file"),
    _json("print the tree and its measures as JSON"),
    _quiet(),
)

_TREE = (
    _T("choices", "preset name, @file, or JSON list of paths", default=REQUIRED, cli_default=None,
       flags=("--choices", "--medusa_choices")),
    _I("num_heads", "head count: a deeper preset is pruned to it, a deeper written-out tree refused",
       flags=("--num_heads", "--num_medusa_heads")),
    _I("max_draft_len", "refuse a tree of more nodes than this"),
    _I("top_k", "refuse a path index of top_k or more", default=10),
    _cli(_B("list_presets", "print the preset names")),
    _json("print the tree and its buffers as JSON"),
    _cli(_B("draw", "print the tree as text, one line per node")),
)

_BUILD = (
    _P("checkpoint_dir", "a checkpoint written by convert", default=REQUIRED, required=True),
    _api(Option("args", Spec("list"), factory="list")),  # trtllm-build's own flags, passed through
    _B("allow_unsupported", "build a float16 checkpoint whose base is known to overflow float16 (rule "
       "float16-range)"),
    _json("print the result (the checkpoint, trtllm-build's exit status) as JSON; a failure as one JSON object"),
)

_DEPLOY = (
    _P("checkpoint_dir", "a checkpoint written by convert", default=REQUIRED, required=True),
    _P("tokenizer_dir", "the Hugging Face base (or its tokenizer's) directory, or its Hub id (owner/name)",
       default=REQUIRED, required=True),
    _P("output_dir", "where the bundle is written", default=REQUIRED, required=True),
    _P("engine_dir", "where build.sh builds the engine, written as an absolute path (so one on the machine that "
       "builds); default: engine/ in the bundle, beside the scripts"),
    _T("medusa_choices", "default: the tree the checkpoint was converted for (else mc_sim_7b_63 cut to the heads)"),
    _B("override_medusa_choices", "serve a --medusa_choices other than the tree the checkpoint records (refused "
       "otherwise)"),
    _I("max_batch_size", "default 8", lo=1),
    _I("max_input_len", "default: half of --max_seq_len", lo=1),
    _I("max_seq_len", "default: the base's max_position_embeddings (learned positions: less the tree's depth; a "
       "larger one is refused, rule learned-position-range)", lo=1),
    _F("gpu_memory_gb", "one GPU's memory: refuse a bundle whose weights and KV cache do not fit it per rank, and "
       "give the KV cache the share of it left after the weights that it needs (at most 0.9, TensorRT-LLM's "
       "default, which every route gets without this flag)", lo=0),
    _B("overwrite", "replace a non-empty --output_dir"),
    _json("print deploy.json"),
)

_INSPECT = (
    _P("path", "a heads directory or file, in any layout", default=REQUIRED, flags=("path",),
       owner="inspect_heads"),
    _json("print what the heads hold as JSON"),
    _cli(_B("no_data_check", "skip the NaN/Inf scan (headers only)")),
    _api(Option("data_check", Spec("bool", flag="--no_data_check"), default=True, owner="inspect_heads")),
)

_DEMO = tuple(_cli(o) for o in (
    _S("workdir", "where the demo writes (it replaces only what it made)", default="demo-output"),
    _S("architecture", "the tiny base's family", default="Qwen2ForCausalLM"),
    _quiet("no progress lines (the results are printed)"),
))

_PORT = tuple(_cli(o) for o in (
    _P("model_dir", "the base: a Hugging Face model directory, or its Hub id (owner/name)", default=REQUIRED,
       flags=("model_dir",)),
    _P("output_dir", "where every stage's result goes (check.json, heads/, tree.json, checkpoint/, verify.json, "
       "serve/, port.json); a rerun resumes there", default=REQUIRED, required=True),
    _P("medusa_model_dir", "Medusa heads to use (any layout, or a Hub id); default: trained by train-heads with the "
       "README's recipe (4 heads, 1,100 steps)"),
    _T("medusa_choices", "the tree (a preset, @FILE or a JSON list); default: tuned by tune-tree on the heads"),
    _revision(),
    _P("tokenizer_dir", "the base's tokenizer (default: --model_dir's), for every stage"),
    _B("overwrite", "run every stage again (default: a stage whose options and inputs are unchanged is reused)"),
    _quiet("no stage lines and no progress bars (the summary is printed)"),
    _json("print the run (each stage, the verdict, tokens per step, the bundle) as one JSON object"),
))

#: the options port sets itself, or that name another command's own files: never taken from a stage's flags
PORT_OWN = frozenset({"model_dir", "revision", "medusa_model_dir", "medusa_choices", "tokenizer_dir", "output_dir",
                      "output", "checkpoint_dir", "overwrite", "resume", "quiet", "json", "work_dir",
                      "base_checkpoint_dir", "override_medusa_choices"})
#: a stage option that port passes to fewer stages than declare its name (the rest: every stage declaring it)
PORT_ONLY_TO = {"dtype": ("check", "convert"),  # the checkpoint's dtype; train-heads computes in its own (auto)
                "prompt": ("train-heads",), "prompts_file": ("train-heads",), "prompt_ids": ("train-heads",),
                "data": ("train-heads",),  # the training text: tune-tree and verify measure on their own prompts
                "calib_dataset": ("convert",), "calib_size": ("convert",), "calib_max_seq_length": ("convert",)}
PORT_STAGES = ("check", "train-heads", "tune-tree", "convert", "verify", "deploy")


def port_routes() -> dict[str, tuple[Option, tuple[str, ...]]]:
    """Each stage flag ``port`` takes, by option name: its declaration (the first stage's) and the stages it goes to
    (every stage declaring the name but those :data:`PORT_ONLY_TO` leaves out); the command line's own options (no
    API field: convert's MoE split, upstream's accepted-only flags) are not taken, but a flag that sets a field
    under another name (``--no_streaming``: ``streaming``)."""
    out: dict[str, tuple[Option, tuple[str, ...]]] = {}
    for stage in PORT_STAGES:
        fields = {o.name for o in COMMANDS[stage][2] if o.owner is not None}
        for o in COMMANDS[stage][2]:
            api_field = o.owner is not None or (o.dest and o.dest in fields)  # --no_streaming sets streaming
            if not o.spellings or not api_field or o.name in PORT_OWN or o.name in ("moe_ep_size",):
                continue
            if o.name in PORT_ONLY_TO and stage not in PORT_ONLY_TO[o.name]:
                continue
            first, stages = out.get(o.name, (o, ()))
            out[o.name] = (first, (*stages, stage))
    return out


#: each command: its one-line help and its options, in the order ``--help`` and the docs list them
COMMANDS: dict[str, tuple[str, str | None, tuple[Option, ...]]] = {
    "inspect-heads": ("read a Medusa head checkpoint of any layout", None, _INSPECT),
    "tree": ("parse and validate medusa_choices; print TensorRT-LLM's buffers", "TreeOptions", _TREE),
    "check": ("can TensorRT-LLM serve Medusa on this base (and heads, tree, parallelism)? With --backend pytorch: "
              "an EAGLE-3 draft on its PyTorch backend (1.3 and later)?", "CheckOptions", _CHECK),
    "convert": ("HF base + Medusa heads -> TensorRT-LLM checkpoint", "ConvertOptions", _CONVERT),
    "verify": ("prove parity and greedy equivalence of a checkpoint on CPU", "VerifyOptions", _VERIFY),
    "train-heads": ("train Medusa heads for a base on its own greedy continuations", "TrainOptions", _TRAIN),
    "tune-tree": ("build a medusa_choices tree from the heads' measured accuracy", "TuneOptions", _TUNE),
    "build": ("trtllm-build with our architectures registered (needs tensorrt_llm)", "BuildOptions", _BUILD),
    "deploy": ("the serving bundle of a checkpoint: build.sh, run.sh, deploy.json", "DeployOptions", _DEPLOY),
    "port": ("one command from a base to a verified serving bundle: check, train-heads, tune-tree, convert, verify, "
             "deploy", None, _PORT),
    "demo": ("the end-to-end job on a small synthetic non-Llama base, offline", None, _DEMO),
}

#: ``convert --base_checkpoint_dir``'s options (api.AddHeadsOptions): these of convert's, with the flags' defaults
ADD_HEADS_FIELDS = ("base_checkpoint_dir", "medusa_model_dir", "output_dir", "max_draft_len", "overwrite", "dtype",
                    "num_medusa_heads", "num_medusa_layers", "medusa_choices", "fsync")


def owned(owner: str) -> list[Option]:
    """The options of one API class (or of ``inspect_heads`` / ``PromptInputs``), each once, in declaration order;
    ``AddHeadsOptions`` has convert's :data:`ADD_HEADS_FIELDS` with the flags' defaults, its heads dir required."""
    if owner == "AddHeadsOptions":
        by = {o.name: o for o in COMMANDS["convert"][2]}
        required = ("base_checkpoint_dir", "medusa_model_dir")
        return [dataclasses.replace(by[n], owner=owner, cli_default=SAME, required=n in required,
                                    default=REQUIRED if n in required else by[n].flag_default
                                    if n != "output_dir" else by[n].default) for n in ADD_HEADS_FIELDS]
    out: dict[str, Option] = {}
    for _, cls, options in COMMANDS.values():
        for o in options:
            if o.owner is not None and (o.owner or cls) == owner:
                out.setdefault(o.name, o)
    return list(out.values())


def _message_flag(o: Option) -> str | None:
    if o.spec.flag != "":
        return o.spec.flag
    spellings = o.spellings
    if not spellings or not spellings[0].startswith("-"):  # no flag, or a positional argument
        return None
    return "" if spellings[0] == f"--{o.name}" else spellings[0]


def specs() -> dict[str, dict[str, Spec]]:
    """Every API owner's validation specs, by field (options/validation.py ``SPECS``)."""
    owners = [c for _, c, _ in COMMANDS.values() if c] + ["FitOptions", "AddHeadsOptions", "PromptInputs",
                                                         "inspect_heads"]
    return {owner: {o.name: dataclasses.replace(o.spec, flag=_message_flag(o)) for o in owned(owner)}
            for owner in owners}


_ANNOTATIONS = {"path": "Path", "int": "int", "float": "float", "bool": "bool", "str": "str", "tree": "str | list",
                "list": "list[str]", "ids": "list[list[int]]", "of": "object"}


def options_class(name: str, doc: str, module: str, bases: tuple = (), factories: dict | None = None) -> type:
    """The API's options dataclass ``name``, made from its declared options: required fields first, then the rest in
    declaration order (a base's fields keep its order, with the declared defaults). ``factories``: the types that
    ``factory`` names (a nested options class, PromptInputs)."""
    factories = {"list": list, **(factories or {})}
    fields = []
    for o in sorted(owned(name), key=lambda o: o.default is not REQUIRED):
        kind = o.spec.kind
        hint = o.spec.of if kind == "nested" else _ANNOTATIONS[kind]
        if (o.default is None and o.factory is None) or o.spec.none:
            hint += " | None"
        if o.factory is not None:
            f = field(default_factory=factories[o.factory])
        else:
            f = field(default=o.default) if o.default is not REQUIRED else field()
        fields.append((o.name, hint, f))
    told = [f"``{o.name}`` ({o.spellings[0]}): {o.help}" for o in owned(name) if o.help and o.spellings]
    if told:
        doc += "\n\nThe fields with a flag, as the flag's help says:\n\n" + "\n".join(f"* {t}" for t in told)
    cls = dataclasses.make_dataclass(name, fields, bases=bases, namespace={"__doc__": doc})
    cls.__module__ = module
    return cls
