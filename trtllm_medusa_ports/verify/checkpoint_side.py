"""The checkpoint side on the reference executor: logits parity against transformers' runs and where they part
ways (the first differing tensor, the first differing hidden state), greedy equivalence of the Medusa loop, and
what the executor computes for a padded vocabulary or a checkpoint written over refusing rules.

May import: ``reference``, ``plan`` and ``files`` (replaying the conversion), ``archs``, ``quant.prequantized``,
``errors``, ``verify.limits``, ``verify.inputs``.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.reference.decoding import medusa_generate
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree
from trtllm_medusa_ports.verify.inputs import checkpoint_dtype
from trtllm_medusa_ports.verify.limits import PARITY_RTOL


def vocab_padding(hf_vocab: int, ref: ReferenceModel, ckpt, model_dir) -> str | None:
    """A checkpoint vocabulary padded past the base's with zero rows (ModelOpt's AWQ export) is compared on the
    base's ids: the executor's logits stop there (the note says so). Any other difference is an error."""
    if hf_vocab == ref.vocab:
        return None
    from trtllm_medusa_ports.quant.prequantized import padded_rows_are_zero

    if hf_vocab > ref.vocab or not padded_rows_are_zero(ckpt, ckpt.config, hf_vocab):
        raise ModelError(f"the base model's vocab_size is {hf_vocab}, the checkpoint's {ref.vocab}"
                         + (" and its rows past the base's are not zero padding" if hf_vocab < ref.vocab else ""),
                         where=str(model_dir), fix="pass the --model_dir the checkpoint was converted from")
    padded = ref.vocab
    ref.vocab = hf_vocab
    return (f"the checkpoint's vocabulary is padded from {hf_vocab} to {padded} with zero rows (ModelOpt pads an "
            f"AWQ export's embedding and lm_head): logits are compared on the base's {hf_vocab} ids; the engine's "
            "padded logits are 0, so its argmax could only pick a padded id where every real logit is below 0")


#: what the reference executor computes for a checkpoint written over each overridable rule: the base's own
#: arithmetic where the engine has no kernel for it (so parity passes and says nothing about the engine), or the
#: engine's where it computes something else (so parity fails by the rule's difference)
_OVERRIDE_MEANS = {
    "alibi-position-embedding": "the base's ALiBi attention, which no XQA kernel of a Medusa engine computes (it "
                                "fails at run time or drops the slopes): parity says nothing about an engine",
    "attention-softcapping": "the base's soft-capped attention, which XQA ignores: parity says nothing about an engine",
    "engine-divergence": "what the engine computes, transformers what the base is: parity fails by that difference",
}


def allow_unsupported_notes(ckpt) -> list[str]:
    """A checkpoint written over refusing rules: what the executor computes for each (see ``_OVERRIDE_MEANS``)."""
    notes = []
    for w in (ckpt.config.get("medusa_ports") or {}).get("warnings", []):
        if not w.startswith("WRITING A CHECKPOINT"):
            continue
        for rule in (r.strip() for r in w.split(": ", 1)[-1].split(";")):
            means = _OVERRIDE_MEANS.get(rule, "what the engine's class would compute where the port models it; "
                                              "check the rule's section in docs/compatibility-rules.md")
            notes.append(f"the checkpoint was written with --allow_unsupported over [{rule}]: the executor computes "
                         f"{means}")
    return notes


def parity_pass(ref: ReferenceModel, prompts: list[list[int]], hf_runs: list, base_tensors: dict):
    """Logits parity of every prompt against transformers' (``hf_runs``), and where the first failing one
    parts ways (with ``base_tensors``, :func:`base_tensor_check`'s result, naming the first differing tensor);
    the runs ``(hf logits, hf states, executor logits, executor states)``."""
    max_diff = 0.0
    scale = 1.0
    divergence = None
    runs = []
    for p, (hl, hs) in zip(prompts, hf_runs, strict=True):
        record: list[torch.Tensor] = []
        rl, _ = ref.forward(p, ref.new_cache(), record=record)
        max_diff = max(max_diff, float((hl - rl).abs().max()))
        scale = max(scale, float(hl.abs().max()))
        runs.append((hl, hs, rl, record))
    tolerance = PARITY_RTOL * scale
    for hl, hs, rl, record in runs:
        if float((hl - rl).abs().max()) > tolerance:
            divergence = _locate(hs, record)
            divergence["first_differing_tensor"] = base_tensors["first_differing"]
            break
    parity = max_diff <= tolerance
    return parity, max_diff, tolerance, divergence, runs


def _differs(a: torch.Tensor, b: torch.Tensor) -> float | None:
    d = float((a - b).abs().max())
    return d if d > PARITY_RTOL * max(1.0, float(a.abs().max())) else None


def _locate(hf_states: tuple[torch.Tensor, ...], ref_states: list[torch.Tensor]) -> dict:
    """First point where the hidden states differ: the embedding, a layer, the final norm, lm_head.

    HF gives the embedding output, each layer's output but the last, and the last
    layer's output after the final norm; the executor records the same points plus
    the last layer's raw output. Each point is judged relative to its own scale.
    """
    n_layers = len(ref_states) - 2
    if len(hf_states) != n_layers + 1:
        return {"where": "unknown (layer counts differ)", "max_abs_diff": float("nan")}
    for i in range(n_layers):
        d = _differs(hf_states[i], ref_states[i])
        if d is not None:
            return {"where": "embedding" if i == 0 else f"layer {i - 1} output", "max_abs_diff": d}
    d = _differs(hf_states[n_layers], ref_states[n_layers + 1])
    if d is not None:
        return {"where": f"layer {n_layers - 1} output or the final norm", "max_abs_diff": d}
    return {"where": "lm_head", "max_abs_diff": 0.0}


def base_tensor_check(model_dir: str | Path, ckpt) -> dict:
    """Every base tensor of the checkpoint against what the converter makes of the Hugging Face weights today,
    whether or not parity passed (a changed embedding row no prompt reads passes parity): ``compared`` (tensors
    equal), ``skipped`` (stored quantized: their codes and scales are the quantization checks'),
    ``first_differing`` (None, or the first tensor in conversion order that differs, naming it where the
    hidden-state comparison can only name a layer, e.g. "transformer.layers.3.post_layernorm.weight, rank 1").

    A vocabulary padded past the base's with zero rows (ModelOpt's export) is compared on the base's rows.
    """
    from trtllm_medusa_ports.conversion.plan import base_jobs, job_inputs, shard_for
    from trtllm_medusa_ports.files.hf_model import HFModel

    out = {"compared": 0, "skipped": 0, "first_differing": None}
    adapter = adapter_for(ckpt.config.get("base_architecture") or "")
    if adapter is None:
        out["first_differing"] = {"tensor": None, "rank": None, "why": "the checkpoint names no ported family"}
        return out
    dtype = checkpoint_dtype(ckpt.config)
    try:
        jobs = base_jobs(HFModel(model_dir), adapter, ckpt.config, dtype)
    except Exception as exc:  # noqa: BLE001 - the weights cannot even be planned: say so in the report
        out["first_differing"] = {"tensor": None, "rank": None, "why": f"the conversion cannot be replayed ({exc})"}
        return out
    for job in jobs:
        job, inputs = job_inputs(job, dtype)
        for rank, name in job.targets:
            why = _stored_differs(ckpt, rank, name, functools.partial(shard_for, job, inputs, ckpt.config, rank))
            if why == "quantized":
                out["skipped"] += 1
            elif why is not None:
                out["first_differing"] = {"tensor": name, "rank": rank, "why": why}
                return out
            else:
                out["compared"] += 1
    return out


def _stored_differs(ckpt, rank: int, name: str, expected_of) -> str | None:
    """Why the stored tensor differs from the replayed one (None: equal; "quantized": not a float tensor)."""
    if not ckpt.has(rank, name):
        return "missing from the checkpoint"
    stored = ckpt.tensor(rank, name)
    if not stored.dtype.is_floating_point or stored.dtype.itemsize < 2:  # int8/int4 codes, FP8
        return "quantized"
    stored, expected = stored.float(), expected_of().float()
    if stored.shape != expected.shape and stored.dim() == 2 and stored.shape[1:] == expected.shape[1:] \
            and stored.shape[0] > expected.shape[0] and not stored[expected.shape[0]:].any():
        stored = stored[: expected.shape[0]]  # zero rows past the base's vocabulary (vocab_padding's note)
    if stored.shape != expected.shape:
        return f"shape {tuple(stored.shape)}, expected {tuple(expected.shape)}"
    if not torch.equal(stored, expected):
        return f"values differ by up to {float((stored - expected).abs().max()):.3g}"
    return None


def first_differing_tensor(model_dir: str | Path, ckpt) -> dict | None:
    """The first checkpoint tensor that differs from the converted Hugging Face weights, or None
    (:func:`base_tensor_check`'s ``first_differing``)."""
    return base_tensor_check(model_dir, ckpt)["first_differing"]


@dataclass
class GreedyRuns:
    equal: bool
    first: dict | None
    steps: int
    accepted: list[int]
    generated: int
    per_prompt: list[dict]
    seqs: list[list[int]]
    until_end: list[int]  # tokens, steps
    ending_early: int


def greedy_runs(ref: ReferenceModel, prompts: list[list[int]], tree: MedusaTree, max_new_tokens: int,
                 expected_tokens: list[list[int]], ends: set[int], quiet: bool) -> GreedyRuns:
    """Greedy equivalence of the Medusa loop against the expected tokens, and its speculation figures."""
    from tqdm import tqdm

    equal = True
    first = None
    steps = 0
    accepted: list[int] = []
    generated = 0
    per_prompt = []
    seqs = []
    until_end = [0, 0]  # tokens, steps
    ending_early = 0
    for i, (p, expected) in enumerate(zip(tqdm(prompts, desc="greedy equivalence", unit="prompt", disable=quiet,
                                               file=sys.stderr), expected_tokens, strict=True)):
        run = medusa_generate(ref, p, tree, max_new_tokens)
        same = run.tokens == expected
        if not same and first is None:
            pos = next(j for j, (a, b) in enumerate(zip(expected, run.tokens, strict=True)) if a != b)
            first = {"prompt": i, "position": pos, "expected": expected[pos], "got": run.tokens[pos]}
        equal &= same
        steps += run.steps
        accepted += run.accepted_per_step
        generated += len(run.tokens)
        t, n = run.until_end(ends)
        until_end[0] += t
        until_end[1] += n
        ending_early += any(tok in ends for tok in run.tokens)
        seqs.append(p + expected)
        per_prompt.append({"prompt": p, "greedy_equal": same, "steps": run.steps,
                           "mean_accepted_tokens_per_step": run.mean_accepted_tokens_per_step})
    return GreedyRuns(equal, first, steps, accepted, generated, per_prompt, seqs, until_end, ending_early)
