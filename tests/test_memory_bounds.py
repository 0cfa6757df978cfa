"""Bounded memory, measured: a base four times a memory allowance verifies and trains heads within it streaming, and
does not in memory (the allowance binds). One forked copy of the test process runs both commands on one pair of bases,
sampling its peak anonymous resident memory (RssAnon, what a memory limit cannot reclaim; the file pages transformers
maps while loading are clean and reclaimable). Forked, it starts with torch, transformers and the package already
imported (a fresh interpreter spent ~8 s importing them); what it inherits is resident before the first run and is
part of every baseline, which each run is measured against."""

from __future__ import annotations

import ctypes
import gc
import json
import multiprocessing
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch
from conftest import convert_to

from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, save_tiny_base
from trtllm_medusa_ports.huggingface.model import base_float32_bytes

WIDTHS = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
              vocab_size=512, tie_word_embeddings=False)


def anon_bytes() -> int:
    """This process's anonymous resident memory (RssAnon)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("/proc/self/status has no RssAnon line")


class AnonPeak:
    """The peak of :func:`anon_bytes`, sampled every millisecond by a daemon thread from :meth:`restart` on."""

    def __init__(self):
        self.peak = 0
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while True:
            self.peak = max(self.peak, anon_bytes())
            time.sleep(0.001)

    def restart(self) -> None:
        for _ in range(2):  # a sample the poller took before the reset is overwritten by the second
            self.peak = anon_bytes()
            time.sleep(0.005)

    def read(self) -> int:
        return max(self.peak, anon_bytes())


def _measure(runs: list[dict]) -> list[dict]:
    """Each run in turn (verify, or train-heads) and its peak anonymous resident memory (in the forked child). Before
    each run the heap the earlier runs freed is handed back to the system (glibc's malloc_trim), so a run reusing it
    cannot hide its own growth, and the peak restarts at what the process holds then."""
    from trtllm_medusa_ports import api
    from trtllm_medusa_ports.verify import verify

    torch.set_num_threads(1)
    gc.set_threshold(700, 10, 10)  # CPython's default, as a user's process runs (conftest raises it for the suite)
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    sampler = AnonPeak()
    out = []
    for run in runs:
        gc.collect()
        if trim is not None:
            trim(0)
        sampler.restart()
        streaming, t0 = run["streaming"], time.monotonic()
        if run["command"] == "verify":
            rep = verify(run["base"], run["ckpt"], prompts=[[5, 6, 7, 8, 9, 10]], max_new_tokens=2,
                         medusa_choices="[[0],[1]]", quiet=True, threads=1, streaming=streaming, skip_tree_proof=True)
            done = {"ok": rep.ok, "mode": rep.memory_mode["mode"]}
        else:
            r = api.train_heads(api.TrainOptions(
                model_dir=Path(run["base"]), output_dir=Path(run["work"]) / "heads",
                work_dir=Path(run["work"]) / "state", prompts=api.PromptInputs(data=Path(run["data"])), new_tokens=3,
                dtype="float32", threads=1, streaming=streaming,
                fit=api.FitOptions(num_heads=1, steps=2, batch_size=8, share_lm_head=True, matmul_dtype="float32",
                                   heldout_fraction=0, quiet=True)))
            done = {"ok": r.steps == 2 and (Path(run["work"]) / "heads").is_dir(), "mode": r.memory_mode["mode"]}
        out.append({**run, **done, "peak_anon": sampler.read(), "seconds": time.monotonic() - t0})
    return out


def _forked(fn, arg, timeout: float = 600):
    """``fn(arg)`` in a forked copy of this process; its result (an error in the child fails the test with the
    child's traceback)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(("ok", fn(arg)))
        except BaseException:
            send.send(("error", traceback.format_exc()))

    proc = ctx.Process(target=child)
    proc.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise AssertionError(f"the forked measurement ran past {timeout} s")
        status, value = receive.recv()
    except EOFError:
        raise AssertionError(f"the forked measurement died (exit code {proc.join(5) or proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    assert status == "ok", value
    return value


def _bases(root: Path) -> dict[int, dict]:
    """The same Llama with 1 and with 12 layers (50 MB in float32), each with a converted checkpoint, and prompts."""
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt_ids": [5 + i, 6, 7, 8]}) + "\n" for i in range(3)))
    made = {}
    for layers in (1, 12):
        base = save_tiny_base("LlamaForCausalLM", root / f"b{layers}", seed=layers, dtype=torch.bfloat16,
                              num_hidden_layers=layers, **WIDTHS)
        heads = save_heads(random_heads(256, 512, num_heads=2, seed=1, own_lm_head=False), root / f"h{layers}",
                           "fasterdecoding-v2")
        made[layers] = {"base": str(base), "ckpt": str(convert_to(root / f"c{layers}", base, heads, dtype="bfloat16")),
                        "data": str(data)}
    return made


def _runs(made: dict[int, dict], root: Path) -> list[dict]:
    """Every streaming run before any in-memory one (whose base, freed, would otherwise be the heap a later run
    grows into), and each 12-layer run right after a one-layer run of the same command: the baseline it is measured
    against is the process as that run finds it (the libraries, transformers' model code, the fit, buffers: what no
    mode avoids), not the process of another command."""
    order = [("verify", 1, True), ("verify", 12, True), ("train", 1, True), ("train", 12, True),
             ("verify", 1, True), ("verify", 12, False), ("train", 1, True), ("train", 12, False)]
    return [{"command": c, "layers": n, "streaming": s, **made[n], "work": str(root / f"w{i}")}
            for i, (c, n, s) in enumerate(order)]


@pytest.mark.verify_without_build("it measures verify's own peak memory in a forked child, which the build would add to")
def test_a_base_four_times_the_allowance_verifies_and_trains_within_it_streaming(tmp_path):
    """verify and train-heads of the 12-layer base: each run's peak above the one-layer run of the same command
    before it stays under a quarter of the base's float32 size streaming, and exceeds it in memory. Peak RssAnon,
    sampled: a virtual-memory cap (``prlimit --as``) binds on the address space torch, its thread arenas and the
    libraries reserve (0.67 GB before any model), not on the model, so it cannot tell the modes apart at a size a
    test can build."""
    made = _bases(tmp_path)
    float32 = base_float32_bytes(Path(made[12]["base"]))
    assert 48e6 < float32 < 56e6
    allowance = float32 / 4
    runs = _forked(_measure, _runs(made, tmp_path))
    assert [(r["command"], r["layers"], r["mode"]) for r in runs] == [
        ("verify", 1, "streaming"), ("verify", 12, "streaming"), ("train", 1, "streaming"), ("train", 12, "streaming"),
        ("verify", 1, "streaming"), ("verify", 12, "in-memory"), ("train", 1, "streaming"), ("train", 12, "in-memory")]
    assert all(r["ok"] for r in runs), runs
    # the margin is the noise measured in this very run: each command's one-layer run is made twice (runs 0 and 4,
    # 2 and 6), and what the same work's peak moved between the two is what load, threads and the allocator add,
    # not the model (a fixed allowance failed at load 8 by 0.9 MB). Streaming must stay under the allowance plus
    # that noise; in memory must exceed it by as much, so the allowance still binds.
    # the larger of the two commands' noise: both ran in this process, under the same load and sampling
    margin = max(abs(runs[i]["peak_anon"] - runs[i + 4]["peak_anon"]) for i in (0, 2))
    for fixed, big in zip(runs[0::2], runs[1::2], strict=True):
        grew = big["peak_anon"] - fixed["peak_anon"]
        if big["streaming"]:
            assert grew < allowance + margin, (f"{big['command']} streaming grew {grew / 1e6:.2f} MB, allowance "
                                               f"{allowance / 1e6:.2f} MB + noise {margin / 1e6:.2f} MB", runs)
        else:
            assert grew > allowance + margin, (f"{big['command']} in memory grew {grew / 1e6:.2f} MB, allowance "
                                               f"{allowance / 1e6:.2f} MB + noise {margin / 1e6:.2f} MB", runs)


def test_the_memory_formulas_the_docs_state_are_the_codes():
    """One formula per command (issue 57, 9): every 'N GB + Mx' the README, the user guide and benchmarks/README.md
    state is an estimate huggingface/memory_mode.py computes - verify's, train-heads' or streaming's - with its own words for
    what is multiplied, and each of the three is stated."""
    import re

    from trtllm_medusa_ports.huggingface import memory_mode

    root = Path(__file__).resolve().parents[1]
    formulas = {
        memory_mode.in_memory_formula(memory_mode.VERIFY_PER_FLOAT32,
                                      "the float32 size of the larger of base and checkpoint"),
        memory_mode.in_memory_formula(memory_mode.TRAIN_PER_FLOAT32, "the base's float32 size"),
        memory_mode.streaming_formula(),
    }
    seen = set()
    for doc in ("README.md", "docs/user-guide.md", "benchmarks/README.md"):
        text = " ".join((root / doc).read_text().split())  # lines joined: a formula may wrap
        for m in re.finditer(r"\d+(?:\.\d+)? ?GB \+ \d+(?:\.\d+)? ?x", text):
            stated = next((f for f in formulas if text.startswith(f, m.start())), None)
            assert stated is not None, f"{doc}: {text[m.start():m.start() + 90]!r} is none of {sorted(formulas)}"
            seen.add(stated)
    assert seen == formulas, sorted(formulas - seen)
