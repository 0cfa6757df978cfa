"""``trtllm-medusa build``: ``trtllm-build`` with our architectures registered and the checks run first."""

from __future__ import annotations

import json
import sys
from importlib import import_module
from pathlib import Path

from trtllm_medusa_ports.compat import ERROR, Finding, alibi_reason
from trtllm_medusa_ports.engine import EngineUnavailable, require_tensorrt_llm
from trtllm_medusa_ports.errors import CheckpointError
from trtllm_medusa_ports.hf_model import HFConfig


def checkpoint_findings(checkpoint_dir: Path) -> list[Finding]:
    """The rules that can be judged from a converted checkpoint's config.json."""
    path = checkpoint_dir / "config.json"
    if not path.is_file():
        raise CheckpointError("no config.json", where=str(checkpoint_dir),
                              fix="pass the --output_dir of trtllm-medusa convert")
    cfg = json.loads(path.read_text())
    out = []
    reason = alibi_reason(HFConfig(cfg, path))
    if reason or str(cfg.get("position_embedding_type", "")).startswith("alibi"):
        out.append(Finding("alibi-position-embedding", ERROR,
                           "the checkpoint uses ALiBi, which the XQA spec-decoding kernels do not implement",
                           "use a RoPE base; this checkpoint was written with --allow_unsupported"))
    if not cfg.get("num_medusa_heads"):
        out.append(Finding("not-medusa", ERROR, "config.json has no num_medusa_heads",
                           "convert with trtllm-medusa convert --medusa_model_dir ..."))
    if cfg.get("dtype") == "float32":
        out.append(Finding("dtype-float32", ERROR, "TensorRT-LLM refuses float32 with speculative decoding",
                           "convert with --dtype float16 or bfloat16"))
    return out


def main(checkpoint_dir: str, rest: list[str]) -> int:
    ckpt = Path(checkpoint_dir)
    try:
        findings = checkpoint_findings(ckpt)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    errors = [f for f in findings if f.severity == ERROR]
    for f in errors:
        print(f"error: [{f.rule}] {f.message}\n  fix: {f.fix}", file=sys.stderr)
    if errors:
        return 1
    try:
        trtllm = require_tensorrt_llm()
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from trtllm_medusa_ports.engine.registry import register_architectures

    register_architectures(trtllm)
    args = ["--checkpoint_dir", str(ckpt)] + list(rest)
    if "--speculative_decoding_mode" not in args:
        args += ["--speculative_decoding_mode", "medusa"]
    if "--workers" in args:
        # worker processes would not see the registration done in this one
        print("warning: --workers ignored; our architectures are registered in this process only",
              file=sys.stderr)
        i = args.index("--workers")
        del args[i : i + 2]
    build = import_module("tensorrt_llm.commands.build")
    old = sys.argv
    sys.argv = ["trtllm-build"] + args
    try:
        build.main()
    finally:
        sys.argv = old
    return 0
