#!/usr/bin/env python3
"""Run the same commands at two git revisions of this repository and compare what they write, file by file.

A restructuring (modules moved, functions split) must not change behaviour: this script proves it on the
outputs. For each revision it checks the tree out (``git worktree``, removed afterwards), then runs with that
revision's package first on ``PYTHONPATH``:

* ``trtllm-medusa demo`` (the README's end-to-end job);
* ``convert`` of one tiny synthetic base and its heads in every format we write (float16, bfloat16, FP8, FP8 with
  an FP8 KV cache, INT8 KV cache, INT8 / INT4 weight-only, tp 2, pp 2), then ``verify --json`` of each;
* ``convert --base_checkpoint_dir`` of the ModelOpt fixtures (FP8, INT4-AWQ) and ``verify --json`` of each;
* ``check --json`` and ``inspect-heads --json``.

Both revisions read the same inputs (made once, by the newer revision's fixtures) and write under the same paths
(one revision at a time), so a recorded path compares equal. Compared: every written file byte for byte, every
command's exit code, stdout and stderr, with wall-clock figures masked (``in 1.4 s`` in the text, the calibration
record's ``seconds`` in a written config.json).

    python3 scripts/compare_revisions.py 002f482 HEAD            # report; exit 1 on any difference
    python3 scripts/compare_revisions.py 002f482 HEAD --keep DIR # keep both runs' outputs in DIR

Never run by CI (it takes a few minutes); its report is quoted in the closing notes of restructuring work.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "modelopt"

#: (name, convert flags) of the formats compared
FORMATS = [
    ("float16", []), ("bfloat16", ["--dtype", "bfloat16"]), ("fp8", ["--qformat", "fp8"]),
    ("fp8-kv", ["--qformat", "fp8", "--kv_cache_dtype", "fp8"]), ("int8-kv", ["--int8_kv_cache"]),
    ("int8-wo", ["--use_weight_only"]), ("int4-wo", ["--use_weight_only", "--weight_only_precision", "int4"]),
    ("tp2", ["--tp_size", "2"]), ("pp2", ["--pp_size", "2"]),
]
#: ModelOpt fixtures the add-heads route is compared on
TOOL_BASES = ["fp8", "int4_awq"]
_TIMES = [re.compile(r"\bin \d+(\.\d+)? ?s\b"), re.compile(r'"(seconds|elapsed[a-z_]*|wall[a-z_]*)": [0-9.e+-]+'),
          re.compile(r"\d+(\.\d+)?(it|s)/s\]|\[\d\d:\d\d<[^\]]*\]"), re.compile(r"\d+(\.\d+)? ?s/it")]


def _masked(text: str) -> str:
    for pattern in _TIMES:
        text = pattern.sub("<time>", text)
    return text


def make_inputs(root: Path) -> dict[str, Path]:
    """One tiny Qwen2 base with 3 heads (the newer revision's fixtures), and the ModelOpt fixtures."""
    from trtllm_medusa_ports.fixtures.synthetic import (
        random_heads,
        save_heads,
        save_tiny_base,
        tiny_config,
    )

    # widths that are multiples of 64 x 2, so that weight-only converts at tp 1 and 2
    sizes = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    base = save_tiny_base("Qwen2ForCausalLM", root / "base", seed=7, **sizes)
    vocab = tiny_config("Qwen2ForCausalLM").vocab_size
    heads = save_heads(random_heads(128, vocab, num_heads=3, seed=8), root / "heads")
    (root / "calib.jsonl").write_text("".join(json.dumps({"input_ids": [(7 * i + 3 * j) % vocab for j in range(24)]})
                                              + "\n" for i in range(8)))
    hf_for_tools = FIXTURES / "hf_qwen2"
    tool_heads = save_heads(random_heads(128, 250, num_heads=3, seed=9), root / "tool-heads")
    return {"base": base, "heads": heads, "tool_hf": hf_for_tools, "tool_heads": tool_heads,
            "calib": root / "calib.jsonl"}


def commands(inputs: dict[str, Path], out: Path) -> list[tuple[str, list[str]]]:
    base, heads = str(inputs["base"]), str(inputs["heads"])
    cmds: list[tuple[str, list[str]]] = [("demo", ["demo", "--workdir", str(out / "demo"), "--quiet"]),
                                         ("check", ["check", "--model_dir", base, "--medusa_model_dir", heads,
                                                    "--json"]),
                                         ("inspect-heads", ["inspect-heads", heads, "--json"])]
    for name, flags in FORMATS:
        ckpt = str(out / f"ckpt-{name}")
        calibrated = any(f in flags for f in ("fp8", "--int8_kv_cache"))
        calib = ["--calib_dataset", str(inputs["calib"]), "--calib_size", "8"] if calibrated else []
        cmds.append((f"convert-{name}", ["convert", "--model_dir", base, "--medusa_model_dir", heads,
                                         "--output_dir", ckpt, "--quiet", *flags, *calib]))
        cmds.append((f"verify-{name}", ["verify", "--model_dir", base, "--checkpoint_dir", ckpt, "--json",
                                        "--quiet", "--max_new_tokens", "8"]))
    for tool in TOOL_BASES:
        ckpt = str(out / f"ckpt-tool-{tool}")
        cmds.append((f"add-heads-{tool}", ["convert", "--base_checkpoint_dir", str(FIXTURES / tool),
                                           "--medusa_model_dir", str(inputs["tool_heads"]), "--output_dir", ckpt,
                                           "--quiet"]))
        calib = ["--calib_dataset", str(FIXTURES / "calib_ids.jsonl")] if (FIXTURES / "calib_ids.jsonl").exists() else []
        cmds.append((f"verify-tool-{tool}", ["verify", "--model_dir", str(inputs["tool_hf"]), "--checkpoint_dir",
                                             ckpt, "--json", "--quiet", "--max_new_tokens", "8", *calib]))
    return cmds


def run_revision(rev: str, inputs: dict[str, Path], out: Path, work: Path) -> dict:
    """Every command at ``rev``: {name: (exit code, stdout, stderr)}; the files are left under ``out``."""
    tree = work / f"tree-{rev.replace('/', '_')}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
    try:
        env = dict(os.environ, PYTHONPATH=str(tree), TQDM_DISABLE="1")
        results = {}
        for name, argv in commands(inputs, out):
            p = subprocess.run([sys.executable, "-m", "trtllm_medusa_ports", *argv], env=env, capture_output=True,
                               text=True, cwd=work)
            results[name] = (p.returncode, _masked(p.stdout.replace(str(tree), "<tree>")),
                             _masked(p.stderr.replace(str(tree), "<tree>")))
            print(f"  {rev} {name}: exit {p.returncode}", file=sys.stderr, flush=True)
        return results
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


#: keys of a written JSON file that hold a wall-clock figure (config.json's calibration record: ``seconds``)
TIME_KEYS = {"seconds"}


def _without_times(v):
    if isinstance(v, dict):
        return {k: _without_times(x) for k, x in v.items() if k not in TIME_KEYS}
    return [_without_times(x) for x in v] if isinstance(v, list) else v


def _digest(p: Path) -> str:
    data = p.read_bytes()
    if p.suffix == ".json":  # the bytes, but for a wall-clock figure: the same JSON with its times taken out
        try:
            value = json.loads(data)
        except ValueError:
            return hashlib.sha256(data).hexdigest()
        stripped = _without_times(value)
        if stripped != value:
            return "json-without-times:" + hashlib.sha256(json.dumps(stripped, sort_keys=True).encode()).hexdigest()
    return hashlib.sha256(data).hexdigest()


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def compare(a: dict, b: dict, files_a: dict, files_b: dict) -> list[str]:
    diffs = []
    for name in a:
        for what, x, y in zip(("exit code", "stdout", "stderr"), a[name], b.get(name, (None,) * 3), strict=True):
            if x != y:
                diffs.append(f"{name}: {what} differs" + (f" ({x} vs {y})" if what == "exit code" else ""))
    for path in sorted(set(files_a) | set(files_b)):
        if files_a.get(path) != files_b.get(path):
            diffs.append(f"file {path}: " + ("only in one run" if path not in files_a or path not in files_b
                                             else "bytes differ"))
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--keep", type=Path, default=None, help="keep both runs' outputs here (a new directory)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compare-revisions-"))
    try:
        inputs = make_inputs(work / "inputs")
        runs, files = {}, {}
        for rev in (args.before, args.after):
            out = work / "out"
            runs[rev] = run_revision(rev, inputs, out, work)
            files[rev] = digests(out)
            if args.keep:
                shutil.copytree(out, args.keep / rev.replace("/", "_"))
            shutil.rmtree(out)
        diffs = compare(runs[args.before], runs[args.after], files[args.before], files[args.after])
        n_files = len(set(files[args.before]) | set(files[args.after]))
        if args.keep:
            for rev in runs:
                (args.keep / f"{rev.replace('/', '_')}.json").write_text(json.dumps(runs[rev], indent=1))
        print(f"{len(runs[args.before])} commands, {n_files} written files compared between {args.before} and "
              f"{args.after}: " + ("identical" if not diffs else f"{len(diffs)} difference(s)"))
        for d in diffs:
            print(f"  {d}")
        return 1 if diffs else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
