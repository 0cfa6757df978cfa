"""Hostile input at the readers' boundaries: every JSON, text and state file read or written.

Each case differs from a valid run in one way. Every case asserts the exit code, the message (the file or
flag, the field or line where known, and a fix), that no traceback escapes, that every input is unchanged
afterwards (hashed before and after; a sparse file by its size, blocks and mtime) and that nothing is left
behind: no output directory, no partial directory, no ``*.tmp``.

Categories: integers longer than Python reads (its 4300-digit limit) in every JSON a user gives; text that is
not UTF-8 (argv decoded with surrogateescape, JSON lone surrogates, file bytes); a text file taken for JSON
lines by its first ``{``; files far past any real size, refused unread; a full disk under train-heads; and
the tree error that listed every problem.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import convert_to, tiny_base

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.jsonfile import MAX_JSON_FILE_BYTES, parse_json, read_bytes_limited
from trtllm_medusa_ports.files.prompts import (
    MAX_TEXT_FILE_BYTES,
    looks_like_json_lines,
    read_data_file,
)
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_tokenizer,
    tiny_config,
)
from trtllm_medusa_ports.trees.tree import MAX_LISTED_PROBLEMS, validate_choices

ARCH = "LlamaForCausalLM"
CFG = tiny_config(ARCH)
H, V = CFG.hidden_size, CFG.vocab_size
#: one digit past Python's int-digit limit (4300 by default)
DIGITS = (sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300) + 700
BIG = "1" * DIGITS

needs_digit_limit = pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits") or sys.get_int_max_str_digits() == 0,
                                       reason="this Python converts integers of any length")


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers")
    base = tiny_base(root, ARCH)
    heads = save_heads(random_heads(H, V, num_heads=3, seed=2), root / "heads", "fasterdecoding-safetensors")
    ck = convert_to(root / "ck", base, heads)
    tok = save_tiny_tokenizer(root / "tok", V)
    return base, heads, ck, tok


@pytest.fixture
def ws(tmp_path, valid, monkeypatch):
    """A fresh workspace of copies: ws/base, ws/heads, ws/ck (a converted checkpoint), ws/tok (a tokenizer)."""
    for src, name in zip(valid, ("base", "heads", "ck", "tok"), strict=True):
        shutil.copytree(src, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- argv and files ---------------------------------------------------------------------------------------
def _convert(ws: Path, *extra: str) -> list[str]:
    return ["convert", "--model_dir", str(ws / "base"), "--medusa_model_dir", str(ws / "heads"),
            "--output_dir", str(ws / "out"), "--quiet", *extra]


def _fp8(ws: Path, calib: Path, size: int = 1) -> list[str]:
    # calibration reads no further than --calib_size samples: a bad line 2 needs a size of 2 to be read
    return _convert(ws, "--qformat", "fp8", "--calib_dataset", str(calib), "--calib_size", str(size))


def _check(ws: Path, *extra: str) -> list[str]:
    return ["check", "--model_dir", str(ws / "base"), "--quiet", *extra]


def _verify(ws: Path, *extra: str) -> list[str]:
    return ["verify", "--model_dir", str(ws / "base"), "--checkpoint_dir", str(ws / "ck"), "--quiet",
            "--max_new_tokens", "2", *extra]


def _ids_file(ws: Path) -> Path:
    p = ws / "ids.jsonl"
    p.write_text("".join(json.dumps({"prompt_ids": [(5 * j + i) % V for i in range(6)]}) + "\n" for j in range(4)))
    return p


def _train(ws: Path, *extra: str) -> list[str]:
    data = [] if any(f in extra for f in ("--data", "--prompt", "--prompts_file")) else ["--data", str(_ids_file(ws))]
    return ["train-heads", "--model_dir", str(ws / "base"), "--output_dir", str(ws / "out"), "--num_heads", "2",
            "--steps", "2", "--new_tokens", "4", "--batch_size", "16", "--quiet", *data, *extra]


def _write(p: Path, data: str | bytes) -> Path:
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def _with_big(p: Path, *keys: str) -> Path:
    """``p``'s JSON object with the field at ``keys`` (nested) set to an integer of :data:`DIGITS` digits."""
    cfg = json.loads(p.read_text()) if p.exists() else {}
    d = cfg
    for k in keys[:-1]:  # a null there (transformers 4.57 writes "rope_scaling": null) is no object yet
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[keys[-1]] = "@BIG@"
    p.write_text(json.dumps(cfg).replace('"@BIG@"', BIG))
    return p


def _b(text: str) -> str:
    return text.replace("@BIG@", BIG)


def _sparse(p: Path, size: int) -> Path:
    p.unlink(missing_ok=True)
    with open(p, "wb") as f:
        f.truncate(size)
    return p


def _index(ws: Path) -> Path:
    from safetensors.torch import load_file

    names = load_file(str(ws / "base" / "model.safetensors"))
    p = ws / "base" / "model.safetensors.index.json"
    p.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": {k: "model.safetensors" for k in names}}))
    return p


# -- the assertions every case makes -----------------------------------------------------------------------
def _digest(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            rel = p.relative_to(root)
            if rel.parts[0] == "out" or rel.parts[0].endswith(".train"):
                continue
            st = p.stat()
            if st.st_size > 2 * MAX_JSON_FILE_BYTES:  # a sparse giant: never read it, fingerprint it
                out[str(rel)] = ("sparse", st.st_size, st.st_blocks, st.st_mtime_ns)
            else:
                out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _leftovers(ws: Path) -> list[str]:
    return sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if p.name.endswith(".tmp") or ".partial" in p.name)


def _run(ws: Path, argv: list[str], capsys, code: int, says: tuple[str, ...]) -> str:
    capsys.readouterr()
    before = _digest(ws)
    left_before = _leftovers(ws)
    out_existed = (ws / "out").exists()
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err
    assert rc == code, err[-3000:]
    assert "Traceback" not in err
    for s in says:
        assert s in err, (s, err[-3000:])
    if code:
        assert "error:" in err and "fix:" in err.partition("error:")[2], err[-3000:]
        assert (ws / "out").exists() == out_existed  # a failed run leaves no output
    assert _digest(ws) == before  # every input unchanged
    assert _leftovers(ws) == left_before  # no temporary or partial file left
    return err


@dataclass
class Case:
    id: str
    setup: Callable[[Path], list[str]]
    says: tuple[str, ...]
    code: int = 1


def _cases(cases: list[Case]):
    return pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])


# == 1. integers longer than Python reads, in every JSON a user gives =====================================
LONG_INTS = [
    Case("data-file", lambda ws: _check(ws, "--data", str(_write(
        ws / "d.jsonl", _b('{"prompt_ids": [1, 2]}\n{"input_ids": [1, @BIG@]}\n')))),
         ("d.jsonl", "line 2: field input_ids[1]", f"{DIGITS} digits")),
    Case("data-file-negative", lambda ws: _train(ws, "--data", str(_write(ws / "d.jsonl",
                                                                           _b('{"prompt_ids": [-@BIG@]}\n')))),
         ("d.jsonl", "line 1: field prompt_ids[0]", f"{DIGITS} digits")),
    Case("calibration-json-lines", lambda ws: _fp8(ws, _write(ws / "c.jsonl", _b('{"input_ids": [@BIG@, 1]}\n'))),
         ("c.jsonl", "line 1", "field input_ids[0]")),
    Case("choices-file", lambda ws: ["tree", "--choices", f"@{_write(ws / 't.json', f'[[0], [{BIG}]]')}"],
         ("t.json", "field [1][0]", f"{DIGITS} digits")),
    Case("choices-file-on-convert", lambda ws: _convert(ws, "--medusa_choices",
                                                        f"@{_write(ws / 't.json', f'[[0], [0, {BIG}]]')}"),
         ("[tree-invalid] ", "t.json: field [1][1]", f"{DIGITS} digits")),  # the finding names the file
    # a typed tree is the command line's: read before any input, its form refused with exit 2 (user guide)
    Case("choices-argv", lambda ws: _convert(ws, "--medusa_choices", f"[[0], [{BIG}]]"),
         ("--medusa_choices: field [1][0]", f"{DIGITS} digits"), 2),
    Case("choices-argv-on-tree", lambda ws: ["tree", "--choices", f"[[0], [{BIG}]]"],
         ("--medusa_choices: field [1][0]",), 2),
    Case("choices-python-literal", lambda ws: ["tree", "--choices", f"((0,), ({BIG},))"],
         ("--medusa_choices", "longer than Python reads"), 2),
    Case("choices-hex-literal", lambda ws: ["tree", "--choices", "[[0], [0x" + "f" * DIGITS + "]]"],
         ("path #1 holds an integer of", "bits"), 2),
    Case("base-config-nested", lambda ws: (_with_big(ws / "base" / "config.json", "rope_scaling", "factor"),
                                           _convert(ws))[1],
         ("base/config.json", "field rope_scaling.factor", f"{DIGITS} digits")),
    Case("base-config-on-check", lambda ws: (_with_big(ws / "base" / "config.json", "hidden_size"), _check(ws))[1],
         ("base/config.json", "field hidden_size")),
    Case("base-config-on-train-heads", lambda ws: (_with_big(ws / "base" / "config.json", "vocab_size"),
                                                   _train(ws))[1],
         ("base/config.json", "field vocab_size")),
    Case("heads-config", lambda ws: (_with_big(ws / "heads" / "config.json", "medusa_num_heads"), _convert(ws))[1],
         ("heads/config.json", "field medusa_num_heads")),
    Case("shard-index", lambda ws: (_with_big(_index(ws), "metadata", "total_size"), _convert(ws))[1],
         ("model.safetensors.index.json", "field metadata.total_size")),
    Case("checkpoint-config-on-verify", lambda ws: (_with_big(ws / "ck" / "config.json", "vocab_size"),
                                                    _verify(ws))[1],
         ("ck/config.json", "field vocab_size")),
    Case("checkpoint-config-on-build", lambda ws: (_with_big(ws / "ck" / "config.json", "mapping", "tp_size"),
                                                   ["build", "--checkpoint_dir", str(ws / "ck")])[1],
         ("ck/config.json", "field mapping.tp_size")),
]


@needs_digit_limit
@_cases(LONG_INTS)
def test_an_integer_longer_than_python_reads_is_named_by_file_and_field(ws, case, capsys):
    err = _run(ws, case.setup(ws), capsys, case.code, case.says)
    assert "Exceeds the limit" not in err


@needs_digit_limit
@pytest.mark.parametrize("text, field", [
    (f'{{"a": {{"b c": [0, {BIG}]}}}}', 'a["b c"][1]'),
    (f"[{{}}, [{BIG}]]", "[1][0]"),
    (f'{{"n": -{BIG}}}', "n"),
    (BIG, None),
], ids=["nested-key-with-a-space", "list-in-a-list", "negative", "top-level"])
def test_parse_json_names_the_field_of_a_long_integer(text, field):
    with pytest.raises(PortError) as exc:
        parse_json(text.encode(), PortError, where="x.json", fix="fix it", kind=None)
    assert exc.value.where == "x.json" and f"{DIGITS} digits" in exc.value.what and "fix it" in exc.value.fix
    assert (f"field {field} " in exc.value.what) if field else exc.value.what.startswith("the value")


def test_integers_python_reads_still_parse():
    assert parse_json(json.dumps({"n": 10 ** 4000}).encode(), PortError, where="x", fix="f")["n"] == 10 ** 4000


# == 2. text that is not valid UTF-8 =======================================================================
NOT_UTF8 = [
    Case("argv-prompt-on-check", lambda ws: _check(ws, "--tokenizer_dir", str(ws / "tok"), "--prompt", "t1 \udcff t2"),
         ("--prompt is not valid UTF-8 text", "byte 0xff at character 4", "--prompt_ids")),
    Case("argv-prompt-on-verify", lambda ws: _verify(ws, "--tokenizer_dir", str(ws / "tok"), "--prompt", "\udce9t1"),
         ("--prompt is not valid UTF-8 text", "byte 0xe9 at character 1")),
    Case("argv-second-prompt-on-train-heads", lambda ws: _train(ws, "--tokenizer_dir", str(ws / "tok"),
                                                                "--prompt", "t1 t2 t3", "--prompt", "t4 \udcc3"),
         ("--prompt 2 (of 2) is not valid UTF-8 text", "byte 0xc3")),
    Case("data-lone-surrogate-escape", lambda ws: _check(ws, "--tokenizer_dir", str(ws / "tok"), "--data", str(
        _write(ws / "d.jsonl", '{"prompt_ids": [1]}\n{"text": "t1 \\ud800"}\n'))),
         ("d.jsonl", "line 2: field text is not valid UTF-8 text", "lone surrogate (U+D800)")),
    Case("prompts-file-bytes", lambda ws: _check(ws, "--prompts_file", str(_write(ws / "p.txt", b"t1 t2\nt3\n\xff t4\n"))),
         ("p.txt", "not UTF-8 text", "line 3, byte 1 is 0xff")),
    Case("data-file-bytes", lambda ws: _train(ws, "--data", str(_write(
        ws / "d.jsonl", b'{"prompt_ids": [1, 2, 3]}\n{"text": "ab\xfe"}\n'))),
         ("d.jsonl", "not UTF-8 text", "line 2, byte 13 is 0xfe")),
    Case("calibration-text-bytes", lambda ws: _convert(  # read line by line: line 1 is tokenized, line 2 is not
        ws, "--qformat", "fp8", "--calib_dataset", str(_write(ws / "calib.txt", b"t1 t2\nt3 \xc3(\n")),
        "--calib_size", "2", "--tokenizer_dir", str(ws / "tok")),
         ("calib.txt", "not UTF-8 text", "line 2, byte 4 is 0xc3")),
]


@_cases(NOT_UTF8)
def test_text_that_is_not_utf8_is_named_before_the_tokenizer_sees_it(ws, case, capsys):
    err = _run(ws, case.setup(ws), capsys, case.code, case.says)
    assert "TextEncodeInput" not in err


# == 3. a text file taken for JSON lines by its first "{" ===================================================
SNIFFED = [
    Case("first-line-is-text", lambda ws: _fp8(ws, _write(ws / "calib.txt", "{name} is a placeholder\nt1 t2\n")),
         ("calib.txt", "line 1 is not JSON", "read as JSON lines: its first line starts with '{'",
          "make the first line one that does not start with '{'", '{"text": "..."}')),
    Case("a-later-line-is-text", lambda ws: _fp8(ws, _write(ws / "calib.txt", '{"input_ids": [1, 2]}\nt1 t2\n'), 2),
         ("line 2 is not JSON", "its first line starts with '{'")),
    Case("a-line-is-a-list", lambda ws: _fp8(ws, _write(ws / "calib.txt", '{"input_ids": [1, 2]}\n[1, 2]\n'), 2),
         ("line 2 is not a JSON object", "its first line starts with '{'")),
    Case("a-line-without-the-keys", lambda ws: _fp8(ws, _write(ws / "calib.txt", '{"prompt_ids": [1]}\n{"t": 1}\n'), 2),
         ("line 2 has none of prompt", "its first line starts with '{'")),
]


@_cases(SNIFFED)
def test_a_file_taken_for_json_lines_says_why_and_how_to_give_it_as_text(ws, case, capsys):
    _run(ws, case.setup(ws), capsys, case.code, case.says)


def test_json_lines_given_by_data_do_not_claim_the_first_character(ws, capsys):
    d = _write(ws / "d.jsonl", '{"prompt_ids": [1]}\n{x\n')
    err = _run(ws, _check(ws, "--data", str(d)), capsys, 1, ("line 2 is not JSON",))
    assert "first line starts" not in err


def test_the_first_character_is_claimed_once(tmp_path):
    p = _write(tmp_path / "c.txt", "{x\n")
    assert looks_like_json_lines(p)
    for claimed in (True, False):  # the sniffed read says why; a later read of the same file (--data) does not
        with pytest.raises(PortError) as exc:
            read_data_file(p, lambda t: [1])
        assert ("first line starts with '{'" in str(exc.value)) == claimed


# == 4. files past any real size are refused unread ==========================================================
TOO_BIG_TEXT = MAX_TEXT_FILE_BYTES + 1
TOO_BIG_JSON = MAX_JSON_FILE_BYTES + 1
TOO_BIG = [
    Case("prompts-file", lambda ws: _check(ws, "--prompts_file", str(_sparse(ws / "p.txt", TOO_BIG_TEXT))),
         ("p.txt", "the prompts file is 1.0 GiB", f"({TOO_BIG_TEXT} bytes)", "it was not read")),
    Case("data-file", lambda ws: _train(ws, "--data", str(_sparse(ws / "d.jsonl", TOO_BIG_TEXT))),
         ("d.jsonl", "the data file is", f"({TOO_BIG_TEXT} bytes)", f"({MAX_TEXT_FILE_BYTES} bytes)")),
    Case("calibration-file", lambda ws: _fp8(ws, _sparse(ws / "calib.txt", TOO_BIG_TEXT)),
         ("calib.txt", f"({TOO_BIG_TEXT} bytes)", "it was not read")),
    Case("verify-prompts-file", lambda ws: _verify(ws, "--prompts_file", str(_sparse(ws / "p.txt", 2 << 30))),
         ("p.txt", "2.0 GiB", "it was not read")),
    Case("base-config", lambda ws: (_sparse(ws / "base" / "config.json", TOO_BIG_JSON), _convert(ws))[1],
         ("base/config.json", "64.0 MiB", f"({TOO_BIG_JSON} bytes)", "it was not read")),
    Case("base-config-on-check", lambda ws: (_sparse(ws / "base" / "config.json", TOO_BIG_JSON), _check(ws))[1],
         ("base/config.json", f"({TOO_BIG_JSON} bytes)")),
    Case("heads-config", lambda ws: (_sparse(ws / "heads" / "config.json", TOO_BIG_JSON), _convert(ws))[1],
         ("heads/config.json", f"({TOO_BIG_JSON} bytes)")),
    Case("shard-index", lambda ws: (_sparse(_index(ws), TOO_BIG_JSON), _convert(ws))[1],
         ("model.safetensors.index.json", f"({TOO_BIG_JSON} bytes)")),
    Case("checkpoint-config", lambda ws: (_sparse(ws / "ck" / "config.json", TOO_BIG_JSON), _verify(ws))[1],
         ("ck/config.json", f"({TOO_BIG_JSON} bytes)")),
]


@_cases(TOO_BIG)
def test_a_file_past_any_real_size_is_refused_before_it_is_read(ws, case, capsys):
    import resource

    argv = case.setup(ws)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    _run(ws, argv, capsys, case.code, case.says)
    # the giant was not read whole (a rise of the process's peak memory would show it)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < (MAX_TEXT_FILE_BYTES >> 10) // 2


@pytest.mark.parametrize("size, ok", [(100, True), (101, False)])
def test_the_size_limit_is_inclusive(tmp_path, size, ok):
    p = _write(tmp_path / "f", b"x" * size)
    if ok:
        assert read_bytes_limited(p, PortError, limit=100, fix="f") == b"x" * size
    else:
        with pytest.raises(PortError, match=r"is 101 bytes, more than the 100 bytes"):
            read_bytes_limited(p, PortError, limit=100, fix="f")


# == 5. train-heads on a full disk ===========================================================================
def _is_state(obj) -> bool:
    return isinstance(obj, dict) and "options" in obj


def _is_corpus(obj) -> bool:
    return isinstance(obj, dict) and "version" in obj and "hidden" in obj


def _torch_save_raises(monkeypatch, target: Callable[[object], bool], code: int) -> None:
    """torch.save of the target object writes a few bytes, then raises the disk's OSError."""
    real = torch.save

    def failing(obj, f, *a, **k):
        if not target(obj):
            return real(obj, f, *a, **k)
        if isinstance(f, (str, Path)):
            Path(f).write_bytes(b"PK\x03\x04half")
        else:
            f.write(b"PK\x03\x04half")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", failing)


def _disk_fills_at(monkeypatch, name: str, code: int) -> None:
    """The disk fills while ``name`` is written: a short write, then the OSError, as a real full disk does (torch
    itself then raises RuntimeError "unexpected pos", which hides the errno)."""
    real = os.write

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith("/" + name):
            if len(data) > 1:
                return real(fd, memoryview(data)[: len(data) // 2])
            raise OSError(code, os.strerror(code))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


FULL_DISK = [
    ("state", "oserror", errno.ENOSPC), ("state", "oserror", errno.EDQUOT), ("state", "short-write", errno.ENOSPC),
    ("corpus", "oserror", errno.ENOSPC), ("corpus", "short-write", errno.ENOSPC), ("state", "oserror", errno.EROFS),
]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
@pytest.mark.parametrize("target, how, code", FULL_DISK,
                         ids=[f"{t}-{h}-{errno.errorcode[c]}" for t, h, c in FULL_DISK])
def test_train_heads_on_a_full_disk_names_the_file_and_errno_and_leaves_no_temporary(ws, capsys, monkeypatch,
                                                                                      target, how, code):
    argv = _train(ws)
    if how == "oserror":
        _torch_save_raises(monkeypatch, _is_state if target == "state" else _is_corpus, code)
    else:
        _disk_fills_at(monkeypatch, f"{target}.tmp", code)
    name = "state.pt" if target == "state" else "corpus.pt"
    err = _run(ws, argv, capsys, 1, (f"out.train/{name}", errno.errorcode[code], os.strerror(code), "--work_dir"))
    assert "unexpected pos" not in err
    assert not list((ws / "out.train").glob("*.tmp"))


def test_a_failed_state_save_keeps_the_last_whole_state(tmp_path, monkeypatch):
    from trtllm_medusa_ports.errors import HeadsError
    from trtllm_medusa_ports.heads.fit import FitOptions, FitState, load_state, save_state

    opts = FitOptions(num_heads=1, steps=4)
    blocks = [[(torch.ones(4, 4), torch.zeros(4))]]
    state = tmp_path / "state.pt"
    save_state(state, opts, FitState(2, blocks, None, {}, []))
    before = hashlib.sha256(state.read_bytes()).hexdigest()
    _torch_save_raises(monkeypatch, _is_state, errno.ENOSPC)
    with pytest.raises(HeadsError, match="ENOSPC") as exc:
        save_state(state, opts, FitState(3, blocks, None, {}, []))
    assert exc.value.where == str(state) and "--resume" in exc.value.fix
    assert hashlib.sha256(state.read_bytes()).hexdigest() == before and load_state(state, opts).step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_a_heads_write_safetensors_refuses_is_one_message_with_the_errno(ws, capsys, monkeypatch):
    import safetensors.torch as st_torch
    from safetensors import SafetensorError

    def failing(*a, **k):  # what safetensors raises on a full disk (not an OSError)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(st_torch, "save_file", failing)
    err = _run(ws, _train(ws), capsys, 1, ("could not write the heads (ENOSPC: No space left on device)", "--resume"))
    assert "SafetensorError" not in err and (ws / "out.train" / "state.pt").is_file()


# == 6. the tree error lists a bounded number of problems =====================================================
def _tree_file(ws: Path, paths) -> str:
    return f"@{_write(ws / 't.json', json.dumps(paths))}"


TREES = [
    Case("duplicates", lambda ws: ["tree", "--choices", _tree_file(ws, [[0]] * 60000)],
         ("path [0] appears more than once", f"and {59999 - MAX_LISTED_PROBLEMS} more paths appear more than once "
          "(of 59999)", "list each path once")),
    Case("duplicates-and-orphans", lambda ws: ["tree", "--choices", _tree_file(
        ws, [[0]] * 20000 + [[1, j % 10] for j in range(20000)])],
         ("more paths appear more than once", f"and {20000 - MAX_LISTED_PROBLEMS} more paths have no parent")),
    Case("a-path-of-100k-indices-twice", lambda ws: ["tree", "--choices", _tree_file(ws, [[0] * 100000] * 2 + [[0]])],
         ("... (100000 indices)] appears more than once",)),
    Case("duplicates-on-convert", lambda ws: _convert(ws, "--medusa_choices", _tree_file(ws, [[0]] * 60000)),
         ("appears more than once", "more paths appear more than once")),
]


@_cases(TREES)
def test_a_tree_error_lists_at_most_ten_problems_of_each_kind(ws, case, capsys):
    err = _run(ws, case.setup(ws), capsys, case.code, case.says)
    assert len(err) < 6000, len(err)


def test_check_reports_a_bounded_number_of_tree_findings(ws, capsys):
    capsys.readouterr()
    main(_check(ws, "--medusa_choices", _tree_file(ws, [[0]] * 60000)))
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and len(cap.out) + len(cap.err) < 20000
    assert "more paths appear more than once" in cap.out + cap.err


@pytest.mark.parametrize("paths, kinds", [
    ([[0]] * 1000, 1),
    ([[0]] * 1000 + [[1, 1]] * 50 + [[20]] * 30, 4),
    ([[0]] * 5, 0),
])
def test_validate_choices_caps_each_kind(paths, kinds):
    problems = validate_choices(paths, num_heads=1)
    assert len(problems) <= 4 * (MAX_LISTED_PROBLEMS + 1) + 1
    assert sum(p.startswith("and ") for p in problems) == kinds
