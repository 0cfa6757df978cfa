"""The prompts an options dataclass names (``PromptInputs``), as token ids.

May import: files.prompts; never api or cli.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_medusa_ports.files.prompts import PromptInputs


def token_ids(prompts: PromptInputs, model_dir: Path, tokenizer_dir: Path | None) -> list[list[int]] | None:
    """Token ids of the given prompts (text through the tokenizer), or None when none were given."""
    return prompt_token_ids(prompts, model_dir, tokenizer_dir)[0]


def prompt_token_ids(prompts: PromptInputs, model_dir: Path, tokenizer_dir: Path | None,
                     chat_template: str = "none") -> tuple[list[list[int]] | None, str]:
    """:func:`token_ids`, text prompts through the chat template where ``chat_template`` is ``auto`` and the tokenizer
    has one; and what was done with it (files/tokenizer.py CHAT_*)."""
    from trtllm_medusa_ports.files.prompts import lazy_tokenizer, read_items

    tokenize = lazy_tokenizer(tokenizer_dir or model_dir, chat_template)
    items = read_items(prompts, tokenize)
    return (None if items is None else [it.ids for it in items]), tokenize.chat
