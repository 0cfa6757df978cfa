"""The main job on an embedded default, offline: build a small non-Llama base and heads, then ``port`` it: check,
convert (tensor parallel 2), verify parity and greedy equivalence on CPU, and write the serving bundle."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from pathlib import Path

from trtllm_medusa_ports.api import PortOptions, port
from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.fixtures.synthetic import (
    TINY_CONFIGS,
    save_heads,
    save_tiny_base,
    save_tiny_tokenizer,
    train_heads,
)
from trtllm_medusa_ports.machine.threads import torch_threads

#: file the demo leaves in its --workdir: only a directory holding it is ever cleared by the demo
MARKER = ".trtllm-medusa-demo"
#: the stages' own options of the demo's port run: tensor parallelism 2 in float16, 48 tokens verified
DEMO_STAGES = {"check": {"tp_size": 2, "dtype": "float16"}, "convert": {"tp_size": 2, "dtype": "float16"},
               "verify": {"max_new_tokens": 48}}


def run_demo(workdir: Path, *, quiet: bool = False, architecture: str = "Qwen2ForCausalLM") -> int:
    """The demo, on the cores nobody else is using (``threads.default_threads``, as every computing command): torch's
    own default of one thread a core waits on descheduled threads at every small operation when other work keeps
    the cores busy. Each step says what it does and how long it took; training shows its progress bar."""
    with torch_threads(None):
        return _run(workdir, quiet, architecture)


def _printer(t0: float, quiet: bool):
    """The demo's lines on stderr (none when quiet); a step's line ("[k/3] ...") starts with the time since ``t0``."""
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
        for name in ("base", "medusa_heads", "tokenizer", "port", "trtllm_checkpoint", "serve"):  # what an earlier
            # demo made (trtllm_checkpoint/ and serve/: before the demo ran port)
            if (workdir / name).exists():
                shutil.rmtree(workdir / name)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        marker.write_text("made by trtllm-medusa demo; `demo --workdir` may replace base/, medusa_heads/, "
                          "tokenizer/, port/ here\n")
    except OSError as exc:  # a read-only working directory, a path under a file or under /proc
        raise PortError(f"cannot create the demo's --workdir ({exc.strerror})", where=str(workdir),
                        fix="run the demo where you can write, or pass --workdir /tmp/demo-output") from None
    base, heads_dir, tok = workdir / "base", workdir / "medusa_heads", workdir / "tokenizer"

    say(f"[1/3] building a small random {architecture} base in {base}, and its tokenizer")
    save_tiny_base(architecture, base, seed=0, embedding_gain=16.0, tie_word_embeddings=False)
    save_tiny_tokenizer(tok, TINY_CONFIGS[architecture]["vocab_size"])
    say("[2/3] training 4 Medusa heads on the base's own greedy text (FasterDecoding medusa_lm_head.pt)")
    heads = train_heads(base, num_heads=4, num_layers=1, positions_per_step=512, quiet=quiet)
    save_heads(heads, heads_dir, "fasterdecoding-pt")

    say(f"[3/3] trtllm-medusa port {base} --medusa_model_dir {heads_dir} --medusa_choices mc_sim_7b_63 --tp_size 2 "
        f"--dtype float16 --max_new_tokens 48 --output_dir {workdir / 'port'}")
    result = port(PortOptions(base, workdir / "port", medusa_model_dir=heads_dir, medusa_choices="mc_sim_7b_63",
                              tokenizer_dir=tok, quiet=quiet, stages=DEMO_STAGES))
    checked = result.made.get("check")
    for f in checked.findings if checked is not None else ():
        say(f"      {f.severity:7s} {f.rule}: {textwrap.shorten(f.message, 110, placeholder=' ...')}")  # whole words
    for stage in ("convert", "verify", "deploy"):
        if stage in result.made:
            print(result.made[stage].summary() if stage == "convert" else result.made[stage].render())
    print(result.render())
    if result.compatible is False:
        print("demo: the base was rejected by the checker", file=sys.stderr)
    print(f"demo finished in {time.time() - t0:.1f} s; artifacts in {workdir}")
    return result.exit_code
