"""The Python API: every ``trtllm-medusa`` command as a function a pipeline calls (docs/api.md).

Each function takes one options dataclass, whose fields and defaults are the command's flags, and
returns a result dataclass whose ``to_dict()`` is exactly what the command prints with ``--json``
(and whose ``render()`` is its text output). The command line (cli.py) parses flags into these
options, calls these functions and prints; it adds nothing else.

Every problem with the inputs raises :class:`~trtllm_medusa_ports.errors.PortError` (or a subclass)
carrying ``rule`` (the check rule id, where a rule refused), ``where`` (the file, tensor or field),
``what`` and ``fix``; nothing is left half-written when one is raised. A failed *verification* is a
result, not an error: ``VerifyReport.ok`` is False.

    from trtllm_medusa_ports import api
    res = api.convert(api.ConvertOptions(model_dir=..., medusa_model_dir=..., output_dir=...))
    report = api.verify(api.VerifyOptions(model_dir=..., checkpoint_dir=res.output_dir))

Names exported here are the promised surface; everything else in the package may change.

This module holds each command's options and result dataclasses and its function, nothing else: what the
functions check and compute from the options is options/'s. May import: options, the stages' types
(convert, compat, files.prompts, tree, errors, threads), and lazily each command's stage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports.compat import ERROR, Finding
from trtllm_medusa_ports.conversion.convert import ConvertOptions as _ConvertOptions
from trtllm_medusa_ports.conversion.convert import ConvertResult
from trtllm_medusa_ports.declared import options_class
from trtllm_medusa_ports.errors import (
    CheckpointError,
    ConversionError,
    ModelError,
    PortError,
    TreeError,
)
from trtllm_medusa_ports.files.hub import hub_inputs
from trtllm_medusa_ports.files.jsonfile import is_int
from trtllm_medusa_ports.files.prompts import PromptInputs
from trtllm_medusa_ports.files.tokenizer import CHAT_UNUSED
from trtllm_medusa_ports.machine import log
from trtllm_medusa_ports.machine.gpu_machine import CHECKOUT_COMMAND
from trtllm_medusa_ports.options.calibration import check_calibration_flags, tool_calibration
from trtllm_medusa_ports.options.check import memory_plan_for, position_range_findings
from trtllm_medusa_ports.options.prompts import prompt_token_ids, token_ids
from trtllm_medusa_ports.options.validation import SPECS as _SPECS  # noqa: F401  (tests read api._SPECS)
from trtllm_medusa_ports.options.validation import check_fields, validate_options
from trtllm_medusa_ports.options.validation import validate as _validate  # noqa: F401  (tests: api._validate)
from trtllm_medusa_ports.port import PortOptions, PortResult, Stages
from trtllm_medusa_ports.port import port as _port
from trtllm_medusa_ports.trees.tree import MedusaTree

#: defined with the training (heads/train.py, which imports torch): read from there when first asked for, so that
#: importing the API stays torch-free for the commands that need no torch (a float or weight-only convert)
_TRAINING = ("TrainOptions", "FitOptions", "TrainResult")


_training: dict = {}


def __getattr__(name: str):
    if name in _TRAINING:
        if not _training:
            _training.update(_training_types())
        return _training[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _training_types() -> dict:
    """train-heads' options with the command's defaults (declared.py: 4 heads, --distill 0.5, progress shown)."""
    from trtllm_medusa_ports.heads import fit as fitting
    from trtllm_medusa_ports.heads import train

    fit = _options("FitOptions", "How the heads are fitted; the defaults are train-heads' flags (``matmul_dtype`` "
                   "``auto``: bfloat16 where the device computes it fast, float32 elsewhere).", (fitting.FitOptions,))
    opts = _options("TrainOptions", "train-heads: ``model_dir`` and ``output_dir``, what to train on (``prompts``), "
                    "how to fit (``fit``); the defaults are the command's flags.", (train.TrainOptions,),
                    FitOptions=fit)
    return {"FitOptions": fit, "TrainOptions": opts, "TrainResult": train.TrainResult}


def _options(name: str, doc: str, bases: tuple = (), **factories) -> type:
    """The API's options class ``name``, made from the one declaration of the command's options (declared.py)."""
    return options_class(name, doc, __name__, bases, {"PromptInputs": PromptInputs, **factories})


__all__ = [
    "PortError", "PromptInputs", "MedusaTree", "Finding",
    "ConvertOptions", "ConvertResult", "convert",
    "AddHeadsOptions", "AddHeadsResult", "add_heads",
    "CheckOptions", "CheckResult", "check",
    "VerifyOptions", "verify",
    "TrainOptions", "FitOptions", "TrainResult", "train_heads",  # noqa: F822  (module __getattr__)
    "TuneOptions", "TuneTreeResult", "tune_tree",
    "TreeOptions", "TreeResult", "tree",
    "HeadsInfo", "inspect_heads",
    "BuildOptions", "BuildResult", "build",
    "PortOptions", "PortResult", "port",
    "default_threads",
]


from trtllm_medusa_ports.machine.threads import default_threads, torch_threads  # noqa: E402

LOG = log.get("api")


# -- convert ------------------------------------------------------------------------------------
ConvertOptions = _options(
    "ConvertOptions", "``trtllm-medusa convert``'s options (convert.ConvertOptions) with the command's defaults: "
    "``--dtype float16`` (upstream's Medusa script's), ``--output_dir tllm_checkpoint``.", (_ConvertOptions,))


def convert(opts: ConvertOptions) -> ConvertResult:
    """``trtllm-medusa convert``: a Hugging Face base and its Medusa heads -> a TensorRT-LLM checkpoint."""
    from trtllm_medusa_ports.conversion.convert import convert as _convert
    from trtllm_medusa_ports.files.checkpoint import guard_output_dir

    validate_options(opts, "ConvertOptions", ConversionError)
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    if opts.calib_dataset is not None:  # never write where the calibration text lives
        guard_output_dir(Path(opts.output_dir), {"--calib_dataset": Path(opts.calib_dataset)})
    unused = check_calibration_flags(opts)
    res = _convert(opts)
    record = (res.config.get("medusa_ports") or {}).get("calibration") or {}
    res.warnings[:0] = unused + list(record.get("notes") or [])  # samples cut at the base's context
    return res


AddHeadsOptions = _options(
    "AddHeadsOptions", "``convert --base_checkpoint_dir``: heads added to a TensorRT-LLM checkpoint NVIDIA's tools "
    "quantized. The base keeps its dtype, quantization and mapping: ``dtype`` None or ``\"auto\"`` means the base's, "
    "and another is refused (``quant.prequantized.FlagConflict``); the rest is checked as ``convert`` checks it.")


@dataclass
class AddHeadsResult:
    output_dir: Path
    config: dict
    warnings: list[str] = field(default_factory=list)
    text: str = ""

    def to_dict(self) -> dict:
        from trtllm_medusa_ports.deploy.commands import build_line

        return {"output_dir": str(self.output_dir), "config": self.config,
                "build_command": build_line(self.config, self.output_dir)}

    def render(self) -> str:
        return self.text


def add_heads(opts: AddHeadsOptions) -> AddHeadsResult:
    from trtllm_medusa_ports.quant.prequantized import add_heads as _add

    validate_options(opts, "AddHeadsOptions", ConversionError)
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    res = _add(Path(opts.base_checkpoint_dir), Path(opts.medusa_model_dir), Path(opts.output_dir),
               max_draft_len=opts.max_draft_len, overwrite=opts.overwrite, dtype=opts.dtype,
               num_medusa_heads=opts.num_medusa_heads, num_medusa_layers=opts.num_medusa_layers,
               medusa_choices=opts.medusa_choices, fsync=opts.fsync)
    return AddHeadsResult(res.output_dir, res.config, list(res.warnings), res.summary())


# -- check --------------------------------------------------------------------------------------
CheckOptions = _options(
    "CheckOptions", "``trtllm-medusa check``: what TensorRT-LLM 1.2 serves for this base (heads, tree, parallelism, "
    "quantization).")


@dataclass
class CheckResult:
    compatible: bool
    architecture: str | None
    findings: list[Finding]
    memory: object = None  # memory.MemoryPlan, or None where the inputs give none
    fit: dict = field(default_factory=dict)  # the serving sizes the plan is judged at

    def to_dict(self) -> dict:
        return {"compatible": self.compatible, "architecture": self.architecture,
                "findings": [f.to_dict() for f in self.findings],
                "memory": self.memory.to_dict(**self.fit) if self.memory else None}

    def render(self) -> str:
        lines = [f"architecture: {self.architecture}"]
        width = max((len(f.rule) for f in self.findings), default=0)
        for f in self.findings:
            lines.append(f"{f.severity.upper():8s} {f.rule:{width}s}  {f.message}")
            lines.append(f"{'':8s} {'':{width}s}  fix: {f.fix}")
        if self.memory:
            lines.append(self.memory.render(**self.fit))
        lines.append("COMPATIBLE" if self.compatible else "NOT COMPATIBLE")
        return "\n".join(lines)


def _inputs_there(opts) -> None:
    """A heads path or a tree file that is not there (or a tree file that cannot be read) is an input missing: exit
    1, as in every other command, not a finding of a check that ran (exit 3). What they hold is judged by the rules."""
    from trtllm_medusa_ports.heads.loader import require_heads_path
    from trtllm_medusa_ports.trees.tree import choices_file

    if opts.medusa_model_dir is not None:
        require_heads_path(Path(opts.medusa_model_dir))
    if isinstance(opts.medusa_choices, str) and opts.medusa_choices.startswith("@"):
        choices_file(opts.medusa_choices)


def _check_pytorch(opts: CheckOptions) -> CheckResult:
    """``check --backend pytorch``: the base's model class on TensorRT-LLM's PyTorch backend (EAGLE-3)."""
    from trtllm_medusa_ports.archs.registry import adapter_for
    from trtllm_medusa_ports.compat import check_pytorch, errors_of
    from trtllm_medusa_ports.files.hf_model import HFConfig

    hf = HFConfig.read(opts.model_dir)
    arch = (hf.get("architectures") or ["(none)"])[0]
    given = tuple(flag for flag, value in (("--medusa_model_dir", opts.medusa_model_dir),
                                           ("--medusa_choices", opts.medusa_choices),
                                           ("--num_medusa_heads", opts.num_medusa_heads),
                                           ("--share_lm_head", opts.share_lm_head)) if value)
    findings = check_pytorch(hf, adapter_for(arch), medusa_given=given)
    return CheckResult(not errors_of(findings), arch, findings)


def check(opts: CheckOptions) -> CheckResult:
    from trtllm_medusa_ports.compat import activation_range_finding, errors_of, serving_findings
    from trtllm_medusa_ports.compat import check as _check
    from trtllm_medusa_ports.quant import spec_from_flags

    validate_options(opts, "CheckOptions")
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    if opts.backend == "pytorch":
        return _check_pytorch(opts)
    _inputs_there(opts)
    spec = spec_from_flags(opts)
    arch, findings = _check(opts.model_dir, opts.medusa_model_dir, medusa_choices=opts.medusa_choices,
                            tp_size=opts.tp_size, pp_size=opts.pp_size, max_draft_len=opts.max_draft_len,
                            dtype=opts.dtype, num_medusa_heads=opts.num_medusa_heads, quantization=spec)
    findings += position_range_findings(opts)
    plan, refused = memory_plan_for(opts)
    if (isinstance(refused, ModelError) and (refused.where or "").endswith("config.json")
            and not errors_of(findings)):  # a field of the base's config.json convert would refuse (not its weights:
        # check reads a config alone)
        findings.append(Finding("invalid-config", ERROR, f"{refused.where}: {refused.what}",
                                refused.fix or "fix config.json"))
    prompts = token_ids(opts.prompts, Path(opts.model_dir), opts.tokenizer_dir)
    if prompts:
        from trtllm_medusa_ports.verify import measure_activation_range

        if not opts.quiet:
            LOG.info(f"check: measuring the activation range on {len(prompts)} prompt(s) with transformers")
        with torch_threads(opts.threads):
            findings.append(activation_range_finding(*measure_activation_range(opts.model_dir, prompts), opts.dtype))
    fit = dict(batch=opts.max_batch_size, seq_len=opts.max_seq_len, gpu_memory_gb=opts.gpu_memory_gb)
    findings += serving_findings(plan.to_dict(**fit) if plan else None, opts.max_seq_len, opts.gpu_memory_gb)
    return CheckResult(not errors_of(findings), arch, findings, plan, fit)


# -- verify -------------------------------------------------------------------------------------
VerifyOptions = _options(
    "VerifyOptions", "``trtllm-medusa verify``: logits parity, heads parity and greedy equivalence of a checkpoint "
    "(CPU or GPU).")


def verify(opts: VerifyOptions):
    """A :class:`~trtllm_medusa_ports.verify.VerifyReport` (``ok``, ``to_dict()``, ``render()``)."""
    from trtllm_medusa_ports.verify import MIN_QUANT_AGREEMENT
    from trtllm_medusa_ports.verify import verify as _verify

    validate_options(opts, "VerifyOptions")
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    _inputs_there(opts)
    prompts, chat = prompt_token_ids(opts.prompts, Path(opts.model_dir), opts.tokenizer_dir, opts.chat_template)
    report = _verify(opts.model_dir, opts.checkpoint_dir, medusa_choices=opts.medusa_choices, prompts=prompts,
                   max_new_tokens=opts.max_new_tokens, quiet=opts.quiet, medusa_model_dir=opts.medusa_model_dir,
                   threads=opts.threads, max_quant_error=opts.max_quant_error, skip_tree_proof=opts.skip_tree_proof,
                   gemm_plugin=opts.gemm_plugin, calibration=tool_calibration(opts),
                   accept_unchecked_scales=opts.accept_unchecked_scales,
                   min_quant_agreement=(MIN_QUANT_AGREEMENT if opts.min_quant_agreement is None
                                        else opts.min_quant_agreement),
                   override_medusa_choices=opts.override_medusa_choices, streaming=opts.streaming,
                   max_memory=opts.max_memory, device=opts.device, offload_dir=opts.offload_dir)
    report.chat_template = None if chat == CHAT_UNUSED else chat
    return report


# -- train-heads ----------------------------------------------------------------------------------
def train_heads(opts):
    """``trtllm-medusa train-heads`` (:class:`TrainOptions` -> :class:`TrainResult`)."""
    # Raises heads.train.TrainingInterrupted (a KeyboardInterrupt) when stopped by a signal; the saved state
    # continues with resume=True. Under torchrun every rank calls it with the same options (heads/distributed.py);
    # rank 0 writes, the others return the same result.
    from trtllm_medusa_ports.heads.train import train

    validate_options(opts, "TrainOptions")
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    threads = opts.threads
    ranks_here = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if threads is None and ranks_here.isdigit() and int(ranks_here) > 1:  # the idle cores shared by this node's ranks
        threads = max(1, default_threads() // int(ranks_here))
    with torch_threads(threads):
        return train(opts)


# -- tune-tree ------------------------------------------------------------------------------------
TuneOptions = _options(
    "TuneOptions", "``trtllm-medusa tune-tree``: a medusa_choices tree from the heads' measured accuracy.")


@dataclass
class TuneTreeResult:
    output: Path | None
    result: object  # tune.TuneResult

    @property
    def paths(self) -> list[list[int]]:
        return self.result.paths

    @property
    def unused_heads(self) -> list[int]:
        """Heads no node of the tree reads (the engine computes them anyway)."""
        depth = max(map(len, self.result.paths), default=0)
        return list(range(depth, len(self.result.accuracy)))

    @property
    def notes(self) -> list[str]:
        """What a user should know beside the tree (the command prints these on stderr)."""
        if not self.unused_heads:
            return []
        depth = max(map(len, self.result.paths))
        return [f"the tree uses {depth} of the {len(self.result.accuracy)} heads: heads {self.unused_heads[0]}.."
                f"{self.unused_heads[-1]} are computed by the engine but no tree node reads them"]

    def to_dict(self) -> dict:
        return {"output": str(self.output) if self.output else None, **self.result.to_dict(),
                "unused_heads": self.unused_heads, "notes": self.notes}

    def render(self) -> str:
        import io

        from trtllm_medusa_ports.trees.tune import print_table

        res, buf = self.result, io.StringIO()
        if res.chat_template:
            print(f"chat template {res.chat_template}", file=buf)
        print(f"measured on {res.positions} positions; each head's cumulative top-k accuracy:", file=buf)
        print_table(res.accuracy, file=buf)
        depth = max(map(len, res.paths))
        where = f" -> {self.output} (use it as --medusa_choices @{self.output})" if self.output else ""
        print(f"tree: {len(res.paths)} nodes, depth {depth}{where}", file=buf)
        print(f"predicted tokens per step until the end token (what a server sees; the loop replayed on the measured "
              f"answers): {res.predicted_tokens_per_step_until_end:.2f}", file=buf)
        print(f"predicted mean accepted tokens per step (every position alike): "
              f"{res.predicted_mean_accepted_tokens_per_step:.2f} ({res.estimate} estimate); on the measured text: "
              f"{res.measured_on_text:.2f}", file=buf)
        if res.baseline:
            b = res.baseline
            print(f"{b['name']} ({b['num_nodes']} nodes at the heads' depth): until the end token "
                  f"{b['predicted_tokens_per_step_until_end']:.2f}; mean accepted "
                  f"{b['predicted_mean_accepted_tokens_per_step']:.2f}, on the measured text "
                  f"{b['acceptance_on_measured_text']:.2f}", file=buf)
        return buf.getvalue().rstrip("\n")


def tune_tree(opts: TuneOptions) -> TuneTreeResult:
    from trtllm_medusa_ports.trees.tune import tune, write_choices

    validate_options(opts, "TuneOptions")
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    if opts.output is not None:
        out = Path(opts.output).resolve()
        inputs = {"--model_dir": opts.model_dir, "--medusa_model_dir": opts.medusa_model_dir,
                  "--tokenizer_dir": opts.tokenizer_dir, **opts.prompts.paths()}
        for flag, src in inputs.items():
            s = Path(src).resolve() if src else None
            if s is not None and (out == s or s in out.parents):  # never write over or into an input
                raise PortError(f"--output {opts.output} is {'the input' if out == s else 'inside the input'} {flag}",
                                where=str(opts.output),
                                fix=f"write the tree outside {flag}, e.g. --output ./tree.json")
    ids, chat = prompt_token_ids(opts.prompts, Path(opts.model_dir), opts.tokenizer_dir, opts.chat_template)
    with torch_threads(opts.threads):
        res = tune(opts.model_dir, opts.medusa_model_dir, prompt_ids=ids, tokenizer_dir=opts.tokenizer_dir,
                   max_nodes=opts.max_nodes, max_draft_len=opts.max_draft_len, top_k=opts.top_k,
                   new_tokens=opts.new_tokens, estimate=opts.estimate, baseline=opts.baseline or None,
                   quiet=opts.quiet, chat_template=opts.chat_template, chat_status=chat)
    if opts.output is not None:
        write_choices(res.paths, opts.output, overwrite=opts.overwrite)
    return TuneTreeResult(Path(opts.output) if opts.output is not None else None, res)


# -- tree -----------------------------------------------------------------------------------------
TreeOptions = _options(
    "TreeOptions", "``trtllm-medusa tree``: a medusa_choices tree (preset, @file or JSON list) and TensorRT-LLM's "
    "buffers.")


@dataclass
class TreeResult:
    tree: MedusaTree
    notes: list[str] = field(default_factory=list)  # what was done to the input (a preset pruned)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**self.tree.to_dict(), "warnings": self.warnings}

    def render(self, draw: bool = False) -> str:
        if draw:
            from trtllm_medusa_ports.trees.tune import draw as draw_tree

            lines = [draw_tree(self.tree)]
        else:
            d = self.tree.to_dict()
            lines = [f"nodes: {d['num_nodes']} (+ root), depth: {d['depth']}, top-k per depth: {d['medusa_topks']}",
                     f"position_offsets: {d['position_offsets']}", f"leaf paths: {len(d['paths_indices'])}"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


def tree(opts: TreeOptions) -> TreeResult:
    from trtllm_medusa_ports.trees.tree import resolve_choices, upstream_quirks

    validate_options(opts, "TreeOptions", TreeError)
    paths, pruned = resolve_choices(opts.choices, opts.num_heads)
    t = MedusaTree.from_spec(paths, top_k=opts.top_k, num_heads=opts.num_heads, max_draft_len=opts.max_draft_len)
    return TreeResult(t, [pruned] if pruned else [], upstream_quirks([list(p) for p in t.paths]))


# -- inspect-heads --------------------------------------------------------------------------------
@dataclass
class HeadsInfo:
    summary: dict
    heads: object = None  # heads.MedusaHeads (lazy tensors)

    def to_dict(self) -> dict:
        """One type per key: ``vocab_size`` is the heads' own vocabulary (an int) or None where they have none
        (heads projecting with the base lm_head); ``vocab_size_note`` says why it is None (else None)."""
        d = dict(self.summary)
        v = d.get("vocab_size")
        note = None
        if v is not None and not is_int(v):
            note, v = str(v), None
        elif v is None and d.get("shares_base_lm_head"):
            note = "the base's (the heads use its lm_head)"
        d["vocab_size"] = v
        out = {}
        for k, val in d.items():  # the note right after the size it explains
            out[k] = val
            if k == "vocab_size":
                out["vocab_size_note"] = note
        return out

    def render(self) -> str:
        d = self.to_dict()
        note = d.pop("vocab_size_note")
        if note is not None:
            d["vocab_size"] = note  # the text output says it in words
        lines = [f"{k:22s}: {v}" for k, v in d.items() if k != "warnings"]
        return "\n".join(lines + [f"warning: {w}" for w in d["warnings"]])


def inspect_heads(path: str | Path, *, data_check: bool = True) -> HeadsInfo:
    """``trtllm-medusa inspect-heads``: a Medusa head checkpoint of any layout; ``data_check``: scan for NaN/Inf."""
    from trtllm_medusa_ports.errors import HeadsError
    from trtllm_medusa_ports.heads import load_heads

    check_fields("inspect_heads", {"path": path, "data_check": data_check}, {"data_check": True}, HeadsError)
    heads = load_heads(path)
    if data_check:
        heads.check_finite()
    return HeadsInfo(heads.summary(), heads)


# -- deploy ---------------------------------------------------------------------------------------
DeployOptions = _options(
    "DeployOptions", "``trtllm-medusa deploy``: the serving bundle of a checkpoint (build.sh, run.sh, deploy.json).")


@dataclass
class DeployResult:
    bundle: dict  # deploy.json
    output_dir: Path
    #: checkpoint / tokenizer -> {"bytes": copied, "scrubbed": ["config.json: medusa_ports.heads_source", ...]}
    brought: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return self.bundle

    def render(self) -> str:
        b = self.bundle
        not_python = [r for r, v in b["routes"].items() if not v["resolves"]]
        out = self.output_dir
        copied = {k: v["bytes"] for k, v in self.brought.items()}
        scrubbed = [f"{k}/{s}" for k, v in self.brought.items() for s in v["scrubbed"]]
        return "\n".join([
            f"Wrote {out}: " + ", ".join(b["files"]) + f" (world size {b['world_size']}; tree "
            f"{b['tree']['nodes']} nodes, {b['tree']['source']})",
            "checkpoint/ and tokenizer/: copies of the inputs (" + ", ".join(f"{k} {v / 1e9:.3g} GB" for k, v in
                                                                             copied.items())
            + "; reflinks where the filesystem shares blocks)"
            + (f"; this machine's paths replaced by their names in {', '.join(scrubbed)}" if scrubbed else "")
            + "; the bundle names no path of this machine: copy it whole to the GPU machine (rsync -a) and run there",
            f"1. build: {out}/build.sh",
            f"2. run:   TRTLLM_EXAMPLES=TensorRT-LLM/examples {out}/run.sh \"your prompt\"   (a source checkout of "
            f"the installed version: {CHECKOUT_COMMAND})",
            f"   or:    python3 {out}/llm_api.py \"your prompt\"   (the LLM API)",
            f"   or:    {out}/serve.sh   (trtllm-serve; a greedy request is in its comments)",
            f"   or:    {out}/triton/fill.sh, then {out}/triton/launch.sh   (Triton's tensorrtllm backend)",
            f"serving sizes: batch {b['serving']['max_batch_size']} ({b['serving_from']['max_batch_size']}), "
            f"max_seq_len {b['serving']['max_seq_len']} ({b['serving_from']['max_seq_len']}), max_input_len "
            f"{b['serving']['max_input_len']}",
            f"KV cache: {b['kv_cache_free_gpu_memory_fraction']:g} of the GPU memory free after the weights, on every "
            f"route ({b['kv_cache_free_gpu_memory_fraction_from']})",
        ] + ([f"engine architecture {b['engine_architecture']} does not resolve on: {', '.join(not_python)}"]
             if not_python else []) + ([f"note: the scripts export {k}={v}. {b['xqa_jit_only']}"
                                        for k, v in b["environment"].items()] if b.get("xqa_jit_only") else []))


def deploy(opts: DeployOptions) -> DeployResult:
    """Raises :class:`~trtllm_medusa_ports.errors.PortError` subclasses for bad input; nothing is written then."""
    from trtllm_medusa_ports.deploy import bundle

    validate_options(opts, "DeployOptions")
    opts = hub_inputs(opts)  # Hub ids -> their local snapshots (files/hub.py)
    d = bundle.plan(Path(opts.checkpoint_dir), Path(opts.tokenizer_dir), Path(opts.output_dir),
                    engine_dir=Path(opts.engine_dir) if opts.engine_dir else None, medusa_choices=opts.medusa_choices,
                    override_medusa_choices=opts.override_medusa_choices, max_batch_size=opts.max_batch_size,
                    max_input_len=opts.max_input_len, max_seq_len=opts.max_seq_len, gpu_memory_gb=opts.gpu_memory_gb)
    out = Path(opts.output_dir).resolve()
    copied = bundle.write(d, out, overwrite=opts.overwrite, checkpoint_dir=Path(opts.checkpoint_dir),
                          tokenizer_dir=Path(opts.tokenizer_dir))
    return DeployResult(d, out, copied)


# -- build ----------------------------------------------------------------------------------------
BuildOptions = _options(
    "BuildOptions", "``trtllm-medusa build``: ``trtllm-build`` with this project's architectures registered (needs "
    "tensorrt_llm 1.2; not installable on CPU-only machines); ``args``: trtllm-build's own flags.")


@dataclass
class BuildResult:
    checkpoint_dir: Path
    returncode: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def to_dict(self) -> dict:
        return {"checkpoint_dir": str(self.checkpoint_dir), "returncode": self.returncode, "ok": self.ok}


def _flag_int(args: list[str], flag: str) -> int | None:
    """The integer a trtllm-build flag is given in ``args`` (``--flag N`` or ``--flag=N``; the last one, as argparse
    takes it), or None; a value that is not an integer is trtllm-build's to refuse."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.partition("=")[2]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def build(opts: BuildOptions) -> BuildResult:
    """Raises :class:`~trtllm_medusa_ports.errors.CheckpointError` for a missing or unreadable checkpoint and for
    one the build rules refuse (``rules`` names them), and a :class:`~trtllm_medusa_ports.errors.PortError` for
    whatever else stops trtllm-build (its flags, TensorRT-LLM missing or failing: engine/build.py)."""
    from trtllm_medusa_ports.compat.checkpoint import checkpoint_findings
    from trtllm_medusa_ports.compat.positions import checkpoint_position_range, checkpoint_seq_limit
    from trtllm_medusa_ports.engine.build import main as build_main
    from trtllm_medusa_ports.engine.build import read_checkpoint_config, refusal

    validate_options(opts, "BuildOptions", CheckpointError)
    ckpt = Path(opts.checkpoint_dir)
    if not ckpt.is_dir():  # worded as every reader words it (files/checkpoint.no_config)
        from trtllm_medusa_ports.files.checkpoint import no_config

        raise CheckpointError(no_config(ckpt), where=str(ckpt), fix="pass the --output_dir of trtllm-medusa convert")
    cfg = read_checkpoint_config(ckpt)
    args = list(opts.args)
    max_seq_len = _flag_int(args, "--max_seq_len")
    limit = checkpoint_seq_limit(cfg)
    if max_seq_len is None and limit is not None:
        # trtllm-build's default (the position table) would run the last steps' tree tokens past it: the largest
        # max_seq_len that does not, said (check warns of the default; a larger given one is refused below)
        LOG.info(f"note: --max_seq_len {limit} (the learned position table less the tree's depth; trtllm-build's "
                 "default, the whole table, would put tree tokens past it: rule learned-position-range)")
        args += ["--max_seq_len", str(limit)]
        max_seq_len = limit
    errors = [f for f in checkpoint_findings(cfg, opts.allow_unsupported) + checkpoint_position_range(cfg, max_seq_len)
              if f.severity == ERROR]
    if errors:
        raise refusal(errors, str(ckpt / "config.json"))
    rc = build_main(str(ckpt), args, allow_unsupported=opts.allow_unsupported)
    return BuildResult(ckpt, rc)


# -- port -----------------------------------------------------------------------------------------
def port(opts: PortOptions) -> PortResult:
    """``trtllm-medusa port``: check -> train-heads -> tune-tree -> convert -> verify -> deploy in
    ``opts.output_dir``, each stage run by this module's own function (port.py)."""
    classes = {"check": CheckOptions, "train-heads": __getattr__("TrainOptions"), "tune-tree": TuneOptions,
               "convert": ConvertOptions, "verify": VerifyOptions, "deploy": DeployOptions}
    functions = {"check": check, "train-heads": train_heads, "tune-tree": tune_tree, "convert": convert,
                 "verify": verify, "deploy": deploy}
    return _port(opts, Stages(classes, functions, __getattr__("FitOptions")))
