"""SIGINT at any moment of an --overwrite (issue 76, 4): the old output stays exactly as it was and the command exits
130, whether the signal lands while the rank files are written, while Python swallows its KeyboardInterrupt (raised
in a finalizer: "Exception ignored"), or during the swap itself (files/interrupts.py, files/checkpoint.py)."""

import os
import signal

import pytest

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.files import checkpoint, interrupts


def _convert(base, heads, out, *extra):
    return main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir", str(out),
                 "--overwrite", "--quiet", *extra])


def _tree(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def old(tmp_path, qwen2_base, qwen2_heads):
    """A converted checkpoint to be overwritten, and its bytes."""
    out = tmp_path / "out"
    assert _convert(qwen2_base, qwen2_heads, out, "--dtype", "bfloat16") == 0
    return out, _tree(out)


def _kept(out, before, capsys):
    err = capsys.readouterr().err
    assert _tree(out) == before, "the old output changed"
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".out.")], "a partial directory is left"
    assert "interrupted" in err and "Traceback" not in err, err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers before are put back


def _sigint():
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_while_the_rank_files_are_written(old, qwen2_base, qwen2_heads, monkeypatch, capsys):
    out, before = old
    real = checkpoint.StreamingSafetensorsFile.written
    calls = {"n": 0}

    def written(self, name):
        calls["n"] += 1
        if calls["n"] == 3:
            _sigint()
        return real(self, name)

    monkeypatch.setattr(checkpoint.StreamingSafetensorsFile, "written", written)
    assert _convert(qwen2_base, qwen2_heads, out, "--dtype", "float16") == 130
    _kept(out, before, capsys)


class _Finalized:
    def __del__(self):
        _sigint()
        for _ in range(100):  # the handler runs here: its KeyboardInterrupt is "Exception ignored", dropped by Python
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_python_swallowed_still_interrupts(old, qwen2_base, qwen2_heads, monkeypatch, capsys):
    out, before = old
    real = checkpoint.StreamingSafetensorsFile.written

    def written(self, name):
        _Finalized()  # dropped at once: its __del__ runs here
        return real(self, name)

    monkeypatch.setattr(checkpoint.StreamingSafetensorsFile, "written", written)
    assert _convert(qwen2_base, qwen2_heads, out, "--dtype", "float16") == 130
    _kept(out, before, capsys)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_ctrl_c_during_the_swap_undoes_it(old, qwen2_base, qwen2_heads, monkeypatch, capsys, exchange):
    out, before = old
    real_exchange, real_rename = checkpoint._exchange, os.rename
    sent = {"n": 0}

    def once():
        if not sent["n"]:
            sent["n"] += 1
            _sigint()  # held back: the swap is not cut in two

    def swapping(a, b):
        done = real_exchange(a, b) if exchange else False
        if done:
            once()
        return done

    def rename(a, b, *args, **kw):
        real_rename(a, b, *args, **kw)
        if not exchange and str(b) == str(out):
            once()

    monkeypatch.setattr(checkpoint, "_exchange", swapping)
    monkeypatch.setattr(checkpoint.os, "rename", rename)
    assert _convert(qwen2_base, qwen2_heads, out, "--dtype", "float16") == 130
    assert sent["n"] == 1
    _kept(out, before, capsys)


def test_a_new_output_is_not_left_by_a_ctrl_c_during_its_rename(tmp_path, qwen2_base, qwen2_heads, monkeypatch,
                                                                capsys):
    out = tmp_path / "out"
    real_rename = os.rename

    def rename(a, b, *args, **kw):
        real_rename(a, b, *args, **kw)
        if str(b) == str(out):
            _sigint()

    monkeypatch.setattr(checkpoint.os, "rename", rename)
    assert _convert(qwen2_base, qwen2_heads, out) == 130
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_swallowed_ctrl_c_interrupts_a_command_that_writes_nothing(qwen2_base, monkeypatch, capsys):
    import trtllm_medusa_ports.api as api

    real = api.check

    def check(*a, **k):
        _Finalized()
        return real(*a, **k)

    monkeypatch.setattr(api, "check", check)
    assert main(["check", "--model_dir", str(qwen2_base)]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_an_api_caller_keeps_its_own_handler_and_gets_the_interrupt(tmp_path, monkeypatch):
    """Without the command line's handlers (a program calling the API), the swap still holds a signal back, undoes
    itself and raises KeyboardInterrupt; the caller's handler is back afterwards and saw nothing."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    seen = []
    before = signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
    real_exchange = checkpoint._exchange

    def swapping(a, b):
        done = real_exchange(a, b)
        _sigint()
        return done

    monkeypatch.setattr(checkpoint, "_exchange", swapping)
    try:
        with pytest.raises(KeyboardInterrupt), checkpoint.atomic_output_dir(out, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
        handler = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and not seen
    assert handler is not interrupts._on_signal and interrupts.received() == 0
