"""deploy's generated files against a hostile checkpoint (issue 63, 1): a checkpoint is downloaded input, a generated
script is code. Every path and recorded string that reaches a script is a payload here; each script is checked by
its language's own reader and run against stub consumers, and no payload may run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_deploy import _filled, served  # noqa: F401  (the fixture)

from trtllm_medusa_ports.cli import main

#: one directory name holding every shell, Python, YAML and pbtxt metacharacter (a newline is refused: below)
HOSTILE = "ck $(touch PWNED1) `touch PWNED2`;touch PWNED3 'q' \"dq\" \\b * #"
#: the tree source config.json records, the text a docstring or comment would have carried
HOSTILE_SOURCE = 'x"""\nimport os; os.system("touch PWNED4")\n"""'.replace("\n", " ") + " $(touch PWNED5) `touch PWNED6`"

#: consumers the scripts exec, each recording its argv (JSON) and its working directory's file list
STUB = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "cwd": os.getcwd()}) + "\\n")
"""

#: the LLM API as llm_api.py imports it, recording what it was given
FAKE_TRTLLM = {
    "tensorrt_llm/__init__.py": "",
    "tensorrt_llm/_tensorrt_engine.py": """import json, os
class LLM:
    def __init__(self, **kw):
        spec = kw["speculative_config"]
        with open(os.environ["STUB_LOG"], "a") as f:
            f.write(json.dumps({"tool": "LLM", "model": kw["model"], "tokenizer": kw["tokenizer"],
                                "medusa_choices": spec.kw["medusa_choices"]}) + "\\n")
    def generate(self, prompts, params):
        return []
""",
    "tensorrt_llm/llmapi.py": """class _Kw:
    def __init__(self, **kw):
        self.kw = kw
KvCacheConfig = MedusaDecodingConfig = SamplingParams = _Kw
""",
}


def _hostile_inputs(served, root: Path) -> tuple[Path, Path]:  # noqa: F811
    ckpt, tok = served
    hostile_ckpt = root / HOSTILE / "ckpt"
    shutil.copytree(ckpt, hostile_ckpt)
    cfg = json.loads((hostile_ckpt / "config.json").read_text())
    cfg["medusa_ports"]["medusa_choices_from"] = HOSTILE_SOURCE
    (hostile_ckpt / "config.json").write_text(json.dumps(cfg))
    hostile_tok = root / HOSTILE / "tok"
    shutil.copytree(tok, hostile_tok)
    return hostile_ckpt, hostile_tok


def _payloads(*roots: Path) -> list[str]:
    return sorted(str(p) for r in roots for p in r.rglob("PWNED*"))


def _stubs(tmp_path: Path, bundle: dict) -> tuple[dict, Path]:
    """The consumers as stubs on PATH, TensorRT-LLM's examples/ and triton_backend/ directories, the log they write."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for tool in ("trtllm-build", "trtllm-medusa", "trtllm-serve", "mpirun", "python3"):
        (stubs / tool).write_text(STUB.replace("/usr/bin/env python3", sys.executable, 1))  # not itself
        (stubs / tool).chmod(0o755)
    (stubs / "examples").mkdir(exist_ok=True)
    (stubs / "examples" / "run.py").write_text("")  # the stub python3 runs in its place
    triton = tmp_path / "triton_backend"
    for model in bundle["triton"]["fill"]:
        (triton / "all_models" / "inflight_batcher_llm" / model).mkdir(parents=True, exist_ok=True)
    log = tmp_path / "stub.log"
    return {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
            "TRTLLM_EXAMPLES": str(stubs / "examples"), "TRTLLM_TRITON": str(triton)}, log


def _calls(log: Path) -> dict[str, list]:
    by_tool: dict[str, list] = {}
    for c in (json.loads(line) for line in log.read_text().splitlines()):
        by_tool.setdefault(c["tool"], []).append(c)
    log.unlink()
    return by_tool


def _run_scripts(out: Path, env: dict, work: Path, scripts: tuple[str, ...]) -> None:
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(out / script)], capture_output=True).returncode == 0, script
        done = subprocess.run(["bash", str(out / script)], cwd=work, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)


def _llm_api(out: Path, env: dict, work: Path, tmp_path: Path) -> None:
    """llm_api.py under a stand-in LLM API that records what it was given."""
    fake = tmp_path / "fake_trtllm"
    for name, text in FAKE_TRTLLM.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    done = subprocess.run([sys.executable, str(out / "llm_api.py"), "hello"], cwd=work, capture_output=True,
                          text=True, env={**env, "PATH": os.environ["PATH"], "PYTHONPATH": str(fake)})
    assert done.returncode == 0, done.stderr


def test_no_payload_runs_and_every_file_reads_back_as_the_value(served, tmp_path, capsys):  # noqa: F811
    from trtllm_medusa_ports.deploy.triton import fill_at

    ckpt, tok = _hostile_inputs(served, tmp_path)
    out = tmp_path / HOSTILE / "serve"
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]) == 0, \
        capsys.readouterr().err
    bundle = json.loads((out / "deploy.json").read_text())
    assert bundle["checkpoint_dir"] == "./checkpoint" and HOSTILE_SOURCE in bundle["tree"]["source"]
    env, log = _stubs(tmp_path, bundle)
    work = tmp_path / "cwd"
    work.mkdir()
    _run_scripts(out, env, work, ("build.sh", "run.sh", "serve.sh"))
    _llm_api(out, env, work, tmp_path)
    by_tool = _calls(log)
    # issue 78: run.sh says so where TRTLLM_EXAMPLES holds no run.py (a wrong directory), before running anything
    (tmp_path / "no-examples").mkdir()
    done = subprocess.run(["bash", str(out / "run.sh")], cwd=work, capture_output=True, text=True,
                          env={**env, "TRTLLM_EXAMPLES": str(tmp_path / "no-examples")})
    assert done.returncode == 1 and f"error: no run.py in {tmp_path / 'no-examples'}" in done.stderr, done.stderr
    assert not log.exists()
    # each consumer got the values as single words, exactly, and ran in the bundle (whose paths are relative)
    assert [c["argv"] for c in by_tool["trtllm-build"]] == [bundle["build"]["argv"][1:]]
    assert {c["cwd"] for c in by_tool["trtllm-build"] + by_tool["mpirun"] + by_tool["trtllm-serve"]} == {str(out)}
    mpirun = by_tool["mpirun"][0]["argv"]
    assert mpirun[mpirun.index("--engine_dir") + 1] == bundle["engine_dir"] == "./engine"
    assert by_tool["trtllm-serve"][0]["argv"][:1] == [bundle["engine_dir"]]
    llm = by_tool["LLM"][0]
    assert (llm["model"], llm["tokenizer"]) == (str(out / "engine"), str(out / "tokenizer"))
    assert llm["medusa_choices"] == bundle["tree"]["medusa_choices"]
    # Triton's fill_template.py splits on , and : and config.pbtxt quotes: fill.sh refuses this path, running nothing
    done = subprocess.run(["bash", str(out / "triton" / "fill.sh")], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "move the bundle to a plain path" in done.stderr and not log.exists()

    served_yaml = yaml.safe_load((out / "serve.yaml").read_text())
    assert served_yaml["speculative_config"]["medusa_choices"] == bundle["tree"]["medusa_choices"]
    for name in ("build.sh", "run.sh", "llm_api.py", "serve.sh"):  # comments and docstrings carry no input value
        assert "PWNED" not in "".join(ln for ln in (out / name).read_text().splitlines() if ln.lstrip().startswith("#"))
        assert "PWNED4" not in (out / name).read_text()

    # moved to a plain path, the Triton route fills there (issue 64: the bundle travels)
    moved = tmp_path / "moved" / "serve"
    shutil.move(str(out), str(moved))
    _run_scripts(moved, env, work, ("triton/fill.sh", "triton/launch.sh"))
    by_tool = _calls(log)
    fills = [c["argv"] for c in by_tool["python3"] if c["argv"][0].endswith("fill_template.py")]
    assert [a[-1] for a in fills] == list(fill_at(bundle["triton"], str(moved)).values())
    launch = [c["argv"] for c in by_tool["python3"] if c["argv"][0].endswith("launch_triton_server.py")]
    assert launch == [[str(Path(env["TRTLLM_TRITON"]) / "scripts" / "launch_triton_server.py"), "--world_size=2",
                       f"--model_repo={moved}/triton/model_repo"]]
    configs = _filled(bundle, moved)  # fill_template.py's model, parsed with Triton's ModelConfig protobuf
    assert configs["tensorrt_llm"].parameters["gpt_model_path"].string_value == str(moved / "engine")
    for model in ("preprocessing", "postprocessing"):
        assert configs[model].parameters["tokenizer_dir"].string_value == str(moved / "tokenizer")
    assert _payloads(tmp_path) == [] and not list(Path.cwd().glob("PWNED*"))


def test_the_bundle_travels_and_names_no_path_of_the_machine_that_wrote_it(served, tmp_path, capsys):  # noqa: F811
    """Issue 64, 3: copied elsewhere (as rsync -a or scp -r would, every link made a file), every route reads the
    copy's own checkpoint, tokenizer and engine; no generated file names a path of this machine."""
    ckpt, tok = served
    out = tmp_path / "serve"
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]) == 0
    generated = [p for p in out.rglob("*") if p.is_file() and p.parts[len(out.parts)] not in ("checkpoint", "tokenizer")]
    assert len(generated) == 8
    for p in generated:
        assert str(tmp_path) not in p.read_text() and "/tmp" not in p.read_text(), p
    bundle = json.loads((out / "deploy.json").read_text())
    there = tmp_path / "gpu-machine" / "bundle"
    shutil.copytree(out, there)  # files, not links
    shutil.rmtree(out)
    copied, given = (json.loads((d / "config.json").read_text()) for d in (there / "checkpoint", ckpt))
    assert given["medusa_ports"]["heads_source"].startswith("/")  # the converting machine's path, in the input
    given["medusa_ports"]["heads_source"] = Path(given["medusa_ports"]["heads_source"]).name
    assert copied == given  # the same config, with that path's name only
    for p in there.rglob("*"):  # every byte of the bundle, the copied inputs too
        assert not p.is_file() or str(tmp_path).encode() not in p.read_bytes(), p
    env, log = _stubs(tmp_path, bundle)
    work = tmp_path / "cwd"
    work.mkdir()
    _run_scripts(there, env, work, ("build.sh", "run.sh", "serve.sh", "triton/fill.sh", "triton/launch.sh"))
    _llm_api(there, env, work, tmp_path)
    by_tool = _calls(log)
    assert {c["cwd"] for c in by_tool["trtllm-build"] + by_tool["mpirun"] + by_tool["trtllm-serve"]} == {str(there)}
    assert (by_tool["LLM"][0]["model"], by_tool["LLM"][0]["tokenizer"]) == (str(there / "engine"),
                                                                            str(there / "tokenizer"))
    fills = [c["argv"][-1] for c in by_tool["python3"] if c["argv"][0].endswith("fill_template.py")]
    assert f"engine_dir:{there}/engine" in fills[0] and all(str(tmp_path / "serve") not in f for f in fills)


@pytest.mark.parametrize("where", ["checkpoint", "tokenizer", "source"])
def test_a_control_character_in_a_path_or_the_recorded_tree_source_is_refused(served, tmp_path, capsys,  # noqa: F811
                                                                               where):
    ckpt, tok = served
    if where == "checkpoint":
        ckpt = Path(shutil.copytree(ckpt, tmp_path / "ck\ntouch PWNED"))
    elif where == "tokenizer":
        tok = Path(shutil.copytree(tok, tmp_path / "tok\rx"))
    else:
        ckpt = Path(shutil.copytree(ckpt, tmp_path / "ck"))
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["medusa_ports"]["medusa_choices_from"] = "tree.json\ntouch PWNED"
        (ckpt / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "serve"
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]) == 1
    err = capsys.readouterr().err
    says = {"checkpoint": "the --checkpoint_dir path holds the control character '\\n'",
            "tokenizer": "the --tokenizer_dir path holds the control character '\\r'",
            "source": "medusa_ports.medusa_choices_from) holds the control character '\\n'"}[where]
    assert says in err and "Traceback" not in err
    assert not out.exists() and _payloads(tmp_path) == []


@pytest.mark.parametrize("case, says", [
    ("float32", "[dtype-float32] TensorRT-LLM refuses float32 with speculative decoding"),
    ("alibi", "[alibi-position-embedding]"),
    ("engine-is-checkpoint", "the build would write its config.json over the input's"),
    ("engine-in-tokenizer", "overlaps the --tokenizer_dir"),
    ("int32", "past the int32"),
    ("no-gpu-memory", "--gpu_memory_gb 0 leaves no memory"),
    ("kv-share", "TensorRT-LLM gives it"),
])
def test_deploy_refuses_what_build_or_the_engine_would_and_writes_nothing(served, tmp_path, capsys,  # noqa: F811
                                                                         case, says):
    """Issue 63, 3: the rules build and verify hold (compat/checkpoint.py), an engine directory apart from every
    input, sizes an int32 holds, a KV cache that fits the share TensorRT-LLM gives it."""
    ckpt, tok = served
    out = tmp_path / "serve"
    args = ["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]
    if case in ("float32", "alibi"):
        ckpt = Path(shutil.copytree(ckpt, tmp_path / "edited"))
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg.update(dtype="float32") if case == "float32" else cfg.update(position_embedding_type="alibi")
        (ckpt / "config.json").write_text(json.dumps(cfg))
        args[2] = str(ckpt)
    before = sorted(p.name for p in ckpt.iterdir())
    args += {"float32": [], "alibi": [], "engine-is-checkpoint": ["--engine_dir", str(ckpt)],
             "engine-in-tokenizer": ["--engine_dir", str(tok / "engine")], "int32": ["--max_batch_size", "2000000000"],
             "no-gpu-memory": ["--gpu_memory_gb", "0"],
             "kv-share": ["--gpu_memory_gb", "0.0027"]}[case]  # fits whole (2.65 MB), not in the 90 % KV share
    assert main(args) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not out.exists() and sorted(p.name for p in ckpt.iterdir()) == before


def test_deploy_overwrite_keeps_a_built_engine(served, tmp_path, capsys):  # noqa: F811
    ckpt, tok = served
    out = tmp_path / "serve"
    args = ["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]
    assert main(args) == 0
    (out / "engine").mkdir()
    (out / "engine" / "rank0.engine").write_bytes(b"built")
    capsys.readouterr()
    assert main(args + ["--overwrite"]) == 1
    assert "holds a built engine, which deploy did not write" in capsys.readouterr().err
    assert (out / "engine" / "rank0.engine").read_bytes() == b"built"


def test_the_recorded_tree_is_named_as_config_jsons_and_the_override_flag_alone_is_explained(served, tmp_path,  # noqa: F811
                                                                                             capsys):
    """Issue 63: a recorded tree the checkpoint cannot run is config.json's, not the user's; --override_medusa_choices
    without a tree says what it is for; the recorded tree passed again is said to be the recorded one (issue 64)."""
    ckpt, tok = served
    junk = Path(shutil.copytree(ckpt, tmp_path / "junk"))
    cfg = json.loads((junk / "config.json").read_text())
    cfg["medusa_ports"]["medusa_choices"] = [[0], [0, 0, 0, 0, 0, 0]]  # deeper than the checkpoint's heads
    (junk / "config.json").write_text(json.dumps(cfg))
    args = ["deploy", "--tokenizer_dir", str(tok), "--output_dir", str(tmp_path / "out")]
    assert main(args + ["--checkpoint_dir", str(junk)]) == 1
    err = capsys.readouterr().err
    assert "the tree config.json records (medusa_ports.medusa_choices) is not one this checkpoint can run" in err
    assert str(junk / "config.json") in err
    assert main(args + ["--checkpoint_dir", str(ckpt), "--override_medusa_choices"]) == 1
    assert "--override_medusa_choices runs a --medusa_choices other than the recorded tree" in capsys.readouterr().err
    assert main(args + ["--checkpoint_dir", str(ckpt), "--medusa_choices", "[[0],[1],[0,0],[0,1]]", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tree"]["source"] == "given (the tree recorded at conversion)"


def test_deploy_refuses_what_the_builds_load_refuses(tmp_path, store, capsys):
    """Issue 63, 3: a scale of a shape the engine's layer does not declare fails the build's load
    (quant/engine_load.py, which verify runs too), and a negated or NaN scale builds an engine that serves wrong
    tokens (verify fails it): deploy refuses both, naming the rank file, before writing; the checkpoint as convert
    wrote it deploys."""
    from conftest import convert_to, tiny_base
    from safetensors.torch import load_file, save_file
    from test_quant import WIDE, _calib, _heads

    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    base = tiny_base(store, "Qwen2ForCausalLM", **WIDE)
    vocab = tiny_config("Qwen2ForCausalLM").vocab_size
    ckpt = convert_to(tmp_path / "fp8", base, _heads(tmp_path, "Qwen2ForCausalLM", 128), dtype="float16",
                      qformat="fp8", calib_dataset=_calib(tmp_path, vocab), calib_size=6)
    tok = save_tiny_tokenizer(tmp_path / "tok", vocab)
    out = tmp_path / "serve"
    args = ["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]
    assert main([*args, "--output_dir", str(tmp_path / "as-written")]) == 0, capsys.readouterr().err  # not refused
    capsys.readouterr()
    good = load_file(str(ckpt / "rank0.safetensors"))
    name = "transformer.layers.0.attention.qkv.weights_scaling_factor"
    for change, says in ((lambda v: v.expand(2).contiguous(), f"{name} is float32 [2], but FP8Linear"),
                         # the engine divides by it: a sign flip serves wrong tokens (the check add-heads runs)
                         (lambda v: -v, f"scale {name} holds -"),
                         (lambda v: v * float("nan"), f"scale {name} holds nan")):
        save_file({**good, name: change(good[name])}, str(ckpt / "rank0.safetensors"), metadata={"format": "pt"})
        assert main(args) == 1
        err = capsys.readouterr().err
        assert says in err and "rank0.safetensors" in err and not out.exists(), err


def test_fill_sh_stops_at_its_first_failing_step(served, tmp_path, capsys):  # noqa: F811
    """Issue 64: a wrong TRTLLM_TRITON made fill.sh print its errors, then 'wrote model_repo' and exit 0 (its strict
    mode came only before its last line), so `fill.sh && launch.sh` launched an empty repository."""
    ckpt, tok = served
    out = tmp_path / "serve"
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]) == 0
    (tmp_path / "not-triton").mkdir()
    done = subprocess.run(["bash", str(out / "triton" / "fill.sh")], capture_output=True, text=True,
                          env={**os.environ, "TRTLLM_TRITON": str(tmp_path / "not-triton")})
    assert done.returncode != 0 and "wrote" not in done.stdout, done
    for script in ("build.sh", "run.sh", "serve.sh", "triton/fill.sh", "triton/launch.sh"):
        assert (out / script).read_text().splitlines()[1] == "set -euo pipefail", script


def _deploy(ckpt, tok, out) -> int:
    return main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)])


def test_the_bundle_holds_copies_and_an_edit_never_crosses(served, tmp_path):  # noqa: F811
    """Issue 76, 1: every file of checkpoint/ and tokenizer/ is a file of its own (a copy, or a reflink where the
    filesystem shares blocks): editing the bundle leaves the inputs as they were, and editing an input after deploy
    leaves the bundle as deploy wrote it (deploy.json and the scripts describe what build.sh builds)."""
    ckpt, tok = served
    out = tmp_path / "serve"
    assert _deploy(ckpt, tok, out) == 0
    for given, copy in [(p, out / "checkpoint" / p.name) for p in ckpt.iterdir()] + \
                       [(p, out / "tokenizer" / p.name) for p in tok.iterdir()]:
        assert os.stat(copy).st_ino != os.stat(given).st_ino and os.stat(copy).st_nlink == 1, copy
    rank = sorted(ckpt.glob("rank*.safetensors"))[0]
    before = rank.read_bytes()
    with open(out / "checkpoint" / rank.name, "r+b") as f:  # the bundle edited in place
        f.seek(100)
        f.write(b"\xff" * 16)
    assert rank.read_bytes() == before
    name = sorted(p.name for p in tok.iterdir())[0]
    shipped = (out / "tokenizer" / name).read_bytes()
    with open(tok / name, "ab") as f:  # the input edited after deploy
        f.write(b" ")
    assert (out / "tokenizer" / name).read_bytes() == shipped


@pytest.mark.parametrize("where, link", [("checkpoint", "../secret.txt"), ("tokenizer", "../secret.txt"),
                                         ("checkpoint", "/etc/hostname"), ("tokenizer", "sub/../../secret.txt")])
def test_a_link_out_of_an_input_is_refused_by_name(served, tmp_path, capsys, where, link):  # noqa: F811
    """A symlink in an input directory whose target lies outside it is never followed into the bundle (which is
    shipped to another machine): deploy exits 1 naming the link and its target, and writes nothing."""
    ckpt, tok = served
    (tmp_path / "secret.txt").write_text("private")
    root = Path(shutil.copytree(ckpt if where == "checkpoint" else tok, tmp_path / f"own-{where}"))
    (root / "sub").mkdir()
    os.symlink(link, root / "notes.txt")
    out = tmp_path / "serve"
    assert _deploy(root if where == "checkpoint" else ckpt, tok if where == "checkpoint" else root, out) == 1
    err = capsys.readouterr().err
    assert "notes.txt is a link to " in err and f"outside the {where} directory" in err and "Traceback" not in err
    assert "cp --remove-destination" in err
    assert not out.exists()


def test_a_link_within_an_input_is_copied_as_a_file(served, tmp_path):  # noqa: F811
    ckpt, tok = served
    root = Path(shutil.copytree(tok, tmp_path / "tok2"))
    first = sorted(p.name for p in root.iterdir())[0]
    os.symlink(first, root / "alias.txt")
    out = tmp_path / "serve"
    assert _deploy(ckpt, root, out) == 0
    copy = out / "tokenizer" / "alias.txt"
    assert not copy.is_symlink() and copy.read_bytes() == (root / first).read_bytes()


def test_a_hub_snapshot_whose_ref_or_file_leads_out_of_the_cache_is_refused(served, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A Hub cache is untrusted input too: a refs/main naming a folder outside the repository's, or a snapshot file
    linking out of it, is refused by name (never read, never shipped)."""
    from test_hub import _cache_repo

    ckpt, tok = served
    hf_home = tmp_path / "hf"
    snapshot = _cache_repo(hf_home, "acme/tok", tok)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.txt").write_text("private")
    os.symlink(os.path.relpath(tmp_path / "secret.txt", snapshot), snapshot / "notes.txt")
    assert _deploy(ckpt, "acme/tok", tmp_path / "serve") == 1
    err = capsys.readouterr().err
    assert "notes.txt is a link to" in err and "outside the tokenizer directory" in err
    os.unlink(snapshot / "notes.txt")
    assert _deploy(ckpt, "acme/tok", tmp_path / "serve") == 0  # the cache's own links (into blobs/) are its files
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(snapshot, elsewhere)
    refs = hf_home / "hub" / "models--acme--tok" / "refs" / "main"
    refs.write_text(os.path.relpath(elsewhere, snapshot.parent))  # a ref leading out of the repository's folder
    assert _deploy(ckpt, "acme/tok", tmp_path / "serve2") == 1
    err = capsys.readouterr().err
    assert "outside its folder in the Hub cache" in err and "refs/main" in err and not (tmp_path / "serve2").exists()


@pytest.mark.parametrize("key, value, says", [
    ("num_medusa_heads", 10**12, "num_medusa_heads is 1000000000000, but the rank files hold 2 head(s) numbered 0, 1"),
    ("num_medusa_heads", 1, "num_medusa_heads is 1, but the rank files hold 2 head(s) numbered 0, 1"),
    ("num_medusa_layers", 3, "num_medusa_layers is 3, but the rank files hold 1 ResBlock layer(s) per head numbered 0"),
])
def test_a_head_count_the_rank_files_do_not_hold_is_refused_by_every_reader(served, tmp_path, capsys, key, value,  # noqa: F811
                                                                          says):
    """Issue 76, 3: config.json's head counts against the heads the rank files hold, judged once
    (files/checkpoint.py check_medusa_heads) for deploy, verify and build: exit 1 naming both, nothing written."""
    ckpt, tok = served
    own = Path(shutil.copytree(ckpt, tmp_path / "ck"))
    cfg = json.loads((own / "config.json").read_text())
    cfg[key] = value
    (own / "config.json").write_text(json.dumps(cfg))
    assert _deploy(own, tok, tmp_path / "serve") == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not (tmp_path / "serve").exists()


@pytest.mark.parametrize("relabel", ["stages-swapped", "pp-read-as-tp", "stage-emptied"])
def test_rank_files_out_of_their_stage_are_refused_by_every_reader(qwen2_base, qwen2_heads, tmp_path, capsys,
                                                                  relabel):
    """Rank files renamed between pipeline stages, or a pp_size 2 mapping read as tp_size 2 (issue 76, D:
    dp_ckpt_pp_world_inconsistent, vt_pp_relabel): deploy and verify refuse them naming the rank file and what its
    stage lacks (files/checkpoint.py check_stages), where deploy wrote a bundle of them."""
    from conftest import convert_to
    from safetensors.torch import save_file

    ckpt = convert_to(tmp_path / "ck", qwen2_base, qwen2_heads, pp_size=2, dtype="float16")
    r0, r1 = ckpt / "rank0.safetensors", ckpt / "rank1.safetensors"
    if relabel == "stages-swapped":
        r0.rename(ckpt / "x")
        r1.rename(r0)
        (ckpt / "x").rename(r1)
    elif relabel == "pp-read-as-tp":
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["mapping"].update(tp_size=2, pp_size=1)
        (ckpt / "config.json").write_text(json.dumps(cfg))
    else:
        save_file({}, r1)
    says = {"stages-swapped": "rank0.safetensors: rank0.safetensors is of the first pipeline stage",
            "pp-read-as-tp": "rank1.safetensors: rank1.safetensors is of the first pipeline stage (tp_size 2, pp_size 1)",
            "stage-emptied": "rank1.safetensors: the rank file holds no tensors"}[relabel]
    assert _deploy(ckpt, qwen2_base, tmp_path / "serve") == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not (tmp_path / "serve").exists(), err
    assert main(["verify", "--model_dir", str(qwen2_base), "--checkpoint_dir", str(ckpt), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


@pytest.mark.parametrize("content, says", [
    (b"", "JSONDecodeError"), (b"{}", "no usable tokenizer"), (b"null", "no usable tokenizer"),
    (b'{"version": "1.0", "mod', "JSONDecodeError"),
], ids=["empty", "braces", "null", "truncated"])
def test_a_tokenizer_that_does_not_load_is_refused_before_the_bundle(served, tmp_path, capsys, content, says):  # noqa: F811
    """dp_tok_empty_json (issue 76, D): deploy loads the tokenizer as every route will, so an empty or damaged
    tokenizer.json is refused naming the directory, not found on the GPU machine; nothing is written."""
    ckpt, tok = served
    own = Path(shutil.copytree(tok, tmp_path / "tok-own"))
    (own / "tokenizer.json").write_bytes(content)
    assert _deploy(ckpt, own, tmp_path / "serve") == 1
    err = capsys.readouterr().err
    assert f"{own}: no usable tokenizer" in err and says in err and "Traceback" not in err
    assert not (tmp_path / "serve").exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(served, tmp_path, capsys):  # noqa: F811
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer

    ckpt, _ = served
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    big = save_tiny_tokenizer(tmp_path / "big", vocab + 10)
    assert _deploy(ckpt, big, tmp_path / "serve") == 1
    err = capsys.readouterr().err
    assert f"the tokenizer has {vocab + 10} tokens, but the checkpoint's vocab_size is {vocab}" in err
