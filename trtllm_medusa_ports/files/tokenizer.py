"""Reading a Hugging Face tokenizer directory: one check and one message for every command that reads one
(``--tokenizer_dir``, or ``--model_dir`` standing in for it: text prompts, train-heads' corpus, calibration text,
deploy's bundle).

A directory holds a tokenizer when it has one of the files that carry a vocabulary (:data:`VOCAB_FILES`:
transformers' fast ``tokenizer.json``, a sentencepiece model, a BPE or WordPiece vocabulary); without one, loading
it is refused by name before transformers runs (which built an empty tokenizer from a base's config.json alone,
and train-heads then said its token ids were outside the vocabulary).
"""

from __future__ import annotations

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
        raise PortError(f"no usable tokenizer in {d} ({type(exc).__name__}: {str(exc).strip()[:200]})",
                        where=str(d), fix=fix) from None


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
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
    return list(tok(rendered, add_special_tokens=False)["input_ids"])
