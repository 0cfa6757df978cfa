"""The stand-in TensorRT-LLM (tests/standin) imported afresh for each test that asks for it, without recompiling it.

Each test gets a pristine stand-in: fresh module objects (so ``CALLS``, ``MODEL_MAP`` and every module attribute a
test patches start as the files say), imported through the ordinary import system. What is *not* redone per test is
turning source into code: with ``PYTHONDONTWRITEBYTECODE=1`` (this environment and CI) no ``.pyc`` is written, so
every re-import compiled the stand-in's ~50 files again (about 10,000 ``compile`` calls in tests/test_engine.py).
:class:`StandinFinder`'s loader keeps each file's code object in memory, keyed by the file's path *and its source
bytes* (a changed file compiles again), and a re-import only executes the cached code in new module objects - what
Python itself does with a ``.pyc``.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import CodeType

STANDIN = Path(__file__).parent / "standin"
PACKAGE = "tensorrt_llm"

#: (source path, source bytes) -> code object, for the whole process (code objects are immutable)
CODE: dict[tuple[str, bytes], CodeType] = {}


class CachedSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader that compiles a file's bytes once per process."""

    def source_to_code(self, data, path, *, _optimize=-1):
        key = (str(path), bytes(data))
        code = CODE.get(key)
        if code is None:
            code = CODE[key] = super().source_to_code(data, path, _optimize=_optimize)
        return code


class StandinFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorrt_llm`` and its submodules in tests/standin only, loaded by :class:`CachedSourceLoader`."""

    _finders: dict[str, importlib.machinery.FileFinder] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        for entry in ([str(STANDIN)] if path is None else path):
            finder = self._finders.get(entry)
            if finder is None:
                details = (CachedSourceLoader, importlib.machinery.SOURCE_SUFFIXES)
                finder = self._finders[entry] = importlib.machinery.FileFinder(entry, details)
            spec = finder.find_spec(fullname, target)
            if spec is not None and spec.loader is not None:
                return spec
        return None  # not in the stand-in: the ordinary finders decide (and find nothing, as in CI)


FINDER = StandinFinder()


def drop_standin() -> None:
    """Forget every imported ``tensorrt_llm`` module (a later import runs the stand-in's code anew)."""
    for name in [m for m in sys.modules if m.startswith(PACKAGE) and (m == PACKAGE or m[len(PACKAGE)] == ".")]:
        del sys.modules[name]


def install_finder() -> None:
    """Put :data:`FINDER` first on ``sys.meta_path`` (once)."""
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def remove_finder() -> None:
    while FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)


def standin_file(relative: str, name: str):
    """One file of tests/standin loaded as module ``name`` on its own (compiled once per process), without making
    ``tensorrt_llm`` importable: e.g. ``standin_file("tensorrt_llm/quantization/functional.py", ...)``."""
    path = str(STANDIN / relative)
    loader = CachedSourceLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    loader.exec_module(module)
    return module


@contextlib.contextmanager
def standin_installed():
    """A pristine stand-in importable as ``tensorrt_llm`` for the block (fresh modules, ``CALLS`` and our engine class
    registry empty), and nothing of it left after; inside a block already holding one, that one is used as it is."""
    from trtllm_medusa_ports.engine import registry as engine_registry

    if FINDER in sys.meta_path:
        import tensorrt_llm

        yield tensorrt_llm
        return
    drop_standin()
    engine_registry._BUILT.clear()
    sys.path.insert(0, str(STANDIN))
    install_finder()
    try:
        import tensorrt_llm

        tensorrt_llm.CALLS.clear()
        yield tensorrt_llm
    finally:
        remove_finder()
        sys.path.remove(str(STANDIN))
        drop_standin()
        engine_registry._BUILT.clear()
