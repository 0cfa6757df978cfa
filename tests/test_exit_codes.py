"""One exit-code rule for every command (issue 63, 5; issue 65, 2; docs/user-guide.md, "Exit codes"): 2 when the
command line alone is wrong, whatever the inputs hold; 1 when an input is wrong, missing or does not fit the flags
(could not run); 3 when the command ran and found a problem (check NOT COMPATIBLE, verify FAILED). Under --json every
failure is also one JSON object on stdout.

The usage cases name directories that do not exist: the command line's fault is found before any input is read,
so the same command line exits 2 whatever is on the disk."""

from __future__ import annotations

import pytest

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import ConversionError, PortError, TreeError
from trtllm_medusa_ports.quant import resolve_spec
from trtllm_medusa_ports.trees.tree import parse_choices

_CONVERT = ["convert", "--model_dir", "/nonexistent/base", "--medusa_model_dir", "/nonexistent/heads",
            "--output_dir", "/nonexistent/out"]
_VERIFY = ["verify", "--model_dir", "/nonexistent/base", "--checkpoint_dir", "/nonexistent/ckpt"]
_DEPLOY = ["deploy", "--checkpoint_dir", "/nonexistent/ckpt", "--tokenizer_dir", "/nonexistent/tok",
           "--output_dir", "/nonexistent/out"]
_TRAIN = ["train-heads", "--model_dir", "/nonexistent/base", "--output_dir", "/nonexistent/out"]

USAGE = {  # the command line alone is wrong: exit 2, and the message names the flag
    "tree-malformed": (["tree", "--choices", "[[0], [1"], "--medusa_choices: not a preset name"),
    "tree-not-a-list": (["tree", "--choices", "7"], "expected a list of paths"),
    "tree-bare-at": (["tree", "--choices", "@"], "'@' names no file"),
    "convert-typed-tree": ([*_CONVERT, "--medusa_choices", "[[0], [x]]"], "--medusa_choices"),
    "deploy-typed-tree": ([*_DEPLOY, "--medusa_choices", "[[0], [0,"], "--medusa_choices"),
    "verify-typed-tree": ([*_VERIFY, "--medusa_choices", "{}"], "expected a list of paths"),
    "convert-two-formats": ([*_CONVERT, "--qformat", "fp8", "--use_weight_only"], "ask for two formats"),
    "convert-kv-contradiction": ([*_CONVERT, "--kv_cache_dtype", "fp8", "--int8_kv_cache"], "contradict"),
    "convert-precision-alone": ([*_CONVERT, "--weight_only_precision", "int4"], "without --use_weight_only"),
    "convert-unsupported-flag": ([*_CONVERT, "--medusa_hidden_act", "gelu"], "only silu"),
    "verify-zero-tokens": ([*_VERIFY, "--max_new_tokens", "0"], "--max_new_tokens 0 must be at least 1"),
    "verify-zero-memory": ([*_VERIFY, "--max_memory", "0"], "--max_memory: 0.0 must be a number above 0"),
    "deploy-zero-batch": ([*_DEPLOY, "--max_batch_size", "0"], "0 must be at least 1"),
    "train-distill-range": ([*_TRAIN, "--distill", "1.5"], "--distill 1.5 must be between 0 and 1"),
    "train-zero-lr": ([*_TRAIN, "--lr", "0"], "must be a number above 0"),
    "missing-flag": (["verify", "--model_dir", "/nonexistent/base"], "--checkpoint_dir"),
}


@pytest.mark.parametrize("argv, says", list(USAGE.values()), ids=list(USAGE))
def test_the_command_line_alone_wrong_exits_2_before_any_input_is_read(argv, says, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert says in err and "Traceback" not in err, err
    assert "/nonexistent" not in err.partition("error:")[2].split("\n")[0], err  # no input was judged first


INPUT = {  # an input is wrong, or does not fit the flags: exit 1, naming the input
    "tree-file-missing": (["tree", "--choices", "@/nonexistent/tree.json"], "/nonexistent/tree.json"),
    "tree-deeper-than-heads": (["tree", "--choices", "[[0], [0, 0]]", "--num_heads", "1"],
                               "has depth 2 but there are only 1 Medusa heads"),
    "verify-no-checkpoint": (_VERIFY, "/nonexistent/ckpt"),
    "convert-no-base": (_CONVERT, "/nonexistent/base: no such directory"),
    "deploy-no-checkpoint": (_DEPLOY, "/nonexistent/ckpt"),
}


@pytest.mark.parametrize("argv, says", list(INPUT.values()), ids=list(INPUT))
def test_an_input_that_is_wrong_exits_1(argv, says, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and says in err and "Traceback" not in err, err


def test_the_api_says_which_errors_are_the_command_lines():
    """The library marks an error of a flag's own value (``usage``); an API caller gets the same class as before."""
    with pytest.raises(TreeError) as typed:
        parse_choices("[[0], [1")
    assert typed.value.usage and typed.value.to_dict()["usage"] is True
    with pytest.raises(TreeError) as in_file:
        parse_choices("@/nonexistent/tree.json")
    assert not in_file.value.usage
    with pytest.raises(ConversionError) as two:
        resolve_spec(qformat="fp8", use_weight_only=True)
    assert two.value.usage
    assert not PortError("x").usage


_CHECK = ["check", "--model_dir", "/nonexistent/base"]
JSON_COMMANDS = {  # every command with --json: an input failure, and a command line failure
    "inspect-heads": (["inspect-heads", "/nonexistent/heads"], ["inspect-heads", "/x", "--bogus"]),
    "tree": (["tree", "--choices", "@/nonexistent/tree.json"], ["tree", "--choices", "[[0], [1"]),
    "check": (_CHECK, [*_CHECK, "--tp_size", "x"]),
    "convert": (_CONVERT, [*_CONVERT, "--qformat", "fp8", "--use_weight_only"]),
    "verify": (_VERIFY, [*_VERIFY, "--max_new_tokens", "0"]),
    "train-heads": (_TRAIN, [*_TRAIN, "--lr", "0"]),
    "tune-tree": (["tune-tree", "--model_dir", "/nonexistent/base", "--medusa_model_dir", "/nonexistent/heads",
                   "--output", "/nonexistent/t.json"], ["tune-tree", "--model_dir", "/x"]),
    "deploy": (_DEPLOY, [*_DEPLOY, "--max_batch_size", "0"]),
}


@pytest.mark.parametrize("command", list(JSON_COMMANDS))
def test_under_json_every_failure_is_one_object_on_stdout(command, capsys):
    import json

    from trtllm_medusa_ports.errors import EXIT_CODES

    for argv, code in zip(JSON_COMMANDS[command], (1, 2), strict=True):
        try:
            rc = main([*argv, "--json"])
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code
        out, err = capsys.readouterr()
        assert rc == code, (argv, err)
        obj = json.loads(out)  # one object, nothing else on stdout
        assert isinstance(obj, dict) and obj["exit_code"] == code and obj["meaning"] == EXIT_CODES[code]
        assert {"error", "where", "fix", "exit_code"} <= set(obj) and obj["error"], obj
        assert "Traceback" not in err and err.strip(), err  # the human message stays on stderr
        if code == 1:
            assert "/nonexistent" in (obj["where"] or "") + obj["error"], obj
        else:
            assert obj["error"].split(":")[0] in err or obj["error"] in err, (obj, err)


def test_a_verdict_is_3_and_its_report_is_the_json(tmp_path, capsys):
    """check ran and found the base cannot be served: exit 3 (not 1, which says it could not run), and --json prints
    the report itself (compatible false), not an error object."""
    import json

    from trtllm_medusa_ports.errors import EXIT_FOUND

    base = tmp_path / "bloom"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({
        "architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2,
        "vocab_size": 100}))
    assert main(["check", "--model_dir", str(base), "--json"]) == EXIT_FOUND
    report = json.loads(capsys.readouterr().out)
    assert report["compatible"] is False and "exit_code" not in report
