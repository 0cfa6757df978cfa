"""Shared fixtures: tiny bases and heads are built by the tests (no model hub).

Inputs that many tests read (tiny bases, their heads, trained heads) are built once per test run, in one
directory every pytest-xdist worker sees (:func:`run_store`), by whichever worker asks first (:func:`built_once`).
They are read-only: a test that must change one copies it first; a test that writes into one fails, naming
what it changed (:func:`pytest_runtest_teardown`).
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import json
import os
import re
import shutil
import sys
import tempfile
import types
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

# torch and the package are imported where used: pytest-xdist's controller loads this file too, and runs no test
# shapes built by transformers are cached per config (files/hf_model.py): this process's cache until the session
# starts, then the run's (_run_store)
os.environ["TRTLLM_MEDUSA_CACHE"] = tempfile.mkdtemp(prefix="trtllm-medusa-test-cache-")
atexit.register(shutil.rmtree, os.environ["TRTLLM_MEDUSA_CACHE"], True)  # ours: gone with the session
# transformers 5 materializes each loaded tensor on a pool of up to four threads (core_model_loading.py
# ``GLOBAL_WORKERS``), new for each of the suite's ~450 loads of a tiny base: the same tensors on the loading thread
# (its own switch), ~2.5 ms of ~13 ms a load; the suite's process environment only
os.environ.setdefault("HF_DEACTIVATE_ASYNC_LOAD", "1")


#: what this file keeps for the session, one for both names it is imported under (``conftest``, as pytest and most
#: tests import it, and ``tests.conftest``): the run's shared directory once the session starts (_run_store), the
#: shared directories handed out in this process and what each held then (path -> {name: (size, mtime)}), those
#: handed out during the test now running
_STATE = sys.modules.setdefault("_medusa_ports_test_state", types.ModuleType("_medusa_ports_test_state"))
if not hasattr(_STATE, "run"):
    _STATE.run, _STATE.shared, _STATE.handed = [], {}, set()
_RUN: list[Path] = _STATE.run
_SHARED: dict[Path, dict[str, tuple[int, int]]] = _STATE.shared
_HANDED: set[Path] = _STATE.handed


@pytest.fixture(scope="session", autouse=True)
def _run_store(tmp_path_factory) -> Path:
    """The run's shared inputs, and its transformers shapes (files/hf_model.py, written atomically): under
    pytest-xdist, in the directory above every worker's own (one per run). One torch thread per process."""
    base = tmp_path_factory.getbasetemp()
    run = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    run.mkdir(exist_ok=True)
    os.environ["TRTLLM_MEDUSA_CACHE"] = str(run / "shape-cache")
    import torch

    torch.set_num_threads(1)  # tiny models: a second thread only waits (and, on a busy machine, stalls every op)
    _RUN[:] = [run]
    return run


def run_store() -> Path:
    """Where :func:`built_once` keeps what the whole run shares."""
    assert _RUN, "the session has not started: build shared inputs in fixtures or tests, not at import"
    return _RUN[0]


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    """This worker's directory for what its session keeps (tiny_base's bases are the run's: run_store)."""
    return tmp_path_factory.mktemp("store")


def _snapshot(d: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in d.rglob("*"):
        st = p.lstat()
        out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns)
    return out


def built_once(target: Path, build: Callable[[Path], object]) -> Path:
    """``target``, made by ``build(directory)`` once per test run whichever worker asks first (the others wait
    for it); read-only from then on (a test that writes into it fails)."""
    if target not in _SHARED:
        if not target.is_dir():
            with open(f"{target}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not target.is_dir():
                    part = target.with_name(f".{target.name}.{os.getpid()}.partial")
                    shutil.rmtree(part, ignore_errors=True)
                    build(part)
                    os.rename(part, target)  # whole or absent for the other workers
        _SHARED[target] = _snapshot(target)
    _HANDED.add(target)
    return target


def _changes(d: Path) -> list[str]:
    now, then = _snapshot(d), _SHARED[d]
    return sorted({n for n in now.keys() | then.keys() if now.get(n) != then.get(n)})


#: the modules holding the longest tests (--durations; 3 s to 11 s each: the demo and the memory proof the longest),
#: run first: under pytest-xdist the tests handed out last are then short ones, and no worker ends waiting for the
#: other's long test; a module's tests stay together (its fixtures are made once) and in their order
LONGEST_FIRST = ("test_memory_bounds.py", "test_cli.py", "test_verify_streaming.py", "test_train_distributed.py",
                 "test_train_streaming.py")


def pytest_report_header(config):
    """The ATen CPU path the floating-point tests run on (.ci/run runs the ``numerics`` ones on each)."""
    import torch

    forced = os.environ.get("ATEN_CPU_CAPABILITY")
    return f"ATen CPU capability: {torch.backends.cpu.get_cpu_capability()}" + (
        f" (ATEN_CPU_CAPABILITY={forced})" if forced else "")


def pytest_collection_modifyitems(items):
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest as collected


def pytest_collection_finish(session):
    """The cyclic garbage collector, off while collection imported (pytest_collectstart), is on again.

    What collection imported (torch, transformers, every test module and what they hold) is left out of the
    cyclic garbage collector's passes from here on (``gc.freeze``), and its passes run ~30x (full ones ~100x) less
    often: passes over those objects, finding almost nothing, took ~6 % of a worker's time (test_families and
    test_quant: 3.5 s of GC, 1.6 s after). Tests free by reference counting all the same; verify and the memory
    proofs' child process collect explicitly where they free much."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    gc.enable()


def pytest_sessionfinish(session):
    """What the tests left is collected twice and frozen: pytest's own clean-up (unraisableexception.py
    ``gc_collect_harder``: five full passes, ~0.25 s each over what the tests imported and cached) then walks only what
    those two left. Unraisable exceptions of the objects freed here are still reported: its hook is still in place."""
    gc.collect()
    gc.collect()
    gc.freeze()


def pytest_runtest_setup(item):
    _HANDED.clear()
    _STATE.build_proven = item.get_closest_marker("verify_without_build") is None


# -- verify OK means the engine builds: every checkpoint any test's verify says OK for is built on the stand-in
# -- (tests/standin) right there, with the build's own refusals on, so no list of checkpoints or modules is kept by
# -- hand; a test whose verify runs on purpose where no build could (it names why) is marked verify_without_build
def pytest_collectstart(collector):
    """Before the first test module is imported (in each process that collects: not pytest-xdist's controller), the
    package's ``verify`` is wrapped, so that ``from trtllm_medusa_ports.verify import verify`` gets the wrapper (which
    also leaves the quantized formats' greedy agreement unjudged unless a test passes ``min_quant_agreement``: the
    CLI and api.verify always pass it)."""
    if not getattr(_STATE, "collecting", False):
        # collection imports torch, transformers and every test module: objects that live as long as the process,
        # which the collector walked ~700 times per process finding nothing (0.5 s a worker); on again and frozen
        # when collection is done (pytest_collection_finish)
        _STATE.collecting = True
        gc.disable()
    if isinstance(collector, pytest.Module) and not getattr(_STATE, "verify_wrapped", False):
        _STATE.verify_wrapped = True
        import trtllm_medusa_ports.verify as package
        from trtllm_medusa_ports.verify import run

        package.verify = run.verify = _building_after(run.verify)


def _building_after(verify: Callable) -> Callable:
    import functools

    @functools.wraps(verify)
    def verify_then_build(model_dir, checkpoint_dir, **kw):
        # a quantized format's damage to the greedy text is judged where a test asks (min_quant_agreement): the
        # tiny random bases' logits are near ties everywhere, so any rounding flips their text early
        kw.setdefault("min_quant_agreement", 0.0)
        rep = verify(model_dir, checkpoint_dir, **kw)
        if rep.ok and getattr(_STATE, "build_proven", False):
            assert_builds_on_standin(checkpoint_dir, kw.get("gemm_plugin", "auto"))
        return rep
    return verify_then_build


def assert_builds_on_standin(checkpoint_dir, gemm_plugin: str = "auto") -> None:
    """``trtllm-medusa build`` of the checkpoint against the stand-in of TensorRT-LLM 1.2's build route succeeds,
    every refusal of build on. One rule verify leaves to what it measured: float16-range (a float16 checkpoint of a
    base known to exceed float16's range), which verify judges on the activations of its prompts; there the build
    must refuse with that rule alone, and builds with ``--allow_unsupported``."""
    import contextlib
    import io

    from standin_import import standin_installed

    from trtllm_medusa_ports.cli import main

    def build(*extra: str) -> tuple[int, str]:
        err = io.StringIO()
        with tempfile.TemporaryDirectory(prefix="standin-engine-") as out, standin_installed(), \
                contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["build", "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(Path(out) / "engine"),
                       "--gemm_plugin", gemm_plugin, *extra])
        return rc, err.getvalue()

    rc, err = build()
    if rc != 0 and set(re.findall(r"\[([a-z][a-z0-9-]*)\]", err)) == {"float16-range"}:
        rc, err = build("--allow_unsupported")
    assert rc == 0, f"verify proved {checkpoint_dir}, but its build on the stand-in fails:\n{err}"


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    """A test that wrote into a shared input errs, naming it: later tests, any worker's, would read the change."""
    used = set(_HANDED)
    _HANDED.clear()
    for value in getattr(item, "funcargs", {}).values():
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, Path) and v in _SHARED:
                used.add(v)
    changed = {d: c for d in sorted(used) if (c := _changes(d))}
    if changed:
        _SHARED.update({d: _snapshot(d) for d in changed})  # reported once
        raise AssertionError("this test changed inputs shared by the whole run (copy one to change it, as in "
                             "shutil.copytree(base, tmp_path / 'base')): "
                             + "; ".join(f"{d.name}: {', '.join(c[:5])}" for d, c in changed.items()))


def tiny_base(root: Path, architecture: str, **overrides) -> Path:
    """A saved tiny base, built once per test run for its parameters (read-only: copy it to change it); ``root``
    is not where it is kept (any worker's test may have built it first)."""
    spec = json.dumps(overrides, sort_keys=True)
    # seeded by the parameters as first spelled (norm_offset was norm_scale), so that every base - and
    # the half-precision margins it was checked at - stays the same
    spelled = {("norm_scale" if k == "norm_offset" else k): v for k, v in overrides.items()}
    seed = zlib.crc32(json.dumps(spelled, sort_keys=True).encode()) % 997
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base

    return built_once(run_store() / f"base-{architecture}-{zlib.crc32(spec.encode()):08x}",
                      lambda d: save_tiny_base(architecture, d, seed=seed, **overrides))


@pytest.fixture(scope="session")
def qwen2_base(store) -> Path:
    return tiny_base(store, "Qwen2ForCausalLM")


@pytest.fixture(scope="session")
def llama_base(store) -> Path:
    return tiny_base(store, "LlamaForCausalLM")


@pytest.fixture(scope="session")
def qwen2_heads(store, qwen2_base) -> Path:
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

    cfg = tiny_config("Qwen2ForCausalLM")
    return built_once(run_store() / "qwen2-heads", lambda d: save_heads(
        random_heads(cfg.hidden_size, cfg.vocab_size, num_heads=3, seed=1), d))


@pytest.fixture(scope="session")
def llama_trained(store) -> tuple[Path, Path]:
    """A Llama base with heads trained to predict it (multi-token acceptance happens)."""
    from trtllm_medusa_ports.fixtures.synthetic import save_heads, train_heads

    base = tiny_base(store, "LlamaForCausalLM", embedding_gain=4.0)
    return base, built_once(run_store() / "llama-trained-heads",
                            lambda d: save_heads(train_heads(base, num_heads=3, positions_per_step=512), d))


def convert_to(out: Path, base: Path, heads: Path, **kw) -> Path:
    from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert

    kw.setdefault("quiet", True)
    convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=out, **kw))
    return out


def assert_proven(rep, context: str = "") -> None:
    """Logits parity, greedy equivalence, and the tree proof reaching every node of the tree (untrained heads accept
    no draft, so only the proof checks the nodes below the root)."""
    proof = rep.tree_proof
    assert rep.parity and rep.greedy_equal, f"{context}\n{rep.render()}"
    assert proof is not None and proof["ok"] and proof["nodes_accepted"] == rep.tree_nodes > 0, f"{context}\n{rep.render()}"


def assert_tree_step_matches_sequential(ref, prompt, tokens, tree):
    """One spec-decoding step over ``tokens`` gives, at every node, the logits of decoding its path.

    This is what makes Medusa's greedy output equal the base model's.
    """
    import torch

    cache = ref.new_cache()
    ref.forward(prompt, cache)
    logits, _ = ref.forward(tokens, cache, spec_decoding_position_offsets=tree.position_offsets,
                            spec_decoding_packed_mask=tree.packed_mask)
    for node in range(tree.num_tokens):
        chain, j = [], node
        while j >= 0:
            chain.append(int(tokens[j]))
            j = tree.parents[j]
        seq, _ = ref.forward(prompt + chain[::-1], ref.new_cache())
        assert torch.allclose(logits[node], seq[-1], atol=1e-5), node
    return logits


# -- conversions and verify reports shared by the whole run (tests/test_families.py, test_verify_streaming.py,
# test_magnitudes.py): one per set of arguments, read-only like the bases --------------------------------------

def _key(*parts) -> str:
    return f"{zlib.crc32(json.dumps(parts, sort_keys=True, default=str).encode()):08x}"


def heads_once(base: Path, num_heads: int = 3, seed: int = 11, layout: str = "fasterdecoding-pt") -> Path:
    """Random heads fitting ``base`` (its hidden size and vocabulary), saved in ``layout`` once per run
    (read-only)."""
    assert base in _SHARED, "heads_once keys the heads by a shared base's name (tiny_base)"

    def build(d: Path) -> None:
        from trtllm_medusa_ports.archs import adapter_for
        from trtllm_medusa_ports.files.hf_model import HFConfig
        from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads

        hf = HFConfig.read(base)
        save_heads(random_heads(adapter_for(hf.architecture).hidden_size(hf), hf.get("vocab_size"),
                                num_heads=num_heads, seed=seed), d, layout)

    return built_once(run_store() / f"heads-{base.name}-{_key(num_heads, seed, layout)}", build)


def converted_once(base: Path, heads: Path, **kw) -> Path:
    """``convert_to(..., base, heads, **kw)``, converted once per run for its arguments (read-only: a test that
    damages it copies it first)."""
    assert base in _SHARED and heads in _SHARED, "converted_once converts shared inputs only (tiny_base, heads_once)"
    return built_once(run_store() / f"ckpt-{base.name}-{_key(heads.name, kw)}",
                      lambda d: convert_to(d, base, heads, **kw))


def family_checkpoint(architecture: str, tp_size: int = 1, **overrides) -> tuple[Path, Path]:
    """(base, checkpoint) of a family's shape as every family-wide test converts it: ``tiny_base(...,
    **overrides)``, three random heads (seed 11), ``tp_size``, ``allow_unsupported`` where the family's own check
    refuses it (family_test_cases' ``unsupported``); once per run."""
    from trtllm_medusa_ports.archs.registry import family_test_cases

    base = tiny_base(run_store(), architecture, **overrides)
    return base, converted_once(base, heads_once(base), tp_size=tp_size,
                                allow_unsupported=architecture in family_test_cases()["unsupported"])


def report_from_dict(data: dict):
    """The VerifyReport whose ``to_dict()`` is ``data`` (all of it: the rebuilt report gives it back whole)."""
    from dataclasses import fields

    from trtllm_medusa_ports.verify import VerifyReport
    from trtllm_medusa_ports.verify.limits import HIT_TOP_K

    names = {f.name for f in fields(VerifyReport)}
    given = dict(data, head_topk=data[f"head_top{HIT_TOP_K}"])
    rep = VerifyReport(**{k: v for k, v in given.items() if k in names})
    assert rep.to_dict() == data, "the report's JSON holds what its fields cannot rebuild"
    return rep


def verified_once(base: Path, ckpt: Path, **kw):
    """``verify(base, ckpt, quiet=True, **kw)``'s report, computed once per run for its arguments and kept as its
    JSON (``to_dict()``, which gives back every field to the last digit): every test asking the same gets it,
    rebuilt (report_from_dict)."""
    def build(d: Path) -> None:
        from trtllm_medusa_ports.verify import verify

        d.mkdir()
        (d / "report.json").write_text(json.dumps(verify(base, ckpt, quiet=True, **kw).to_dict()))

    assert base in _SHARED and ckpt in _SHARED, "verified_once verifies shared checkpoints only (converted_once)"
    d = built_once(run_store() / f"report-{ckpt.name}-{_key(base.name, kw)}", build)
    return report_from_dict(json.loads((d / "report.json").read_text()))
