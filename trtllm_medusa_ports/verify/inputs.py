"""What verify runs with: the default prompts, the tree (a preset pruned to the heads' depth, within the
checkpoint's max_draft_len) and the checkpoint's dtype by name.

May import: the file layer (``files/``), ``tree``, ``errors``, ``archs.semantics``, ``reference`` (types); no other verify module.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES
from trtllm_medusa_ports.files.prompts import check_ids
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree, checkpoint_tree, resolve_choices


def default_prompts(vocab: int) -> list[list[int]]:
    """Deterministic prompts that avoid the special ids at the bottom of the vocabulary."""
    return [[(7 * i + 11) % vocab for i in range(6)], [(13 * i + 101) % vocab for i in range(9)]]


def tree_for(spec: str, num_heads: int) -> tuple[MedusaTree, str | None]:
    """The tree; a preset deeper than the heads is pruned (and the note says so), any other
    tree deeper than the heads is refused, never cut."""
    paths, pruned = resolve_choices(spec, num_heads)
    return MedusaTree.from_spec(paths, num_heads=num_heads), pruned


def checkpoint_dtype(cfg: dict) -> str:
    """The checkpoint's dtype by name (float32 where config.json names none a checkpoint uses)."""
    dtype = cfg.get("dtype")
    return dtype if dtype in CHECKPOINT_DTYPES else "float32"


def check_position_table(prompts: list[list[int]], max_new_tokens: int, ref: ReferenceModel, where: str) -> None:
    """Runs verify cannot compare are refused before transformers runs them: a learned-position base's run past its
    table's end (transformers' embedding lookup would fail with an IndexError; check bounds --max_seq_len the same
    way), and a long_rope base's run past original_max_position_embeddings (:func:`_check_longrope_range`)."""
    _check_longrope_range(prompts, max_new_tokens, ref, where)
    table = ref.config.get("max_position_embeddings")
    if ref.semantics.position_embedding is not PositionEmbedding.LEARNED_ABSOLUTE or not isinstance(table, int):
        return
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > table:
        raise ModelError(f"a prompt of {longest} tokens and --max_new_tokens {max_new_tokens} reach position "
                         f"{longest + max_new_tokens - 1}, past this base's learned position table "
                         f"({table} positions)", where=where,
                         fix=f"pass --max_new_tokens {max(1, table - longest)} or less, or shorter prompts")


def _check_longrope_range(prompts: list[list[int]], max_new_tokens: int, ref: ReferenceModel, where: str) -> None:
    """long_rope (Phi-3 / Phi-3.5 128k): the engine picks its table per phase (archs/semantics.py ``LongRope``): the
    context step by the tokens it computes, every generation step by the prompt plus the engine's max draft length;
    transformers picks it at every forward pass by the sequence's length (Phi-3: long factors once past
    original_max_position_embeddings, the cached keys keeping the short ones), or keeps the short factors and
    changes only the scale (PhiMoE). The two compute the same model where every step of both stays short: a prompt
    of at most original - max_draft_len tokens, a sequence of at most original; verify runs there."""
    longrope = ref.semantics.longrope
    if longrope is None:
        return
    limit = longrope.original_max_positions
    draft = ref.engine_draft_tokens
    longest = max(len(p) for p in prompts)
    window = longrope.short_window(draft)
    if longest > window:
        if longest <= limit:
            what = (f"the engine writes its keys with the short table (the context step computes {longest} tokens, "
                    f"within original_max_position_embeddings {limit}) and runs every generation step on the long one "
                    f"(the prompt plus the checkpoint's max_draft_len: {longest} + {draft} > {limit}), while "
                    "transformers stays on the short one: the two no longer compute the same model")
        else:
            what = (f"past original_max_position_embeddings ({limit}) the engine runs on the long table, and verify "
                    "compares the engine with transformers only where both stay on the short one")
        raise ModelError(
            f"a prompt of {longest} tokens on a long_rope base: {what}", where=where,
            fix=(f"verify with prompts of at most {window} tokens (original_max_position_embeddings {limit} - "
                 f"max_draft_len {draft})" if window >= 1 else
                 f"convert with a --max_draft_len below original_max_position_embeddings ({limit})")
                + (", or a checkpoint converted with a smaller --max_draft_len" if window >= 1 else ""))
    if longest + max_new_tokens - 1 > limit:
        raise ModelError(
            f"a prompt of {longest} tokens and --max_new_tokens {max_new_tokens}: transformers' last step reads "
            f"{longest + max_new_tokens - 1} tokens, past original_max_position_embeddings ({limit}); there the engine "
            "keeps the short table its prompt chose while transformers switches its RoPE factors as the sequence "
            "grows, so the two no longer compute the same model", where=where,
            fix=f"verify with --max_new_tokens {max(1, limit + 1 - longest)} or less, or shorter prompts (the long "
                "table is the same code with the long factors)")


def prompts_and_tree(prompts: list[list[int]] | None, medusa_choices: str | None, ref: ReferenceModel, ckpt,
                     checkpoint_dir: str | Path, override_medusa_choices: bool = False
                     ) -> tuple[list[list[int]], MedusaTree, str | None, str]:
    """The prompts (inside the vocabulary), the tree (within the checkpoint's max_draft_len) to verify with, a note
    where a preset was pruned, and where the tree came from (:func:`checkpoint_tree`)."""
    prompts = prompts or default_prompts(ref.vocab)
    check_ids(prompts, ref.vocab, error=ModelError, fix="pass --prompt_ids with valid token ids")
    spec, source = checkpoint_tree(ckpt.config, medusa_choices, ref.num_medusa_heads,
                                   override=override_medusa_choices, where=str(Path(checkpoint_dir) / "config.json"))
    tree, pruned = tree_for(spec, ref.num_medusa_heads)
    draft = ckpt.config.get("max_draft_len")
    if isinstance(draft, int) and tree.num_nodes > draft:  # TensorRT-LLM sizes the tree buffers by it
        raise ModelError(f"the tree has {tree.num_nodes} nodes, the checkpoint's max_draft_len is {draft}: the engine "
                         "could not run it", where=str(Path(checkpoint_dir) / "config.json"),
                         fix=f"verify with a tree of at most {draft} nodes, or convert with --max_draft_len "
                             f"{tree.num_nodes}")
    return prompts, tree, pruned, source
