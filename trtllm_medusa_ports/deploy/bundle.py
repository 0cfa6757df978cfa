"""``trtllm-medusa deploy``: one directory with what each serving step reads, made from a checkpoint.

- ``build.sh``: the build this checkpoint needs (deploy/commands.py), with the serving sizes: ``--max_batch_size``,
  ``--max_input_len``, ``--max_seq_len`` and ``--max_num_tokens`` (at least one step of every sequence's tree:
  ``max_batch_size x (max_draft_len + 1)``, as tensorrt_llm/builder.py raises it, and a whole prompt);
- ``run.sh``: TensorRT-LLM's ``examples/run.py`` on the engine, under ``mpirun -n <world size> --allow-run-as-root``
  when the world size is over 1, with the tree as the Python literal run.py parses (``ast.literal_eval``) and
  ``--temperature 1.0``, which run.py asserts for Medusa;
- ``llm_api.py``: the engine through the LLM API's TensorRT-engine ``LLM`` (``tensorrt_llm._tensorrt_engine``; plain
  ``tensorrt_llm.LLM`` is the PyTorch backend, which Medusa does not support: ``MedusaDecodingConfig``
  ``supports_backend``), with ``MedusaDecodingConfig`` (the tree, the heads, the engine's ``max_draft_len``, which
  must be above 0) and greedy sampling (``SamplingParams(top_k=1)``: tensorrt_llm/sampling_params.py);
- ``serve.yaml`` and ``serve.sh``: ``trtllm-serve ENGINE --backend tensorrt`` (its default backend is pytorch), the
  YAML (``--extra_llm_api_options``) carrying the tree and every key whose command-line value it would otherwise
  replace (its top-level keys replace the command line's outright: tensorrt_llm/llmapi/llm_args.py
  ``update_llm_args_with_extra_dict``), and a greedy ``/v1/completions`` request;
- ``triton/fill.sh`` and ``triton/launch.sh``: Triton's model repository (``ensemble``, ``preprocessing``,
  ``tensorrt_llm``, ``postprocessing``) copied from TensorRT-LLM 1.2's own templates (``triton_backend/all_models/
  inflight_batcher_llm``: their Python models are upstream's, so they are not rewritten here) and filled with its
  ``tools/fill_template.py``: backend ``tensorrtllm``, ``decoding_mode`` medusa and ``medusa_choices`` in the C++
  backend's brace groups (deploy/triton.py: on any other form it logs a line and serves mc_sim_7b_63), the engine,
  ``inflight_fused_batching``, beam width 1, the KV cache's share, the tokenizer; then
  ``scripts/launch_triton_server.py --world_size N``;
- ``deploy.json``: all of it, machine-readable, with the memory plan at the serving sizes and, per route, whether
  the engine's ``architecture`` resolves there (deploy/routes.py).

The tree is the one the checkpoint records (``convert --medusa_choices``), since no route reads a tree from the
engine and the C++ executor falls back to mc_sim_7b_63 (4 heads, 63 nodes) without one. The bundle is written
atomically, as convert writes.

The bundle travels (issue 64): it holds what every route reads, ``checkpoint/`` (the rank files and config.json) and
``tokenizer/`` (the tokenizer directory's files but weights), copies of the inputs (reflinks where the filesystem
shares blocks copy-on-write; never hard links, so an edit of either side stays its own; a link leading out of an
input, or out of its repository in the Hugging Face cache, is refused by name), and ``engine/`` once build.sh ran.
The copied JSON configs keep no absolute path of this machine (config.json's ``medusa_ports.heads_source``, a
tokenizer's recorded base): each is replaced by its last component. No generated file names a path of the
machine that ran deploy: each script works from its own directory (the shell scripts ``cd`` there, llm_api.py joins
its own location, triton/fill.sh fills Triton's absolute paths from where it runs), so the directory can be copied
to the GPU machine whole (``rsync -a``, ``scp -r``) and run there. Only an ``--engine_dir`` the user gives is written as
given: a path on the machine that builds.

Every value from an input reaches a script through ``deploy.quoting`` only; comments carry none.

May import: ``files``, ``memory``, ``tree``, ``errors``, ``findings``, ``compat.checkpoint`` and ``compat.positions``
(the rules build refuses by), ``quant.engine_load`` (what the build's load refuses), ``quant.prequantized`` (a quantized checkpoint's scales), ``deploy.commands``, ``deploy.routes``,
``deploy.quoting``, ``deploy.triton``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtllm_medusa_ports.compat.checkpoint import checkpoint_findings
from trtllm_medusa_ports.compat.positions import checkpoint_position_range, learned_seq_limit
from trtllm_medusa_ports.deploy import quoting
from trtllm_medusa_ports.deploy.commands import build_argv, environment, jit_only_note, world_size
from trtllm_medusa_ports.deploy.routes import engine_architecture, routes
from trtllm_medusa_ports.deploy.triton import bundle_name, triton_fill
from trtllm_medusa_ports.errors import CheckpointError, ConversionError, ModelError
from trtllm_medusa_ports.files.checkpoint import atomic_output_dir, no_config, read_checkpoint
from trtllm_medusa_ports.files.copies import copy_scrubbed, input_root, own_file
from trtllm_medusa_ports.files.tokenizer import load_tokenizer, require_tokenizer
from trtllm_medusa_ports.findings import ERROR
from trtllm_medusa_ports.gpu.memory import memory_plan
from trtllm_medusa_ports.machine.gpu_machine import NEEDS
from trtllm_medusa_ports.quant.engine_load import load_problems
from trtllm_medusa_ports.quant.prequantized import check_base_tensors
from trtllm_medusa_ports.trees.tree import MedusaTree, checkpoint_tree, resolve_choices

#: where the bundle keeps what the routes read, relative to its directory (every script works from there)
CHECKPOINT, TOKENIZER, ENGINE = "./checkpoint", "./tokenizer", "./engine"
#: a tokenizer directory's files the bundle leaves out: model weights (a base directory passed as --tokenizer_dir)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".npz",
                   ".index.json")
DEFAULT_MAX_BATCH_SIZE = 8
#: the sequence length deploy builds for where config.json gives no max_position_embeddings
DEFAULT_CONTEXT = 2048


@dataclass
class ServingSizes:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int


def serving_sizes(cfg: dict, max_batch_size: int | None, max_input_len: int | None,
                  max_seq_len: int | None, tree_depth: int = 0,
                  where: str | None = None) -> tuple[ServingSizes, dict[str, str]]:
    """The build's serving sizes: the given ones, else a batch of 8, the base's context (max_position_embeddings;
    with learned positions, the table less the tree's depth: compat/positions.py) and half of it for the prompt;
    refused where they cannot hold together, or run tree tokens past a learned position table (the rule check and
    build hold: learned-position-range). With them, where the batch and the sequence length come from (said in
    deploy's summary and deploy.json)."""
    batch = max_batch_size or DEFAULT_MAX_BATCH_SIZE
    given_table = cfg.get("max_position_embeddings")
    table = int(given_table or DEFAULT_CONTEXT)
    learned = cfg.get("position_embedding_type") == "learned_absolute"
    seq = max_seq_len or (learned_seq_limit(table, tree_depth) if learned else table)
    if max_seq_len:
        seq_from = "--max_seq_len"
    elif given_table:
        seq_from = (f"the base's context: max_position_embeddings {table} of the checkpoint's config.json"
                    + (", less the tree's depth (a learned position table)" if learned else ""))
    else:
        seq_from = f"the default {DEFAULT_CONTEXT} (the checkpoint's config.json has no max_position_embeddings)"
    source = {"max_batch_size": "--max_batch_size" if max_batch_size else f"the default {DEFAULT_MAX_BATCH_SIZE}",
              "max_seq_len": seq_from}
    refused = checkpoint_position_range(cfg, seq, tree_depth)
    if refused:
        raise CheckpointError(f"[{refused[0].rule}] {refused[0].message}", where=where, fix=refused[0].fix,
                              rules=[refused[0].rule])
    inp = max_input_len or max(1, seq // 2)
    if inp >= seq:
        raise ModelError(f"--max_input_len {inp} leaves no room to generate within --max_seq_len {seq}",
                         fix="pass a --max_input_len below --max_seq_len")
    draft = int(cfg.get("max_draft_len") or 0)
    sizes = ServingSizes(batch, inp, seq, max(inp, batch * (draft + 1)))
    for name, value in vars(sizes).items():
        if value > INT32_MAX:
            raise ModelError(f"--{name} would be {value:,}, past the int32 the engine's sizes are "
                             f"(--max_batch_size {batch} x {draft + 1} tree tokens for max_num_tokens)",
                             fix="pass smaller serving sizes")
    return sizes, source


#: TensorRT-LLM's builder and runtime hold the serving sizes as int32
INT32_MAX = 2**31 - 1


def _tokenizer(tokenizer_dir: Path, vocab_size: int) -> Path:
    """The tokenizer directory, proven by loading it as every route will (transformers' AutoTokenizer: the LLM API,
    run.py and Triton's preprocessing model load it so): an empty or damaged tokenizer.json is refused here, not on
    the GPU machine; and its tokens must be ids of the checkpoint's vocabulary."""
    fix = "pass the Hugging Face base directory (or its tokenizer's) as --tokenizer_dir: engine directories carry no " \
          "tokenizer"
    found = require_tokenizer(tokenizer_dir, fix=fix)
    size = len(load_tokenizer(found, fix=fix))
    if size > vocab_size:
        raise ModelError(f"the tokenizer has {size} tokens, but the checkpoint's vocab_size is {vocab_size}: ids from "
                         f"{vocab_size} on have no embedding", where=str(found),
                         fix="pass the tokenizer of the base the checkpoint was converted from")
    return found.resolve()


def _plain_inputs(checkpoint_dir: Path, tokenizer: Path, output_dir: Path, engine_dir: Path | None, source: str,
                  where: str) -> None:
    """The paths and the recorded tree source the bundle names, refused where they hold a control character (a
    newline in a directory name or in config.json's ``medusa_ports.medusa_choices_from``): deploy/quoting.py."""
    rename = "rename the directory (no newline or other control character) and pass it again"
    for what, path in (("--checkpoint_dir", checkpoint_dir), ("--tokenizer_dir", tokenizer),
                       ("--output_dir", output_dir), ("--engine_dir", engine_dir)):
        if path is not None:
            quoting.plain_text(str(path.resolve()), f"the {what} path", str(path), rename)
    quoting.plain_text(source, "the tree source config.json records (medusa_ports.medusa_choices_from)", where,
                       "pass the tree with --medusa_choices and --override_medusa_choices, or convert again with a "
                       "tree file whose name holds no control character")


def _buildable(ckpt, checkpoint_dir: Path) -> None:
    """What the build refuses, refused before anything is written: compat/checkpoint.py's rules (as build and verify
    count them: no heads, float32, ALiBi, float16 range), a quantized checkpoint's scales and layers
    (quant/prequantized.py's checks of a tool's base) and the build's load (quant/engine_load.py)."""
    refused = [f for f in checkpoint_findings(ckpt.config) if f.severity == ERROR]
    if refused:
        raise CheckpointError("no engine serves this checkpoint: " + "; ".join(f"[{f.rule}] {f.message}" for f in refused),
                              where=str(checkpoint_dir / "config.json"), fix=refused[0].fix)
    quant = ckpt.config.get("quantization") or {}
    if quant.get("quant_algo") or quant.get("kv_cache_quant_algo"):
        # a quantized checkpoint's rank files as add-heads checks a tool's base (quant/prequantized.py): every scale
        # finite and of a value the engine can use, each layer's weight and scales as its quant_algo declares them,
        # a KV cache scale per attention layer - an engine built from anything else serves wrong tokens
        check_base_tensors(ckpt, quant.get("exclude_modules"))
    loads = load_problems(ckpt.ranks, ckpt.config)
    if loads:
        raise CheckpointError(loads[0].message, where=str(checkpoint_dir / f"rank{loads[0].rank}.safetensors"),
                              fix=loads[0].fix)


def _fitting_memory(plan_, sizes, draft: int, gpu_memory_gb: float | None, where: str) -> dict:
    """The memory plan at the serving sizes (memory.py), refused where weights and KV cache do not fit one GPU of
    ``gpu_memory_gb`` per rank, or where the KV cache needs more of what the weights leave than TensorRT-LLM
    gives it."""
    memory = plan_.to_dict(sizes.max_batch_size, sizes.max_seq_len, gpu_memory_gb)
    if memory.get("fits") is False:
        worst = max(memory["total_bytes"])
        raise ModelError(f"weights and KV cache need {worst / 1e9:.3g} GB on a rank at --max_batch_size "
                         f"{sizes.max_batch_size} x --max_seq_len {sizes.max_seq_len} (+{draft} tree slots each), "
                         f"more than --gpu_memory_gb {gpu_memory_gb:g}", where=where,
                         fix="lower --max_batch_size or --max_seq_len, or convert with a larger --tp_size")
    share = kv_share(memory, gpu_memory_gb)
    if share is not None and share > KV_FRACTION:
        raise ModelError(f"the KV cache needs {share:.0%} of the GPU memory left after the weights, more than the "
                         f"{KV_FRACTION:.0%} TensorRT-LLM gives it (--gpu_memory_gb {gpu_memory_gb:g})",
                         where=where, fix="lower --max_batch_size or --max_seq_len, or convert with a larger --tp_size")
    return memory


def _engine_apart(engine_dir: Path | None, output_dir: Path, checkpoint_dir: Path, tokenizer: Path) -> None:
    """The engine directory (default: the bundle's engine/) apart from every input: the build writes a config.json
    there."""
    engine = (engine_dir or output_dir.resolve() / "engine").resolve()
    for what, given in (("--checkpoint_dir", checkpoint_dir.resolve()), ("--tokenizer_dir", tokenizer)):
        if engine == given or given in engine.parents or engine in given.parents:
            raise ModelError(f"the engine directory {engine} {'is' if engine == given else 'overlaps'} the "
                             f"{what} {given}: the build would write its config.json over the input's",
                             where=str(engine), fix="pass an --engine_dir apart from every input directory")


def plan(checkpoint_dir: Path, tokenizer_dir: Path, output_dir: Path, *, engine_dir: Path | None = None,
         medusa_choices: str | None = None, override_medusa_choices: bool = False, max_batch_size: int | None = None,
         max_input_len: int | None = None, max_seq_len: int | None = None,
         gpu_memory_gb: float | None = None) -> dict:
    """What the bundle holds (``deploy.json``), every input checked; nothing is written."""
    if not (checkpoint_dir / "config.json").is_file():
        raise CheckpointError(no_config(checkpoint_dir), where=str(checkpoint_dir),
                              fix="pass the --output_dir of trtllm-medusa convert as --checkpoint_dir")
    if gpu_memory_gb is not None and not gpu_memory_gb > 0:
        raise ModelError(f"--gpu_memory_gb {gpu_memory_gb:g} leaves no memory for the engine",
                         fix="pass one GPU's memory in GB, or leave --gpu_memory_gb out")
    ckpt = read_checkpoint(checkpoint_dir)
    cfg = ckpt.config
    _buildable(ckpt, checkpoint_dir)
    heads = int(cfg["num_medusa_heads"])  # above 0: compat's not-medusa rule
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
    tokenizer = _tokenizer(tokenizer_dir, int(cfg["vocab_size"]))
    _plain_inputs(checkpoint_dir, tokenizer, output_dir, engine_dir, source, where)
    sizes, sizes_from = serving_sizes(cfg, max_batch_size, max_input_len, max_seq_len, tree.depth, where)
    entries = {r: [(n, t.dtype_name, tuple(t.shape)) for n, t in ckpt.ranks[r].items()] for r in range(len(ckpt.ranks))}
    memory = _fitting_memory(memory_plan(cfg, entries), sizes, draft, gpu_memory_gb, where)
    _engine_apart(engine_dir, output_dir, checkpoint_dir, tokenizer)
    world = world_size(cfg)
    kv = kv_fraction(memory, gpu_memory_gb)
    engine_path = ENGINE if engine_dir is None else str(Path(engine_dir).resolve())  # given: the user's, to build on
    build = build_argv(cfg, CHECKPOINT, engine_path, max_batch_size=sizes.max_batch_size,
                       max_input_len=sizes.max_input_len, max_seq_len=sizes.max_seq_len,
                       max_num_tokens=sizes.max_num_tokens)
    literal = json.dumps(paths, separators=(", ", ": "))  # run.py: ast.literal_eval
    run = (["mpirun", "-n", str(world), "--allow-run-as-root"] if world > 1 else []) + [
        "python3", RUN_PY, "--engine_dir", engine_path, "--tokenizer_dir", TOKENIZER,
        "--max_input_length", str(sizes.max_input_len), "--max_output_len", str(sizes.max_seq_len - sizes.max_input_len),
        "--medusa_choices", literal,
        "--temperature", "1.0"]
    return {
        "paths": "relative to the bundle's directory, where every script runs",
        "checkpoint_dir": CHECKPOINT, "tokenizer_dir": TOKENIZER, "engine_dir": engine_path,
        "architecture": cfg.get("architecture"),
        "engine_architecture": engine_architecture(cfg), "world_size": world,
        "position_embedding_type": cfg.get("position_embedding_type"),
        "tree": {"medusa_choices": paths, "source": source, "pruned": pruned, "nodes": tree.num_nodes,
                 "max_draft_len": draft, "num_medusa_heads": heads},
        "serving": vars(sizes), "serving_from": sizes_from,
        "environment": environment(cfg), "xqa_jit_only": jit_only_note(cfg), "build": {"argv": build},
        "run": {"argv": run}, "memory": memory, "routes": routes(cfg),
        "kv_cache_free_gpu_memory_fraction": kv,
        "kv_cache_free_gpu_memory_fraction_from": kv_fraction_source(kv, gpu_memory_gb, sizes),
        "files": ["build.sh", "run.sh", "llm_api.py", "serve.yaml", "serve.sh", "triton/fill.sh", "triton/launch.sh",
                  "deploy.json", "checkpoint/", "tokenizer/"],
        "triton": triton_fill(paths, engine_path, TOKENIZER, sizes.max_batch_size, kv),
    }


#: TensorRT-LLM's default share of the free GPU memory the KV cache takes (KvCacheConfig, trtllm-serve, Triton)
KV_FRACTION = 0.9


def kv_share(memory: dict, gpu_memory_gb: float | None) -> float | None:
    """The share of the GPU memory left after the weights that the memory plan's KV cache needs (the fullest rank;
    inf where the weights leave none); None without ``gpu_memory_gb``."""
    if not gpu_memory_gb:
        return None
    free = [gpu_memory_gb * 1e9 - w for w in memory["weight_bytes"]]
    return max((k / f if f > 0 else float("inf")) for k, f in zip(memory["kv_cache_bytes"], free, strict=True))


def kv_fraction_source(kv: float, gpu_memory_gb: float | None, sizes) -> str:
    """Where the KV cache's share (every route's ``kv_cache_free_gpu_memory_fraction``) comes from, in words."""
    if gpu_memory_gb is None:
        return f"TensorRT-LLM's default {KV_FRACTION:g}: no --gpu_memory_gb"
    return (f"--gpu_memory_gb {gpu_memory_gb:g}: what the KV cache of --max_batch_size {sizes.max_batch_size} x "
            f"--max_seq_len {sizes.max_seq_len} needs of one GPU's memory left after the weights, rounded up to a "
            f"hundredth (at most {KV_FRACTION:g}): the engine's KV cache holds that and no more, so a larger GPU gets "
            "a smaller share")


def kv_fraction(memory: dict, gpu_memory_gb: float | None) -> float:
    """The KV cache's share of the GPU memory left after the weights: what the memory plan's KV cache needs, where
    ``gpu_memory_gb`` is given (rounded up to a hundredth, at most TensorRT-LLM's default 0.9), else the default."""
    need = kv_share(memory, gpu_memory_gb)
    if need is None:
        return KV_FRACTION
    return min(KV_FRACTION, max(0.01, -(-need * 100 // 1) / 100))




def _script(lines: list[str], env: dict[str, str], *, needs: tuple[str, ...] = (), home: str = ".") -> str:
    """A bash script: strict from its first command (a failing step stops it: fill.sh's copies and fills before its
    last line included); the directories it ``needs`` from the environment checked and made absolute; then it
    works from the bundle's directory (``home``, relative to the script), so its relative paths are the bundle's
    wherever the bundle was moved; then ``lines``, the environment exported before the last one (the exec)."""
    exports = [f"export {k}={quoting.sh(v)}" for k, v in env.items()]
    required = [ln for k in needs for ln in (
        f'[ -n "${{{k}:-}}" ] || {{ echo {quoting.sh("error: " + NEEDS[k])} >&2; exit 1; }}',
        f'{k}="$(cd "${k}" && pwd)"')]
    to_home = 'cd "$(dirname "$0")"' + ("" if home == "." else "/" + home)
    return "\n".join(["#!/usr/bin/env bash", "set -euo pipefail", *required, to_home, *lines[:-1], *exports,
                      lines[-1]]) + "\n"


def render_build(d: dict) -> str:
    return _script([
        f"# The build the checkpoint needs (trtllm-medusa deploy; deploy.json has the why): {d['build']['argv'][0]}"
        + (" build" if d["build"]["argv"][0] == "trtllm-medusa" else "") + ", Medusa mode on (TensorRT-LLM 1.x",
        "# turns it on only with --speculative_decoding_mode medusa), sized for serving: "
        + ", ".join(f"{k} {v}" for k, v in d["serving"].items()) + ".",
        "exec " + quoting.sh_argv(d["build"]["argv"])], d["environment"])


RUN_PY = "${TRTLLM_EXAMPLES}/run.py"


def render_run(d: dict) -> str:
    argv = d["run"]["argv"]
    i = argv.index(RUN_PY)  # expanded by the shell, so in double quotes
    line = " ".join(x for x in (quoting.sh_argv(argv[:i]), f'"{RUN_PY}"', quoting.sh_argv(argv[i + 1:])) if x)
    line += ' --input_text "$@"'
    return _script([
        "# TensorRT-LLM 1.2's examples/run.py on the engine (set TRTLLM_EXAMPLES to its examples/ directory); the",
        "# prompts are the arguments. --temperature 1.0 is what run.py requires for Medusa, and with its default",
        "# --top_k 1 decoding is greedy: the text is the base model's greedy text, and the tree only decides how many",
        f"# tokens each step accepts. Tree: {int(d['tree']['nodes'])} nodes (deploy.json: tree)."
        + (f" World size {int(d['world_size'])}: one MPI rank per engine rank." if d["world_size"] > 1 else ""),
        *(["# Learned positions: keep run.py's C++ runtime (no --use_py_session, whose context step passes [batch, T]",
            "# position offsets, which the engine's tree-position rebuild cannot take)."]
          if d.get("position_embedding_type") == "learned_absolute" else []),
        f'[ -f "{RUN_PY}" ] || {{ echo "error: no run.py in $TRTLLM_EXAMPLES: set TRTLLM_EXAMPLES to the examples/ '
        'directory of a TensorRT-LLM source checkout of the installed version" >&2; exit 1; }',
        '[ "$#" -gt 0 ] || set -- "Once upon a time"',
        "exec " + line], d["environment"], needs=("TRTLLM_EXAMPLES",))


def render_llm_api(d: dict) -> str:
    t = d["tree"]
    env = [f"os.environ.setdefault({quoting.py(k)}, {quoting.py(v)})  # before tensorrt_llm loads its kernels"
           for k, v in d["environment"].items()]
    head = f'''#!/usr/bin/env python3
"""The engine through TensorRT-LLM 1.2's LLM API (trtllm-medusa deploy): python3 llm_api.py "prompt" [...].

The TensorRT-engine LLM (tensorrt_llm._tensorrt_engine): tensorrt_llm.LLM is the PyTorch backend, which Medusa does
not support. The engine's config.json holds no tree, so the tree goes in MedusaDecodingConfig ({int(t["nodes"])} nodes;
deploy.json says where it came from); max_draft_len is the engine's. top_k=1 is greedy: the text is the base model's
greedy text. The LLM adopts the engine's parallelism (world size {int(d["world_size"])}) and starts its own workers.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))  # the bundle: its paths are relative to it
'''
    body = [
        *env,
        "",
        "from tensorrt_llm._tensorrt_engine import LLM  # noqa: E402",
        "from tensorrt_llm.llmapi import KvCacheConfig, MedusaDecodingConfig, SamplingParams  # noqa: E402",
        "",
        f"ENGINE_DIR = os.path.normpath(os.path.join(HERE, {quoting.py(d['engine_dir'])}))",
        f"TOKENIZER_DIR = os.path.normpath(os.path.join(HERE, {quoting.py(d['tokenizer_dir'])}))",
        f"MEDUSA_CHOICES = {quoting.py(t['medusa_choices'])}",
        "",
        "",
        "def main(prompts: list[str]) -> None:",
        "    llm = LLM(model=ENGINE_DIR, tokenizer=TOKENIZER_DIR,",
        f"              speculative_config=MedusaDecodingConfig(max_draft_len={quoting.py(t['max_draft_len'])}, "
        f"num_medusa_heads={quoting.py(t['num_medusa_heads'])},",
        "                                                      medusa_choices=MEDUSA_CHOICES),",
        "              kv_cache_config=KvCacheConfig(free_gpu_memory_fraction="
        f"{quoting.py(d['kv_cache_free_gpu_memory_fraction'])}))",
        "    greedy = SamplingParams(max_tokens="
        f"{quoting.py(d['serving']['max_seq_len'] - d['serving']['max_input_len'])}, top_k=1)",
        "    for output in llm.generate(prompts, greedy):",
        "        print(output.outputs[0].text)",
        "",
        "",
        'if __name__ == "__main__":',
        '    main(sys.argv[1:] or ["Once upon a time"])',
    ]
    return head + "\n".join(body) + "\n"


def render_serve_yaml(d: dict) -> str:
    t, s = d["tree"], d["serving"]
    spec = {"decoding_type": "Medusa", "max_draft_len": t["max_draft_len"], "num_medusa_heads": t["num_medusa_heads"],
            "medusa_choices": t["medusa_choices"]}
    lines = ["# trtllm-serve --extra_llm_api_options (trtllm-medusa deploy). Its top-level keys replace the command",
             "# line's outright, so every one the server needs is here: the tree (no route reads it from the engine),",
             "# the KV cache's share of the free GPU memory and the serving sizes.",
             "speculative_config:"] + [f"  {k}: {quoting.yaml(v)}" for k, v in spec.items()] + [
             "kv_cache_config:", f"  free_gpu_memory_fraction: {quoting.yaml(d['kv_cache_free_gpu_memory_fraction'])}",
             f"max_batch_size: {quoting.yaml(s['max_batch_size'])}", f"max_seq_len: {quoting.yaml(s['max_seq_len'])}",
             f"max_num_tokens: {quoting.yaml(s['max_num_tokens'])}"]
    return "\n".join(lines) + "\n"


def serve_argv(d: dict) -> list[str]:
    tp = d["memory"]["tp_size"]
    pp = d["memory"]["pp_size"]
    return ["trtllm-serve", d["engine_dir"], "--backend", "tensorrt", "--tokenizer", d["tokenizer_dir"],
            "--tp_size", str(tp), "--pp_size", str(pp), "--extra_llm_api_options", "./serve.yaml"]


def render_serve(d: dict) -> str:
    request = json.dumps({"prompt": "Once upon a time", "max_tokens": 32, "top_k": 1})
    return _script([
        "# trtllm-serve on the engine (trtllm-medusa deploy): --backend tensorrt serves a built engine (its default,",
        "# pytorch, does not serve Medusa); serve.yaml holds the tree. Ask it, greedily (top_k 1: the base's text):",
        f"#   curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{request}'",
        "exec " + quoting.sh_argv(serve_argv(d))], d["environment"])


def render_triton_fill(d: dict) -> str:
    lines = ["# Triton's model repository for the engine (trtllm-medusa deploy), from TensorRT-LLM 1.2's own templates:",
             "# set TRTLLM_TRITON to its triton_backend/ directory. Writes triton/model_repo/ in the bundle, whose",
             "# absolute paths it fills from where the bundle is now (Triton needs them absolute).",
             'bundle="$(pwd)"',
             'case "$bundle" in *[\\\",:]* | *[[:cntrl:]]*)',
             '  echo "fill.sh: the bundle\'s path $bundle holds a backslash, double quote, comma, colon or control '
             'character, which Triton\'s fill_template.py splits on or config.pbtxt cannot hold: move the bundle to '
             'a plain path and run fill.sh again" >&2',
             "  exit 1;;",
             "esac",
             'repo="$bundle/triton/model_repo"', 'rm -rf "$repo" && mkdir -p "$repo"']
    for model, fill in d["triton"]["fill"].items():
        here = "".join(f",{k}:${{bundle}}/{bundle_name(v)}" for k, v in d["triton"]["in_bundle"].get(model, {}).items())
        lines += [f'cp -r "$TRTLLM_TRITON/all_models/inflight_batcher_llm/{model}" "$repo/"',
                  f'python3 "$TRTLLM_TRITON/tools/fill_template.py" -i "$repo/{quoting.sh(model)}/config.pbtxt" '
                  + quoting.sh(fill) + (f'"{here}"' if here else "")]
    lines.append('echo "wrote $repo"')
    return _script(lines, {}, needs=("TRTLLM_TRITON",), home="..")


def render_triton_launch(d: dict) -> str:
    return _script([
        "# Triton with the repository fill.sh wrote: one MPI rank per engine rank "
        f"(world size {int(d['world_size'])}); ask it with (top_k 1: greedy, the base's own text)",
        "#   curl -s localhost:8000/v2/models/ensemble/generate -d "
        "'{\"text_input\": \"Once upon a time\", \"max_tokens\": 32, \"top_k\": 1, \"bad_words\": \"\", "
        "\"stop_words\": \"\"}'",
        'exec python3 "$TRTLLM_TRITON/scripts/launch_triton_server.py" '
        f'--world_size={int(d["world_size"])} --model_repo="$(pwd)/triton/model_repo"'], d["environment"],
        needs=("TRTLLM_TRITON",), home="..")


def _bring(source: Path, into: Path, keep, what: str) -> dict:
    """``source``'s top-level files that ``keep`` takes, copied into the new directory ``into`` (files/copies.py:
    reflinks where the filesystem has them, never hard links; a link out of the input refused by name; this
    machine's paths in a JSON config replaced by their last component): the bytes copied and the fields scrubbed."""
    source = source.resolve()
    root = input_root(source)
    into.mkdir()
    copied, scrubbed = 0, []
    for f in sorted(source.iterdir()):
        if not keep(f.name):
            continue
        target = own_file(f, root, f"{what} directory")
        if not target.is_file():
            continue
        scrubbed += [f"{f.name}: {field}" for field in copy_scrubbed(target, into / f.name)]
        copied += target.stat().st_size
    return {"bytes": copied, "scrubbed": scrubbed}


def _not_weights(name: str) -> bool:
    return not name.endswith(WEIGHT_SUFFIXES)


def write(d: dict, output_dir: Path, *, overwrite: bool, checkpoint_dir: Path, tokenizer_dir: Path) -> dict:
    """The bundle in ``output_dir``, atomically, with the checkpoint's and the tokenizer's files in it (module doc);
    never over a built engine there (``OUTPUT_DIR/engine``, the default --engine_dir, is the build's, not deploy's:
    --overwrite would remove it). Returns what was brought in: per input the bytes copied and the config fields
    whose paths of this machine were replaced."""
    held = output_dir / "engine"
    if overwrite and held.is_dir() and any(held.iterdir()):
        raise ConversionError("holds a built engine, which deploy did not write; --overwrite would remove it with the "
                              "bundle", where=str(held),
                              fix="move the engine elsewhere (and pass it as --engine_dir), or deploy into another "
                                  "--output_dir")
    brought = {}
    try:
        with atomic_output_dir(output_dir, overwrite=overwrite,
                               inputs={"--checkpoint_dir": checkpoint_dir, "--tokenizer_dir": tokenizer_dir}) as tmp:
            for name, text in (("build.sh", render_build(d)), ("run.sh", render_run(d)),
                               ("llm_api.py", render_llm_api(d)), ("serve.sh", render_serve(d)),
                               ("triton/fill.sh", render_triton_fill(d)), ("triton/launch.sh", render_triton_launch(d))):
                (tmp / name).parent.mkdir(exist_ok=True)
                (tmp / name).write_text(text)
                (tmp / name).chmod(0o755)
            (tmp / "serve.yaml").write_text(render_serve_yaml(d))
            (tmp / "deploy.json").write_text(json.dumps(d, indent=2) + "\n")
            for what, source, keep in (("checkpoint", checkpoint_dir, lambda n: True),
                                       ("tokenizer", tokenizer_dir, _not_weights)):
                brought[what] = _bring(source, tmp / bundle_name(d[f"{what}_dir"]), keep, what)
    except OSError as exc:
        raise ConversionError(f"cannot write the bundle ({exc.strerror})", where=str(output_dir),
                              fix="free space or choose another --output_dir") from None
    return brought
