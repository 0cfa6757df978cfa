"""The Python API (trtllm_medusa_ports/api.py): its options default as the flags do, its results print as
`--json` does, its errors carry rule, where, what and fix, and docs/api.md's pipeline runs as written."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.cli import build_parser, main
from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

ROOT = Path(__file__).resolve().parent.parent

#: option field -> the parser's dest, where the two names differ
RENAMED = {"max_draft_len": "max_medusa_token_len", "matmul_dtype": "fit_dtype", "data_check": "no_data_check"}
#: fields with no flag of the same meaning (given by the pipeline, or read from several flags)
NO_FLAG = {"prompts", "fit", "calibration", "fast_path", "stop_after", "args", "output", "schedule", "warmup",
           "weight_decay"}


def _defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _norm(v):
    return str(v) if isinstance(v, Path) else v


@pytest.mark.parametrize("command, argv, classes", [
    ("convert", ["--model_dir", "m", "--medusa_model_dir", "h"], [api.ConvertOptions]),
    ("check", ["--model_dir", "m"], [api.CheckOptions]),
    ("verify", ["--model_dir", "m", "--checkpoint_dir", "c"], [api.VerifyOptions]),
    ("train-heads", ["--model_dir", "m", "--output_dir", "o"], [api.TrainOptions, api.FitOptions]),
    ("tune-tree", ["--model_dir", "m", "--medusa_model_dir", "h", "--output", "t.json"], [api.TuneOptions]),
    ("tree", ["--choices", "mc_sim_7b_63"], [api.TreeOptions]),
])
def test_every_option_defaults_as_its_flag_does(command, argv, classes):
    ns = build_parser().parse_args([command, *argv])
    compared = 0
    for cls in classes:
        for name, default in _defaults(cls).items():
            dest = RENAMED[name] if hasattr(ns, RENAMED.get(name, "")) else name
            if name in NO_FLAG or not hasattr(ns, dest):
                continue
            flag = getattr(ns, dest)
            if command == "train-heads" and name == "batch_size":
                flag = flag or None  # --batch_size 0 means every position: None in FitOptions
            if command == "convert" and name == "dtype":
                flag = flag or "float16"  # no --dtype: float16 (None only tells add-heads a typed float16 apart)
            if command == "convert" and name == "moe_ep_size":
                flag = 1 if flag == -1 else flag  # upstream's -1: no expert parallelism
            assert _norm(default) == _norm(flag), f"{command}: {cls.__name__}.{name} = {default!r}, flag {flag!r}"
            compared += 1
    assert compared >= 3, compared  # the comparison really ran over the command's flags
    assert api.ConvertOptions(model_dir=Path("m"), medusa_model_dir=Path("h")).dtype == "float16"
    assert api.FitOptions().num_heads == 4 and api.FitOptions().distill == 0.0 and not api.FitOptions().dense_updates


def test_the_api_classes_are_made_from_the_one_declaration():
    """Issue 65, 5: each options class has exactly the fields declared for it (declared.py), with the declared
    defaults; a field a stage class (convert.ConvertOptions, heads/train.py) adds without a declaration fails here."""
    from trtllm_medusa_ports import declared

    names = ["ConvertOptions", "AddHeadsOptions", "CheckOptions", "VerifyOptions", "TrainOptions", "FitOptions",
             "TuneOptions", "TreeOptions", "DeployOptions", "BuildOptions"]
    for name in names:
        cls, opts = getattr(api, name), {o.name: o for o in declared.owned(name)}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert set(fields) == set(opts), (name, set(fields) ^ set(opts))
        for field_name, f in fields.items():
            o = opts[field_name]
            if o.factory is not None:
                assert f.default_factory is not dataclasses.MISSING, (name, field_name)
            else:
                assert f.default == o.default or (f.default is dataclasses.MISSING and o.default is declared.REQUIRED), (
                    name, field_name, f.default, o.default)
        assert name in api._SPECS and set(api._SPECS[name]) == set(opts), name
    # a flag's help is the field's documentation
    assert "``max_new_tokens`` (--max_new_tokens): greedy tokens per prompt" in api.VerifyOptions.__doc__
    assert [f.name for f in dataclasses.fields(api.DeployOptions)][:3] == ["checkpoint_dir", "tokenizer_dir",
                                                                           "output_dir"]


def _json(capsys, argv) -> tuple[int, dict]:
    rc = main(argv + ["--json"])
    return rc, json.loads(capsys.readouterr().out)


def _same(a: dict, b: dict, timing=("seconds", "corpus_seconds", "fit_seconds")) -> None:
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))
    for k in timing:
        a.pop(k, None)
        b.pop(k, None)
    assert a == b


def test_results_are_what_the_commands_print_with_json(tmp_path, store, capsys):
    base = tiny_base(store, "Qwen2ForCausalLM")
    c = tiny_config("Qwen2ForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=3), tmp_path / "heads")

    rc, printed = _json(capsys, ["check", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--tp_size", "2",
                                 "--max_batch_size", "2", "--max_seq_len", "64"])
    res = api.check(api.CheckOptions(model_dir=base, medusa_model_dir=heads, tp_size=2, max_batch_size=2,
                                     max_seq_len=64))
    assert rc == 0 and res.compatible and len(printed["memory"]["kv_cache_bytes"]) == 2
    _same(res.to_dict(), printed)

    rc, printed = _json(capsys, ["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                                 str(tmp_path / "cli"), "--tp_size", "2", "--quiet"])
    res = api.convert(api.ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "api",
                                         tp_size=2, quiet=True))
    assert rc == 0 and printed["config"]["dtype"] == "float16"
    printed["output_dir"] = str(tmp_path / "api")
    printed["build_command"] = printed["build_command"].replace(str(tmp_path / "cli"), str(tmp_path / "api"))
    _same(res.to_dict(), printed)

    argv = ["verify", "--model_dir", str(base), "--checkpoint_dir", str(tmp_path / "api"), "--prompt_ids", "5,9,13",
            "--max_new_tokens", "4", "--medusa_choices", "[[0],[1],[0,0]]", "--quiet"]
    rc, printed = _json(capsys, argv)
    report = api.verify(api.VerifyOptions(model_dir=base, checkpoint_dir=tmp_path / "api",
                                          prompts=api.PromptInputs(prompt_ids=[[5, 9, 13]]), max_new_tokens=4,
                                          medusa_choices="[[0],[1],[0,0]]", quiet=True))
    assert rc == 0 and report.ok
    _same(report.to_dict(), printed)

    rc, printed = _json(capsys, ["inspect-heads", str(heads)])
    _same(api.inspect_heads(heads).to_dict(), printed)
    assert printed["num_heads"] == 2

    rc, printed = _json(capsys, ["tree", "--choices", "mc_sim_7b_63", "--num_heads", "2"])
    tree = api.tree(api.TreeOptions("mc_sim_7b_63", num_heads=2))
    _same(tree.to_dict(), printed)
    assert isinstance(tree.tree, api.MedusaTree) and tree.notes


def test_train_and_tune_results_are_what_the_commands_print(tmp_path, store, capsys):
    base = tiny_base(store, "LlamaForCausalLM")
    vocab = tiny_config("LlamaForCausalLM").vocab_size
    ids = ";".join(",".join(str((7 * i + 3 * j) % vocab) for i in range(4)) for j in range(24))
    common = ["--num_heads", "2", "--steps", "3", "--batch_size", "16", "--new_tokens", "6", "--quiet"]
    rc, printed = _json(capsys, ["train-heads", "--model_dir", str(base), "--output_dir", str(tmp_path / "h1"),
                                 "--prompt_ids", ids, *common])
    prompts = api.PromptInputs(prompt_ids=[[(7 * i + 3 * j) % vocab for i in range(4)] for j in range(24)])
    res = api.train_heads(api.TrainOptions(model_dir=base, output_dir=tmp_path / "h2", prompts=prompts,
                                           new_tokens=6, fit=api.FitOptions(num_heads=2, steps=3, batch_size=16,
                                                                            quiet=True)))
    printed["output_dir"] = str(tmp_path / "h2")
    _same(res.to_dict(), printed)
    # 24 sequences: every 20th (one) held out, measured per head at the end beside the last training batch
    assert res.heldout_sequences == 1 and len(res.heldout_top1) == 2 and res.heldout_positions > 0
    assert res.positions + res.heldout_positions == printed["positions"] + printed["heldout_positions"]
    assert "held out (1 sequences" in res.summary() and "(training batch)" in res.summary()

    argv = ["tune-tree", "--model_dir", str(base), "--medusa_model_dir", str(tmp_path / "h2"), "--prompt_ids",
            ids, "--new_tokens", "6", "--max_nodes", "4", "--output", str(tmp_path / "t1.json"), "--quiet"]
    rc, printed = _json(capsys, argv)
    tuned = api.tune_tree(api.TuneOptions(model_dir=base, medusa_model_dir=tmp_path / "h2", prompts=prompts,
                                          new_tokens=6, max_nodes=4, output=tmp_path / "t2.json", quiet=True))
    printed["output"] = str(tmp_path / "t2.json")
    _same(tuned.to_dict(), printed)
    assert json.loads((tmp_path / "t2.json").read_text()) == tuned.paths


def test_errors_carry_rule_where_what_and_fix(tmp_path, store):
    base = tiny_base(store, "Qwen2ForCausalLM")
    c = tiny_config("Qwen2ForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=3), tmp_path / "heads")
    with pytest.raises(api.PortError) as e:
        api.convert(api.ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "o",
                                       medusa_choices="[[0], [0, 0], [0, 0, 0]]"))
    d = e.value.to_dict()
    assert d["rule"] == "tree-deeper-than-heads" and d["rules"] == ["tree-deeper-than-heads"]
    assert d["error"] == "ConversionError" and "depth 3" in d["what"] and d["fix"]
    assert not (tmp_path / "o").exists()
    with pytest.raises(api.PortError) as e:
        api.inspect_heads(tmp_path / "nowhere")
    assert e.value.rule is None and e.value.where and e.value.fix
    with pytest.raises(api.PortError, match="--threads 0"):
        api.verify(api.VerifyOptions(model_dir=base, checkpoint_dir=tmp_path, threads=0))


def test_the_documented_pipeline_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/api.md's example as a script run from an empty directory, in this process: what it proves is the
    script (a fresh interpreter importing the package is test_importing_the_api_needs_no_torch's and
    tests/test_cli.py's); a subprocess would add 5 s of imports."""
    import runpy

    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1 and "api.check" in blocks[0] and "api.verify" in blocks[0]
    script = tmp_path / "pipeline.py"
    script.write_text(blocks[0])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "tokens per step until the end token:" in out and "'rule': 'tree-deeper-than-heads'" in out
    assert (tmp_path / "api-example" / "ckpt" / "rank1.safetensors").is_file()


def test_importing_the_api_needs_no_torch_and_nothing_imports_tensorrt_llm_outside_engine():
    """One fresh interpreter for both (each start costs the imports): the API's options without torch, then the
    command line, convert, verify and the engine package without tensorrt_llm."""
    code = ("import sys; from trtllm_medusa_ports import api; api.ConvertOptions; print('torch' in sys.modules); "
            "import trtllm_medusa_ports.cli, trtllm_medusa_ports.conversion.convert, trtllm_medusa_ports.verify, "
            "trtllm_medusa_ports.engine, trtllm_medusa_ports.engine.registry; "
            "print(any(m.startswith('tensorrt_llm') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_every_promised_name_exists_and_the_cli_calls_the_api():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    cli = (ROOT / "trtllm_medusa_ports" / "cli.py").read_text()
    for fn in ("check", "convert", "add_heads", "verify", "train_heads", "tune_tree", "tree", "inspect_heads", "build"):
        assert re.search(rf"from trtllm_medusa_ports\.api import [^\n]*\b{fn}\b", cli), fn


def test_one_spelling_per_text_input_on_every_command(tmp_path):
    parser = build_parser()
    for command, required in (("check", ["--model_dir", "m"]), ("verify", ["--model_dir", "m", "--checkpoint_dir", "c"]),
                              ("train-heads", ["--model_dir", "m", "--output_dir", "o"]),
                              ("tune-tree", ["--model_dir", "m", "--medusa_model_dir", "h", "--output", "t"])):
        for flag, value, dest, want in (("--prompt", "hi", "prompt", ["hi"]),
                                        ("--prompts_file", "p.txt", "prompts_file", "p.txt"),
                                        ("--prompt_ids", "1,2;3", "prompt_ids", "1,2;3"),
                                        ("--data", "d.jsonl", "data", "d.jsonl")):
            ns = parser.parse_args([command, *required, flag, value])
            assert getattr(ns, dest) == want, (command, flag)
        with pytest.raises(SystemExit):  # one source at a time
            parser.parse_args([command, *required, "--prompt", "a", "--prompt_ids", "1"])
    # upstream-era spelling kept where the command had it
    assert parser.parse_args(["train-heads", "--model_dir", "m", "--output_dir", "o", "--prompts", "p"]).prompts_file == "p"
