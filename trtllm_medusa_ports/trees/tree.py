"""Medusa trees (``medusa_choices``): parsing, presets, validation, TensorRT-LLM buffers.

A tree is a list of paths; each path lists one top-k index per depth, and depth
``d`` (1-based) is guessed by Medusa head ``d - 1``. The root (the last accepted
token) is implicit and is node 0 of every buffer.

The buffers follow TensorRT-LLM 1.2.x ``tensorrt_llm/runtime/medusa_utils.py``
(``_medusa_setup`` / ``get_packed_mask``): paths sorted by ``(len, values)``,
node 0 = root, position offset = depth, one packed int32 mask row per token
(bit ``j % 32`` of word ``j // 32`` set when the row may attend to tree token
``j``, LSB first, two's-complement), and one retrieve row per leaf path,
padded with -1. This module computes them itself; it never imports TensorRT-LLM.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import ModelError, PortError, TreeError
from trtllm_medusa_ports.files.jsonfile import is_int, loads, require_regular_file

if TYPE_CHECKING:
    import torch

#: Default bound on top-k indices: FasterDecoding's ``TOPK = 10``
#: (medusa/model/utils.py); every published preset uses indices < 10.
DEFAULT_TOP_K = 10

Path_ = tuple[int, ...]


#: the largest @FILE tree read (a tree of thousands of nodes takes tens of kB)
MAX_CHOICES_FILE_BYTES = 1 << 20

#: problems of one kind listed by :func:`validate_choices` before "and N more" (a 1 MB file of duplicate
#: paths would otherwise be a 7 MB error)
MAX_LISTED_PROBLEMS = 10

#: the widest integer a path may hold: a top-k index is below top_k (10 in every preset); a wider one
#: (a Python literal like 0x...) would not even print (Python's int-digit limit)
_MAX_INDEX_BITS = 64


def _show(path) -> str:
    """A path as messages show it: its first indices (a path of 100k indices is not printed whole), and an
    integer too wide to print named by its width."""
    def one(v) -> str:
        if is_int(v) and v.bit_length() > _MAX_INDEX_BITS:
            return f"<a {v.bit_length()}-bit integer>"
        r = repr(v)
        return r if len(r) <= 24 else r[:21] + "..."

    items = [one(v) for v in list(path)[:12]]
    if len(path) > 12:
        items.append(f"... ({len(path)} indices)")
    return "[" + ", ".join(items) + "]"


def load_presets() -> dict[str, list[list[int]]]:
    """The FasterDecoding trees (medusa/model/medusa_choices.py), shipped as data."""
    text = resources.files("trtllm_medusa_ports").joinpath("data/medusa_presets.json").read_text()
    return json.loads(text)


def preset_names() -> list[str]:
    return sorted(load_presets())


def parse_choices(spec: str | list) -> list[list[int]]:
    """Read ``medusa_choices`` from a preset name, ``@file``, or a JSON / Python literal.

    Returns the raw list of paths (not validated beyond its shape). A flag's own text of the wrong form is an error
    of the command line (``usage``: exit 2); a tree file's, of an input (exit 1).
    """
    try:
        return _parse_choices(spec)
    except TreeError as exc:
        exc.usage = exc.where == "--medusa_choices"
        raise


def _parse_choices(spec: str | list) -> list[list[int]]:
    if isinstance(spec, list):
        raw, origin = spec, "medusa_choices"
    else:
        raw, origin = _read_choices(spec.strip())
        if origin is None:  # a preset
            return raw
    if isinstance(raw, tuple):
        raw = list(raw)
    if not isinstance(raw, list):
        raise TreeError(
            f"expected a list of paths, got {type(raw).__name__}",
            where=origin,
            fix="write the tree as a list of lists of top-k indices, e.g. [[0], [0, 0], [1]]",
        )
    return [_checked_path(i, path, origin) for i, path in enumerate(raw)]


def _read_choices(text: str) -> tuple[object, str | None]:
    """The tree a command line spells: a preset's paths (origin None), or what @FILE, JSON or a Python literal
    holds, with where it came from."""
    origin = "--medusa_choices"
    presets = load_presets()
    if text in presets:
        return [list(p) for p in presets[text]], None
    if text.startswith("@"):
        origin, text = choices_file(text)
        if text in presets:
            return [list(p) for p in presets[text]], None
    try:
        return loads(text, TreeError, where=origin, fix="a tree is a list of paths of small top-k indices: "
                     "[[0], [0, 0], [1]]"), origin  # deep nesting, an integer of 5000 digits: one TreeError
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(text), origin
        except (ValueError, SyntaxError, RecursionError, MemoryError) as exc:
            if "digits" in str(exc) and "limit" in str(exc):  # Python's int-digit limit, in a Python literal
                raise TreeError("the tree holds an integer longer than Python reads (its int-digit limit); a "
                                "top-k index is below top_k", where=origin,
                                fix="use small top-k indices, e.g. [[0], [0, 0], [1]]") from None
            raise TreeError(
                f"not a preset name, @file, JSON or Python list: {text[:80]!r}",
                where=origin,
                fix="use e.g. '[[0], [0, 0], [1]]' or a preset: " + ", ".join(sorted(presets)),
            ) from None


def choices_file(text: str) -> tuple[str, str]:
    """``@PATH``'s text (a UTF-8 byte-order mark read as one), refused by name where it is not a readable small
    UTF-8 file; ``(PATH, text)``."""
    if not text[1:].strip():
        raise TreeError("'@' names no file", where="--medusa_choices",
                        fix="pass @PATH to a readable file holding a JSON list of paths, e.g. @tree.json")
    path = Path(text[1:])
    fix = "pass @PATH to a readable file holding a JSON list of paths"
    require_regular_file(path, TreeError, fix)
    if path.stat().st_size > MAX_CHOICES_FILE_BYTES:  # never read a huge (or sparse) file whole
        raise TreeError(f"the tree file is {path.stat().st_size} bytes, more than any tree needs "
                        f"({MAX_CHOICES_FILE_BYTES})", where=str(path), fix=fix)
    try:
        return str(path), path.read_text(encoding="utf-8-sig").strip()
    except OSError as exc:
        raise TreeError(f"cannot read the tree file ({exc.strerror})", where=str(path), fix=fix) from None
    except UnicodeDecodeError:
        raise TreeError("the tree file is not UTF-8 text", where=str(path), fix=fix) from None


def _checked_path(i: int, path, origin: str) -> list[int]:
    """Path ``#i`` as a list of integers, refused by name where it is empty, not a list or holds a non-integer or
    an integer no top-k reaches."""
    if not isinstance(path, (list, tuple)) or not path:
        raise TreeError(
            f"path #{i} is {_show([path])[1:-1]}; each path must be a non-empty list of integers",
            where=origin,
            fix="remove it or write it as a list such as [0, 1]",
        )
    for v in path:
        if not is_int(v):
            raise TreeError(
                f"path {_show(path)} holds {_show([v])[1:-1]}; indices must be integers",
                where=origin,
                fix="use integer top-k indices",
            )
        if v.bit_length() > _MAX_INDEX_BITS:
            raise TreeError(
                f"path #{i} holds an integer of {v.bit_length()} bits; a top-k index is below top_k",
                where=origin,
                fix="use small top-k indices, e.g. [[0], [0, 0], [1]]",
            )
    return list(path)


def resolve_choices(spec: str | list, num_heads: int | None = None) -> tuple[list[list[int]], str | None]:
    """The tree's paths, and a note when a *preset* was pruned to the heads' depth.

    The presets were tuned for 4 or 5 heads; with fewer, their deeper paths cannot be drafted
    (depth d is guessed by head d - 1). Dropping them keeps every prefix (a pruned preset is
    still a tree). A tree the user wrote out is never cut: a path deeper than the heads is an
    error, reported by :func:`validate_choices`.
    """
    paths = parse_choices(spec)
    name = spec.strip() if isinstance(spec, str) else None
    if name is not None and name.startswith("@"):  # a file holding a preset's name is that preset (read: checked above)
        name = Path(name[1:]).read_text(encoding="utf-8-sig").strip()
    if num_heads is None or name not in load_presets():
        return paths, None
    kept = [p for p in paths if len(p) <= num_heads]
    if len(kept) == len(paths):
        return paths, None
    return kept, (f"preset {name} pruned to the depth of {num_heads} Medusa head(s): "
                  f"{len(kept)} of its {len(paths)} nodes kept")


def recorded_tree(spec: str | list, num_heads: int) -> dict:
    """What a checkpoint records of the tree it is converted for (config.json ``medusa_ports``): the paths, as
    every later step reads them, and where they came from. No route of TensorRT-LLM reads a tree from the engine
    (the C++ executor falls back to mc_sim_7b_63), so ``verify`` and ``deploy`` take it from here."""
    paths, pruned = resolve_choices(spec, num_heads)
    text = spec.strip() if isinstance(spec, str) else None
    if pruned:
        source = pruned
    elif text in load_presets():
        source = f"preset {text}"
    elif text is not None and text.startswith("@"):
        source = f"the file {Path(text[1:]).resolve()}"
    else:
        source = "the tree given"
    return {"medusa_choices": paths, "medusa_choices_from": source}


def same_tree(a: list[list[int]], b: list[list[int]]) -> bool:
    """The same set of paths, whatever their order."""
    return sorted(map(tuple, a)) == sorted(map(tuple, b))


def checkpoint_tree(cfg: dict, medusa_choices: str | None, num_heads: int, *, override: bool,
                    where: str) -> tuple[str | list, str]:
    """The tree a step after conversion runs, and where it came from: the one config.json records (``convert
    --medusa_choices``) unless another is given, which must be the same tree unless ``override`` (a checkpoint
    converted for one tree and proven or served with another would measure a tree it never serves); with none
    recorded, the one given, else mc_sim_7b_63 (what TensorRT-LLM's C++ executor falls back to)."""
    record = (cfg.get("medusa_ports") or {})
    recorded = record.get("medusa_choices")
    if recorded is not None:
        try:  # a list written by convert; checked as any tree is, and said to be the recorded one
            recorded, _ = resolve_choices(recorded, num_heads)
            MedusaTree.from_spec(recorded, num_heads=num_heads)
        except PortError as exc:
            raise ModelError(f"the tree config.json records (medusa_ports.medusa_choices) is not one this checkpoint "
                             f"can run: {exc.what}", where=where,
                             fix="pass the tree to run with --medusa_choices and --override_medusa_choices, or "
                                 "convert again") from None
    if medusa_choices is None:
        if override:
            raise ModelError("--override_medusa_choices runs a --medusa_choices other than the recorded tree, and no "
                             "--medusa_choices was given", where=where,
                             fix="pass the tree to run with --medusa_choices, or leave --override_medusa_choices out "
                                 "to run the recorded one")
        if recorded is not None:
            return recorded, f"recorded at conversion ({record.get('medusa_choices_from') or 'a tree'})"
        return "mc_sim_7b_63", "mc_sim_7b_63: the checkpoint records no tree (convert with --medusa_choices)"
    if recorded is not None and not override:
        given, _ = resolve_choices(medusa_choices, num_heads)
        if not same_tree(given, recorded):
            raise ModelError(f"--medusa_choices ({len(given)} nodes) is not the tree this checkpoint was converted "
                             f"for ({len(recorded)} nodes, {record.get('medusa_choices_from') or 'recorded'})",
                             where=where, fix="leave --medusa_choices out to use the recorded tree, or pass "
                                              "--override_medusa_choices to run another tree on purpose")
    if recorded is None:
        return medusa_choices, "given"
    given, _ = resolve_choices(medusa_choices, num_heads)
    return medusa_choices, ("given (the tree recorded at conversion)" if same_tree(given, recorded) else
                            "given (another than the one recorded at conversion)")


def validate_choices(
    paths: list[list[int]],
    *,
    top_k: int = DEFAULT_TOP_K,
    num_heads: int | None = None,
    max_draft_len: int | None = None,
) -> list[str]:
    """Every problem of the tree, one message each naming the offending path; of each kind, the first
    :data:`MAX_LISTED_PROBLEMS` and a count of the rest."""
    if not is_int(top_k, 1):
        return [f"top_k {_show([top_k])[1:-1]} must be a positive integer"]
    if not paths:
        return ["the tree is empty; give at least one path such as [0]"]
    seen: set[Path_] = set()
    duplicates: list[str] = []
    for p in paths:
        t = tuple(p)
        if t in seen:
            duplicates.append(f"path {_show(p)} appears more than once")
        seen.add(t)
    ranges: list[str] = []
    for p in paths:
        bad = [v for v in p if v < 0 or v >= top_k]
        if bad:
            ranges.append(
                f"path {_show(p)} uses index {_show([bad[0]])[1:-1]}, outside the top-{top_k} range 0..{top_k - 1}"
            )
    orphans: list[str] = []
    for p in paths:
        for d in range(1, len(p)):
            if tuple(p[:d]) not in seen:
                orphans.append(f"path {_show(p)} has no parent: its prefix {_show(p[:d])} is not in the tree")
                break
    deep: list[str] = []
    if num_heads is not None:
        for p in paths:
            if len(p) > num_heads:
                deep.append(
                    f"path {_show(p)} has depth {len(p)} but there are only {num_heads} Medusa heads "
                    f"(depth d is guessed by head d-1)"
                )
    problems: list[str] = []
    for kind, found in (("paths appear more than once", duplicates), ("paths use an index outside the range", ranges),
                        ("paths have no parent", orphans), ("paths are deeper than the heads", deep)):
        problems += found[:MAX_LISTED_PROBLEMS]
        if len(found) > MAX_LISTED_PROBLEMS:
            problems.append(f"and {len(found) - MAX_LISTED_PROBLEMS} more {kind} (of {len(found)})")
    if max_draft_len is not None and len(seen) > max_draft_len:
        problems.append(
            f"the tree has {len(seen)} nodes but max_draft_len is {max_draft_len}; "
            "raise --max_draft_len (--max_medusa_token_len) or prune the tree"
        )
    return problems


def _fix_for(problems: list[str]) -> str:
    """The fix of the first problem (messages come from :func:`validate_choices`)."""
    first = problems[0]
    if "Medusa heads" in first:
        return ("drop the paths deeper than the heads; a preset is pruned for you when you pass the head count "
                "(--num_medusa_heads N)")
    if "max_draft_len" in first:
        return "raise --max_draft_len, or use a smaller tree"
    if "has no parent" in first:
        return "every prefix of a path must itself be a path: add the missing prefix"
    if "outside the top-" in first:
        return "use indices below top_k (--top_k)"
    if "appears more than once" in first:
        return "list each path once (remove the repeated paths)"
    return "see `trtllm-medusa tree --help`"


def upstream_quirks(paths: list[list[int]]) -> list[str]:
    """Trees that are valid but that TensorRT-LLM 1.2.x's runtime misreads (warnings)."""
    first = sorted({p[0] for p in paths})
    if first and first != list(range(len(first))):
        return [
            f"depth-1 indices {first} have gaps: TensorRT-LLM's C++ runtime handles them "
            "(cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp), but the Python session "
            "(run.py --use_py_session; tensorrt_llm/runtime/medusa_utils.py get_medusa_tree) numbers "
            "depth-1 nodes 0..k-1 and builds inconsistent tree buffers"
        ]
    return []


@dataclass(frozen=True)
class MedusaTree:
    """A validated tree and the buffers TensorRT-LLM's runtime derives from it."""

    paths: tuple[Path_, ...]
    top_k: int = DEFAULT_TOP_K
    _index: dict[Path_, int] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_spec(
        cls,
        spec: str | list,
        *,
        top_k: int = DEFAULT_TOP_K,
        num_heads: int | None = None,
        max_draft_len: int | None = None,
    ) -> MedusaTree:
        raw = parse_choices(spec)
        problems = validate_choices(raw, top_k=top_k, num_heads=num_heads, max_draft_len=max_draft_len)
        if problems:
            raise TreeError("invalid medusa_choices:\n  - " + "\n  - ".join(problems), fix=_fix_for(problems))
        ordered = tuple(sorted((tuple(p) for p in raw), key=lambda p: (len(p), p)))
        index = {p: i + 1 for i, p in enumerate(ordered)}
        return cls(paths=ordered, top_k=top_k, _index=index)

    # -- shape -----------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Tree nodes, root excluded (the draft length this tree needs)."""
        return len(self.paths)

    @property
    def num_tokens(self) -> int:
        """Tokens of one generation step: root + nodes."""
        return len(self.paths) + 1

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    # -- buffers ---------------------------------------------------------------
    @cached_property
    def position_offsets(self) -> list[int]:
        """Depth of each token, root first (``spec_decoding_position_offsets`` of one request)."""
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def parents(self) -> list[int]:
        """Parent token of each token (root: -1)."""
        return [-1] + [0 if len(p) == 1 else self._index[p[:-1]] for p in self.paths]

    @cached_property
    def attention_mask(self) -> torch.Tensor:
        """Bool ``[T, T]``: row i may attend to tree token j (itself, ancestors, root)."""
        import torch

        n = self.num_tokens
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = self.parents[j]
        return mask

    @cached_property
    def packed_mask(self) -> list[list[int]]:
        """``spec_decoding_packed_mask`` rows for one request: int32 words, LSB first."""
        return pack_mask(self.attention_mask)

    @cached_property
    def medusa_topks(self) -> list[int]:
        """Candidates taken from each depth's head: ``max index + 1`` (``medusa_topks``)."""
        return [max((p[d] + 1 for p in self.paths if len(p) > d), default=0) for d in range(self.depth)]

    @cached_property
    def candidate_indices(self) -> list[int]:
        """Index of each token into ``[root] + topk(head_0, k_0) + topk(head_1, k_1) + ...``.

        TensorRT-LLM's ``medusa_tree_ids``: ``cum_topks[depth-1] + index + 1`` with
        ``k_d = medusa_topks[d]``. Upstream numbers depth-1 nodes by their position
        in the level rather than their index, which is only the same when depth-1
        indices are 0..k-1 without gaps; :func:`validate_choices` warns otherwise.
        """
        cum = [0]
        for k in self.medusa_topks:
            cum.append(cum[-1] + k)
        return [0] + [cum[len(p) - 1] + p[-1] + 1 for p in self.paths]

    def retrieve_paths(self, width: int | None = None) -> list[list[int]]:
        """One row per leaf (TensorRT-LLM's ``medusa_paths``): root 0, then node indices, -1 pads.

        Leaves are in lexicographic order of their paths; rows have ``width``
        entries (upstream uses ``num_medusa_heads + 1``; default ``depth + 1``).
        """
        width = self.depth + 1 if width is None else width
        if width < self.depth + 1:
            raise ValueError(f"width {width} < depth + 1 = {self.depth + 1}")
        parents = {p[:-1] for p in self.paths}
        leaves = sorted(p for p in self.paths if p not in parents)
        rows = []
        for leaf in leaves:
            row = [0] + [self._index[leaf[:d]] for d in range(1, len(leaf) + 1)]
            rows.append(row + [-1] * (width - len(row)))
        return rows

    def packed_mask_words(self, max_draft_len: int | None = None) -> list[list[int]]:
        """Packed mask padded to ``ceil((max_draft_len + 1) / 32)`` words per row (engine input width)."""
        import torch

        total = self.num_tokens if max_draft_len is None else max_draft_len + 1
        padded = torch.zeros(self.num_tokens, total, dtype=torch.bool)
        padded[:, : self.num_tokens] = self.attention_mask
        return pack_mask(padded)

    def to_dict(self) -> dict:
        return {
            "num_nodes": self.num_nodes,
            "depth": self.depth,
            "top_k": self.top_k,
            "paths": [list(p) for p in self.paths],
            "parents": self.parents,
            "position_offsets": self.position_offsets,
            "packed_mask": self.packed_mask,
            "paths_indices": self.retrieve_paths(),
            "medusa_topks": self.medusa_topks,
            "candidate_indices": self.candidate_indices,
        }


def pack_mask(mask: torch.Tensor) -> list[list[int]]:
    """Pack a bool ``[T, T]`` mask into int32 words per row (bit j%32 of word j//32)."""
    rows, cols = mask.shape
    words = (cols + 31) // 32
    out: list[list[int]] = []
    for i in range(rows):
        row = []
        for w in range(words):
            value = 0
            for b in range(32):
                j = w * 32 + b
                if j < cols and bool(mask[i, j]):
                    value |= 1 << b
            if value >= 1 << 31:  # two's complement, as the int32 tensor holds it
                value -= 1 << 32
            row.append(value)
        out.append(row)
    return out


def unpack_mask(packed: torch.Tensor | list[list[int]], num_tokens: int) -> torch.Tensor:
    """Inverse of :func:`pack_mask`: int32 words ``[T, W]`` -> bool ``[T, num_tokens]``."""
    import torch

    words = torch.as_tensor(packed, dtype=torch.int64) & 0xFFFFFFFF
    bits = torch.arange(32, dtype=torch.int64)
    expanded = ((words.unsqueeze(-1) >> bits) & 1).bool()  # [T, W, 32]
    return expanded.reshape(words.shape[0], -1)[:, :num_tokens]
