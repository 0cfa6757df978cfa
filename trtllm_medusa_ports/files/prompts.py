"""Text and token inputs, one reader for every command that takes them.

Every command that reads text (``check``, ``verify``, ``train-heads``, ``tune-tree`` and the
calibration of a quantized ``convert``) takes the same four spellings, meaning the same thing:

* ``--prompt TEXT`` (repeatable): one prompt each;
* ``--prompts_file FILE``: a UTF-8 text file, one prompt per line (a literal ``\\n`` is a line break);
* ``--prompt_ids 1,2,3;4,5``: token ids, ``;`` between prompts;
* ``--data FILE``: JSON lines, one object each: ``{"prompt": str}`` or ``{"prompt_ids": [int]}`` (a
  prompt, which ``train-heads`` continues with the base's greedy tokens) or ``{"text": str}`` /
  ``{"input_ids": [int]}`` (a sequence used as it is). Ids are used as they are: no token is added.

Where a command only decodes from its inputs (``verify``, ``check``, ``tune-tree``, calibration),
a text item is a prompt like any other. :class:`PromptInputs` holds what was given;
:func:`read_items` reads it into :class:`Item` s, tokenizing text only when some is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from trtllm_medusa_ports.errors import PortError

DATA_FIX = 'one JSON object per line: {"prompt": "..."}, {"text": "..."}, {"prompt_ids": [..]} or {"input_ids": [..]}'


@dataclass
class Item:
    """One input: ``ids`` to continue greedily (a prompt), or a sequence used as it is (``continue_it`` False)."""

    ids: list[int]
    continue_it: bool = True


@dataclass
class PromptInputs:
    """What a command was given to read text from; at most one of the four is set (None: the command's default)."""

    prompt: list[str] = field(default_factory=list)
    prompts_file: Path | None = None
    prompt_ids: list[list[int]] | None = None
    data: Path | None = None

    def given(self) -> list[str]:
        """The flags set, in their CLI spelling."""
        return [flag for flag, v in (("--prompt", self.prompt), ("--prompts_file", self.prompts_file),
                                     ("--prompt_ids", self.prompt_ids), ("--data", self.data)) if v]

    def paths(self) -> dict[str, Path]:
        """The input files, by flag (for the guards that never write into an input)."""
        return {flag: Path(p) for flag, p in (("--prompts_file", self.prompts_file), ("--data", self.data)) if p}


def parse_prompt_ids(text: str) -> list[list[int]]:
    """``"1,2,3;4,5"`` -> ``[[1, 2, 3], [4, 5]]``."""
    prompts = []
    for chunk in text.split(";"):
        try:
            prompts.append([int(x) for x in chunk.split(",") if x.strip()])
        except ValueError:
            raise PortError(f"--prompt_ids {text!r}: expected comma-separated integers (';' between prompts)",
                            fix="e.g. --prompt_ids 1,2,3;4,5,6") from None
    return prompts


def prompt_lines(text: str) -> list[str]:
    """One prompt per non-empty line; a literal backslash-n stands for a line break inside a prompt."""
    return [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]


def packaged_prompts() -> list[str]:
    """The prompts shipped with the package (varied topics, code, lists, Q&A; offline use)."""
    text = resources.files("trtllm_medusa_ports").joinpath("data/prompts.txt").read_text(encoding="utf-8")
    return prompt_lines(text)


def heldout_prompts() -> list[str]:
    """Prompts shipped for measuring heads (300), none of which is among the training prompts."""
    data = resources.files("trtllm_medusa_ports").joinpath("data")
    # 30 written by hand, then 270 of the training prompts' kinds that scripts/make_prompts.py left out
    return [p for name in ("heldout_prompts.txt", "tune_prompts.txt")
            for p in prompt_lines(data.joinpath(name).read_text(encoding="utf-8"))]


def read_prompts_file(path: str | Path) -> list[str]:
    from trtllm_medusa_ports.files.jsonfile import require_regular_file

    path = Path(path)
    require_regular_file(path, PortError, "pass a UTF-8 text file with one prompt per line")  # a FIFO would block
    try:
        lines = prompt_lines(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PortError(f"cannot read the prompts ({exc})", where=str(path),
                        fix="pass a UTF-8 text file with one prompt per line") from None
    if not lines:
        raise PortError("no prompts in the file", where=str(path), fix="write one prompt per line")
    return lines


def read_data_file(path: str | Path, tokenize: Callable[[str], list[int]]) -> list[Item]:
    """JSON lines: ``{"prompt": str}`` or ``{"prompt_ids": [int]}`` (prompts) or ``{"text": str}`` /
    ``{"input_ids": [int]}`` (sequences used as they are)."""
    from trtllm_medusa_ports.files.jsonfile import require_regular_file

    path = Path(path)
    require_regular_file(path, PortError, DATA_FIX)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PortError(f"cannot read the data ({exc})", where=str(path), fix=DATA_FIX) from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PortError(f"line {n} is not JSON ({exc.msg})", where=str(path), fix=DATA_FIX) from None
        except RecursionError:
            raise PortError(f"line {n} nests JSON deeper than can be read", where=str(path), fix=DATA_FIX) from None
        if not isinstance(obj, dict):
            raise PortError(f"line {n} is not a JSON object", where=str(path), fix=DATA_FIX)
        if isinstance(obj.get("prompt"), str):
            items.append(Item(tokenize(obj["prompt"]), True))
        elif isinstance(obj.get("text"), str):
            items.append(Item(tokenize(obj["text"]), False))
        elif _int_list(obj.get("prompt_ids")):
            items.append(Item(list(obj["prompt_ids"]), True))
        elif _int_list(obj.get("input_ids")):
            items.append(Item(list(obj["input_ids"]), False))
        else:
            raise PortError(f"line {n} has none of prompt, text, prompt_ids, input_ids", where=str(path), fix=DATA_FIX)
    if not items:
        raise PortError("no items in the data file", where=str(path), fix=DATA_FIX)
    return items


def _int_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def looks_like_json_lines(path: str | Path) -> bool:
    """Whether a file given where either form is accepted (``--calib_dataset``) holds JSON lines."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096).lstrip()[:1] == "{"
    except OSError:
        return False


def tokenizer_for(tok_dir: str | Path):
    """A transformers tokenizer, or one clear error."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(tok_dir))
    except Exception as exc:
        raise PortError(f"no usable tokenizer in {tok_dir} ({type(exc).__name__})",
                        fix="pass --tokenizer_dir, or --prompt_ids / --data with prompt_ids or input_ids") from None


def lazy_tokenizer(tok_dir: str | Path) -> Callable[[str], list[int]]:
    """``text -> ids`` through the tokenizer of ``tok_dir``, loaded at the first text only."""
    cache: list = []

    def tokenize(text: str) -> list[int]:
        if not cache:
            cache.append(tokenizer_for(tok_dir))
        return list(cache[0](text)["input_ids"])

    return tokenize


def read_items(inputs: PromptInputs, tokenize: Callable[[str], list[int]],
               default: Callable[[], list[str]] | None = None) -> list[Item] | None:
    """The items of ``inputs``: text through ``tokenize``; none given: ``default()`` 's texts as prompts, or None."""
    given = inputs.given()
    if len(given) > 1:
        raise PortError(f"{' and '.join(given)}: give one source of prompts", fix=f"keep {given[0]} alone")
    if inputs.prompt_ids is not None:
        if not inputs.prompt_ids or any(not p for p in inputs.prompt_ids):
            raise PortError("--prompt_ids holds an empty prompt", fix="e.g. --prompt_ids 1,2,3;4,5")
        return [Item(list(p)) for p in inputs.prompt_ids]
    if inputs.data is not None:
        return read_data_file(inputs.data, tokenize)
    if inputs.prompts_file is not None:
        return [Item(tokenize(t)) for t in read_prompts_file(inputs.prompts_file)]
    if inputs.prompt:
        return [Item(tokenize(t)) for t in inputs.prompt]
    return None if default is None else [Item(tokenize(t)) for t in default()]


def check_ids(seqs: list[list[int]], vocab: int, what: str = "prompt", *, error: type[PortError] = PortError,
              where: str | None = None,
              fix: str = "use the base's own tokenizer (--tokenizer_dir) or ids below the vocabulary size") -> None:
    """Every id sequence non-empty and inside the vocabulary ``0..vocab-1``, or ``error`` naming the first bad one
    (``what`` and its index) and its first bad ids. Every command that takes token ids checks them here."""
    for n, ids in enumerate(seqs):
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad or not ids:
            raise error(f"{what} {n}: token ids {bad[:3] or '(empty)'} are outside the vocabulary 0..{vocab - 1}",
                        where=where, fix=fix)
