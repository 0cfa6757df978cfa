"""``trtllm-medusa deploy``: one directory with what each serving step reads, made from a checkpoint.

- ``build.sh``: the build this checkpoint needs (deploy/commands.py), with the serving sizes: ``--max_batch_size``,
  ``--max_input_len``, ``--max_seq_len`` and ``--max_num_tokens`` (at least one step of every sequence's tree:
  ``max_batch_size x (max_draft_len + 1)``, as tensorrt_llm/builder.py raises it, and a whole prompt);
- ``run.sh``: TensorRT-LLM's ``examples/run.py`` on the engine, under ``mpirun -n <world size> --allow-run-as-root``
  when the world size is over 1, with the tree as the Python literal run.py parses (``ast.literal_eval``) and
  ``--temperature 1.0``, which run.py asserts for Medusa;
- ``deploy.json``: all of it, machine-readable, with the memory plan at the serving sizes and, per route, whether
  the engine's ``architecture`` resolves there (deploy/routes.py).

The tree is the one the checkpoint records (``convert --medusa_choices``), since no route reads a tree from the
engine and the C++ executor falls back to mc_sim_7b_63 (4 heads, 63 nodes) without one. The bundle is written
atomically, as convert writes; every path in it is absolute.

May import: ``files``, ``memory``, ``tree``, ``errors``, ``deploy.commands``, ``deploy.routes``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from trtllm_medusa_ports.deploy.commands import build_argv, environment, world_size
from trtllm_medusa_ports.deploy.routes import engine_architecture, routes
from trtllm_medusa_ports.errors import CheckpointError, ConversionError, ModelError
from trtllm_medusa_ports.files.checkpoint import atomic_output_dir, read_checkpoint
from trtllm_medusa_ports.memory import memory_plan
from trtllm_medusa_ports.tree import MedusaTree, checkpoint_tree, resolve_choices

#: files a Hugging Face tokenizer directory holds (transformers' AutoTokenizer reads one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
DEFAULT_MAX_BATCH_SIZE = 8


@dataclass
class ServingSizes:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int


def serving_sizes(cfg: dict, max_batch_size: int | None, max_input_len: int | None,
                  max_seq_len: int | None) -> ServingSizes:
    """The build's serving sizes: the given ones, else a batch of 8, the base's context (max_position_embeddings)
    and half of it for the prompt; refused where they cannot hold together."""
    batch = max_batch_size or DEFAULT_MAX_BATCH_SIZE
    seq = max_seq_len or int(cfg.get("max_position_embeddings") or 2048)
    inp = max_input_len or max(1, seq // 2)
    if inp >= seq:
        raise ModelError(f"--max_input_len {inp} leaves no room to generate within --max_seq_len {seq}",
                         fix="pass a --max_input_len below --max_seq_len")
    draft = int(cfg.get("max_draft_len") or 0)
    return ServingSizes(batch, inp, seq, max(inp, batch * (draft + 1)))


def _tokenizer(tokenizer_dir: Path) -> Path:
    if not tokenizer_dir.is_dir() or not any((tokenizer_dir / f).is_file() for f in TOKENIZER_FILES):
        raise ModelError("no tokenizer there (none of " + ", ".join(TOKENIZER_FILES) + ")", where=str(tokenizer_dir),
                         fix="pass the Hugging Face base directory (or its tokenizer's) as --tokenizer_dir: engine "
                             "directories carry no tokenizer")
    return tokenizer_dir.resolve()


def plan(checkpoint_dir: Path, tokenizer_dir: Path, output_dir: Path, *, engine_dir: Path | None = None,
         medusa_choices: str | None = None, override_medusa_choices: bool = False, max_batch_size: int | None = None,
         max_input_len: int | None = None, max_seq_len: int | None = None,
         gpu_memory_gb: float | None = None) -> dict:
    """What the bundle holds (``deploy.json``), every input checked; nothing is written."""
    if not (checkpoint_dir / "config.json").is_file():
        raise CheckpointError("no config.json", where=str(checkpoint_dir),
                              fix="pass the --output_dir of trtllm-medusa convert as --checkpoint_dir")
    ckpt = read_checkpoint(checkpoint_dir)
    cfg = ckpt.config
    heads = int(cfg.get("num_medusa_heads") or 0)
    if heads <= 0:
        raise CheckpointError("config.json has no Medusa heads (num_medusa_heads)", where=str(checkpoint_dir),
                              fix="convert with trtllm-medusa convert --medusa_model_dir ...")
    where = str(checkpoint_dir / "config.json")
    spec, source = checkpoint_tree(cfg, medusa_choices, heads, override=override_medusa_choices, where=where)
    paths, pruned = resolve_choices(spec, heads)
    tree = MedusaTree.from_spec(paths, num_heads=heads)
    draft = int(cfg.get("max_draft_len") or 0)
    if tree.num_nodes > draft:
        raise CheckpointError(f"the tree has {tree.num_nodes} nodes, the checkpoint's max_draft_len is {draft}: "
                              "the engine could not run it", where=where,
                              fix=f"pass a tree of at most {draft} nodes, or convert with --max_draft_len "
                                  f"{tree.num_nodes}")
    tokenizer = _tokenizer(tokenizer_dir)
    sizes = serving_sizes(cfg, max_batch_size, max_input_len, max_seq_len)
    entries = {r: [(n, t.dtype_name, tuple(t.shape)) for n, t in ckpt.ranks[r].items()] for r in range(len(ckpt.ranks))}
    memory = memory_plan(cfg, entries).to_dict(sizes.max_batch_size, sizes.max_seq_len, gpu_memory_gb)
    if memory.get("fits") is False:
        worst = max(memory["total_bytes"])
        raise ModelError(f"weights and KV cache need {worst / 1e9:.3g} GB on a rank at --max_batch_size "
                         f"{sizes.max_batch_size} x --max_seq_len {sizes.max_seq_len} (+{draft} tree slots each), "
                         f"more than --gpu_memory_gb {gpu_memory_gb:g}", where=where,
                         fix="lower --max_batch_size or --max_seq_len, or convert with a larger --tp_size")
    out = output_dir.resolve()
    engine = (engine_dir or out / "engine").resolve()
    world = world_size(cfg)
    build = build_argv(cfg, checkpoint_dir.resolve(), engine, max_batch_size=sizes.max_batch_size,
                       max_input_len=sizes.max_input_len, max_seq_len=sizes.max_seq_len,
                       max_num_tokens=sizes.max_num_tokens)
    literal = json.dumps(paths, separators=(", ", ": "))  # run.py: ast.literal_eval
    run = (["mpirun", "-n", str(world), "--allow-run-as-root"] if world > 1 else []) + [
        "python3", RUN_PY, "--engine_dir", str(engine), "--tokenizer_dir", str(tokenizer),
        "--max_output_len", str(sizes.max_seq_len - sizes.max_input_len), "--medusa_choices", literal,
        "--temperature", "1.0"]
    return {
        "checkpoint_dir": str(checkpoint_dir.resolve()), "tokenizer_dir": str(tokenizer), "engine_dir": str(engine),
        "output_dir": str(out), "architecture": cfg.get("architecture"),
        "engine_architecture": engine_architecture(cfg), "world_size": world,
        "tree": {"medusa_choices": paths, "source": source, "pruned": pruned, "nodes": tree.num_nodes,
                 "max_draft_len": draft, "num_medusa_heads": heads},
        "serving": vars(sizes), "environment": environment(cfg),
        "build": {"argv": build}, "run": {"argv": run}, "memory": memory, "routes": routes(cfg),
        "files": ["build.sh", "run.sh", "deploy.json"],
    }


def _script(lines: list[str], env: dict[str, str]) -> str:
    exports = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    return "\n".join(["#!/usr/bin/env bash", *lines[:-1], "set -euo pipefail", *exports, lines[-1]]) + "\n"


def render_build(d: dict) -> str:
    return _script([
        f"# The build {d['checkpoint_dir']} needs (trtllm-medusa deploy; deploy.json has the why): {d['build']['argv'][0]}"
        + (" build" if d["build"]["argv"][0] == "trtllm-medusa" else "") + ", Medusa mode on (TensorRT-LLM 1.x",
        "# turns it on only with --speculative_decoding_mode medusa), sized for serving: "
        + ", ".join(f"{k} {v}" for k, v in d["serving"].items()) + ".",
        "exec " + shlex.join(d["build"]["argv"])], d["environment"])


RUN_PY = "${TRTLLM_EXAMPLES}/run.py"


def render_run(d: dict) -> str:
    argv = d["run"]["argv"]
    i = argv.index(RUN_PY)  # expanded by the shell, so in double quotes
    line = " ".join(x for x in (shlex.join(argv[:i]), f'"{RUN_PY}"', shlex.join(argv[i + 1:])) if x)
    line += ' --input_text "$@"'
    return _script([
        "# TensorRT-LLM 1.2's examples/run.py on the engine (set TRTLLM_EXAMPLES to its examples/ directory); the",
        "# prompts are the arguments. --temperature 1.0 is what run.py requires for Medusa, and with its default",
        "# --top_k 1 decoding is greedy: the text is the base model's greedy text, and the tree only decides how many",
        f"# tokens each step accepts. Tree: {d['tree']['nodes']} nodes, {d['tree']['source']}."
        + (f" World size {d['world_size']}: one MPI rank per engine rank." if d["world_size"] > 1 else ""),
        ': "${TRTLLM_EXAMPLES:?set TRTLLM_EXAMPLES to TensorRT-LLM 1.2 examples/ directory}"',
        '[ "$#" -gt 0 ] || set -- "Once upon a time"',
        "exec " + line], d["environment"])


def write(d: dict, *, overwrite: bool, inputs: dict[str, Path]) -> None:
    """The bundle in ``d['output_dir']``, atomically."""
    try:
        with atomic_output_dir(Path(d["output_dir"]), overwrite=overwrite, inputs=inputs) as tmp:
            for name, text in (("build.sh", render_build(d)), ("run.sh", render_run(d))):
                (tmp / name).write_text(text)
                (tmp / name).chmod(0o755)
            (tmp / "deploy.json").write_text(json.dumps(d, indent=2) + "\n")
    except OSError as exc:
        raise ConversionError(f"cannot write the bundle ({exc.strerror})", where=d["output_dir"],
                              fix="free space or choose another --output_dir") from None
