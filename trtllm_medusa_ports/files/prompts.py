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
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.jsonfile import is_int

DATA_FIX = 'one JSON object per line: {"prompt": "..."}, {"text": "..."}, {"prompt_ids": [..]} or {"input_ids": [..]}'
PROMPTS_FIX = "pass a UTF-8 text file with one prompt per line"

#: The largest prompts / data / calibration file read (read line by line, as far as needed). Every item is used: train-heads keeps
#: the base's hidden state of every token (kilobytes each), calibration takes 512 samples by default, so a
#: real input is megabytes; 1 GiB of text (~250M tokens) would need terabytes of corpus. A larger file
#: (a model file or disk image passed by mistake) is refused by its size before it is read.
MAX_TEXT_FILE_BYTES = 1 << 30

#: files :func:`looks_like_json_lines` took for JSON lines, so that their errors say why (see read_data_file)
_SNIFFED: set[Path] = set()


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


def verify_prompts() -> list[str]:
    """Prompts shipped for verify to measure a tuned tree on (16): of the kinds of tune-tree's (:func:`heldout_prompts`)
    and in neither file, so what verify measures on them is what tune-tree's prediction is judged against."""
    text = resources.files("trtllm_medusa_ports").joinpath("data/verify_prompts.txt").read_text(encoding="utf-8")
    return prompt_lines(text)


def _not_utf8(data: bytes, exc: UnicodeDecodeError, line: int, path: Path, what: str, fix: str) -> PortError:
    """The error for ``data`` (line ``line`` of the file) that is not UTF-8: the line and the column of the bad byte."""
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    line += data.count(b"\n", 0, exc.start)
    return PortError(f"cannot read {what}: it is not UTF-8 text (line {line}, byte {column} is "
                      f"0x{data[exc.start]:02x}: {exc.reason})", where=str(path),
                      fix=f"{fix} (convert it, e.g. iconv -f LATIN1 -t UTF-8 FILE > NEW)")


def _physical_lines(path: Path, what: str, fix: str, max_line_bytes: int | None) -> Iterator[tuple[bytes, bool]]:
    """Each ``\\n``-ended line of the file as bytes, read as it is needed (a reader that stops early reads no
    further), and whether it was cut at ``max_line_bytes`` (its rest is skipped, never held). A file over
    :data:`MAX_TEXT_FILE_BYTES` is refused unread, as is one that grows past it while it is read."""
    from trtllm_medusa_ports.files.jsonfile import require_regular_file, size_text

    def too_big(size: int) -> PortError:
        return PortError(f"{what} is {size_text(size)}, more than the {size_text(MAX_TEXT_FILE_BYTES)} any real one "
                         "takes; it was not read", where=str(path), fix=fix)

    require_regular_file(path, PortError, fix)  # a FIFO would block
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_TEXT_FILE_BYTES:  # never read a huge (or sparse) file
                raise too_big(size)
            seen, cap = 0, max_line_bytes or MAX_TEXT_FILE_BYTES + 1
            while line := f.readline(cap):
                seen += len(line)
                cut = len(line) == cap and not line.endswith(b"\n")
                while cut and (rest := f.readline(1 << 20)):  # the rest of a cut line: skipped a MiB at a time
                    seen += len(rest)
                    if rest.endswith(b"\n"):
                        break
                if seen > MAX_TEXT_FILE_BYTES:
                    raise too_big(seen)
                yield line, cut
    except OSError as exc:
        raise PortError(f"cannot read ({exc.strerror})", where=str(path), fix=fix) from None


def text_lines(path: str | Path, what: str, fix: str, *, max_line_bytes: int | None = None
               ) -> Iterator[tuple[int, str, bool]]:
    """``(number, text, cut)`` of each line of a UTF-8 text file, the lines ``str.splitlines`` gives, read as
    they are asked for. ``max_line_bytes``: a longer line is cut there (``cut`` True; a multi-byte character
    the cut splits is left out), and its rest is never read into memory. A byte that is not UTF-8 is an error
    naming its line and column."""
    path = Path(path)
    number = 0
    for physical, (data, cut) in enumerate(_physical_lines(path, what, fix, max_line_bytes), 1):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if not (cut and exc.reason == "unexpected end of data"):
                raise _not_utf8(data, exc, physical, path, what, fix) from None
            text = data[: exc.start].decode("utf-8")  # the cut split the last character
        parts = text.splitlines()
        for i, part in enumerate(parts):
            number += 1
            yield number, part, cut and i == len(parts) - 1


def not_utf8(text: str, *, from_os: bool = False) -> str | None:
    """Why ``text`` cannot be encoded as UTF-8 (None: it can). ``from_os``: the text came from argv, which Python
    decodes with ``surrogateescape``, so U+DC80..U+DCFF stands for a byte that was not UTF-8; otherwise any
    surrogate is a lone one (a JSON ``\\udXXX`` escape of half a pair)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        if from_os and 0xDC80 <= code <= 0xDCFF:
            return f"byte 0x{code - 0xDC00:02x} at character {exc.start + 1} is not UTF-8"
        return f"character {exc.start + 1} is a lone surrogate (U+{code:04X}), which UTF-8 cannot hold"
    return None


def check_text(text: str, subject: str, *, where: str | None = None, fix: str, from_os: bool = False) -> str:
    """``text``, or a :class:`PortError` naming ``subject`` when it is not valid UTF-8 (a tokenizer raises
    ``TypeError`` on such a string)."""
    why = not_utf8(text, from_os=from_os)
    if why:
        raise PortError(f"{subject} is not valid UTF-8 text ({why})", where=where, fix=fix)
    return text


ARGV_TEXT_FIX = ("pass the prompt as UTF-8 text (convert it, e.g. with iconv -t UTF-8), put it in a UTF-8 "
                 "--prompts_file, or give its token ids with --prompt_ids")


def read_prompts_file(path: str | Path) -> list[str]:
    path = Path(path)
    lines = [text for _, text, _ in prompt_file_lines(path)]
    if not lines:
        raise PortError("no prompts in the file", where=str(path), fix="write one prompt per line")
    return lines


def prompt_file_lines(path: str | Path, *, max_line_bytes: int | None = None) -> Iterator[tuple[int, str, bool]]:
    """``(line number, prompt, cut)`` of each non-blank line of a prompts file, read as asked for (a literal
    backslash-n is a line break; ``max_line_bytes`` as in :func:`text_lines`)."""
    for n, line, cut in text_lines(path, "the prompts file", PROMPTS_FIX, max_line_bytes=max_line_bytes):
        if line.strip():
            yield n, line.replace("\\n", "\n"), cut


def read_data_file(path: str | Path, tokenize: Callable[[str], list[int]]) -> list[Item]:
    """JSON lines: ``{"prompt": str}`` or ``{"prompt_ids": [int]}`` (prompts) or ``{"text": str}`` /
    ``{"input_ids": [int]}`` (sequences used as they are)."""
    path = Path(path)
    sniffed = _take_sniffed(path)
    items = [item for _, item in data_file_items(path, tokenize, sniffed=sniffed)]
    if not items:
        raise PortError("no items in the data file", where=str(path), fix=_data_fix(sniffed))
    return items


def _data_fix(sniffed: bool) -> str:
    # taken for JSON lines by its first character (--calib_dataset): a text file's error says so, and how to pass it
    return (DATA_FIX + "; it was read as JSON lines because its first line starts with '{': if it is text (one "
            "sample per line), make the first line one that does not start with '{', or write each line as "
            '{"text": "..."}') if sniffed else DATA_FIX


def data_file_items(path: str | Path, tokenize: Callable[[str], list[int]], *, max_line_bytes: int | None = None,
                    sniffed: bool | None = None) -> Iterator[tuple[int, Item]]:
    """``(line number, item)`` of each non-blank line of a JSON-lines data file, read as asked for (a reader that
    stops early reads no further). ``max_line_bytes``: a longer line is refused, naming it. ``sniffed``: whether
    :func:`looks_like_json_lines` took the file for JSON lines (None: ask it), so that errors say why."""
    from trtllm_medusa_ports.files.jsonfile import size_text

    path = Path(path)
    sniffed = _take_sniffed(path) if sniffed is None else sniffed
    fix = _data_fix(sniffed)
    why = " (read as JSON lines: its first line starts with '{')" if sniffed else ""
    for n, line, cut in text_lines(path, "the data file", fix, max_line_bytes=max_line_bytes):
        if cut:
            raise PortError(f"line {n} is longer than {size_text(max_line_bytes or 0)}, more than any sample "
                            "needs; it was not read whole", where=str(path), fix=fix)
        if line.strip():
            yield n, _data_item(line, n, path, tokenize, fix, why)


def _data_item(line: str, n: int, path: Path, tokenize: Callable[[str], list[int]], fix: str, why: str) -> Item:
    """Line ``n`` of a data file as its item (text through ``tokenize``), or the error naming the line."""
    from trtllm_medusa_ports.files.jsonfile import loads

    try:
        obj = loads(line, PortError, where=str(path), fix=fix, at=f"line {n}{why}")
    except json.JSONDecodeError as exc:
        raise PortError(f"line {n} is not JSON ({exc.msg}){why}", where=str(path), fix=fix) from None
    if not isinstance(obj, dict):
        raise PortError(f"line {n} is not a JSON object{why}", where=str(path), fix=fix)
    for key in ("prompt", "text"):
        if isinstance(obj.get(key), str):
            check_text(obj[key], f"line {n}: field {key}", where=str(path),
                       fix="write the text as UTF-8 (an escape \\uD800..\\uDFFF is valid only as half of a surrogate pair)")
    if isinstance(obj.get("prompt"), str):
        return Item(_prompt_tokenizer(tokenize)(obj["prompt"]), True)
    if isinstance(obj.get("text"), str):
        return Item(tokenize(obj["text"]), False)
    if _int_list(obj.get("prompt_ids")):
        return Item(list(obj["prompt_ids"]), True)
    if _int_list(obj.get("input_ids")):
        return Item(list(obj["input_ids"]), False)
    for key, kind in (("prompt", "a string"), ("text", "a string"), ("prompt_ids", "a non-empty list of integer "
                      "token ids"), ("input_ids", "a non-empty list of integer token ids")):
        if key in obj:  # there, of the wrong kind: said as such, not as missing
            raise PortError(f"line {n}: {key} is {_shown(obj[key])}, not {kind}{why}", where=str(path), fix=fix)
    raise PortError(f"line {n} has none of prompt, text, prompt_ids, input_ids{why}", where=str(path), fix=fix)


def _shown(value) -> str:
    """A JSON value as the user wrote it, cut to a readable length."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_list(v) -> bool:
    return isinstance(v, list) and bool(v) and all(map(is_int, v))


def looks_like_json_lines(path: str | Path) -> bool:
    """Whether a file given where either form is accepted (``--calib_dataset``) holds JSON lines: its first
    non-blank character is ``{``. A file so taken is remembered, so that an error reading it as JSON lines says
    why it was read so, and how to give it as text."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            found = f.read(4096).lstrip()[:1] == "{"
    except OSError:
        return False
    if found:
        _SNIFFED.add(_key(path))
    return found


def _key(path: str | Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return Path(path)


def _take_sniffed(path: Path) -> bool:
    """Whether :func:`looks_like_json_lines` took ``path`` for JSON lines (once: a later ``--data`` of the same file
    was given as JSON lines by its flag)."""
    key = _key(path)
    if key in _SNIFFED:
        _SNIFFED.discard(key)
        return True
    return False


def tokenizer_for(tok_dir: str | Path):
    """A transformers tokenizer, or one clear error (files/tokenizer.py, the same for every command)."""
    from trtllm_medusa_ports.files.tokenizer import load_tokenizer

    return load_tokenizer(tok_dir)


class LazyTokenizer:
    """``text -> ids`` through the tokenizer of ``tok_dir``, loaded at the first text only; ``prompt(text)``: a prompt's
    ids, through the tokenizer's chat template where ``chat_template`` is ``auto`` and it has one
    (files/tokenizer.py); ``chat``: what was done, in words (:data:`~trtllm_medusa_ports.files.tokenizer.CHAT_UNUSED`
    until a prompt is tokenized)."""

    def __init__(self, tok_dir: str | Path, chat_template: str = "none"):
        from trtllm_medusa_ports.files.tokenizer import CHAT_UNUSED

        self.tok_dir, self.mode, self._tok = tok_dir, chat_template, None
        self.chat = CHAT_UNUSED

    def _loaded(self):
        if self._tok is None:
            self._tok = tokenizer_for(self.tok_dir)
        return self._tok

    def __call__(self, text: str) -> list[int]:
        return list(self._loaded()(text)["input_ids"])

    def prompt(self, text: str) -> list[int]:
        from trtllm_medusa_ports.files.tokenizer import (
            CHAT_APPLIED,
            CHAT_NONE,
            CHAT_OFF,
            prompt_ids,
            uses_chat_template,
        )

        tok = self._loaded()
        chat = uses_chat_template(tok, self.mode)
        self.chat = CHAT_APPLIED if chat else CHAT_OFF if self.mode == "none" else CHAT_NONE
        return prompt_ids(tok, text, chat)


def lazy_tokenizer(tok_dir: str | Path, chat_template: str = "none") -> LazyTokenizer:
    """``text -> ids`` through the tokenizer of ``tok_dir``, loaded at the first text only (:class:`LazyTokenizer`)."""
    return LazyTokenizer(tok_dir, chat_template)


def _prompt_tokenizer(tokenize: Callable[[str], list[int]]) -> Callable[[str], list[int]]:
    """How a prompt is tokenized: a :class:`LazyTokenizer`'s ``prompt`` (the chat template where asked), else as text."""
    return getattr(tokenize, "prompt", tokenize)


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
    prompt = _prompt_tokenizer(tokenize)
    if inputs.prompts_file is not None:
        return [Item(prompt(t)) for t in read_prompts_file(inputs.prompts_file)]
    if inputs.prompt:
        n = len(inputs.prompt)
        for i, t in enumerate(inputs.prompt):  # argv is decoded with surrogateescape: bytes not UTF-8 stay in it
            check_text(t, "--prompt" if n == 1 else f"--prompt {i + 1} (of {n})", fix=ARGV_TEXT_FIX, from_os=True)
        return [Item(prompt(t)) for t in inputs.prompt]
    return None if default is None else [Item(prompt(t)) for t in default()]


def items_source(inputs: PromptInputs) -> tuple[str, str | None]:
    """How an error names :func:`read_items`' item ``n`` (counted from 0 over the non-blank lines of a file): the
    label before the index, and the file it came from."""
    if inputs.data is not None:
        return "--data item", str(inputs.data)
    if inputs.prompts_file is not None:
        return "--prompts_file prompt", str(inputs.prompts_file)
    if inputs.prompt_ids is not None:
        return "--prompt_ids prompt", None
    return ("--prompt", None) if inputs.prompt else ("packaged prompt", None)


def check_ids(seqs: list[list[int]], vocab: int, what: str = "prompt", *, error: type[PortError] = PortError,
              where: str | None = None,
              fix: str = "use the base's own tokenizer (--tokenizer_dir) or ids below the vocabulary size") -> None:
    """Every id sequence non-empty and inside the vocabulary ``0..vocab-1``, or ``error`` naming the first bad one
    (``what`` and its index) and its first bad ids. Every command that takes token ids checks them here."""
    for n, ids in enumerate(seqs):
        if not ids:  # an empty text, or a chat template that rendered nothing: no token to start from
            raise error(f"{what} {n} is empty: no token ids (an empty text, or one its tokenizer or chat template "
                        "turned into nothing)", where=where,
                        fix="give a non-empty prompt (check the chat template's output), or token ids")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise error(f"{what} {n}: token ids {bad[:3]} are outside the vocabulary 0..{vocab - 1}",
                        where=where, fix=fix)
