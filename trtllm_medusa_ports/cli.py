"""``trtllm-medusa``: the command line (parse the flags, call the library, print, exit code).

One ``run_<command>`` per command (flags -> the api's options -> its function -> printed), ``build_parser`` and
``main``; nothing else: the flags themselves, their types and the values read from them are cli_flags/'s.
May import: cli_flags, errors, and lazily api (each command's function) and what a command needs beyond it.

Exit codes (errors.EXIT_CODES, docs/user-guide.md "Exit codes"): 0 success; 1 an input is wrong or does not fit the
flags; 2 the command line alone is wrong (argparse's own errors, the refusals printed here, and a PortError raised
with ``usage=True``); 3 check or verify ran and found a problem; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from trtllm_medusa_ports.cli_flags import parsers
from trtllm_medusa_ports.cli_flags.refused import (
    ADD_HEADS_REFUSED,
    ADD_HEADS_WHY,
    FROM_CONFIG,
    NOT_SUPPORTED,
)
from trtllm_medusa_ports.cli_flags.values import (
    calibration_device_ok,
    changed_flags,
    device_ok,
    moe_ep_size,
    options_from,
    port_stages,
    print_result,
    prompt_inputs,
)
from trtllm_medusa_ports.errors import (
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PortError,
    failure,
)
from trtllm_medusa_ports.files import interrupts
from trtllm_medusa_ports.machine import log

LOG = log.get("cli")


def _say_findings(findings, warnings: list[str]) -> None:
    """convert's findings (but info) and warnings on stderr; a finding carried into config.json is said once."""
    shown = [f.message for f in findings if f.severity != "info"]
    for f in findings:
        if f.severity != "info":
            (LOG.error if f.severity == "error" else LOG.warning)(f"[{f.rule}] {f.message}")
    for w in warnings:
        if not any(w.endswith(m) for m in shown):
            LOG.warning(w)


def run_convert(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import ConvertOptions, convert
    from trtllm_medusa_ports.conversion.options import default_dtype

    for flag, what in NOT_SUPPORTED.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
            hint = ("quantize with TensorRT-LLM's own tools later" if "quant" in what or "calibration" in what
                    or "SmoothQuant" in what or "KV cache" in what else "lm_head and every tensor are written in --dtype")
            raise PortError(f"{flag}: {what} is not supported yet by trtllm-medusa-ports; convert without it ({hint})",
                            usage=True)
    for flag in FROM_CONFIG:
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
            raise PortError(f"{flag} is not supported: the value is read from "
                            f"{args.model_dir or args.base_checkpoint_dir}/config.json (edit that file if it is wrong)",
                            usage=True)
    if (args.model_dir is None) == (args.base_checkpoint_dir is None):
        raise PortError("--model_dir and --base_checkpoint_dir: pass one of them", usage=True,
                        fix="--model_dir for a Hugging Face base, --base_checkpoint_dir for a TensorRT-LLM checkpoint "
                            "NVIDIA's tools quantized")
    if args.medusa_hidden_act != "silu":
        raise PortError("--medusa_hidden_act: only silu is supported (Medusa ResBlocks are trained with SiLU)",
                        usage=True)
    if args.base_checkpoint_dir is not None:
        return _add_heads(args)
    ep = moe_ep_size(args)
    if ep is None or not calibration_device_ok(args):
        return 2
    opts = ConvertOptions(**options_from("ConvertOptions", args, moe_ep_size=ep,
                                         dtype=args.dtype or default_dtype(Path(args.model_dir))))
    result = convert(opts)
    _say_findings(result.findings, result.warnings)
    print(json.dumps(result.to_dict(), indent=2) if getattr(args, "json", False) else result.summary())
    return 0


def _add_heads(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import AddHeadsOptions, add_heads

    asked = changed_flags("convert", ADD_HEADS_REFUSED, args)
    if asked:
        reasons = dict.fromkeys(ADD_HEADS_WHY[ADD_HEADS_REFUSED[f.lstrip("-")]] for f in asked)
        raise PortError(f"{', '.join(asked)} with --base_checkpoint_dir: {'; '.join(reasons)}",
                        fix="drop them (quantize and shard the base with NVIDIA's tools)", usage=True)
    if args.workers < 1:
        raise PortError(f"--workers {args.workers} must be at least 1", fix="use --workers 1 or more", usage=True)
    # no --dtype: the base's own (a typed --dtype other than the base's is refused by add_heads, exit 2)
    result = add_heads(AddHeadsOptions(**options_from("AddHeadsOptions", args)))
    for w in result.warnings:
        LOG.warning(w)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.render())
    return 0


def run_inspect_heads(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import inspect_heads

    print_result(args, inspect_heads(args.path, data_check=not args.no_data_check))
    return 0


def run_tree(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import TreeOptions, tree
    from trtllm_medusa_ports.trees.tree import preset_names

    if args.list_presets:
        print("\n".join(preset_names()))
        return 0
    if not args.choices:
        raise PortError("--choices is required (a preset, @file, or a JSON list)", usage=True)
    result = tree(TreeOptions(**options_from("TreeOptions", args)))
    for note in result.notes:
        LOG.info(f"note: {note}")
    print(json.dumps(result.to_dict()) if args.json else result.render(draw=args.draw))
    return 0


def run_train_heads(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import FitOptions, TrainOptions, train_heads
    from trtllm_medusa_ports.heads.fit import TrainingInterrupted

    if args.device is not None and not device_ok(args.device):  # computed on before the base is loaded
        return 2
    fit = FitOptions(**options_from("FitOptions", args))  # --batch_size 0: every position (values.flag_value)
    opts = TrainOptions(**options_from("TrainOptions", args, prompts=prompt_inputs(args), fit=fit))
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

    result = tune_tree(TuneOptions(**options_from("TuneOptions", args, prompts=prompt_inputs(args),
                                                  baseline=args.baseline or None)))
    for note in result.notes:
        LOG.info(f"note: {note}")
    print_result(args, result)
    return 0


def run_check(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import CheckOptions, check

    result = check(CheckOptions(**options_from("CheckOptions", args, prompts=prompt_inputs(args))))
    print_result(args, result)
    return EXIT_OK if result.compatible else EXIT_FOUND


def run_verify(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import VerifyOptions, verify

    device = getattr(args, "device", "cpu")
    if device != "cpu" and not device_ok(device):  # computed on before anything is loaded
        return 2
    if args.calib_dataset is None:  # they say how to read --calib_dataset: alone, they change nothing
        given = [f for f, v, d in (("--calib_size", args.calib_size, None),
                                   ("--calib_max_seq_length", args.calib_max_seq_length, 512)) if v != d]
        if given:
            LOG.warning(f"{', '.join(given)}: ignored without --calib_dataset (a checkpoint converted here "
                        "re-derives its scales from its recorded calibration)")
    report = verify(VerifyOptions(**options_from("VerifyOptions", args, prompts=prompt_inputs(args))))
    print_result(args, report)
    return EXIT_OK if report.ok else EXIT_FOUND


def run_build(args: argparse.Namespace, rest: list[str]) -> int:
    from trtllm_medusa_ports.api import BuildOptions, build

    result = build(BuildOptions(**options_from("BuildOptions", args, args=list(rest))))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    return result.returncode


def run_deploy(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import DeployOptions, deploy

    print_result(args, deploy(DeployOptions(**options_from("DeployOptions", args))))
    return 0


def run_port(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.api import PortOptions, port

    result = port(PortOptions(model_dir=args.model_dir, output_dir=Path(args.output_dir),
                              medusa_model_dir=args.medusa_model_dir, medusa_choices=args.medusa_choices,
                              revision=args.revision, tokenizer_dir=args.tokenizer_dir, stages=port_stages(args),
                              overwrite=args.overwrite, quiet=args.quiet))
    print_result(args, result)
    return result.exit_code


def run_demo(args: argparse.Namespace) -> int:
    from trtllm_medusa_ports.demo import run_demo as demo

    return demo(Path(args.workdir), quiet=args.quiet, architecture=args.architecture)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser (cli_flags/parsers.py), each calling its run_<command> below; ``only``: that
    command's alone (main, for a command line that names it first)."""
    return parsers.build_parser({
        "inspect-heads": run_inspect_heads, "tree": run_tree, "check": run_check, "convert": run_convert,
        "verify": run_verify, "train-heads": run_train_heads, "tune-tree": run_tune_tree, "build": run_build,
        "deploy": run_deploy, "port": run_port, "demo": run_demo}, only)


def _typed_trees(args: argparse.Namespace) -> None:
    """A tree typed on the command line (not @FILE) is read before any input, so that its form is judged as the
    command line's (exit 2) whatever the directories hold; whether it fits the heads is the command's to say."""
    from trtllm_medusa_ports.trees.tree import parse_choices

    for dest in ("medusa_choices", "choices"):
        text = getattr(args, dest, None)
        if isinstance(text, str) and not text.strip().startswith("@"):
            parse_choices(text)


def _hub_inputs(args: argparse.Namespace) -> None:
    """Each directory flag given as a Hub id (files/hub.py) replaced by its local snapshot before the command reads
    it: --model_dir at --revision, the others at main."""
    from trtllm_medusa_ports.files.hub import resolved_inputs

    for field, path in resolved_inputs(args, "--").items():
        setattr(args, field, str(path))
    if getattr(args, "revision", None):
        args.revision = None  # used (or said unused) here: the API reads local paths only now


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    """The command line; SIGINT and SIGTERM interrupt it at any moment, the partial output removed (files/interrupts.py:
    also one Python swallowed is honoured), and the handlers before are put back after (a caller running main
    in-process keeps its own). ``prog``: the name the command's usage and errors give (the drop-in
    convert/convert_checkpoint.py names itself)."""
    with interrupts.handled():
        return _main(argv, prog)


def _log_level_after_command(argv: list[str]) -> list[str]:
    """``--log_level L`` written before the command (``trtllm-medusa --log_level debug check ...``) moved after it:
    every command takes it, and argparse read the level as the command's name."""
    lead = []
    while argv and (argv[0].startswith("--log_level=") or (argv[0] == "--log_level" and len(argv) > 1)):
        n = 1 if "=" in argv[0] else 2
        lead, argv = lead + argv[:n], argv[n:]
    return [argv[0], *lead, *argv[1:]] if lead and argv and argv[0] in parsers.COMMAND_PARSERS else lead + argv


def _main(argv: list[str] | None, prog: str | None = None) -> int:
    argv = _log_level_after_command(list(sys.argv[1:] if argv is None else argv))
    # a command line naming its command first reaches that command's parser only; anything else (--help,
    # --version, an unknown command, none) gets the whole parser and its messages
    parser = build_parser(argv[0] if argv and argv[0] in parsers.COMMAND_PARSERS else None)
    if prog and argv and argv[0] in parser.commands:
        parser.commands[argv[0]].prog = prog
    as_json = "--json" in argv  # every failure is then also one JSON object on stdout (errors.failure)
    try:
        args, rest = parser.parse_known_args(argv)
        if rest and args.command != "build":  # build passes the rest to trtllm-build; the others refuse it with their
            # own usage line, not the top-level one
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as exc:  # argparse's own: usage errors exit 2 (its message on stderr), --help / --version 0
        if as_json and exc.code == EXIT_USAGE:
            print(json.dumps(failure(parsers.Parser.last_error or "the command line is wrong", exit_code=EXIT_USAGE,
                                     kind="usage", fix="see --help")))
        raise
    level = getattr(args, "log_level", None)
    if args.command == "build" and level is not None:
        rest = [*rest, "--log_level", level]  # trtllm-build's own flag of the same name and levels
    try:
        with log.shown(level or log.DEFAULT_LEVEL):
            _typed_trees(args)
            _hub_inputs(args)
            code = args.func(args, rest) if args.command == "build" else args.func(args)
            if code == 0:
                interrupts.honour()  # a Ctrl-C Python swallowed (raised in a finalizer) still interrupts
            return code
    except PortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", []):
            print(f"note: {note}", file=sys.stderr)
        if as_json:
            print(json.dumps(exc.failure()))
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; nothing was left half-written", file=sys.stderr)
        if as_json:
            print(json.dumps(failure("interrupted; nothing was left half-written", exit_code=EXIT_INTERRUPTED,
                                     kind="KeyboardInterrupt")))
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early (`... | head`): not an error of ours, and no traceback
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (Python flushes stdout again at exit)
        return 141
