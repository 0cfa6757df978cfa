"""Reading a Hugging Face tokenizer directory: one check and one message for every command that reads one
(``--tokenizer_dir``, or ``--model_dir`` standing in for it: text prompts, train-heads' corpus, calibration text,
deploy's bundle).

A directory holds a tokenizer when it has one of the files that carry a vocabulary (:data:`VOCAB_FILES`:
transformers' fast ``tokenizer.json``, a sentencepiece model, a BPE or WordPiece vocabulary); without one, loading
it is refused by name before transformers runs (which built an empty tokenizer from a base's config.json alone,
and train-heads then said its token ids were outside the vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_medusa_ports.errors import ModelError, PortError

#: the files that carry a vocabulary (one is needed)
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
               "vocab.txt")
#: every file of a tokenizer (what a record of it hashes, quant/calibrate.py, in this order: recorded digests
#: depend on it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "merges.txt", "vocab.txt", "added_tokens.json", "special_tokens_map.json", "tokenizer_config.json")
#: the fix where token ids can stand in for text
IDS_INSTEAD = ("pass --tokenizer_dir (the Hugging Face base directory, or its tokenizer's), or token ids instead of "
               "text (--prompt_ids, or --data with prompt_ids / input_ids)")


def require_tokenizer(tok_dir: str | Path, *, fix: str = IDS_INSTEAD) -> Path:
    """``tok_dir`` where it holds a tokenizer; else the one error every command gives for it."""
    d = Path(tok_dir)
    if not d.is_dir() or not any((d / f).is_file() for f in VOCAB_FILES):
        raise ModelError("no tokenizer there (" + ("not a directory" if not d.is_dir() else
                                                   "none of " + ", ".join(VOCAB_FILES)) + ")", where=str(d), fix=fix)
    return d


def load_tokenizer(tok_dir: str | Path, *, fix: str = IDS_INSTEAD):
    """A transformers tokenizer of ``tok_dir`` (checked by :func:`require_tokenizer` first), or one clear error."""
    from transformers import AutoTokenizer

    d = require_tokenizer(tok_dir, fix=fix)
    try:
        return AutoTokenizer.from_pretrained(str(d))
    except Exception as exc:  # noqa: BLE001  (transformers raises many kinds for a broken tokenizer)
        _not_json(d / "tokenizer.json", fix)
        raise PortError(f"no usable tokenizer in {d} ({type(exc).__name__}: {str(exc).strip()[:200]})",
                        where=str(d), fix=fix) from None


def _not_json(path: Path, fix: str) -> None:
    """After a failed load: a tokenizer.json that is not JSON, refused in one wording on every transformers line
    (the Rust tokenizers library says "EOF while parsing" under transformers 4.x, transformers 5 a
    JSONDecodeError); a loaded tokenizer's file is not parsed twice."""
    if not path.is_file():
        return
    try:
        json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise PortError(f"no usable tokenizer in {path.parent} ({path.name} is not JSON: {type(exc).__name__}: "
                        f"{str(exc).strip()[:200]})", where=str(path.parent), fix=fix) from None


#: --chat_template: "auto" applies the tokenizer's chat template to prompts where it has one, "none" never
CHAT_TEMPLATE_MODES = ("auto", "none")
CHAT_APPLIED = "applied: the tokenizer's chat template (a user turn, then the generation prompt) around each prompt"
CHAT_OFF = "not applied: --chat_template none"
CHAT_NONE = "not applied: the tokenizer has no chat template"
CHAT_UNUSED = "not used: no text prompt was tokenized"


def uses_chat_template(tok, mode: str) -> bool:
    return mode == "auto" and bool(getattr(tok, "chat_template", None))


def prompt_ids(tok, text: str, chat: bool) -> list[int]:
    """A prompt's token ids: as the base is served where ``chat`` (its chat template rendered around the prompt as a
    user turn with the generation prompt, then tokenized without adding special tokens again: the template holds
    them), else the text as it is."""
    if not chat:
        return list(tok(text)["input_ids"])
    try:
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001  (a template may raise anything jinja2 or Python can; none is a crash)
        raise _template_error(tok, exc) from None
    if not isinstance(rendered, str):
        raise _template_error(tok, TypeError(f"rendered a {type(rendered).__name__}, not text"))
    return list(tok(rendered, add_special_tokens=False)["input_ids"])


def _template_source(tok) -> str:
    """Where the tokenizer's chat template was read from, in words: transformers reads ``chat_template.jinja`` of the
    tokenizer's directory first, else ``tokenizer_config.json``'s ``chat_template``."""
    d = Path(str(getattr(tok, "name_or_path", "") or "."))
    if (d / "chat_template.jinja").is_file():
        return str(d / "chat_template.jinja")
    return f"{d / 'tokenizer_config.json'}, chat_template"


def template_line(exc: BaseException) -> int | None:
    """The template's line that raised ``exc``: a syntax error's own line, else the innermost frame jinja2 runs as
    ``<template>`` (its traceback carries the template's line numbers)."""
    import traceback

    line = getattr(exc, "lineno", None)
    if isinstance(line, int) and type(exc).__name__ == "TemplateSyntaxError":
        return line
    frames = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<template>"]
    return frames[-1] if frames else None


def _template_error(tok, exc: BaseException) -> PortError:
    """The one error for a chat template that does not render a user turn: its source, line and jinja2's (or the
    template's own ``raise_exception``) message; the template never ran outside transformers' sandbox."""
    line = template_line(exc)
    source = getattr(tok, "chat_template", None)
    text = ""
    if line and isinstance(source, str) and 0 < line <= len(source.splitlines()):
        text = f": {source.splitlines()[line - 1].strip()[:120]!r}"
    at = f"line {line}{text}" if line else "no line known"
    message = " ".join(str(exc).split())[:300] or "(no message)"
    return PortError(f"the tokenizer's chat template does not render a user turn with the generation prompt "
                     f"({at}): {type(exc).__name__}: {message}", where=_template_source(tok),
                     fix="fix the template, or pass --chat_template none to feed the prompts as they are (or give "
                         "token ids: --prompt_ids, or --data with prompt_ids / input_ids)")
