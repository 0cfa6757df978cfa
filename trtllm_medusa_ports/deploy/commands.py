"""The commands a checkpoint is built and run with, read from its config.json alone.

- **Which build command.** Upstream's ``trtllm-build`` looks ``architecture`` up in ``MODEL_MAP``
  (tensorrt_llm/commands/build.py ``main`` -> tensorrt_llm/models/modeling_utils.py ``PretrainedConfig.from_dict``)
  and so refuses every ``MedusaPorts<class>`` checkpoint: those build with ``trtllm-medusa build`` (engine/build.py),
  which hands upstream's ``parallel_build`` our class. Only a checkpoint naming upstream's own
  ``MedusaForCausalLM`` builds with plain ``trtllm-build``.
- **Always ``--speculative_decoding_mode medusa``.** The 1.x builder no longer turns Medusa on from the checkpoint's
  ``max_draft_len`` (tensorrt_llm/builder.py ``build``): without the flag no runtime treats the engine as Medusa.
- **The XQA JIT switch.** With speculative decoding, generation attention runs on XQA kernels only; where the runner
  would pick precompiled kernels that do not take this attention shape but the JIT kernels do
  (:func:`trtllm_medusa_ports.gpu.xqa.xqa_medusa_route`), the engine runs only with ``TRTLLM_ENABLE_XQA_JIT=1``; where
  it would pick JIT kernels that do not take it but the precompiled ones do, only with ``TRTLLM_ENABLE_XQA_JIT=0``;
  where only the precompiled ones take it (a group over 32) and the runner picks them, ``=0`` pins them (a later
  runner's default is JIT, which has no kernel for it: :func:`jit_only_note`).
- **Tensor and pipeline parallelism at run time**: a world size over 1 runs under ``mpirun -n <world size>
  --allow-run-as-root`` (examples/run.py reads its rank from MPI).

May import: ``xqa`` only (convert, verify and the deploy bundle read it).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trtllm_medusa_ports.gpu.xqa import (
    XQA_JIT_ENV,
    XQA_JIT_ONLY,
    relies_on_precompiled,
    xqa_environment,
    xqa_serving_routes,
)

#: upstream's own Medusa class (tensorrt_llm/models/__init__.py MODEL_MAP): plain trtllm-build builds it
UPSTREAM_MEDUSA = "MedusaForCausalLM"


def world_size(cfg: dict) -> int:
    m = cfg.get("mapping") or {}
    return int(m.get("world_size") or int(m.get("tp_size", 1)) * int(m.get("pp_size", 1)))


def build_tool(cfg: dict) -> str:
    """``trtllm-build`` for upstream's own class, ``trtllm-medusa build`` for ours (see the module doc)."""
    return "trtllm-build" if cfg.get("architecture") == UPSTREAM_MEDUSA else "trtllm-medusa build"


def xqa_routes(cfg: dict) -> dict:
    """The XQA routes of this checkpoint's attention shape on the GPUs that hold its KV cache (xqa.py)."""
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_size = int(cfg.get("head_size") or int(cfg.get("hidden_size") or 0) // heads)
    kv_dtype = (cfg.get("quantization") or {}).get("kv_cache_quant_algo")
    return xqa_serving_routes(max(1, heads // max(1, kv)), head_size, kv_dtype)


def jit_only_note(cfg: dict) -> str | None:
    """What a runner with the XQA JIT kernels alone means for this attention shape (xqa.py ``XQA_JIT_ONLY``), where
    only the precompiled kernels serve it (a group over 32 with head size 128); None otherwise."""
    routes = xqa_routes(cfg)
    return XQA_JIT_ONLY if relies_on_precompiled(routes) else None


def needs_xqa_jit(cfg: dict) -> bool:
    """Whether some GPU serves this attention shape only with ``TRTLLM_ENABLE_XQA_JIT=1``."""
    return xqa_environment(xqa_routes(cfg)).get(XQA_JIT_ENV) == "1"


def build_argv(cfg: dict, checkpoint_dir: str | Path, engine_dir: str | Path, **serving: int | None) -> list[str]:
    """The build command for this checkpoint, as an argument list: ``serving`` adds ``--max_batch_size``,
    ``--max_input_len``, ``--max_seq_len``, ``--max_num_tokens`` where given."""
    argv = [*build_tool(cfg).split(), "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(engine_dir),
            "--speculative_decoding_mode", "medusa"]
    for flag in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"):
        if serving.get(flag) is not None:
            argv += [f"--{flag}", str(int(serving[flag]))]
    return argv


def environment(cfg: dict) -> dict[str, str]:
    """What the engine's process needs in its environment: the XQA JIT switch where some GPU has a kernel for this
    attention shape only with it (``1``: the JIT kernels; ``0``: the precompiled ones, where the runner would pick
    JIT kernels that do not take it - a group of 64, or 33-64 with an FP8 cache on SM 9.0; xqa.py)."""
    return xqa_environment(xqa_routes(cfg))


def build_line(cfg: dict, checkpoint_dir: str | Path, engine_dir: str | Path = "ENGINE_DIR", **serving) -> str:
    """:func:`build_argv` as one shell line, with the environment it needs in front."""
    env = " ".join(f"{k}={v}" for k, v in environment(cfg).items())
    return (env + " " if env else "") + shlex.join(build_argv(cfg, checkpoint_dir, engine_dir, **serving))
