"""Tree rules (``--medusa_choices``): a tree that cannot be parsed, is deeper than the heads, has more nodes
than max_draft_len, was pruned, or has depth-1 gaps upstream's Python session mishandles.

May import: ``tree``, ``findings``, ``errors``.
"""

from __future__ import annotations

import dataclasses

from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.findings import ERROR, WARNING, Finding
from trtllm_medusa_ports.trees.tree import (
    DEFAULT_TOP_K,
    resolve_choices,
    upstream_quirks,
    validate_choices,
)


def check_tree(spec: str, num_heads: int | None, max_draft_len: int | None) -> list[Finding]:
    """The tree's findings; a tree read from a file (``@FILE``) is named in each of them."""
    try:
        paths, pruned = resolve_choices(spec, num_heads)
    except PortError as exc:
        where = f"{exc.where}: " if exc.where and exc.where != "--medusa_choices" else ""
        return [Finding("tree-invalid", ERROR, where + exc.what, exc.fix or "")]
    out = _tree_findings(spec, paths, pruned, num_heads, max_draft_len)
    if isinstance(spec, str) and spec.strip().startswith("@"):
        source = spec.strip()[1:]
        out = [dataclasses.replace(f, message=f"{source}: {f.message}") for f in out]
    return out


def _tree_findings(spec, paths: list[list[int]], pruned: str | None, num_heads: int | None,
                   max_draft_len: int | None) -> list[Finding]:
    out: list[Finding] = []
    if pruned:
        out.append(Finding("tree-pruned", WARNING, pruned,
                           # examples/run.py parses --medusa_choices with ast.literal_eval: a literal list only
                           "give TensorRT-LLM's run.py the pruned tree as a literal list: --medusa_choices "
                           f"\"$(trtllm-medusa tree --choices {spec} --num_medusa_heads {num_heads} --json "
                           "| jq -c .paths)\" (run.py reads it with ast.literal_eval; a preset name fails there)"))
    for problem in validate_choices(paths, top_k=DEFAULT_TOP_K):
        out.append(Finding("tree-invalid" if "index" not in problem else "tree-index-range", ERROR, problem,
                           "fix the tree: every prefix must be a node, indices 0..9"))
    if num_heads is not None:
        deep = [p for p in paths if len(p) > num_heads]
        if deep:
            out.append(
                Finding(
                    "tree-deeper-than-heads",
                    ERROR,
                    f"path {deep[0]} has depth {len(deep[0])} but there are {num_heads} Medusa heads",
                    "drop the paths deeper than the heads (presets are pruned for you), or use more heads",
                )
            )
    unique = {tuple(p) for p in paths}
    if max_draft_len is not None and len(unique) > max_draft_len:
        out.append(
            Finding(
                "tree-too-many-nodes",
                ERROR,
                f"the tree has {len(unique)} nodes but max_draft_len is {max_draft_len}",
                f"convert with --max_medusa_token_len {len(unique)} or more, or prune the tree",
            )
        )
    for q in upstream_quirks(paths):
        out.append(Finding("tree-depth1-gaps", WARNING, q,
                           "serve with the default C++ runtime, or renumber the depth-1 indices 0..k-1"))
    return out
