"""The main job on an embedded default, offline: build a small non-Llama base and heads,
check, convert (tensor parallel 2), verify parity and greedy equivalence on CPU, and write the serving bundle."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from pathlib import Path

from trtllm_medusa_ports.api import DeployOptions, deploy
from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.compat import check, errors_of
from trtllm_medusa_ports.convert import ConvertOptions, convert
from trtllm_medusa_ports.errors import EXIT_FOUND, EXIT_OK, PortError
from trtllm_medusa_ports.fixtures.synthetic import (
    TINY_CONFIGS,
    save_heads,
    save_tiny_base,
    save_tiny_tokenizer,
    train_heads,
)
from trtllm_medusa_ports.threads import torch_threads
from trtllm_medusa_ports.verify import verify

#: file the demo leaves in its --workdir: only a directory holding it is ever cleared by the demo
MARKER = ".trtllm-medusa-demo"


def run_demo(workdir: Path, *, quiet: bool = False, architecture: str = "Qwen2ForCausalLM") -> int:
    """The demo, on the cores nobody else is using (``threads.default_threads``, as every computing command): torch's
    own default of one thread a core waits on descheduled threads at every small operation when other work keeps
    the cores busy. Each step says what it does and how long it took; training shows its progress bar."""
    with torch_threads(None):
        return _run(workdir, quiet, architecture)


def _printer(t0: float, quiet: bool):
    """The demo's lines on stderr (none when quiet); a step's line ("[k/6] ...") starts with the time since ``t0``."""
    def say(message: str) -> None:
        if not quiet:
            print(message if not message.startswith("[") else
                  f"{message[:5]} {time.time() - t0:5.1f} s  {message[6:]}", file=sys.stderr)
    return say


def _run(workdir: Path, quiet: bool, architecture: str) -> int:
    t0 = time.time()
    say = _printer(t0, quiet)
    if quiet:  # transformers' own bars (saving and loading the tiny base) too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if adapter_for(architecture) is None or architecture not in TINY_CONFIGS:
        raise PortError(f"--architecture {architecture!r} has no tiny demo model",
                        fix="one of: " + ", ".join(sorted(TINY_CONFIGS)))
    marker = workdir / MARKER
    if workdir.exists() or workdir.is_symlink():
        if not workdir.is_dir():
            raise PortError("exists and is not a directory", where=str(workdir), fix="choose another --workdir")
        if any(workdir.iterdir()) and not marker.is_file():
            raise PortError("the directory is not empty and was not made by the demo; nothing was removed",
                            where=str(workdir), fix="choose a new or empty --workdir")
        for name in ("base", "medusa_heads", "trtllm_checkpoint", "tokenizer", "serve"):  # what an earlier demo made
            if (workdir / name).exists():
                shutil.rmtree(workdir / name)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        marker.write_text("made by trtllm-medusa demo; `demo --workdir` may replace base/, medusa_heads/, "
                          "trtllm_checkpoint/, tokenizer/, serve/ here\n")
    except OSError as exc:  # a read-only working directory, a path under a file or under /proc
        raise PortError(f"cannot create the demo's --workdir ({exc.strerror})", where=str(workdir),
                        fix="run the demo where you can write, or pass --workdir /tmp/demo-output") from None
    base, heads_dir, ckpt = workdir / "base", workdir / "medusa_heads", workdir / "trtllm_checkpoint"

    say(f"[1/6] building a small random {architecture} base in {base}")
    save_tiny_base(architecture, base, seed=0, embedding_gain=16.0, tie_word_embeddings=False)
    say("[2/6] training 4 Medusa heads on the base's own greedy text (FasterDecoding medusa_lm_head.pt)")
    heads = train_heads(base, num_heads=4, num_layers=1, positions_per_step=512, quiet=quiet)
    save_heads(heads, heads_dir, "fasterdecoding-pt")

    say("[3/6] trtllm-medusa check")
    arch, findings = check(base, heads_dir, medusa_choices="mc_sim_7b_63", tp_size=2, dtype="float16")
    for f in findings:
        say(f"      {f.severity:7s} {f.rule}: {textwrap.shorten(f.message, 110, placeholder=' ...')}")  # whole words
    if errors_of(findings):
        print("demo: the base was rejected by the checker", file=sys.stderr)
        return EXIT_FOUND

    say(f"[4/6] trtllm-medusa convert --tp_size 2 --dtype float16 -> {ckpt}")
    result = convert(ConvertOptions(model_dir=base, medusa_model_dir=heads_dir, output_dir=ckpt,
                                    tp_size=2, dtype="float16", medusa_choices="mc_sim_7b_63", quiet=quiet))
    print(result.summary())

    say("[5/6] trtllm-medusa verify (HF transformers vs the CPU reference executor, tree mc_sim_7b_63)")
    report = verify(base, ckpt, max_new_tokens=48, quiet=quiet)  # the tree convert recorded
    print(report.render())

    say(f"[6/6] trtllm-medusa deploy -> {workdir / 'serve'} (build.sh, run.sh, llm_api.py, serve.*, triton/)")
    save_tiny_tokenizer(workdir / "tokenizer", TINY_CONFIGS[architecture]["vocab_size"])
    bundle = deploy(DeployOptions(ckpt, workdir / "tokenizer", workdir / "serve", overwrite=True))
    print(bundle.render())
    print(f"demo finished in {time.time() - t0:.1f} s; artifacts in {workdir}")
    return EXIT_OK if report.ok else EXIT_FOUND
