"""logging with --log_level on every command (issue 65, 4; trtllm_medusa_ports/machine/log.py): TensorRT-LLM's level names,
warnings and notes through the package's logger, the CLI showing them on stderr at the level asked, an API call
leaving the logger as it found it."""

import logging

import pytest

from trtllm_medusa_ports.cli import build_parser, main
from trtllm_medusa_ports.cli_flags.parsers import COMMAND_PARSERS
from trtllm_medusa_ports.machine import log

# tree's notes (a preset cut to the heads' depth) and a warning-level finding of check
_TREE = ["tree", "--choices", "mc_sim_7b_63", "--num_heads", "2"]


def test_every_command_takes_tensorrt_llms_level_names():
    assert list(log.LEVELS) == ["internal_error", "error", "warning", "info", "verbose", "debug"]
    for command in COMMAND_PARSERS:
        action = next(a for a in build_parser(command)._subparsers._group_actions[0].choices[command]._actions
                      if "--log_level" in a.option_strings)
        assert action.choices == list(log.LEVELS) and action.default is None, command


@pytest.mark.parametrize("level, notes_shown", [(None, True), ("info", True), ("warning", False), ("error", False)])
def test_the_level_decides_what_stderr_shows(capsys, level, notes_shown):
    rc = main([*_TREE, *(["--log_level", level] if level else [])])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip()  # the result is stdout's whatever the level
    assert ("note: " in err) is notes_shown, err


def test_a_warning_shows_at_warning_and_not_at_error(tmp_path, capsys):
    argv = ["verify", "--model_dir", str(tmp_path / "none"), "--checkpoint_dir", str(tmp_path / "none"),
            "--calib_size", "4"]  # warned of (ignored without --calib_dataset), then the missing base is the error
    assert main([*argv, "--log_level", "warning"]) == 1
    err = capsys.readouterr().err
    assert "warning: --calib_size: ignored without --calib_dataset" in err and "error: " in err
    assert main([*argv, "--log_level", "error"]) == 1
    err = capsys.readouterr().err
    assert "warning:" not in err and "error: " in err  # a command's own error is always said


def test_the_cli_leaves_the_logger_as_it_found_it_and_an_api_call_prints_nothing(capsys, caplog):
    from trtllm_medusa_ports import api

    package = logging.getLogger(log.NAME)
    before = (package.level, package.propagate, list(package.handlers))
    assert main(_TREE) == 0
    assert (package.level, package.propagate, list(package.handlers)) == before
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger=log.NAME):
        res = api.tree(api.TreeOptions("mc_sim_7b_63", num_heads=2))
    assert res.notes and capsys.readouterr().err == ""  # the records are the caller's to show
    assert (package.level, package.propagate, list(package.handlers)) == before


@pytest.mark.parametrize("lead", [["--log_level", "warning"], ["--log_level=warning"]])
def test_the_level_may_come_before_the_command(capsys, lead):
    """``trtllm-medusa --log_level warning tree ...`` (issue 76, D): the level before the command is the command's
    level, not an invalid command named 'warning'."""
    assert main([*lead, *_TREE]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "note: " not in err and "invalid choice" not in err
    assert main([*_TREE]) == 0 and "note: " in capsys.readouterr().err
