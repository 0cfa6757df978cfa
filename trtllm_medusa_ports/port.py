"""``trtllm-medusa port``: one command from a base (a directory or a Hub id) to a verified serving bundle.

The stages are the commands a user would run by hand, in their order, each with its own options:
check -> train-heads (only without ``medusa_model_dir``: the README's recipe, 4 heads and 1,100 steps) -> tune-tree
(only without ``medusa_choices``) -> convert -> verify -> deploy. Each stage writes into ``output_dir``:

    check.json           check's findings (NOT COMPATIBLE stops the run: exit 3)
    heads/, heads.train/ train-heads' heads and its corpus and training state (reused by a rerun)
    tree.json            tune-tree's medusa_choices (what convert, verify and deploy use)
    checkpoint/          convert's TensorRT-LLM checkpoint
    verify.json          verify's report (a failed verdict stops the run: exit 3, no bundle)
    serve/               deploy's bundle: copy it to the GPU machine and run serve/build.sh there
    port.json            what each stage ran on: its options, its inputs' fingerprints, its time

A rerun reads port.json and skips each stage whose options, inputs and earlier stages are unchanged and whose
output is still as it wrote it (saying so); a changed option, or an output changed since, reruns its stage and every
stage after it.

api.port runs it with the API's own stage functions and options classes (:class:`Stages`): this module imports
neither api nor the stages, so that api can offer port beside them.

May import: declared (the stages and port's own fields), errors, files, log, convert_options, heads (the heads
path's check), tree (a tree file's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_medusa_ports.declared import PORT_OWN, PORT_STAGES
from trtllm_medusa_ports.errors import EXIT_FOUND, EXIT_OK, PortError
from trtllm_medusa_ports.files.hub import is_hub_id, local_dir
from trtllm_medusa_ports.files.identity import file_identity
from trtllm_medusa_ports.machine import log

LOG = log.get("port")

#: the stages in their order, and the option fields port sets itself (the paths between the stages, its own flags):
#: one declaration with the command line's (declared.py), which routes every other flag to its stages
STAGES = PORT_STAGES
PORT_FIELDS = PORT_OWN
#: train-heads' recipe when the user names none: the README's (4 heads, 1,100 steps; benchmarks/results/heads.json)
README_RECIPE = {"num_heads": 4, "steps": 1100}
RECORD = "port.json"
RECORD_VERSION = 1


@dataclass
class PortOptions:
    """``trtllm-medusa port``: ``model_dir`` (a directory or a Hub id, at ``revision``) to a bundle in ``output_dir``.

    ``medusa_model_dir``: heads to use (none: trained by train-heads); ``medusa_choices``: a tree (none: tuned by
    tune-tree); ``stages``: each stage's own options by stage name (``{"convert": {"tp_size": 2}}``, the fields of
    its options class, ``"fit"`` for train-heads' FitOptions fields), all but the paths port sets itself
    (:data:`PORT_FIELDS`). ``overwrite``: run every stage again, whatever port.json says."""

    model_dir: str | Path
    output_dir: str | Path
    medusa_model_dir: str | Path | None = None
    medusa_choices: str | list | None = None
    revision: str | None = None
    tokenizer_dir: str | Path | None = None
    stages: dict = field(default_factory=dict)
    overwrite: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class Stages:
    """What runs each stage: by stage name, its options class and its function (api's, which returns a result
    with ``to_dict()``), and train-heads' ``FitOptions``."""

    classes: dict
    functions: dict
    fit_options: type


@dataclass
class StageRun:
    stage: str
    status: str  # "ran", "reused", "skipped" (not needed: heads or tree given), "failed"
    seconds: float = 0.0
    output: str | None = None
    why: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class PortResult:
    output_dir: Path
    stages: list[StageRun]
    compatible: bool | None = None
    verified: bool | None = None
    tokens_per_step_until_end: float | None = None
    mean_accepted_tokens_per_step: float | None = None
    #: what verify measured on (the prompts, their chat template), in words
    measured_on: str | None = None
    #: tune-tree's prediction of the tokens per step until the end token for the tree it wrote (None: not tuned here)
    predicted_tokens_per_step_until_end: float | None = None
    bundle: Path | None = None
    #: the result objects of the stages that ran in this call (CheckResult, VerifyReport, ...), by stage name
    made: dict = field(default_factory=dict, repr=False)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.compatible and self.verified and self.bundle is not None else EXIT_FOUND

    def next_command(self) -> str | None:
        return None if self.bundle is None else (f"copy {self.bundle} to the GPU machine (rsync -a), then run "
                                                 f"{self.bundle.name}/build.sh there")

    def to_dict(self) -> dict:
        return {"output_dir": str(self.output_dir), "stages": [s.to_dict() for s in self.stages],
                "compatible": self.compatible, "verified": self.verified,
                "tokens_per_step_until_end": self.tokens_per_step_until_end,
                "mean_accepted_tokens_per_step": self.mean_accepted_tokens_per_step,
                "measured_on": self.measured_on,
                "predicted_tokens_per_step_until_end": self.predicted_tokens_per_step_until_end,
                "bundle": None if self.bundle is None else str(self.bundle), "next": self.next_command(),
                "exit_code": self.exit_code}

    def render(self) -> str:
        verdict = ("NOT COMPATIBLE (check.json)" if self.compatible is False else
                   "FAILED (verify.json)" if self.verified is False else "VERIFIED" if self.verified else "not reached")
        lines = [f"port: {verdict}"]
        if self.tokens_per_step_until_end is not None:
            lines.append(f"  speculation: {self.tokens_per_step_until_end:.2f} tokens per step until the end token "
                         f"(mean accepted {self.mean_accepted_tokens_per_step:.2f}), measured by verify on CPU"
                         + (f" on {self.measured_on}" if self.measured_on else ""))
            if self.predicted_tokens_per_step_until_end is not None:
                lines.append(f"  tune-tree predicted {self.predicted_tokens_per_step_until_end:.2f} for its tree "
                             "(tune.json: measured on its own prompts)")
        if self.bundle is not None:
            lines.append(f"  bundle: {self.bundle}")
            lines.append(f"  next: {self.next_command()}")
        return "\n".join(lines)


# -- what a stage runs on ------------------------------------------------------------------------------------------
def _jsonable(value):
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _digest(path: Path, salt: str = "") -> str:
    """The files under ``path`` as they are now (files/identity.py: names, sizes, times, inodes), in one hash: an
    output changed or damaged since its stage ran is made again, and the stages after it run on the new one."""
    return hashlib.sha256(json.dumps([salt, file_identity(path)]).encode()).hexdigest()


def _key(stage: str, options, inputs: dict[str, Path | None], before: str) -> str:
    """The stage's identity: its options, its inputs' fingerprints and the stage before it."""
    what = {"stage": stage, "options": _jsonable(options), "before": before,
            "inputs": {k: file_identity(v) if v is not None else None for k, v in inputs.items()}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


# -- the record --------------------------------------------------------------------------------------------------
def _read_record(out: Path) -> dict:
    path = out / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else {}


def _write_record(out: Path, record: dict) -> None:
    tmp = out / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out / RECORD)


def _prepare_output(out: Path, inputs: dict[str, Path | None], overwrite: bool) -> dict:
    """``out`` made (or an earlier port's, its record read): never an input or inside one, never another tool's."""
    from trtllm_medusa_ports.files.checkpoint import guard_output_dir

    guard_output_dir(out, {k: v for k, v in inputs.items() if v is not None})
    if out.exists() and not out.is_dir():
        raise PortError("--output_dir exists and is not a directory", where=str(out), fix="choose another --output_dir")
    if out.is_dir() and any(out.iterdir()) and not (out / RECORD).is_file():
        raise PortError(f"--output_dir is not empty and holds no {RECORD}: it was not made by port, and nothing in it "
                        "was touched", where=str(out), fix="choose a new or empty --output_dir")
    out.mkdir(parents=True, exist_ok=True)
    record = {} if overwrite else _read_record(out)
    return {"version": RECORD_VERSION, "stages": dict(record.get("stages") or {})}


# -- the stages' options -----------------------------------------------------------------------------------------
def _check_stages(opts: PortOptions) -> None:
    """``opts.stages`` names stages and none of the fields port sets (before anything is written)."""
    unknown = set(opts.stages) - set(STAGES)
    if unknown:
        raise PortError(f"PortOptions.stages names no stage {', '.join(sorted(unknown))}",
                        fix=f"use the stages' names: {', '.join(STAGES)}")
    for stage, given in opts.stages.items():
        owned = sorted(set(given or {}) & PORT_FIELDS)
        if owned:
            raise PortError(f"PortOptions.stages[{stage!r}] sets {', '.join(owned)}, which port sets itself (the "
                            "paths between the stages)", fix="give model_dir, medusa_model_dir, medusa_choices, "
                                                             "tokenizer_dir and revision to port itself")


def _options(opts: PortOptions, run: _Run, stage: str, **paths):
    """The stage's options: its own fields from ``opts.stages``, the paths between the stages, port's quiet."""
    given = dict(opts.stages.get(stage) or {})
    cls = run.stages.classes[stage]
    if stage == "train-heads":
        fit = {**README_RECIPE, "quiet": opts.quiet, **dict(given.pop("fit", None) or {})}
        try:
            given["fit"] = run.stages.fit_options(**fit)
        except TypeError as exc:
            raise PortError(f"train-heads' fit options: {exc}", fix="use FitOptions' fields") from None
    if "quiet" in {f.name for f in dataclasses.fields(cls)}:
        given["quiet"] = opts.quiet
    try:
        return cls(**paths, **given)
    except TypeError as exc:
        raise PortError(f"{stage}'s options: {exc}", fix=f"use the fields of {cls.__name__}") from None


# -- the run -----------------------------------------------------------------------------------------------------
#: option fields that change how a stage runs, not what it writes: left out of its identity
NEUTRAL = {"quiet", "threads", "workers", "fsync", "save_every"}


def _identity(value):
    value = _jsonable(value)
    if isinstance(value, dict):
        return {k: _identity(v) for k, v in value.items() if k not in NEUTRAL}
    return value


class _Run:
    """One port run: the record, the stages' lines, and the key chain (each stage's key names the one before)."""

    def __init__(self, opts: PortOptions, out: Path, record: dict, stages: Stages):
        self.opts, self.out, self.record, self.stages = opts, out, record, stages
        self.before = ""
        self.runs: list[StageRun] = []
        self.made: dict[str, object] = {}  # the results of the stages that ran now, by stage

    def say(self, line: str) -> None:
        if not self.opts.quiet:
            print(line, file=sys.stderr, flush=True)

    def skip(self, stage: str, why: str) -> None:
        self.runs.append(StageRun(stage, "skipped", why=why))
        self.say(f"[{STAGES.index(stage) + 1}/{len(STAGES)}] {stage}: skipped ({why})")

    def stage(self, stage: str, options, inputs: dict, output: Path, run, saved: str | None = None) -> dict:
        """``run()`` (which returns the stage's result; its ``to_dict()`` is saved as ``saved`` under the output
        directory) unless the record holds the same key and the output is as it was written: then the saved
        dict. Either way the dict is returned (the result itself, where it ran, is kept in ``made``)."""
        key = _key(stage, _identity(options), inputs, self.before)
        n = f"[{STAGES.index(stage) + 1}/{len(STAGES)}] {stage}"
        done = self.record["stages"].get(stage) or {}
        saved_path = self.out / saved if saved else None
        if (done.get("key") == key and output.exists() and done.get("output_files") == _digest(output)
                and (saved_path is None or saved_path.is_file())):
            self.before = _digest(output, key)  # what the next stage reads: this output as it is
            self.runs.append(StageRun(stage, "reused", output=str(output), why="its options and inputs are unchanged"))
            self.say(f"{n}: reused ({output.name}: options and inputs unchanged since its run)")
            return json.loads(saved_path.read_text()) if saved_path else {}
        self.record["stages"].pop(stage, None)
        _write_record(self.out, self.record)  # a stage that stops half-way is not taken for done by a rerun
        self.say(f"{n}: running ...")
        t = time.monotonic()
        try:
            made = run()
        except (PortError, KeyboardInterrupt) as exc:
            self.runs.append(StageRun(stage, "failed", time.monotonic() - t, str(output)))
            if isinstance(exc, PortError):
                exc.add_note(f"port stopped at its {stage} stage; the stages before it are kept in {self.out} and "
                             "a rerun of the same command resumes there")
            raise
        seconds = round(time.monotonic() - t, 1)
        self.made[stage] = made
        result = made.to_dict()
        if saved_path is not None:
            saved_path.write_text(json.dumps(_jsonable(result), indent=2) + "\n")
        self.before = _digest(output, key)
        self.record["stages"][stage] = {"key": key, "seconds": seconds, "output": output.name,
                                        "output_files": _digest(output),
                                        "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        _write_record(self.out, self.record)
        self.runs.append(StageRun(stage, "ran", seconds, str(output)))
        self.say(f"{n}: done in {seconds:.1f} s -> {output}")
        return result


def _local(value, kind: str, flag: str, revision: str | None = None) -> Path | None:
    if value is None:
        return None
    return local_dir(value, kind, flag=flag, revision=revision) if is_hub_id(value) else Path(value)


def _inputs(opts: PortOptions) -> tuple[Path, Path | None, Path | None]:
    """The base, the heads and the tokenizer as local paths (Hub ids fetched), each input that must be there
    checked before anything is written (exit 1, as every command)."""
    from trtllm_medusa_ports.heads.loader import require_heads_path
    from trtllm_medusa_ports.trees.tree import choices_file

    _check_stages(opts)
    model = _local(opts.model_dir, "base", "--model_dir", opts.revision)
    heads = _local(opts.medusa_model_dir, "heads", "--medusa_model_dir")
    tok = _local(opts.tokenizer_dir, "tokenizer", "--tokenizer_dir")
    if heads is not None:
        require_heads_path(heads)
    if isinstance(opts.medusa_choices, str) and opts.medusa_choices.startswith("@"):
        choices_file(opts.medusa_choices)
    return model, heads, tok


def port(opts: PortOptions, stages: Stages) -> PortResult:
    """Every stage in order (module doc); the result says how far it went. A stage's error is raised (a
    :class:`PortError` with a note naming the stage); NOT COMPATIBLE and a failed verify end the run early."""
    model, heads_given, tok = _inputs(opts)
    out = Path(opts.output_dir)
    record = _prepare_output(out, {"--model_dir": model, "--medusa_model_dir": heads_given, "--tokenizer_dir": tok},
                             opts.overwrite)
    run = _Run(opts, out, record, stages)
    do = stages.functions
    result = PortResult(out.resolve(), run.runs, made=run.made)
    paths = {"tokenizer_dir": tok} if tok is not None else {}
    inputs = {"model": model, "heads": heads_given, "tokenizer": tok}
    choices = opts.medusa_choices

    o = _options(opts, run, "check", model_dir=model, medusa_model_dir=heads_given, medusa_choices=choices, **paths)
    checked = run.stage("check", o, inputs, out / "check.json", lambda: do["check"](o), "check.json")
    result.compatible = bool(checked.get("compatible"))
    if not result.compatible:
        return result
    heads = heads_given
    if heads is None:
        heads = out / "heads"
        o = _options(opts, run, "train-heads", model_dir=model, output_dir=heads, overwrite=True, **paths)
        run.stage("train-heads", o, inputs, heads, lambda: do["train-heads"](o), "train.json")
    else:
        run.skip("train-heads", "--medusa_model_dir given")
    if choices is None:
        tree = out / "tree.json"
        o = _options(opts, run, "tune-tree", model_dir=model, medusa_model_dir=heads, output=tree, overwrite=True,
                     **paths)
        tuned = run.stage("tune-tree", o, {**inputs, "heads": heads}, tree, lambda: do["tune-tree"](o), "tune.json")
        result.predicted_tokens_per_step_until_end = tuned.get("predicted_tokens_per_step_until_end")
        choices = f"@{tree}"
    else:
        run.skip("tune-tree", "--medusa_choices given")
    return _convert_verify_deploy(opts, run, result, model, heads, tok, choices)


def _measured_on(report: dict) -> str:
    """What verify measured on, in words, from its report (``chat_template``: files/tokenizer.py CHAT_*)."""
    from trtllm_medusa_ports.files.tokenizer import CHAT_APPLIED

    n = len(report.get("prompts") or ())
    chat = report.get("chat_template")
    how = ("token-id prompt(s)" if chat is None else "text prompt(s) through the chat template"
           if chat == CHAT_APPLIED else f"text prompt(s), the chat template {chat}")
    return f"{n} {how}"


def _default(run: _Run, stage: str, name: str):
    """A stage's options field's default (its options class, as declared.py made it)."""
    return {f.name: f.default for f in dataclasses.fields(run.stages.classes[stage])}[name]


def _verify_prompts(opts: PortOptions, run: _Run, tok: Path) -> dict:
    """What verify measures on within port: the packaged verify prompts (files/prompts.py ``verify_prompts``: of
    tune-tree's kinds, in none of train-heads' and tune-tree's files) through the chat template as tune-tree's are,
    each answered for as many tokens as tune-tree measured (its ``--new_tokens``) unless ``--max_new_tokens`` is
    given: so that verify's tokens per step is the figure tune-tree predicted, measured on other prompts of the same
    kind. A prompt the tokenizer turns into no token is left out; a base without a tokenizer, or whose tokenizer
    empties them all, keeps verify's default prompts (token ids)."""
    from trtllm_medusa_ports.files.prompts import PromptInputs, lazy_tokenizer, verify_prompts
    from trtllm_medusa_ports.files.tokenizer import VOCAB_FILES

    if not any((tok / f).is_file() for f in VOCAB_FILES):
        return {}
    given = opts.stages.get("verify") or {}
    tokenize = lazy_tokenizer(tok, given.get("chat_template", _default(run, "verify", "chat_template")))
    texts = [t for t in verify_prompts() if tokenize.prompt(t)]
    if not texts:
        return {}
    tuned = (opts.stages.get("tune-tree") or {}).get("new_tokens", _default(run, "tune-tree", "new_tokens"))
    new = {} if "max_new_tokens" in given else {"max_new_tokens": tuned}
    return {"prompts": PromptInputs(prompt=texts), **new}


def _convert_verify_deploy(opts: PortOptions, run: _Run, result: PortResult, model: Path, heads: Path,
                           tok: Path | None, choices) -> PortResult:
    from trtllm_medusa_ports.conversion.options import default_dtype

    out, do = run.out, run.stages.functions
    paths = {"tokenizer_dir": tok} if tok is not None else {}
    inputs = {"model": model, "heads": heads, "tokenizer": tok}
    ckpt = out / "checkpoint"
    dtype = {} if "dtype" in (opts.stages.get("convert") or {}) else {"dtype": default_dtype(model)}
    o = _options(opts, run, "convert", model_dir=model, medusa_model_dir=heads, output_dir=ckpt, medusa_choices=choices,
                 overwrite=True, **paths, **dtype)
    run.stage("convert", o, inputs, ckpt, lambda: do["convert"](o), "convert.json")
    o = _options(opts, run, "verify", model_dir=model, checkpoint_dir=ckpt, medusa_model_dir=heads, **paths,
                 **_verify_prompts(opts, run, tok or model))
    report = run.stage("verify", o, inputs, out / "verify.json", lambda: do["verify"](o), "verify.json")
    result.verified = bool(report.get("ok"))
    result.tokens_per_step_until_end = report.get("tokens_per_step_until_end")
    result.mean_accepted_tokens_per_step = report.get("mean_accepted_tokens_per_step")
    result.measured_on = _measured_on(report)
    if not result.verified:
        return result
    serve = out / "serve"
    o = _options(opts, run, "deploy", checkpoint_dir=ckpt, tokenizer_dir=tok or model, output_dir=serve, overwrite=True)
    run.stage("deploy", o, {"tokenizer": tok or model}, serve, lambda: do["deploy"](o), "deploy.json")
    result.bundle = serve.resolve()
    return result
