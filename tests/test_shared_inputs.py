"""The suite's shared inputs (tests/conftest.py): built once per run whichever worker asks first, and read-only -
a test that writes into one errs at its teardown, naming what it changed."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import conftest
import pytest
from conftest import built_once, run_store, tiny_base


def test_a_shared_input_is_built_once_and_whole(tmp_path):
    calls = []

    def build(d: Path) -> None:
        calls.append(d)
        d.mkdir()
        (d / "a.txt").write_text("x")

    target = tmp_path / "thing"
    assert built_once(target, build) == target and (target / "a.txt").read_text() == "x"
    assert built_once(target, build) == target and len(calls) == 1
    assert calls[0] != target and not calls[0].exists()  # built beside it, then renamed whole
    # another worker's (the directory is there, this process never built it): taken as it is
    other = tmp_path / "other"
    other.mkdir()
    assert built_once(other, build) == other and len(calls) == 1


def test_two_processes_asking_at_once_build_it_once(tmp_path):
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import conftest; "
            "t = Path(sys.argv[2]); "
            "conftest.built_once(t, lambda d: (d.mkdir(), time.sleep(0.5), (d / f'by-{sys.argv[3]}').touch()))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent), str(tmp_path / "t"), str(i)])
             for i in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert len(os.listdir(tmp_path / "t")) == 1  # one builder; the other waited for it


def test_a_test_that_writes_into_a_shared_input_errs_naming_it(tmp_path):
    d = built_once(tmp_path / "shared-x", lambda d: (d.mkdir(), (d / "config.json").write_text("{}")))
    item = types.SimpleNamespace(funcargs={"base": d})
    conftest.pytest_runtest_teardown(item)  # unchanged: nothing to say
    (d / "config.json").write_text('{"changed": 1}')
    (d / "extra.bin").write_bytes(b"")
    with pytest.raises(AssertionError, match=r"shared-x: config.json, extra.bin") as err:
        conftest.pytest_runtest_teardown(item)
    assert "copy one to change it" in str(err.value)
    conftest.pytest_runtest_teardown(item)  # said once, not again by every later test


def test_tiny_bases_live_in_the_runs_store_whatever_root_is_given(tmp_path, store):
    a = tiny_base(tmp_path, "LlamaForCausalLM")
    assert a == tiny_base(store, "LlamaForCausalLM") and a.parent == run_store()
    assert tiny_base(store, "LlamaForCausalLM", num_hidden_layers=1) != a  # its own, for its parameters
    # beside this worker's own directory: one for every worker of the run
    run = store.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else store.parent
    assert run_store() == run / "shared"
