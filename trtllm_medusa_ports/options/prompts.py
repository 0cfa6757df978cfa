"""The prompts an options dataclass names (``PromptInputs``), as token ids.

May import: files.prompts; never api or cli.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_medusa_ports.files.prompts import PromptInputs


def token_ids(prompts: PromptInputs, model_dir: Path, tokenizer_dir: Path | None) -> list[list[int]] | None:
    """Token ids of the given prompts (text through the tokenizer), or None when none were given."""
    from trtllm_medusa_ports.files.prompts import lazy_tokenizer, read_items

    items = read_items(prompts, lazy_tokenizer(tokenizer_dir or model_dir))
    return None if items is None else [it.ids for it in items]
