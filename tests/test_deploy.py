"""The commands a checkpoint is built and run with (trtllm_medusa_ports/deploy): which build command, the Medusa
mode flag, the XQA JIT switch, and that convert and verify end by naming the build command."""

import json
import shlex
from pathlib import Path

import pytest
from conftest import tiny_base
from standin_import import standin_file
from test_engine import trtllm  # noqa: F401  (the stand-in fixture)
from test_quant import _heads

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.deploy.commands import (
    build_argv,
    build_line,
    build_tool,
    environment,
    needs_xqa_jit,
    world_size,
)
from trtllm_medusa_ports.verify import verify


def _cfg(arch="MedusaPortsGPTNeoXForCausalLM", heads=8, kv=8, hidden=1024, **kw):
    return {"architecture": arch, "num_attention_heads": heads, "num_key_value_heads": kv, "hidden_size": hidden,
            "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}, **kw}


def test_our_classes_build_with_trtllm_medusa_build_and_upstreams_with_trtllm_build():
    """trtllm-build looks architecture up in MODEL_MAP (tensorrt_llm/commands/build.py): our MedusaPorts names are not
    there; the 1.x builder turns Medusa on only with --speculative_decoding_mode medusa (tensorrt_llm/builder.py)."""
    ours = build_argv(_cfg(), "/ck", "/eng", max_batch_size=8, max_seq_len=4096, max_input_len=None)
    assert ours == ["trtllm-medusa", "build", "--checkpoint_dir", "/ck", "--output_dir", "/eng",
                    "--speculative_decoding_mode", "medusa", "--max_batch_size", "8", "--max_seq_len", "4096"]
    assert build_tool(_cfg(arch="MedusaForCausalLM")) == "trtllm-build"
    assert build_argv(_cfg(arch="MedusaForCausalLM"), "c", "e")[:1] == ["trtllm-build"]
    assert world_size(_cfg()) == 2 and world_size({"mapping": {"tp_size": 2, "pp_size": 3}}) == 6


@pytest.mark.parametrize("heads, kv, hidden, needed", [
    (8, 8, 1024, False),   # head size 128, group 1: the runner's JIT kernels (group divides 64)
    (12, 4, 768, True),    # head size 64, group 3: precompiled picked (3 does not divide 64), none for 64: JIT only
    (24, 8, 3072, False),  # head size 128, group 3: the precompiled head-size-128 kernels serve it
])
def test_the_xqa_jit_switch_is_set_where_only_the_jit_kernels_serve(heads, kv, hidden, needed):
    cfg = _cfg(heads=heads, kv=kv, hidden=hidden)
    assert needs_xqa_jit(cfg) is needed
    line = build_line(cfg, "/c d")
    assert line.startswith("TRTLLM_ENABLE_XQA_JIT=1 ") is needed
    assert shlex.split(line)[int(needed):] == ["trtllm-medusa", "build", "--checkpoint_dir", "/c d", "--output_dir",
                                               "ENGINE_DIR", "--speculative_decoding_mode", "medusa"]
    assert "'/c d'" in line  # quoted for the shell


@pytest.mark.parametrize("heads, kv, hidden, kv_algo", [(64, 1, 8192, None), (48, 1, 6144, "FP8"),
                                                       (48, 1, 6144, None), (40, 1, 5120, None)])
def test_the_xqa_jit_switch_is_off_where_only_the_precompiled_kernels_serve(heads, kv, hidden, kv_algo):
    """Group 64 (any cache), and StarCoder-15B's 48 with an FP8 cache on SM 9.0: the runner would pick JIT kernels
    that take at most 32 query heads per KV head; the scripts run with TRTLLM_ENABLE_XQA_JIT=0 (issue 57, m5). Groups
    48 and 40 with a float cache: 1.2's runner picks the precompiled kernels, the only ones that take them; the
    switch pins them, should the default move to JIT (issue 64, 5)."""
    cfg = _cfg(heads=heads, kv=kv, hidden=hidden, quantization={"kv_cache_quant_algo": kv_algo})
    assert environment(cfg) == {"TRTLLM_ENABLE_XQA_JIT": "0"} and not needs_xqa_jit(cfg)
    assert build_line(cfg, "/c").startswith("TRTLLM_ENABLE_XQA_JIT=0 trtllm-medusa build ")
    from trtllm_medusa_ports.deploy.commands import jit_only_note

    assert "A JIT-only runner takes at most 32 query heads per KV head" in jit_only_note(cfg)
    assert jit_only_note(_cfg(heads=12, kv=4, hidden=1536)) is None  # group 3: the JIT kernels take it too


def test_convert_and_verify_end_by_naming_the_build_command(tmp_path, store, capsys):
    base = tiny_base(store, "GPTNeoXForCausalLM")
    ckpt = tmp_path / "ck"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir",
                 str(_heads(tmp_path, "GPTNeoXForCausalLM", 64)), "--output_dir", str(ckpt), "--dtype", "float16",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    cfg = json.loads((ckpt / "config.json").read_text())
    line = build_line(cfg, ckpt)
    assert out.rstrip().endswith(f"Build it with: {line}") and "trtllm-medusa build" in line
    assert "--speculative_decoding_mode medusa" in line
    rep = verify(base, ckpt, max_new_tokens=2)
    assert rep.build_command == line and f"build with        : {line}" in rep.render()
    assert rep.to_dict()["build_command"] == line


# -- trtllm-medusa deploy ------------------------------------------------------------------------------------------
@pytest.fixture
def served(tmp_path, store):
    """A tp 2 float16 checkpoint converted for a tree of 4 nodes, and a tokenizer directory."""
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    base = tiny_base(store, "Qwen2ForCausalLM")
    vocab = tiny_config("Qwen2ForCausalLM").vocab_size
    ckpt = tmp_path / "ckpt"
    heads = _heads(tmp_path, "Qwen2ForCausalLM", tiny_config("Qwen2ForCausalLM").hidden_size)
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads),
                 "--output_dir", str(ckpt), "--tp_size", "2", "--dtype", "float16", "--max_draft_len", "6",
                 "--medusa_choices", "[[0],[1],[0,0],[0,1]]", "--quiet"]) == 0
    save_tiny_tokenizer(tmp_path / "tok", vocab)
    return ckpt, tmp_path / "tok"


_run_py = standin_file("examples_run.py", "standin_examples_run")


def _exec_line(script: str) -> list[str]:
    """The script's command as the shell splits it (the examples directory left as a variable)."""
    line = next(ln for ln in script.splitlines() if ln.startswith("exec "))
    return shlex.split(line.removeprefix("exec ").replace('"${TRTLLM_EXAMPLES}/run.py"', "EXAMPLES/run.py"))


def test_deploy_writes_the_build_the_run_and_what_they_rest_on(served, tmp_path, capsys):
    import subprocess

    ckpt, tok = served
    out = tmp_path / "serve"
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out),
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    bundle = json.loads((out / "deploy.json").read_text())
    written = sorted(str(p.relative_to(out)) + "/" * p.is_dir() for p in out.rglob("*")
                     if p.parent == out or p.parent.name == "triton")
    assert printed == bundle and written == sorted(bundle["files"] + ["triton/"]) == [
        "build.sh", "checkpoint/", "deploy.json", "llm_api.py", "run.sh", "serve.sh", "serve.yaml", "tokenizer/",
        "triton/", "triton/fill.sh", "triton/launch.sh"]
    # what the routes read is in the bundle: copies of the inputs (never the same files: an edit would cross)
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == sorted(p.name for p in ckpt.iterdir())
    assert sorted(p.name for p in (out / "tokenizer").iterdir()) == sorted(p.name for p in tok.iterdir())
    assert not any((out / "checkpoint" / p.name).samefile(p) for p in ckpt.iterdir())
    assert all((out / "checkpoint" / p.name).read_bytes() == p.read_bytes() for p in ckpt.glob("*.safetensors"))
    compile((out / "llm_api.py").read_text(), "llm_api.py", "exec")  # Python reads it
    for script in ("build.sh", "run.sh", "serve.sh", "triton/fill.sh", "triton/launch.sh"):  # executable, bash reads them
        assert (out / script).stat().st_mode & 0o111
        assert subprocess.run(["bash", "-n", str(out / script)], capture_output=True).returncode == 0
    build = _exec_line((out / "build.sh").read_text())
    # Qwen2 with its own heads at pp 1: upstream's MedusaForCausalLM, which plain trtllm-build builds; the paths are
    # the bundle's, where the script runs
    assert 'cd "$(dirname "$0")"' in (out / "build.sh").read_text()
    assert build == ["trtllm-build", "--checkpoint_dir", "./checkpoint", "--output_dir", "./engine",
                     "--speculative_decoding_mode", "medusa", "--max_batch_size", "8", "--max_input_len", "128",
                     "--max_seq_len", "256", "--max_num_tokens", "128"]
    assert bundle["serving"] == {"max_batch_size": 8, "max_input_len": 128, "max_seq_len": 256, "max_num_tokens": 128}
    assert bundle["serving_from"] == {"max_batch_size": "the default 8", "max_seq_len": "the base's context: "
                                      "max_position_embeddings 256 of the checkpoint's config.json"}
    run_script = (out / "run.sh").read_text()
    run = _exec_line(run_script)
    assert run[:5] == ["mpirun", "-n", "2", "--allow-run-as-root", "python3"]  # world size 2: one MPI rank each
    assert run[5] == "EXAMPLES/run.py" and run[-2:] == ["--input_text", "$@"]
    args, choices = _run_py.medusa_run([*run[6:-1], "a prompt"])  # run.py's own flags and Medusa assertions
    assert choices == [[0], [1], [0, 0], [0, 1]] and args.temperature == 1.0 and args.top_k == 1
    assert args.engine_dir == "./engine" and args.tokenizer_dir == "./tokenizer" and args.input_text == ["a prompt"]
    assert args.max_output_len == 128 and 128 + bundle["serving"]["max_input_len"] <= bundle["serving"]["max_seq_len"]
    with pytest.raises(AssertionError, match="temperature"):  # the model fails a wrong field
        _run_py.medusa_run([*run[6:-1], "x", "--temperature", "0.7"])
    assert "the text is the base model's greedy text" in run_script and "Tree: 4 nodes (deploy.json: tree)" in run_script
    assert "recorded at conversion" not in run_script  # a value from the checkpoint: never in a comment
    assert bundle["tree"]["source"] == "recorded at conversion (the tree given)" and bundle["tree"]["nodes"] == 4
    assert bundle["engine_architecture"] == "MedusaForCausalLM" and bundle["world_size"] == 2
    assert all(r["resolves"] for r in bundle["routes"].values())
    assert bundle["memory"]["batch"] == 8 and len(bundle["memory"]["total_bytes"]) == 2
    # the text form says where things are and what to run
    assert main(["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out),
                 "--overwrite", "--max_batch_size", "2", "--max_seq_len", "200", "--max_input_len", "50"]) == 0
    text = capsys.readouterr().out
    assert f"Wrote {out.resolve()}: build.sh, run.sh, llm_api.py, serve.yaml, serve.sh, triton/fill.sh, " \
           "triton/launch.sh, deploy.json, checkpoint/, tokenizer/ (world size 2; tree 4 nodes" in text
    assert "checkpoint/ and tokenizer/: copies of the inputs (checkpoint 0.00" in text
    assert "this machine's paths replaced by their names in checkpoint/config.json: medusa_ports.heads_source" in text
    assert "; the bundle names no path of this machine" in text
    assert "serving sizes: batch 2 (--max_batch_size), max_seq_len 200 (--max_seq_len), max_input_len 50" in text
    assert "triton/fill.sh, then" in text
    assert json.loads((out / "deploy.json").read_text())["serving"] == {
        "max_batch_size": 2, "max_input_len": 50, "max_seq_len": 200, "max_num_tokens": 50}


@pytest.mark.parametrize("case, says", [
    ("no-checkpoint", "none: no such directory"),
    ("no-tokenizer", "no tokenizer there"),
    ("not-empty", "not empty"),
    ("other-tree", "is not the tree this checkpoint was converted for"),
    ("tree-too-big", "the tree has 7 nodes, the checkpoint's max_draft_len is 6"),
    ("does-not-fit", "more than --gpu_memory_gb 1e-06"),
    ("input-too-long", "--max_input_len 300 leaves no room to generate within --max_seq_len 256"),
])
def test_deploy_refuses_what_could_not_serve_and_writes_nothing(served, tmp_path, capsys, case, says):
    ckpt, tok = served
    out = tmp_path / "serve"
    args = ["deploy", "--checkpoint_dir", str(ckpt), "--tokenizer_dir", str(tok), "--output_dir", str(out)]
    if case == "no-checkpoint":
        args[2] = str(tmp_path / "none")
    elif case == "no-tokenizer":
        (tmp_path / "empty").mkdir()
        args[4] = str(tmp_path / "empty")
    elif case == "not-empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "other-tree":
        args += ["--medusa_choices", "[[0]]"]
    elif case == "tree-too-big":
        args += ["--medusa_choices", "[[0],[1],[2],[0,0],[0,1],[1,0],[2,0]]", "--override_medusa_choices"]
    elif case == "does-not-fit":
        args += ["--gpu_memory_gb", "0.000001"]
    elif case == "input-too-long":
        args += ["--max_input_len", "300"]
    assert main(args) == 1
    assert says in capsys.readouterr().err
    assert (sorted(p.name for p in out.iterdir()) == ["keep.txt"]) if case == "not-empty" else not out.exists()


def test_every_family_engine_name_is_a_model_map_key_as_the_standin_reads_it(trtllm):  # noqa: F811
    """deploy/routes.py's MODEL_MAP names against the stand-in's (tensorrt_llm/models/__init__.py): for every
    family's architecture, the two agree on whether the Python routes resolve it."""
    from tensorrt_llm.models import MODEL_MAP

    from trtllm_medusa_ports.archs import registry
    from trtllm_medusa_ports.deploy.routes import MODEL_MAP_NAMES

    names = {a for cls in registry().values() for a in cls.hf_architectures} | {"MedusaForCausalLM"}
    assert {n for n in names if n in MODEL_MAP} == {n for n in names if n in MODEL_MAP_NAMES}
    # what a checkpoint records as base_architecture (the engine's name, archs/base.py base_architecture) resolves,
    # and names the same family again (verify and deploy find the adapter by it)
    for name, cls in registry().items():
        written = cls().base_architecture(name)
        assert written in MODEL_MAP and written in MODEL_MAP_NAMES, (name, written)
        assert registry()[written] is cls, (name, written)


def test_one_rank_runs_without_mpirun_and_our_class_builds_with_trtllm_medusa_build(tmp_path, store):
    from trtllm_medusa_ports import api
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    base = tiny_base(store, "GPTNeoXForCausalLM")
    heads = _heads(tmp_path, "GPTNeoXForCausalLM", tiny_config("GPTNeoXForCausalLM").hidden_size)
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir", str(ckpt),
                 "--dtype", "float16", "--quiet"]) == 0
    save_tiny_tokenizer(tmp_path / "tok", tiny_config("GPTNeoXForCausalLM").vocab_size)
    res = api.deploy(api.DeployOptions(ckpt, tmp_path / "tok", tmp_path / "serve", engine_dir=tmp_path / "eng"))
    run_script = (tmp_path / "serve" / "run.sh").read_text()
    run = _exec_line(run_script)
    assert run[:2] == ["python3", "EXAMPLES/run.py"] and "mpirun" not in run
    assert "--use_py_session" not in run and "Learned positions" not in run_script  # GPT-NeoX: RoPE
    build = _exec_line((tmp_path / "serve" / "build.sh").read_text())
    assert build[:2] == ["trtllm-medusa", "build"] and build[build.index("--output_dir") + 1] == str(tmp_path / "eng")
    b = res.to_dict()
    assert b["engine_architecture"] == "GPTNeoXForCausalLM" and b["world_size"] == 1
    assert b["tree"]["source"].startswith("mc_sim_7b_63: the checkpoint records no tree")
    assert b["tree"]["nodes"] <= b["tree"]["max_draft_len"]


def _engine_dir(bundle: dict, ckpt, out: Path) -> None:
    """What a build leaves in the engine directory as the runtime reads it: config.json's ``pretrained_config`` (the
    checkpoint's, naming the engine's architecture) and ``build_config`` (tensorrt_llm/builder.py EngineConfig)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architecture"] = bundle["engine_architecture"]
    engine = out / bundle["engine_dir"]
    engine.mkdir(parents=True)
    (engine / "config.json").write_text(json.dumps({"pretrained_config": cfg, "build_config": {
        "max_draft_len": cfg["max_draft_len"], "speculative_decoding_mode": "medusa"}}))


def _bundle(served, tmp_path) -> dict:
    ckpt, tok = served
    from trtllm_medusa_ports import api

    res = api.deploy(api.DeployOptions(ckpt, tok, tmp_path / "serve", gpu_memory_gb=8))
    _engine_dir(res.to_dict(), ckpt, tmp_path / "serve")
    return res.to_dict()


def _run_llm_api(path, argv):
    import runpy
    import sys

    old = sys.argv
    sys.argv = [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = old


def test_llm_api_script_loads_the_engine_with_its_tree_greedily(served, tmp_path, trtllm, capsys):  # noqa: F811
    b = _bundle(served, tmp_path)
    script = tmp_path / "serve" / "llm_api.py"
    _run_llm_api(script, ["Hello there", "second"])
    (_, args), (_, prompts, sampling) = [c for c in trtllm.CALLS if c[0] in ("llm", "generate")]
    spec = args["speculative_config"]
    assert type(spec).__name__ == "MedusaDecodingConfig" and spec.medusa_choices == [[0], [1], [0, 0], [0, 1]]
    assert spec.max_draft_len == 6 and spec.num_medusa_heads == b["tree"]["num_medusa_heads"]
    # the bundle's own directories, found from the script's location
    assert args["model"] == str(tmp_path / "serve" / "engine") and args["tokenizer"] == str(tmp_path / "serve" / "tokenizer")
    assert args["kv_cache_config"].free_gpu_memory_fraction == b["kv_cache_free_gpu_memory_fraction"] <= 0.9
    assert prompts == ["Hello there", "second"] and sampling._greedy_decoding and sampling.max_tokens == 128
    assert capsys.readouterr().out == "Hello there\nsecond\n"


@pytest.mark.parametrize("change, fails", [
    (("num_medusa_heads=", "num_heads="), "Extra inputs are not permitted"),  # MedusaDecodingConfig is strict
    (("max_draft_len=6", "max_draft_len=0"), "max_draft_len must be > 0"),
    (("medusa_choices=MEDUSA_CHOICES", "medusa_choices=str(MEDUSA_CHOICES)"), "valid list of lists of integers"),
])
def test_the_llm_api_model_fails_a_wrong_field(served, tmp_path, trtllm, change, fails):  # noqa: F811
    _bundle(served, tmp_path)
    script = tmp_path / "serve" / "llm_api.py"
    text = script.read_text()
    assert change[0] in text
    bad = tmp_path / "bad.py"
    bad.write_text(text.replace(change[0], change[1]))
    with pytest.raises((ValueError, AssertionError), match=fails):
        _run_llm_api(bad, [])


def test_an_engine_name_outside_model_map_fails_the_python_routes(served, tmp_path, trtllm):  # noqa: F811
    b = _bundle(served, tmp_path)
    engine = tmp_path / "serve" / b["engine_dir"] / "config.json"
    cfg = json.loads(engine.read_text())
    cfg["pretrained_config"]["architecture"] = "MedusaPortsQWenForCausalLM"
    engine.write_text(json.dumps(cfg))
    with pytest.raises(KeyError, match="MedusaPortsQWenForCausalLM"):
        _run_llm_api(tmp_path / "serve" / "llm_api.py", [])
    from trtllm_medusa_ports.deploy.routes import routes

    assert not routes({"architecture": "MedusaPortsX", "base_architecture": "NotAModel"})["llm_api"]["resolves"]


def _serve_args(serve_sh, model_parser):
    return model_parser.parse_args(_exec_line(serve_sh.read_text())[1:])


def test_trtllm_serve_takes_the_engine_backend_and_the_yaml_keeps_what_the_command_line_set(served, tmp_path,
                                                                                           trtllm, monkeypatch):  # noqa: F811
    from tensorrt_llm.commands import serve

    b = _bundle(served, tmp_path)
    monkeypatch.chdir(tmp_path / "serve")  # where serve.sh runs it
    args = _serve_args(tmp_path / "serve" / "serve.sh", serve.parser())
    assert args.backend == "tensorrt" and args.model == b["engine_dir"] and args.tokenizer == b["tokenizer_dir"]
    assert (args.tp_size, args.pp_size) == (2, 1)
    llm_args = serve.get_llm_args(args)
    spec = llm_args["speculative_config"]
    assert spec.medusa_choices == [[0], [1], [0, 0], [0, 1]] and spec.max_draft_len == 6
    # the YAML's kv_cache_config replaced the command line's whole: it carries the fraction itself
    assert llm_args["kv_cache_config"].free_gpu_memory_fraction == b["kv_cache_free_gpu_memory_fraction"]
    assert llm_args["max_batch_size"] == 8 and llm_args["max_seq_len"] == 256 and llm_args["max_num_tokens"] == 128
    assert type(serve.launch(args)).__name__ == "LLM"  # the server's TensorRT-engine LLM takes them
    serve_sh = (tmp_path / "serve" / "serve.sh").read_text()
    assert '"top_k": 1' in serve_sh and "/v1/completions" in serve_sh
    # without --backend tensorrt, trtllm-serve's default pytorch backend refuses Medusa
    bad = tmp_path / "bad.sh"
    bad.write_text(serve_sh.replace(" --backend tensorrt", ""))
    with pytest.raises(ValueError, match="does not support backend pytorch"):
        serve.launch(_serve_args(bad, serve.parser()))


# -- Triton ----------------------------------------------------------------------------------------------------------
TRITON_TEMPLATES = Path(__file__).parent / "fixtures" / "triton"
_triton = standin_file("triton_backend.py", "standin_triton_backend")


def _filled(bundle: dict, at: Path) -> dict:
    """Each model's config.pbtxt as fill.sh leaves it with the bundle at ``at``: the fill argument through
    fill_template.py's model, parsed with NVIDIA's protobuf of Triton's ModelConfig."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from trtllm_medusa_ports.deploy.triton import fill_at

    out = {}
    for model, argument in fill_at(bundle["triton"], str(at)).items():
        text = _triton.fill_template((TRITON_TEMPLATES / model / "config.pbtxt").read_text(), argument)
        out[model] = text_format.Parse(text.replace("${batch_scheduler_policy}", "guaranteed_no_evict"),
                                       model_config_pb2.ModelConfig())
    return out


def test_the_triton_repository_is_filled_for_medusa_and_parses_as_tritons_model_config(served, tmp_path):
    b = _bundle(served, tmp_path)
    configs = _filled(b, tmp_path / "serve")
    trt = configs["tensorrt_llm"]
    params = {k: v.string_value for k, v in trt.parameters.items()}
    assert trt.backend == "tensorrtllm" and trt.max_batch_size == 8 and not trt.model_transaction_policy.decoupled
    assert params["gpt_model_path"] == str(tmp_path / "serve" / "engine")
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["max_beam_width"] == "1" and params["decoding_mode"] == "medusa"
    assert float(params["kv_cache_free_gpu_mem_fraction"]) == b["kv_cache_free_gpu_memory_fraction"]
    # the C++ backend's own reading of the tree (utils.cc csvStrToVecVecInt): the recorded tree, not mc_sim_7b_63
    assert _triton.medusa_choices_served(params["decoding_mode"], params["medusa_choices"]) == b["tree"][
        "medusa_choices"] == [[0], [1], [0, 0], [0, 1]]
    for model in ("preprocessing", "postprocessing"):
        assert configs[model].parameters["tokenizer_dir"].string_value == str(tmp_path / "serve" / "tokenizer")
        assert configs[model].max_batch_size == 8 and configs[model].instance_group[0].count == 1
    assert configs["ensemble"].max_batch_size == 8
    fill = (tmp_path / "serve" / "triton" / "fill.sh").read_text()
    assert all(f"all_models/inflight_batcher_llm/{m}" in fill for m in configs)
    launch = _exec_line((tmp_path / "serve" / "triton" / "launch.sh").read_text().replace(
        '"$TRTLLM_TRITON/scripts/launch_triton_server.py"', "LAUNCH"))
    assert launch[:3] == ["python3", "LAUNCH", "--world_size=2"]
    # issue 78: the sample request is greedy (the ensemble's top_k 1), and JSON as written
    curl = next(line for line in (tmp_path / "serve" / "triton" / "launch.sh").read_text().splitlines()
                if "ensemble/generate" in line)
    request = json.loads(shlex.split(curl.lstrip("# "))[-1])
    assert request["top_k"] == 1 and request["max_tokens"] == 32 and request["text_input"]


@pytest.mark.parametrize("written", ["[[0], [1], [0, 0]]", " {0}, {1}, {0, 0}", "${medusa_choices}", "{0},{1},{0,0"])
def test_every_other_tree_form_is_silently_served_as_the_default_tree(written):
    """What the C++ backend does with anything but brace groups: the default tree, with one log line (so deploy
    writes the braces; the last form loses its unclosed group)."""
    served = _triton.medusa_choices_served("medusa", written)
    assert served == "mc_sim_7b_63" or served == [[0], [1]]
    assert _triton.medusa_choices_served("top_k", "{0}, {1}") == "mc_sim_7b_63"  # not medusa mode: never read


def test_fill_arguments_survive_both_of_fill_templates_splits():
    from trtllm_medusa_ports.deploy.triton import fill_argument

    values = {"engine_dir": "/data/a,b:c\\d", "medusa_choices": "{0}, {0, 1}"}
    text = _triton.fill_template("${engine_dir} | ${medusa_choices}", fill_argument(values))
    assert text == "/data/a,b:c\\d | {0}, {0, 1}"
    with pytest.raises(AssertionError, match="does not exist"):
        _triton.fill_template("${engine_dir}", fill_argument({"tokenizer_type": "auto"}))  # gone from 1.x templates


def test_a_learned_position_bundle_says_to_keep_the_cpp_runtime(tmp_path, store):
    """run.py --use_py_session passes [batch, T] position offsets in the context step, which the tree-position
    rebuild cannot take (issue 57, m1): a GPT-2 bundle's run.sh says so, and never passes the flag."""
    from trtllm_medusa_ports import api
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_tokenizer, tiny_config

    c = tiny_config("GPT2LMHeadModel")
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--model_dir", str(tiny_base(store, "GPT2LMHeadModel")), "--medusa_model_dir",
                 str(_heads(tmp_path, "GPT2LMHeadModel", c.n_embd)), "--output_dir", str(ckpt), "--dtype", "float16",
                 "--max_draft_len", "6", "--medusa_choices", "[[0],[1],[0,0]]", "--quiet"]) == 0
    save_tiny_tokenizer(tmp_path / "tok", c.vocab_size)
    b = api.deploy(api.DeployOptions(ckpt, tmp_path / "tok", tmp_path / "serve")).to_dict()
    script = (tmp_path / "serve" / "run.sh").read_text()
    assert b["position_embedding_type"] == "learned_absolute" and "keep run.py's C++ runtime" in script
    assert "--use_py_session" not in _exec_line(script)


def test_deploy_says_where_the_kv_cache_share_comes_from(served, tmp_path):
    """--gpu_memory_gb also sets every route's KV cache share (issue 64, 7): deploy.json and the summary say how, and
    without the flag that it is TensorRT-LLM's default."""
    from trtllm_medusa_ports import api
    from trtllm_medusa_ports.machine.gpu_machine import CHECKOUT_COMMAND

    ckpt, tok = served
    sized = api.deploy(api.DeployOptions(ckpt, tok, tmp_path / "a", gpu_memory_gb=80))
    b = sized.to_dict()
    assert b["kv_cache_free_gpu_memory_fraction"] == 0.01  # a tiny model's KV cache on an 80 GB GPU
    assert b["kv_cache_free_gpu_memory_fraction_from"].startswith("--gpu_memory_gb 80: what the KV cache of "
                                                                   "--max_batch_size ")
    assert "a larger GPU gets a smaller share" in b["kv_cache_free_gpu_memory_fraction_from"]
    shown = sized.render()
    assert "KV cache: 0.01 of the GPU memory free after the weights, on every route (--gpu_memory_gb 80" in shown
    assert CHECKOUT_COMMAND in shown
    default = api.deploy(api.DeployOptions(ckpt, tok, tmp_path / "b")).to_dict()
    assert (default["kv_cache_free_gpu_memory_fraction"], default["kv_cache_free_gpu_memory_fraction_from"]) == (
        0.9, "TensorRT-LLM's default 0.9: no --gpu_memory_gb")
