"""Every command's argparse parser, made from the one declaration of its options (declared.py ``COMMANDS``).

Parsing only: what a command does with its flags is cli.py's run_<command>, passed in to ``build_parser``.
May import: the standard library, declared, errors (its exit codes), log and cli_flags.types / cli_flags.refused (the package's version
lazily); never cli or api.
"""

from __future__ import annotations

import argparse

from trtllm_medusa_ports import declared
from trtllm_medusa_ports.cli_flags.refused import FROM_CONFIG, NOT_SUPPORTED
from trtllm_medusa_ports.cli_flags.types import fraction, int_in, non_negative, number_in, positive
from trtllm_medusa_ports.errors import EXIT_CODES
from trtllm_medusa_ports.machine.log import DEFAULT_LEVEL, LEVELS


def flag_type(spec: declared.Spec):
    """The argparse type of a declared range (cli_flags/types.py), None for text."""
    if spec.kind == "int":
        return int if spec.lo is None and spec.hi is None else int_in(spec.lo, spec.hi)
    if spec.kind != "float":
        return None
    if spec.lo is None:
        return float
    if spec.lo != 0:
        raise ValueError(f"no flag type for a number range from {spec.lo}")  # a declaration to extend types.py for
    if spec.hi is not None:
        return number_in(spec.lo, spec.hi)
    if spec.below is not None:
        if spec.below != 1:
            raise ValueError(f"no flag type for a number below {spec.below}")
        return fraction
    return positive if spec.lo_excluded else non_negative


def add_declared(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s flags, in declaration order, in their groups (declared.py)."""
    groups: dict[str, object] = {}
    exclusive: dict[str, object] = {}
    for o in declared.COMMANDS[command][2]:
        if not o.spellings:  # the API's alone
            continue
        target = p
        if o.group:
            target = groups.get(o.group) or groups.setdefault(o.group, p.add_argument_group(o.group))
        if o.exclusive:
            target = exclusive.get(o.exclusive) or exclusive.setdefault(o.exclusive,
                                                                        target.add_mutually_exclusive_group())
        _add(target, o, command)
    if command == "convert":  # upstream's flags accepted only to be refused by name (cli_flags/refused.py)
        for flag in list(NOT_SUPPORTED) + list(FROM_CONFIG):
            p.add_argument(flag, nargs="*", default=None, help=argparse.SUPPRESS)
    if command == "port":
        _add_port_routes(p)


def _add(target, o: declared.Option, command: str, *, default=None, help: str | None = None) -> None:
    """One declared flag; ``default``: argparse's default instead of the declared one (port's SUPPRESS)."""
    spellings, spec, kw = o.spellings, o.cli_spec or o.spec, dict(o.extra)
    if spec.kind == "bool":
        kw.setdefault("action", "store_true")
    elif flag_type(spec) is not None:
        kw["type"] = flag_type(spec)
    if spec.choices and spec.kind != "bool":
        kw["choices"] = list(spec.choices)
    if command == "demo" and o.name == "architecture":  # the families with a tiny model (read when demo's
        # parser is built: the adapters' import is not paid by the other commands)
        from trtllm_medusa_ports.archs.registry import tiny_configs

        kw["choices"] = sorted(tiny_configs())
    if o.dest:
        kw["dest"] = o.dest
    if default is not None:
        kw["default"] = default
    elif o.required:
        kw["required"] = True
    elif spellings[0].startswith("-") and kw.get("action") != "store_false" and (
            o.flag_default is not False or kw.get("action") != "store_true"):
        kw["default"] = o.flag_default
    target.add_argument(*spellings, help=o.help if help is None else help, **kw)


def _add_port_routes(p: argparse.ArgumentParser) -> None:
    """port's stage flags (declared.port_routes), grouped by the stages they go to; a flag not given leaves no
    attribute (SUPPRESS), so that only what the user typed is passed on and each stage keeps its own defaults."""
    groups: dict[tuple, object] = {}
    for o, stages in declared.port_routes().values():
        title = "passed on to " + ", ".join(stages)
        target = groups.get(stages) or groups.setdefault(stages, p.add_argument_group(title))
        shown = o.flag_default
        default = f"; default {shown}" if shown not in (None, False) else ""
        _add(target, o, "port", default=argparse.SUPPRESS, help=f"{o.help} [to {', '.join(stages)}{default}]")


USAGE = """Medusa speculative decoding in TensorRT-LLM 1.2 for base models other than Llama: check what the
engine can serve, convert a Hugging Face base and its Medusa heads (float, FP8, INT8/INT4 weight-only),
prove the checkpoint on CPU, and build it - or all of it in one command, port.

examples:
  trtllm-medusa port Qwen/Qwen2-0.5B-Instruct --output_dir ./qwen2-medusa --tp_size 2   # check ... deploy
  trtllm-medusa check --model_dir ./Qwen2-7B --medusa_model_dir ./heads --tp_size 2 --qformat int4_wo \\
      --max_batch_size 8 --max_seq_len 4096 --gpu_memory_gb 24
  trtllm-medusa convert --model_dir ./Qwen2-7B --medusa_model_dir ./heads --output_dir ./ckpt --tp_size 2
  trtllm-medusa verify --model_dir ./Qwen2-7B --checkpoint_dir ./ckpt --prompt "Hello"
  trtllm-medusa build --checkpoint_dir ./ckpt --output_dir ./engine --max_batch_size 4
  trtllm-medusa deploy --checkpoint_dir ./ckpt --tokenizer_dir ./Qwen2-7B --output_dir ./serve
  trtllm-medusa train-heads --model_dir ./Qwen2-0.5B --output_dir ./heads --num_heads 4 --steps 1100
  trtllm-medusa tune-tree --model_dir ./Qwen2-0.5B --medusa_model_dir ./heads --output tree.json
  trtllm-medusa tree --choices mc_sim_7b_63 --draw
  trtllm-medusa inspect-heads ./heads
  trtllm-medusa demo

exit codes:
{exit_codes}
docs: docs/user-guide.md (commands), docs/compatibility-rules.md (every check rule)."""


#: build --help: what it does with the flags it does not know (engine/build.py main)
BUILD_PASSES_ON = """Every other flag goes to trtllm-build as it is, with trtllm-build's names and defaults
(trtllm-build --help lists them), e.g. --output_dir ENGINE_DIR, --max_batch_size, --max_input_len, --max_seq_len,
--max_num_tokens, --gemm_plugin, --workers; build adds --speculative_decoding_mode medusa where it is not given,
checks the flags against the checkpoint's rules first, and registers this project's engine classes for the
checkpoint's architecture (so --model_cls_file / --model_cls_name are refused). Example:
  trtllm-medusa build --checkpoint_dir ./ckpt --output_dir ./engine --max_batch_size 8 --max_seq_len 4096"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` with every flag's default (where it has one, and its help does not already say it) after its help;
    the choices are in the usage's ``{a,b}``. The docs' tables read the same parser and show the default apart."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == argparse.SUPPRESS or not action.option_strings
                or "default" in text or isinstance(default, list)):
            return text
        shown = str(default).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class Parser(argparse.ArgumentParser):
    """argparse's parser, its last usage error kept (``Parser.last_error``) for the CLI's ``--json`` failure object;
    what argparse prints and its exit 2 are unchanged. Subparsers are of the same class (argparse's default)."""

    last_error: str | None = None

    def __init__(self, *args, **kwargs):
        # a prefix is never taken for a flag (--jso is not --json; argparse's default would run --json without
        # printing it, or another command's meaning): every parser of the CLI, subparsers included
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        Parser.last_error = f"{self.prog}: {message}"
        super().error(message)


#: the commands, in the order ``--help`` lists them
COMMAND_PARSERS = tuple(declared.COMMANDS)


def build_parser(commands: dict, only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; ``commands`` maps each command's name to the function its ``func`` calls
    (cli.py's run_<command>). ``only``: that command's parser alone (what parsing a command line that starts
    with it reaches: the same namespace and messages, without building the other eight, ~10 ms)."""
    from trtllm_medusa_ports import __version__

    Parser.last_error = None
    codes = "\n".join(f"  {code:<3} {meaning}" for code, meaning in EXIT_CODES.items())
    p = Parser(prog="trtllm-medusa", description=USAGE.format(exit_codes=codes), formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=__version__)
    # the usage line names every command whichever parsers are built (argparse's own spelling of the choices)
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMAND_PARSERS) + "}")
    p.commands = sub.choices  # each command's own parser: an unknown flag is refused with that command's usage
    for name, (what, _, _) in declared.COMMANDS.items():
        if only is None or name == only:
            s = sub.add_parser(name, help=what, formatter_class=HelpFormatter,
                               epilog=BUILD_PASSES_ON if name == "build" else None)
            s.set_defaults(func=commands[name])
            add_declared(s, name)
            s.add_argument(
                "--log_level", default=None, choices=list(LEVELS),
                help=f"what the log on stderr shows: TensorRT-LLM's level names (default {DEFAULT_LEVEL}, as "
                     "trtllm-build's; build passes it on to trtllm-build); --quiet still turns progress bars off")
    return p
