"""Hostile input to the calibration of a quantized convert, by category.

Categories: samples longer than the base's context (cut to it, with a note that names them, recorded); samples
that must not be tokenized or read whole (a 200,000-token line, a file far larger than the samples need);
``--device`` checked by computing on it (meta, no CUDA, an ordinal past the GPUs, a bad name: exit 2, the flag
named); calibration flags on a conversion that calibrates nothing (a warning naming them, a missing path an
error); the tokenizer a text calibration went through, recorded so that verify can tell it from the samples.

Each case asserts the exit code and the message; every input is hashed before and after (unchanged), and
nothing is left behind (no output after a failure, no ``*.tmp`` / partial file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files import prompts
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_tokenizer,
    tiny_config,
)
from trtllm_medusa_ports.machine.devices import check_device
from trtllm_medusa_ports.quant.calibrate import (
    read_calibration_samples,
    recorded_tokenizer_dir,
    recorded_tokenizer_matches,
    tokenizer_record,
)

ARCH = "LlamaForCausalLM"
CFG = tiny_config(ARCH)
H, V, CONTEXT = CFG.hidden_size, CFG.vocab_size, CFG.max_position_embeddings


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibration")
    base = tiny_base(root, ARCH)
    heads = save_heads(random_heads(H, V, num_heads=2, seed=3), root / "heads", "fasterdecoding-safetensors")
    tok = save_tiny_tokenizer(root / "tok", V)
    return base, heads, tok


@pytest.fixture
def ws(tmp_path, valid, monkeypatch):
    """A fresh workspace of copies: ws/base, ws/heads, ws/tok (a tokenizer of the base's vocabulary)."""
    for src, name in zip(valid, ("base", "heads", "tok"), strict=True):
        shutil.copytree(src, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _convert(ws: Path, *extra: str) -> list[str]:
    return ["convert", "--model_dir", str(ws / "base"), "--medusa_model_dir", str(ws / "heads"),
            "--output_dir", str(ws / "out"), "--quiet", *extra]


def _ids_line(n: int, start: int = 1) -> str:
    return json.dumps({"input_ids": [(start + i) % V for i in range(n)]}) + "\n"


def _words(n: int, start: int = 1) -> str:
    """``n`` tokens of the tiny tokenizer (``t1 t2 ...``), as one text line."""
    return " ".join(f"t{(start + i) % V}" for i in range(n))


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).parts[0] != "out"}


def _leftovers(ws: Path) -> list[str]:
    return sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if p.name.endswith(".tmp") or ".partial" in p.name)


def _run(ws: Path, argv: list[str], capsys, code: int, says: tuple[str, ...] = ()) -> str:
    capsys.readouterr()
    before, left = _digest(ws), _leftovers(ws)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == code, err[-3000:]
    assert "Traceback" not in err
    for s in says:
        assert s in err, (s, err[-3000:])
    if code:
        assert "error:" in err and "fix:" in err.partition("error:")[2], err[-3000:]
        assert not (ws / "out").exists()  # a failed run leaves no output
    assert _digest(ws) == before  # every input unchanged
    assert _leftovers(ws) == left
    return err


def _record(ws: Path) -> dict:
    return json.loads((ws / "out" / "config.json").read_text())["medusa_ports"]["calibration"]


# == 1. samples longer than the base's context ===============================================================
def test_a_sample_longer_than_the_context_is_cut_to_it_with_a_note_naming_it(ws, capsys):
    calib = ws / "c.jsonl"
    calib.write_text(_ids_line(40) + _ids_line(CONTEXT + 150, 7) + _ids_line(CONTEXT + 1, 9))
    err = _run(ws, _convert(ws, "--qformat", "fp8", "--calib_dataset", str(calib), "--calib_size", "3",
                            "--calib_max_seq_length", "1000"), capsys, 0,
               ("2 of 3 sample(s) (line 2, line 3) are longer than the base's context of 256 tokens "
                "(max_position_embeddings)", "--calib_max_seq_length 1000 is above the context"))
    assert err.count("longer than the base's context") == 1  # said once
    rec = _record(ws)
    assert rec["tokens"] == 40 + 2 * CONTEXT and rec["cut"] == 2 and rec["context"] == CONTEXT
    assert rec["max_seq_length"] == 1000 and "line 2, line 3" in rec["notes"][0]
    assert "tokenizer" not in rec  # token ids only: no tokenizer took part


def test_cut_at_calib_max_seq_length_within_the_context_is_the_flag_and_says_nothing(ws):
    calib = ws / "c.jsonl"
    calib.write_text(_ids_line(100) + _ids_line(30))
    samples, _ = read_calibration_samples(calib, ws / "base", size=2, max_seq_length=64)
    assert [len(s) for s in samples] == [64, 30] and samples.cut == 1 and samples.notes == []


def test_the_context_is_the_familys_own_key(ws, tmp_path):
    gpt2 = tiny_base(tmp_path, "GPT2LMHeadModel", n_positions=32)
    calib = ws / "c.jsonl"
    calib.write_text(_ids_line(50))
    samples, _ = read_calibration_samples(calib, gpt2, size=1, max_seq_length=512)
    assert len(samples[0]) == 32 and samples.context == 32
    assert "context of 32 tokens (n_positions)" in samples.notes[0] and "line 1" in samples.notes[0]


def test_a_200000_token_line_is_cut_before_the_tokenizer_sees_it(ws, monkeypatch):
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(str(ws / "tok"))
    seen: list[int] = []

    def counting(tok_dir):
        def tok(text):
            seen.append(len(text))
            return real(text)
        return tok

    monkeypatch.setattr(prompts, "tokenizer_for", counting)
    line = _words(200_000)
    calib = ws / "c.txt"
    calib.write_text(_words(5) + "\n" + line + "\n")
    samples, _ = read_calibration_samples(calib, ws / "base", size=2, max_seq_length=16, tokenizer_dir=ws / "tok")
    assert samples[1] == real(line[:2000])["input_ids"][:16]  # the line's first 16 tokens
    assert samples[0] == real(_words(5))["input_ids"] and samples.cut == 1
    assert max(seen) < 2000  # the tokenizer saw a few hundred characters, never the 1.2 MB line


def test_a_text_line_far_past_what_its_tokens_need_is_not_held(ws):
    calib = ws / "c.txt"
    calib.write_text(_words(3) + "\n" + "t5 " * 3_000_000 + "\n" + _words(4) + "\n")  # a 9 MB line between two
    read_calibration_samples(calib, ws / "tok", size=1, max_seq_length=8)  # the tokenizer loaded, outside the count
    tracemalloc.start()
    try:  # ws/tok as the base: no config.json, whose reader reserves its 64 MiB limit at once
        samples, _ = read_calibration_samples(calib, ws / "tok", size=3, max_seq_length=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(s) for s in samples] == [3, 8, 4] and samples[2] == [1, 2, 3, 4]
    assert peak < 6 << 20, peak  # its first MiB is read (held a few times over), the rest skipped a MiB at a time


# == 2. the file is read no further than the samples need ====================================================
def test_reading_stops_after_calib_size_samples(ws):
    calib = ws / "c.jsonl"
    calib.write_text(_ids_line(5) + "\n" + _ids_line(6) + "{not json\n")
    samples, _ = read_calibration_samples(calib, ws / "base", size=2, max_seq_length=512)
    assert [len(s) for s in samples] == [5, 6]  # upstream's dataset[:calib_size]: the broken line 4 is not read
    with pytest.raises(PortError, match="line 4 is not JSON"):  # asked for all of it, it is read
        read_calibration_samples(calib, ws / "base", size=None, max_seq_length=512)


def test_a_file_far_larger_than_the_samples_need_is_not_read_whole(ws):
    calib = ws / "c.jsonl"
    with open(calib, "w") as f:
        f.write(_ids_line(4) + _ids_line(5))
        f.write(_ids_line(200) * 40_000)  # ~30 MB the two samples do not need
    before = _bytes_read()
    samples, _ = read_calibration_samples(calib, ws / "base", size=2, max_seq_length=512)
    assert [len(s) for s in samples] == [4, 5]
    assert _bytes_read() - before < (calib.stat().st_size >> 4)  # a few buffers of the 30 MB


def _bytes_read() -> int:
    """The bytes this process has read so far (Linux: /proc/self/io rchar)."""
    line = next(x for x in Path("/proc/self/io").read_text().splitlines() if x.startswith("rchar:"))
    return int(line.split()[1])


def test_a_json_line_past_any_real_size_is_refused_naming_it(ws, monkeypatch):
    from trtllm_medusa_ports.files import jsonfile

    monkeypatch.setattr(jsonfile, "MAX_JSON_FILE_BYTES", 1000)  # the line limit, made small
    calib = ws / "c.jsonl"
    calib.write_text(_ids_line(3) + _ids_line(500))
    with pytest.raises(PortError, match=r"line 2 is longer than 1000 bytes") as exc:
        read_calibration_samples(calib, ws / "base", size=2, max_seq_length=512)
    assert exc.value.where == str(calib)


def test_a_file_over_the_text_limit_is_refused_unread(ws, monkeypatch, capsys):
    monkeypatch.setattr(prompts, "MAX_TEXT_FILE_BYTES", 64)
    calib = ws / "calib.txt"
    calib.write_text(_words(40) + "\n")
    _run(ws, _convert(ws, "--qformat", "fp8", "--calib_dataset", str(calib), "--calib_size", "1", "--tokenizer_dir",
                      str(ws / "tok")), capsys, 1, ("calib.txt", "more than the 64 bytes", "it was not read"))


# == 3. --device checked by computing on it ==================================================================
BAD_DEVICES = ["meta", "bogus", "cuda:7"] + ([] if torch.cuda.is_available() else ["cuda"])


@pytest.mark.parametrize("device", BAD_DEVICES)
def test_a_device_nothing_can_compute_on_is_a_usage_error_of_convert(ws, capsys, device):
    _run(ws, _convert(ws, "--qformat", "fp8", "--device", device, "--calib_size", "1"), capsys, 2,
         (f"--device {device}" if device != "bogus" else "--device 'bogus' is not a torch device",))


@pytest.mark.parametrize("device", ["meta", "cuda:7"])
def test_a_device_nothing_can_compute_on_is_a_usage_error_of_train_heads(ws, capsys, device):
    ids = ws / "ids.jsonl"
    ids.write_text(_ids_line(6) * 2)
    _run(ws, ["train-heads", "--model_dir", str(ws / "base"), "--output_dir", str(ws / "out"), "--data", str(ids),
              "--steps", "1", "--quiet", "--device", device], capsys, 2, (f"--device {device}",))


def test_a_device_nothing_can_compute_on_is_a_usage_error_of_verify(ws, capsys):
    from trtllm_medusa_ports.cli import build_parser

    try:
        build_parser().parse_args(["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--device", "meta"])
    except SystemExit:
        pytest.skip("verify takes no --device in this checkout")
    capsys.readouterr()
    _run(ws, ["verify", "--model_dir", str(ws / "base"), "--checkpoint_dir", str(ws / "nosuchckpt"), "--quiet",
              "--device", "meta"], capsys, 2, ("--device meta: the meta device holds",))


def test_the_api_refuses_the_device_before_calibrating(ws):
    with pytest.raises(PortError, match="--device meta: the meta device holds") as exc:
        api.convert(api.ConvertOptions(model_dir=ws / "base", medusa_model_dir=ws / "heads", output_dir=ws / "out",
                                       qformat="fp8", device="meta", calib_size=1, quiet=True))
    assert exc.value.fix and not (ws / "out").exists()


def test_a_device_torch_computes_on_passes():
    assert check_device("cpu") == "cpu"
    if torch.cuda.is_available():
        assert check_device("cuda").startswith("cuda")


# == 4. calibration flags where nothing is calibrated ========================================================
@pytest.mark.parametrize("fmt, why", [((), "a float checkpoint calibrates nothing"),
                                      (("--qformat", "int8_wo"), "weight-only W8A16 calibrates nothing")])
def test_calibration_flags_on_a_format_that_calibrates_nothing_warn(ws, capsys, fmt, why):
    if fmt:  # weight-only layers pad to multiples of 64 (rule quant-weight-only-shape): a base whose widths are
        shutil.rmtree(ws / "base")
        shutil.copytree(tiny_base(ws.parent, ARCH, intermediate_size=128), ws / "base")
    calib = ws / "c.txt"
    calib.write_text(_words(4) + "\n")
    err = _run(ws, _convert(ws, *fmt, "--calib_dataset", str(calib), "--calib_size", "8", "--tokenizer_dir",
                            str(ws / "tok"), "--device", "meta"), capsys, 0, (why,))
    warning = next(line for line in err.splitlines() if "calibrates nothing" in line)
    assert warning.startswith("warning: --calib_dataset, --calib_size, --tokenizer_dir, --device: ignored")
    assert "calibration" not in json.loads((ws / "out" / "config.json").read_text())["medusa_ports"]


@pytest.mark.parametrize("flag", ["--calib_dataset", "--tokenizer_dir"])
def test_a_missing_calibration_path_is_an_error_even_where_it_does_not_apply(ws, capsys, flag):
    _run(ws, _convert(ws, "--qformat", "int4_wo", flag, str(ws / "NOSUCHFILE")), capsys, 1,
         (f"{flag}: no such file or directory", "NOSUCHFILE", "drop"))


def test_the_api_reports_the_ignored_flags_in_the_result(ws):
    res = api.convert(api.ConvertOptions(model_dir=ws / "base", medusa_model_dir=ws / "heads", output_dir=ws / "out",
                                         calib_max_seq_length=64, threads=2, quiet=True))
    assert res.warnings[0].startswith("--calib_max_seq_length, --threads: ignored, a float checkpoint")


def test_calibration_flags_without_calib_dataset_warn_on_verify(ws, capsys):
    err = _run(ws, ["verify", "--model_dir", str(ws / "base"), "--checkpoint_dir", str(ws / "nosuchckpt"),
                    "--calib_size", "4", "--quiet"], capsys, 1)
    assert "warning: --calib_size: ignored without --calib_dataset" in err


# == 5. the tokenizer a text calibration went through is recorded ============================================
def test_the_tokenizer_is_recorded_and_tells_a_different_one_from_different_samples(ws, capsys):
    calib = ws / "c.txt"
    calib.write_text(_words(6) + "\n" + _words(9, 3) + "\n")
    _run(ws, _convert(ws, "--qformat", "fp8", "--calib_dataset", str(calib), "--calib_size", "2",
                      "--tokenizer_dir", str(ws / "tok")), capsys, 0)
    rec = _record(ws)
    assert rec["tokenizer"]["path"] == str((ws / "tok").resolve()) and rec["tokenizer"]["name"] == "tok"
    assert rec["tokenizer"]["sha256"] == tokenizer_record(ws / "tok")["sha256"]
    assert "tokenizer.json" in rec["tokenizer"]["files"]
    assert recorded_tokenizer_matches(rec, ws / "tok") is None
    assert recorded_tokenizer_dir(rec, ws / "base") == (ws / "tok").resolve()
    same = shutil.copytree(ws / "tok", ws / "tok-copy")  # the same tokenizer elsewhere matches
    assert recorded_tokenizer_matches(rec, same) is None
    other = save_tiny_tokenizer(ws / "tok-other", V - 1)  # another vocabulary does not
    why = recorded_tokenizer_matches(rec, other)
    assert why and "tokenized with the tokenizer in" in why and str((ws / "tok").resolve()) in why
    assert rec["tokenizer"]["sha256"][:12] in why and "tok-other" in why
    shutil.rmtree(ws / "tok")  # gone: the base's folder is the one to try
    assert recorded_tokenizer_dir(rec, ws / "base") == ws / "base"


def test_a_calibration_read_back_from_json_keeps_what_reading_found(ws):
    from trtllm_medusa_ports.quant.calibrate import Calibration

    calib = ws / "c.jsonl"
    calib.write_text(_ids_line(CONTEXT + 5))
    samples, _ = read_calibration_samples(calib, ws / "base", size=1, max_seq_length=1000)
    cal = Calibration(source="s", cut=samples.cut, context=samples.context, notes=list(samples.notes),
                      tokenizer={"path": "/t", "sha256": "0" * 64})
    back = Calibration.from_json(cal.to_json())
    assert back.record() == cal.record() and back.record()["cut"] == 1 and back.record()["context"] == CONTEXT
    assert os.path.basename(back.record()["tokenizer"]["path"]) == "t"
