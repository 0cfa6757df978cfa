"""tests/standin_import.py: each import of the stand-in is pristine (new module objects, nothing a test changed
survives), yet compiles nothing it compiled before; a changed file compiles again; outside the finder the
stand-in stays unimportable."""

import builtins
import importlib
import importlib.util
import sys

import pytest
from standin_import import (
    CODE,
    STANDIN,
    CachedSourceLoader,
    drop_standin,
    install_finder,
    remove_finder,
)


@pytest.fixture
def finder():
    drop_standin()
    install_finder()
    yield
    remove_finder()
    drop_standin()


def _count_compiles(monkeypatch, under):
    """The files under ``under`` compiled from now on."""
    calls = []
    real = builtins.compile

    def counting(source, filename, *a, **kw):
        if str(filename).startswith(str(under)):
            calls.append(filename)
        return real(source, filename, *a, **kw)

    monkeypatch.setattr(builtins, "compile", counting)
    return calls


def test_a_reimport_is_pristine_and_compiles_nothing(finder, monkeypatch):
    first = importlib.import_module("tensorrt_llm.models")
    top = sys.modules["tensorrt_llm"]
    assert isinstance(top.__spec__.loader, CachedSourceLoader) and top.__file__.startswith(str(STANDIN))
    top.CALLS.append(("changed by a test",))
    first.MODEL_MAP["Changed"] = object
    drop_standin()
    assert "tensorrt_llm" not in sys.modules and "tensorrt_llm.models" not in sys.modules

    compiles = _count_compiles(monkeypatch, STANDIN)
    second = importlib.import_module("tensorrt_llm.models")
    assert second is not first and sys.modules["tensorrt_llm"] is not top
    assert sys.modules["tensorrt_llm"].CALLS == [] and "Changed" not in second.MODEL_MAP
    assert compiles == []  # every file came from the cache...
    cls = second.MODEL_MAP["LlamaForCausalLM"]
    old = first.MODEL_MAP["LlamaForCausalLM"]
    assert cls is not old and cls.__init__.__code__ is old.__init__.__code__  # ...as the same code, run anew


def test_a_changed_file_compiles_again(tmp_path, monkeypatch):
    path = tmp_path / "mod.py"

    def load():
        loader = CachedSourceLoader("h1_cached_mod", str(path))
        spec = importlib.util.spec_from_file_location("h1_cached_mod", path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

    path.write_text("VALUE = 1\n")
    compiles = _count_compiles(monkeypatch, path)
    assert load().VALUE == 1 and load().VALUE == 1
    assert compiles == [str(path)]  # once for both loads
    path.write_text("VALUE = 2\n")
    assert load().VALUE == 2 and compiles == [str(path)] * 2
    assert len([k for k in CODE if k[0] == str(path)]) == 2


def test_without_the_finder_the_standin_is_not_importable():
    drop_standin()
    remove_finder()
    with pytest.raises(ImportError):
        importlib.import_module("tensorrt_llm")


def test_one_standin_file_loads_alone_compiled_once(monkeypatch):
    from standin_import import standin_file

    drop_standin()
    first = standin_file("runtime_buffers.py", "h1_buffers")
    compiles = _count_compiles(monkeypatch, STANDIN)
    second = standin_file("runtime_buffers.py", "h1_buffers")
    assert second is not first and second.medusa_step_inputs.__code__ is first.medusa_step_inputs.__code__
    assert compiles == [] and "tensorrt_llm" not in sys.modules
