import re
import subprocess
import sys
from pathlib import Path

import pytest

from trtllm_medusa_ports import __version__
from trtllm_medusa_ports.cli import main


def test_demo_is_the_end_to_end_job(tmp_path, capsys):
    """The demo shows each step's start time and training's progress on stderr (issue 62, 3); its reports on
    stdout."""
    assert main(["demo", "--workdir", str(tmp_path / "demo")]) == 0
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert "logits parity     : PASS" in out and "greedy equivalence: PASS" in out
    assert "architecture MedusaForCausalLM, dtype float16" in out and "RESULT: OK" in out
    assert (tmp_path / "demo" / "port" / "checkpoint" / "rank1.safetensors").is_file()
    starts = [float(m) for m in re.findall(r"^\[\d/3\]\s+([\d.]+) s  ", err, re.M)]
    assert len(starts) == 3 and starts == sorted(starts), err[-2000:]
    # the demo is port on the embedded fixture (issue 78, 1): its stage lines and its summary
    assert "[3/3]" in err and "trtllm-medusa port " in err and "[5/6] verify: done in" in err
    assert "port: VERIFIED" in out and (tmp_path / "demo" / "port" / "serve" / "build.sh").is_file()
    assert "train heads: 100%" in err  # fit_heads' bar, not a silent minute
    # a long finding is cut after a whole word, and says so (issue 78: the demo cut findings mid-word)
    messages = [m.group(1) for m in re.finditer(r"^\s+(?:info|warning|error)\s+[a-z0-9-]+: (.*)$", out + err, re.M)]
    assert messages and all(len(m) <= 110 for m in messages)
    assert any(m.endswith(" ...") for m in messages), messages


def test_demo_computes_on_the_idle_cores(tmp_path, monkeypatch):
    """Every step of the demo runs under the thread rule of the computing commands (threads.default_threads):
    torch's default of a thread a core stalls every small operation when other work keeps the cores busy."""
    import torch

    import trtllm_medusa_ports.demo as demo
    import trtllm_medusa_ports.machine.threads as threads

    seen = []
    monkeypatch.setattr(threads, "default_threads", lambda: 1)
    monkeypatch.setattr(demo, "_run", lambda *a: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert demo.run_demo(tmp_path / "d", quiet=True) == 0
        assert seen == [1] and torch.get_num_threads() == 2  # the caller's threads back afterwards
    finally:
        torch.set_num_threads(before)


def test_a_quiet_demo_prints_nothing_on_stderr(tmp_path, capsys, monkeypatch):
    import trtllm_medusa_ports.demo as demo

    monkeypatch.setattr(demo, "train_heads", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("stop here")))
    with pytest.raises(RuntimeError, match="stop here"):
        demo.run_demo(tmp_path / "d", quiet=True)
    assert capsys.readouterr().err == ""


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "trtllm_medusa_ports", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == __version__
    r = subprocess.run([sys.executable, "-m", "trtllm_medusa_ports", "tree", "--list_presets"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "mc_sim_7b_63" in r.stdout.split()


def test_top_level_help_speaks_to_users_with_one_example_per_command(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "thin command line" not in out and "exit codes:" in out
    for command in ("check", "convert", "verify", "build", "train-heads", "tune-tree", "tree", "inspect-heads", "demo"):
        assert f"  trtllm-medusa {command} " in out or out.rstrip().endswith(f"trtllm-medusa {command}") or \
            f"  trtllm-medusa {command}\n" in out, command


def _said(parser, argv: list[str], capsys) -> tuple[int, str, str]:
    import pytest

    with pytest.raises(SystemExit) as e:
        parser.parse_args(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_a_command_parsed_alone_is_the_whole_parsers_command(capsys):
    """main builds only the parser of the command its line names first (cli.build_parser(only)): the same help,
    the same errors and the same namespace as the whole parser's."""
    from trtllm_medusa_ports.cli import build_parser
    from trtllm_medusa_ports.cli_flags.parsers import COMMAND_PARSERS

    whole = build_parser()
    assert list(COMMAND_PARSERS) == ["inspect-heads", "tree", "check", "convert", "verify", "train-heads",
                                     "tune-tree", "build", "deploy", "port", "demo"]
    for command in COMMAND_PARSERS:
        alone = build_parser(command)
        code, out, _ = _said(alone, [command, "--help"], capsys)
        assert (code, out) == _said(whole, [command, "--help"], capsys)[:2] and f"trtllm-medusa {command}" in out
        code, _, err = _said(alone, [command, "--no_such_flag"], capsys)
        assert code == 2 and err == _said(whole, [command, "--no_such_flag"], capsys)[2]
        assert "unrecognized arguments: --no_such_flag" in err or "the following arguments are required" in err
        # another command is not known to it: main gives such lines the whole parser
        other = next(c for c in COMMAND_PARSERS if c != command)
        assert _said(alone, [other], capsys)[0] == 2
    line = ["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--max_new_tokens", "5"]
    assert vars(build_parser("verify").parse_args(line)) == vars(whole.parse_args(line))
    # main: an unknown command still gets the whole parser's message, which lists every command
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["nope"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'nope'" in err and all(f"'{c}'" in err for c in COMMAND_PARSERS)


def test_the_user_guides_flag_tables_are_the_parsers():
    """docs/user-guide.md's flag tables are rendered from the commands' parsers (python -m
    trtllm_medusa_ports.cli_flags.tables --write): every flag of every command once, its default and help; a note
    below a table names only flags the command has."""
    import re

    from trtllm_medusa_ports.cli_flags import tables

    text = (Path(__file__).parent.parent / tables.DOCUMENT).read_text()
    assert tables.rendered_document(text) == text, "run python -m trtllm_medusa_ports.cli_flags.tables --write"
    parsers = tables._command_parsers()
    for command, parser in parsers.items():
        table = re.search(rf"<!-- flags:{command}:begin -->\n(.*?)\n<!-- flags:{command}:end -->", text, re.S).group(1)
        listed = re.findall(r"^\| `(--[\w-]+)`", table, re.M)
        flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.option_strings[0] != "-h"]
        assert listed == flags and len(set(listed)) == len(listed), command
        section = text[text.index(f"<!-- flags:{command}:end -->"):]
        section = section[:min(i for i in (section.find("\n### "), section.find("\n## "), len(section)) if i > 0)]
        known = {o for a in parser._actions for o in a.option_strings}
        for note in re.findall(r"^- `(--[\w-]+)", section, re.M):
            assert note in known, f"{command}: a note on {note}, which the command does not have"


@pytest.mark.parametrize("argv", [["check", "--model_dir", "x", "--jso"], ["check", "--model_dir", "x", "--js"],
                                  ["verify", "--model_dir", "x", "--checkpoint_dir", "y", "--max_new", "4"]])
def test_a_prefix_of_a_flag_is_not_taken_for_it(argv, capsys):
    """Issue 76, 4: allow_abbrev=False on every parser: --jso is no --json (it ran without printing JSON)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert f"unrecognized arguments: {argv[-1] if argv[-1] != '4' else '--max_new'}" in capsys.readouterr().err


def test_help_shows_every_default_and_an_unknown_flag_gets_its_commands_usage(capsys):
    """Issue 78, 3: --help hid the defaults (train-heads --steps, --lr, --num_heads, verify --max_new_tokens); an
    unknown flag printed the top-level usage; build --help listed 3 flags; the drop-in converter called itself
    trtllm-medusa."""
    from trtllm_medusa_ports import declared

    for command, (_, _, options) in declared.COMMANDS.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for o in options:
            d = o.flag_default
            if o.spellings and o.spellings[0].startswith("-") and d not in (None, False) and not isinstance(d, list) \
                    and "default" not in (o.help or ""):
                assert f"(default: {d})" in text or f"default: {d}" in text, (command, o.name)
    with pytest.raises(SystemExit):
        main(["train-heads", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "optimizer steps of the fit (default: 1000)" in text and "(default: 0.003)" in text
    with pytest.raises(SystemExit) as exc:
        main(["check", "--model_dir", "m", "--no_such_flag"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "trtllm-medusa check: error: unrecognized arguments: --no_such_flag" in err
    assert "usage: trtllm-medusa check" in err
    with pytest.raises(SystemExit) as exc:  # the demo's families are its --architecture's choices
        main(["demo", "--workdir", "d", "--architecture", "Qwen9"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "invalid choice: 'Qwen9'" in err and "Qwen2ForCausalLM" in err
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    assert "Every other flag goes to trtllm-build as it is" in capsys.readouterr().out
    script = Path(__file__).resolve().parents[1] / "convert" / "convert_checkpoint.py"
    run = subprocess.run([sys.executable, str(script), "--bogus"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "convert_checkpoint.py: error:" in run.stderr and "trtllm-medusa" not in run.stderr


def test_the_idle_cores_are_read_now_not_from_the_one_minute_load_average(monkeypatch):
    """threads.busy_elsewhere reads the tasks running now (/proc/loadavg's running/total, median of a few reads,
    this process not counted): right after a command ends the one-minute load average still counted it, and
    train-heads took one thread of two (1.5x slower)."""
    import os

    from trtllm_medusa_ports.machine import threads

    reads = iter(f"1.00 1.00 1.00 {n}/300 9" for n in (1, 3, 1, 1, 2))  # a passing burst is not counted
    assert threads.busy_elsewhere(interval=0, read=lambda: next(reads)) == 0
    lines = iter(["0.9 0.9 0.9 2/300 9"] * 5)
    assert threads.busy_elsewhere(interval=0, read=lambda: next(lines)) == 1
    assert threads.busy_elsewhere(read=lambda: "garbage") is None
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: 0)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))  # a command that ended: no longer counted
    import torch

    assert threads.default_threads() == min(torch.get_num_threads(), len(os.sched_getaffinity(0)))


def test_every_command_line_the_docs_print_parses():
    """Issue 78, 4: two user-guide lines were not runnable as printed (`convert ... --output_dir`, a flag in
    brackets): every `trtllm-medusa <command>` line of a shell block in the README and docs/ parses with that
    command's own parser, no flag unknown (trtllm-build's own flags after `build` excepted)."""
    import contextlib
    import io
    import shlex
    from pathlib import Path

    from trtllm_medusa_ports.cli import build_parser
    from trtllm_medusa_ports.cli_flags.parsers import COMMAND_PARSERS

    root = Path(__file__).resolve().parent.parent
    seen, bad = 0, []
    for doc in [root / "README.md", root / "benchmarks" / "README.md", *sorted((root / "docs").glob("*.md"))]:
        block, shell, joined = False, False, ""
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                block = not block
                shell = block and line.strip("`").strip() in ("", "bash", "sh", "console")
                continue
            if not shell:
                continue
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            full, joined = joined + line, ""
            m = re.search(r"trtllm-medusa ([a-z-]+)(.*)", full)
            if not m or m.group(1) not in COMMAND_PARSERS:
                continue
            command, rest = m.group(1), re.split(r"\s[|;&]+\s|\s#\s", m.group(2))[0]
            seen += 1
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    _, unknown = build_parser(command).parse_known_args([command, *shlex.split(rest)])
                if unknown and command != "build":
                    bad.append(f"{doc.name}:{n}: unknown {unknown}")
            except (SystemExit, ValueError):  # argparse's refusal; shlex's unclosed quote
                bad.append(f"{doc.name}:{n}: {full.strip()[:120]}")
    assert seen >= 20 and not bad, (seen, bad)
