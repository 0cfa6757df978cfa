"""The family tables of the README and the porting guide, rendered from the adapters.

Each registered adapter class declares its own row (``display_note``, ``position_summary``,
``medusa_status``); the guide's table lists each module of ``archs/`` with the architectures it
registers and the first line of its docstring. The documents hold the rendered tables between
``<!-- families:begin -->`` and ``<!-- families:end -->`` markers, and lists of families inline
between ``<!-- families:NAME -->`` and ``<!-- /families -->`` (:data:`LISTS`: the engine classes
without pipeline parallelism, without spec-decoding plumbing, ...), so that no document holds a
family list written by hand; ``tests/test_families.py`` fails when they differ, and
``python -m trtllm_medusa_ports.families --write`` rewrites them.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import sys
from pathlib import Path

from trtllm_medusa_ports.archs import pitfalls, registry
from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import Eagle3Support
from trtllm_medusa_ports.archs.semantics import PositionEmbedding
from trtllm_medusa_ports.findings import OVERRIDABLE

BEGIN, END = "<!-- families:begin -->", "<!-- families:end -->"
ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = {"README.md": "readme", "docs/porting-guide.md": "guide"}
#: documents holding inline lists (``<!-- families:NAME -->...<!-- /families -->``, see :data:`LISTS`)
LIST_DOCUMENTS = ("README.md", "docs/porting-guide.md", "docs/engine.md", "docs/compatibility-rules.md")
_INLINE = re.compile(r"(<!-- families:([a-z-]+) -->)(.*?)(<!-- /families -->)", re.S)


@functools.cache
def _source_line(cls: type) -> int:
    return inspect.getsourcelines(cls)[1]  # reads and parses the module: once per class


def adapter_classes() -> list[type[ArchAdapter]]:
    """Each registered class once: servable families first, then ALiBi ones, by module and definition order."""
    classes = list(dict.fromkeys(registry().values()))

    def key(cls: type[ArchAdapter]) -> tuple:
        module = sys.modules[cls.__module__]
        line = _source_line(cls)
        return (cls.position_embedding is PositionEmbedding.ALIBI, module.__name__ != "trtllm_medusa_ports.archs.llama",
                module.__name__, line)

    return sorted(classes, key=key)


def _row_problems(cls: type[ArchAdapter]) -> list[str]:
    return [f"{cls.__name__} declares no {name} of its own (it would inherit its parent's row)"
            for name in ("display_note", "position_summary", "medusa_status") if name not in cls.__dict__]


def readme_table() -> str:
    lines = ["| HF architecture | position embedding | TensorRT-LLM base class | Medusa status |", "|---|---|---|---|"]
    for cls in adapter_classes():
        problems = _row_problems(cls)
        if problems:
            raise AssertionError("; ".join(problems))
        names = ", ".join(f"`{a}`" for a in cls.hf_architectures)
        note = f" ({cls.display_note})" if cls.display_note else ""
        lines.append(f"| {names}{note} | {cls.position_summary} | `{cls.trtllm_base_class}` | {cls.medusa_status} |")
    return "\n".join(lines)


def guide_table() -> str:
    by_module: dict[str, list[type[ArchAdapter]]] = {}
    for cls in adapter_classes():
        by_module.setdefault(cls.__module__, []).append(cls)
    lines = ["| module | architectures | what it maps |", "|---|---|---|"]
    for module_name in sorted(by_module):
        module = sys.modules[module_name]
        summary = _first_sentence(module.__doc__ or "")
        names = ", ".join(f"`{a}`" for cls in by_module[module_name] for a in cls.hf_architectures)
        lines.append(f"| `{module_name.rsplit('.', 1)[1]}.py` | {names} | {summary} |")
    return "\n".join(lines)


def _first_sentence(doc: str) -> str:
    """The docstring's first sentence on one line, reStructuredText literals as Markdown ones."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = re.search(r"\.(\s|$)", paragraph)
    return (paragraph[: end.start() + 1] if end else paragraph).replace("``", "`")


def engine_classes(keep) -> list[str]:
    """The TensorRT-LLM classes (with their upstream folder) of the families for which ``keep(cls)`` holds."""
    seen: dict[str, str] = {}
    for cls in adapter_classes():
        if keep(cls) and cls.trtllm_base_class:
            seen.setdefault(cls.trtllm_base_class, cls.trtllm_module)
    return [f"`{name}` (`models/{module}/`)" for name, module in seen.items()]


def _words(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else "none"


def engine_limit_lines() -> str:
    """One line per family whose class declares an ``engine_limits_summary`` (its own, not inherited)."""
    lines = []
    for cls in adapter_classes():
        note = cls.__dict__.get("engine_limits_summary")
        if note:
            lines.append(f"\n  - `{cls.hf_architectures[0]}`: {note};")
    return "".join(lines) + "\n  "


def pytorch_architectures(support: Eagle3Support) -> str:
    """The HF architectures whose PyTorch-backend class serves EAGLE-3 as ``support`` says (their declarations)."""
    return _words([f"`{arch}`" for cls in adapter_classes() for arch, model in cls.pytorch_models.items()
                   if model.support is support])


def _medusa_verdict(arch: str) -> str:
    """check's verdict on the family's tiny config for the 1.2 TensorRT backend: Medusa, or the rules refusing it."""
    from trtllm_medusa_ports.compat.base import tiny_config_errors

    refused = sorted({f.rule for f in tiny_config_errors(arch)})
    return "Medusa" if not refused else "refused: " + ", ".join(f"`{r}`" for r in refused)


def backend_table() -> str:
    """Bases x backend x drafter: what `check` says for each architecture on 1.2's TensorRT backend (Medusa, on the
    family's tiny config) and on the PyTorch backend (EAGLE-3, the family's declaration)."""
    words = {Eagle3Support.ONE_MODEL: "EAGLE-3, one-model", Eagle3Support.TWO_MODEL: "EAGLE-3, two-model only "
             "(removed in 1.4)", Eagle3Support.NO_CAPTURE: "no: its class has no capture hook",
             Eagle3Support.NO_CLASS: "no: no PyTorch class"}
    lines = ["\n| HF architecture | TensorRT-LLM 1.2.x (TensorRT backend) | 1.3 and later (PyTorch backend) | upstream file |",
             "|---|---|---|---|"]
    for cls in adapter_classes():
        for arch, model in cls.pytorch_models.items():
            lines.append(f"| `{arch}` | {_medusa_verdict(arch)} | {words[model.support]} | `{model.upstream}` |")
    return "\n".join(lines) + "\n"


#: the named lists documents hold inline, each derived from the adapters
LISTS = {
    "pytorch-one-model": lambda: pytorch_architectures(Eagle3Support.ONE_MODEL),
    "pytorch-two-model": lambda: pytorch_architectures(Eagle3Support.TWO_MODEL),
    "pytorch-no-capture": lambda: pytorch_architectures(Eagle3Support.NO_CAPTURE),
    "pytorch-no-class": lambda: pytorch_architectures(Eagle3Support.NO_CLASS),
    "backend-table": backend_table,
    "engine-limits": engine_limit_lines,
    "no-pipeline-parallel": lambda: _words(engine_classes(lambda c: not c.engine_pipeline_parallel)),
    "no-spec-plumbing": lambda: _words(engine_classes(lambda c: not c.upstream_spec_decoding_plumbing)),
    "spec-plumbing": lambda: _words(engine_classes(lambda c: c.upstream_spec_decoding_plumbing)),
    "upstream-medusa-bases": lambda: _words(engine_classes(lambda c: c.upstream_medusa_base)),
    "overridable": lambda: _words([f"`{rule}`" for rule in sorted(OVERRIDABLE)]),
    "pitfalls": pitfalls.rendered,
}


def rendered_lists(text: str) -> str:
    """``text`` with every inline list re-rendered from the adapters."""
    def one(m: re.Match) -> str:
        if m.group(2) not in LISTS:
            raise ValueError(f"unknown family list {m.group(2)!r} (known: {', '.join(LISTS)})")
        return m.group(1) + LISTS[m.group(2)]() + m.group(4)

    return _INLINE.sub(one, text)


def render(kind: str) -> str:
    return readme_table() if kind == "readme" else guide_table()


def between_markers(text: str, where: str) -> tuple[int, int]:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{where}: no {BEGIN} ... {END} markers around the family table")
    return start + len(BEGIN), end


def rendered_document(path: Path, kind: str | None) -> str:
    """The document with its family table (``kind``: readme, guide; None: none) and inline lists rendered."""
    text = path.read_text(encoding="utf-8")
    if kind is not None:
        start, end = between_markers(text, str(path))
        text = text[:start] + "\n" + render(kind) + "\n" + text[end:]
    return rendered_lists(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_medusa_ports.families", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the tables in README.md and docs/porting-guide.md")
    args = parser.parse_args(argv)
    if not args.write:
        print(readme_table() + "\n\n" + guide_table())
        return 0
    for rel in dict.fromkeys([*DOCUMENTS, *LIST_DOCUMENTS]):
        path = ROOT / rel
        path.write_text(rendered_document(path, DOCUMENTS.get(rel)), encoding="utf-8")
        print(f"wrote the family tables and lists of {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
