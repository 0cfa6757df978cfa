"""``verify``: prove that a converted checkpoint is the base model, and that Medusa greedy = base greedy.

1. Logits parity: Hugging Face transformers vs the reference executor on the prompts.
   The HF model computes in float32 on its weights *rounded to the checkpoint's dtype*,
   and so does the executor, so any difference is the conversion's, not the dtype's:
   one tolerance holds for float32, float16 and bfloat16 checkpoints: ``PARITY_RTOL`` times the
   largest |logit| (at least 1), i.e. float32 rounding through a deep network, not a port bug.
2. Greedy equivalence: HF greedy decoding vs reference Medusa decoding with the tree,
   token for token.
3. Speculation quality: mean tokens per step; per-head top-1 / top-k hit rates on the text.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.base_model import (  # noqa: F401  (load_hf_model, value_transforms: re-exported)
    end_token_ids,
    load_hf_model,
    value_transforms,
)
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.checkpoint import read_checkpoint
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES, to_torch
from trtllm_medusa_ports.files.prompts import check_ids
from trtllm_medusa_ports.heads.logits import source_heads_logits
from trtllm_medusa_ports.quant import FP8_GEMM_PATHS, QuantSpec, format_name
from trtllm_medusa_ports.reference.decoding import medusa_generate, plain_generate
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.reference.tree_proof import tree_proof
from trtllm_medusa_ports.threads import default_threads, torch_threads
from trtllm_medusa_ports.tree import MedusaTree, resolve_choices

#: max |logit difference| accepted between HF and the executor (both float32 on the same weights),
#: relative to the logits' scale: max(1, max |logit|) x PARITY_RTOL. Real models carry hidden
#: states of 1e4 and more ("massive activations"), where float32 summation order alone moves
#: the logits by ~1e-5 of their scale; a wrong port moves them by far more.
PARITY_RTOL = 1e-4
#: top-k used for the heads' top-k hit rate
HIT_TOP_K = 5
#: the largest finite float16 value: an activation beyond it is inf in a float16 engine
FLOAT16_MAX = 65504.0


@dataclass
class VerifyReport:
    parity: bool
    logits_max_abs_diff: float
    tolerance: float
    greedy_equal: bool
    tokens_generated: int
    steps: int
    mean_accepted_tokens_per_step: float
    head_top1: list[float]
    head_topk: list[float]
    checkpoint_dtype: str
    prompts: list[list[int]]
    first_divergence: dict | None = None
    adjustments: list[str] = field(default_factory=list)
    engine_arithmetic_effect_max_abs_diff: float | None = None
    parity_divergence: dict | None = None
    per_prompt: list[dict] = field(default_factory=list)
    #: largest |output| of any module of the transformers model on the prompts (float32)
    max_activation: float = 0.0
    #: where it was reached
    max_activation_at: str = ""
    #: what verify did to the inputs it was given (a preset pruned to the heads' depth)
    notes: list[str] = field(default_factory=list)
    #: the checkpoint's heads against the heads read from their source (None: not compared)
    heads_parity: bool | None = None
    heads_max_abs_diff: float | None = None
    heads_tolerance: float | None = None
    heads_source: str | None = None
    heads_detail: str | None = None
    #: tokens per step the tree should give, from the heads' top-k accuracy on these prompts'
    #: greedy text (Medusa paper's product estimate, tune.py) and from joint counts (no independence)
    predicted_tokens_per_step: float | None = None
    predicted_tokens_per_step_joint: float | None = None
    tree_nodes: int = 0
    #: tokens per step had every run stopped at the base's end token, as TensorRT-LLM's runtime
    #: stops at ``end_id`` (reference/decoding.py ``MedusaRun.until_end``); the runs go on past it
    #: so that greedy equivalence compares every token
    tokens_per_step_until_end: float | None = None
    prompts_ending_early: int = 0
    #: quantized checkpoints (trtllm_medusa_ports/quant): the format; parity is against transformers with
    #: the same quantization, greedy equivalence against the executor's own plain decoding of it
    quantization: str | None = None
    quant_scales_checked: int = 0
    quant_scale_mismatches: list = field(default_factory=list)
    quant_scales_not_rederived: str | None = None
    #: the user accepted scales verify could not re-derive (``accept_unchecked_scales``): said in the verdict
    unchecked_scales_accepted: bool = False
    #: the quantization's effect against the float base (information unless max_quant_error is given)
    quant_effect: dict | None = None
    max_quant_error: float | None = None
    #: mixture-of-experts bases: distinct experts a Medusa tree step wakes per layer, on average over the steps,
    #: against a plain decoding step's (one token: its top-k), of ``moe_num_experts`` - the tree's extra cost
    moe_num_experts: int | None = None
    moe_experts_per_tree_step: float | None = None
    moe_experts_per_plain_step: int | None = None
    #: the tree proof (reference/tree_proof.py): steps whose drafts are greedy's own tokens along each branch in
    #: turn, so that every node is accepted and its logits checked; None: not run (``skip_tree_proof``)
    tree_proof: dict | None = None

    @property
    def float16_overflow(self) -> bool:
        return self.checkpoint_dtype == "float16" and self.max_activation > FLOAT16_MAX

    @property
    def quant_error_exceeded(self) -> bool:
        return (self.max_quant_error is not None and self.quant_effect is not None
                and self.quant_effect["max_abs_diff"] > self.max_quant_error)

    @property
    def heads_unaccounted(self) -> bool:
        """The heads could not be compared with their source: it was recorded at conversion and is gone (a head
        changed after conversion would pass greedy equivalence unseen)."""
        return self.heads_parity is None and bool(self.heads_detail) and "is gone" in self.heads_detail

    @property
    def ok(self) -> bool:
        return (self.parity and self.greedy_equal and not self.float16_overflow and self.heads_parity is not False
                and not self.heads_unaccounted and not self.quant_scale_mismatches and not self.quant_error_exceeded
                and (self.tree_proof is None or self.tree_proof["ok"])
                and not (self.quant_scales_not_rederived and not self.unchecked_scales_accepted))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["float16_overflow"] = self.float16_overflow
        d[f"head_top{HIT_TOP_K}"] = d.pop("head_topk")
        return d

    def render(self) -> str:
        lines = [f"note: {n}" for n in self.notes] + [
            f"logits parity     : {'PASS' if self.parity else 'FAIL'}  max |diff| = {self.logits_max_abs_diff:.3g} "
            f"(tolerance {self.tolerance:g}; checkpoint dtype {self.checkpoint_dtype})",
        ]
        for a in self.adjustments:
            lines.append(f"  (arithmetic as the engine's: {a})")
        if self.adjustments:
            lines.append(f"  engine vs transformers arithmetic: logits differ by "
                         f"{self.engine_arithmetic_effect_max_abs_diff:.3g}")
        if self.parity_divergence:
            t = self.parity_divergence.get("first_differing_tensor")
            if t and t.get("tensor"):
                lines.append(f"  first tensor that differs from the converted HF weights: {t['tensor']} "
                             f"(rank {t['rank']}: {t['why']})")
            elif t:
                lines.append(f"  {t['why']}")
            else:
                lines.append("  every base tensor equals the converted HF weights: the difference is in how they "
                             "are used (config.json fields, arithmetic)")
            lines.append(f"  hidden states part ways at: {self.parity_divergence['where']} "
                         f"(max |diff| {self.parity_divergence['max_abs_diff']:.3g})")
        if self.heads_parity is None:
            lines.append(f"heads parity      : {'FAIL  ' if self.heads_unaccounted else ''}not checked "
                         f"({self.heads_detail})")
        else:
            lines.append(f"heads parity      : {'PASS' if self.heads_parity else 'FAIL'}  max |diff| = "
                         f"{self.heads_max_abs_diff:.3g} (tolerance {self.heads_tolerance:g}; heads from "
                         f"{self.heads_source})" + (f"\n  {self.heads_detail}" if self.heads_detail else ""))
        if self.float16_overflow:
            lines.append(f"float16 range     : FAIL  activations reach {self.max_activation:.3g} at "
                         f"{self.max_activation_at}, beyond float16's {FLOAT16_MAX:g}: a float16 engine "
                         "computes inf/NaN there; convert with --dtype bfloat16")
        else:
            lines.append(f"activation range  : largest |activation| {self.max_activation:.3g} "
                         f"({self.max_activation_at})")
        lines.append(f"greedy equivalence: {'PASS' if self.greedy_equal else 'FAIL'}  "
                     f"{self.tokens_generated} tokens over {len(self.prompts)} prompt(s)")
        if self.first_divergence:
            d = self.first_divergence
            lines.append(f"  first divergence: prompt {d['prompt']}, position {d['position']}: "
                         f"base model {d['expected']}, Medusa {d['got']}")
        lines.append(self._tree_proof_line())
        lines.append(f"speculation       : {self.mean_accepted_tokens_per_step:.2f} tokens/step over {self.steps} steps")
        if self.prompts_ending_early and self.tokens_per_step_until_end is not None:
            lines.append(f"  until end token : {self.tokens_per_step_until_end:.2f} tokens/step ({self.prompts_ending_early} "
                         f"of {len(self.prompts)} prompt(s) emit the end token, where a runtime stops)")
        if self.predicted_tokens_per_step is not None:
            lines.append(f"  predicted       : {self.predicted_tokens_per_step:.2f} tokens/step for this {self.tree_nodes}-node "
                         f"tree from the heads' top-k accuracy (joint counts: "
                         f"{self.predicted_tokens_per_step_joint:.2f}); measured {self.mean_accepted_tokens_per_step:.2f}")
        if self.moe_experts_per_tree_step is not None:
            lines.append(f"experts           : a tree step of {self.tree_nodes + 1} tokens wakes "
                         f"{self.moe_experts_per_tree_step:.2f} of {self.moe_num_experts} experts per layer on average; "
                         f"a plain decoding step {self.moe_experts_per_plain_step} (the weights each step reads)")
        if self.quantization:
            lines.append(f"quantization      : {self.quantization}; parity against transformers quantized the same way")
            if self.quant_scale_mismatches:
                lines.append(f"  scales          : FAIL  {len(self.quant_scale_mismatches)} of {self.quant_scales_checked} "
                             "differ from the re-derived ones, e.g. " + "; ".join(
                                 f"{n}: written {a:.6g}, re-derived {b:.6g}" for n, a, b in self.quant_scale_mismatches[:3]))
            elif self.quant_scales_not_rederived:
                lines.append(f"  scales          : {'UNCHECKED' if self.unchecked_scales_accepted else 'FAIL'}  "
                             f"{self.quant_scales_checked} weight scale(s) equal the re-derived ones; the activation / "
                             f"KV scales were not re-derived: {self.quant_scales_not_rederived}"
                             + ("" if self.unchecked_scales_accepted else
                                " (pass the calibration samples, or --accept_unchecked_scales to accept them)"))
            else:
                lines.append(f"  scales          : PASS  {self.quant_scales_checked} written scale(s) equal the re-derived ones")
            e = self.quant_effect
            if e:
                lines.append(f"  against float   : top-1 agreement {e['top1_agreement']:.3f}, logits max |diff| "
                             f"{e['max_abs_diff']:.3g}, mean {e['mean_abs_diff']:.3g}; greedy equal to the float base "
                             f"on {e['greedy_equal_prompts']} of {len(self.prompts)} prompt(s), first "
                             f"{e['greedy_agreed_fraction']:.2f} of the tokens agree"
                             + (f"; with the FP8 / KV rounding Medusa and plain decoding agree on "
                                f"{e['medusa_vs_plain_with_rounding']:.2f} of the tokens"
                                if "medusa_vs_plain_with_rounding" in e else "")
                             + (f" (limit --max_quant_error {self.max_quant_error:g}: "
                                f"{'FAIL' if self.quant_error_exceeded else 'PASS'})"
                                if self.max_quant_error is not None else " (information, not a verdict)"))
        lines.append("head top-1 hits   : " + ", ".join(f"{x:.2f}" for x in self.head_top1))
        lines.append(f"head top-{HIT_TOP_K} hits   : " + ", ".join(f"{x:.2f}" for x in self.head_topk))
        lines.append("RESULT: " + ("OK" if self.ok else "FAILED")
                     + (" (with scales it could not re-derive, accepted by --accept_unchecked_scales)"
                        if self.ok and self.quant_scales_not_rederived and self.unchecked_scales_accepted else "")
                     + (" (the tree proof was skipped: nodes below the root are proven only where the heads' drafts "
                        "were accepted)" if self.tree_proof is None else ""))
        return "\n".join(lines)

    def _tree_proof_line(self) -> str:
        p = self.tree_proof
        if p is None:
            return "tree proof        : not run (--skip_tree_proof)"
        depths = ", ".join(f"{d['accepted']}/{d['nodes']}" for d in p["per_depth"])
        line = (f"tree proof        : {'PASS' if p['ok'] else 'FAIL'}  {p['nodes_accepted']} of {p['tree_nodes']} nodes "
                f"accepted with greedy's own drafts in {p['steps']} steps (by depth: {depths}), logits max |diff| "
                f"{p['max_abs_diff']:.3g} against plain decoding (tolerance {p['tolerance']:.3g})")
        return line + (f"\n  {p['failure']}" if p["failure"] else "")


def default_prompts(vocab: int) -> list[list[int]]:
    """Deterministic prompts that avoid the special ids at the bottom of the vocabulary."""
    return [[(7 * i + 11) % vocab for i in range(6)], [(13 * i + 101) % vocab for i in range(9)]]


def use_engine_gelu(model) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Swap exact (erf) GELUs for the tanh form that TensorRT-LLM computes.

    TensorRT-LLM has one gelu, the tanh approximation (tensorrt_llm/functional.py).
    Comparing against transformers' exact GELU would blur conversion errors with
    this known kernel difference, so parity is judged with the engine's arithmetic
    and the size of the difference is reported on its own. Returns what was swapped
    as ``(parent, name, original)`` so that :func:`restore_modules` can undo it.
    """
    swapped = []
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            exact_torch = isinstance(child, torch.nn.GELU) and child.approximate == "none"
            exact_hf = type(child).__name__ == "GELUActivation"
            if exact_torch or exact_hf:
                setattr(module, name, torch.nn.GELU(approximate="tanh"))
                swapped.append((module, name, child))
    return swapped


def restore_modules(swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]]) -> None:
    for parent, name, original in swapped:
        setattr(parent, name, original)


@dataclass
class EngineArithmetic:
    """One place where the transformers model is made to compute as the engine does."""

    description: str
    undo: Callable[[], None]
    redo: Callable[[], None]


def engine_arithmetic(model, sem: Semantics) -> list[EngineArithmetic]:
    """Make the transformers model compute what TensorRT-LLM computes, where the two differ.

    * GELU: TensorRT-LLM has one, the tanh form (tensorrt_llm/functional.py);
    * q/k norms: built without ``eps`` by the Gemma 3 and QWen layers, so 1e-5 in the engine
      (``Semantics.qk_norm_epsilon``) where transformers uses ``rms_norm_eps``.
    Parity is judged with the engine's arithmetic; ``verify`` reports the size of the difference
    against transformers' own arithmetic separately.
    """
    out = []
    if sem.hidden_act.startswith("gelu"):
        swapped = use_engine_gelu(model)
        if swapped:
            out.append(EngineArithmetic(f"{len(swapped)} exact GELU(s) computed with TensorRT-LLM's tanh form",
                                        lambda: restore_modules(swapped), lambda: use_engine_gelu(model) and None))
    if sem.qk_norm:
        norms = [(m, attr) for name, m in model.named_modules() if name.endswith(("q_norm", "k_norm"))
                 for attr in ("eps", "variance_epsilon") if hasattr(m, attr)]
        changed = [(m, attr, getattr(m, attr)) for m, attr in norms if getattr(m, attr) != sem.qk_norm_epsilon]
        if changed:
            def set_eps(use_engine: bool) -> None:
                for m, attr, own in changed:
                    setattr(m, attr, sem.qk_norm_epsilon if use_engine else own)

            set_eps(True)
            out.append(EngineArithmetic(
                f"{len(changed)} q/k norm(s) with the engine's epsilon {sem.qk_norm_epsilon:g} "
                f"(transformers: {changed[0][2]:g})", lambda: set_eps(False), lambda: set_eps(True)))
    return out


@torch.no_grad()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by the transformers model with its own KV cache, fixed length.

    Written as the loop ``generate`` runs, without its end-of-sequence handling:
    Medusa's equivalence is checked token for token over a fixed length, and a
    random tiny base may emit its EOS id at any point.
    """
    import inspect

    # transformers 5 renamed past_key_values to cache (in and out); 4.x has the old name
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def step(ids: list[int], past):
        out = model(input_ids=torch.tensor([ids]), use_cache=True, **({key: past} if past is not None else {}))
        new_past = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
        return int(out.logits[0, -1].argmax()), new_past

    token, past = step(prompt, None)
    tokens = [token]
    while len(tokens) < max_new_tokens:
        token, past = step([tokens[-1]], past)
        tokens.append(token)
    return tokens


@torch.no_grad()
def _hf_hidden_states(model, ids: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], tuple(h[0] for h in out.hidden_states)


class ActivationRange:
    """The largest |output| of every module of a model while it runs (forward hooks)."""

    def __init__(self, model: torch.nn.Module):
        self.max, self.where = 0.0, ""
        self._hooks = [m.register_forward_hook(self._hook(name)) for name, m in model.named_modules() if name]

    def _hook(self, name: str):
        def hook(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) and output else output
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                m = float(out.detach().abs().max())
                if m > self.max:
                    self.max, self.where = m, name
        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


@torch.no_grad()
def measure_activation_range(model_dir: str | Path, prompts: list[list[int]]) -> tuple[float, str]:
    """Largest |output| of any module of the transformers model (float32) on the prompts, and where."""
    model = load_hf_model(model_dir, torch.float32)
    check_ids(prompts, model.config.vocab_size, error=ModelError, fix="pass prompts of this model's tokenizer")
    rng = ActivationRange(model)
    try:
        for p in prompts:
            model(input_ids=torch.tensor([p]))
    finally:
        rng.close()
    return rng.max, rng.where


def verify(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    medusa_choices: str | None = None,
    prompts: list[list[int]] | None = None,
    max_new_tokens: int = 32,
    quiet: bool = False,
    medusa_model_dir: str | Path | None = None,
    threads: int | None = None,
    max_quant_error: float | None = None,
    skip_tree_proof: bool = False,
    gemm_plugin: str = "auto",
    calibration: list[list[int]] | None = None,
    accept_unchecked_scales: bool = False,
) -> VerifyReport:
    """Logits parity, heads parity, greedy equivalence and the tree proof of a checkpoint (see the module doc).

    ``threads``: torch threads to compute with (default :func:`default_threads`).
    """
    with torch_threads(threads or default_threads()):
        return _verify(model_dir, checkpoint_dir, medusa_choices=medusa_choices, prompts=prompts,
                       max_new_tokens=max_new_tokens, quiet=quiet, medusa_model_dir=medusa_model_dir,
                       max_quant_error=max_quant_error, skip_tree_proof=skip_tree_proof, gemm_plugin=gemm_plugin,
                       calibration=calibration, accept_unchecked_scales=accept_unchecked_scales)


def _verify(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    medusa_choices: str | None,
    prompts: list[list[int]] | None,
    max_new_tokens: int,
    quiet: bool,
    medusa_model_dir: str | Path | None,
    max_quant_error: float | None = None,
    skip_tree_proof: bool = False,
    gemm_plugin: str = "auto",
    calibration: list[list[int]] | None = None,
    accept_unchecked_scales: bool = False,
) -> VerifyReport:
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if max_new_tokens < 1:
        raise ModelError(f"--max_new_tokens {max_new_tokens} must be at least 1", fix="e.g. --max_new_tokens 32")
    def status(text: str) -> None:  # the phases without a progress bar of their own
        if not quiet:
            print(f"verify: {text}", file=sys.stderr, flush=True)

    status(f"reading {checkpoint_dir} (every tensor checked for NaN/Inf)")
    ckpt = read_checkpoint(checkpoint_dir)
    ref = ReferenceModel(ckpt)
    if gemm_plugin not in FP8_GEMM_PATHS:
        raise ModelError(f"--gemm_plugin {gemm_plugin!r}: verify emulates FP8Linear's GEMM for "
                         + " or ".join(FP8_GEMM_PATHS), fix="pass the --gemm_plugin the engine is built with")
    ref.fp8_gemm = gemm_plugin
    dtype = to_torch(_checkpoint_dtype(ckpt.config))
    status(f"loading the base from {model_dir} with transformers")
    hf = load_hf_model(model_dir, dtype, value_transforms(model_dir, ckpt.config.get("base_architecture")),
                       full_precision=ref.adapter.full_precision_parameters)
    ends = end_token_ids(hf)  # where a runtime would stop each run (hf is freed before the runs)
    arithmetic = engine_arithmetic(hf, ref.semantics)
    adjustments = [a.description for a in arithmetic]
    padding = _vocab_padding(hf.config.vocab_size, ref, ckpt, model_dir)
    prompts, tree, pruned = _prompts_and_tree(prompts, medusa_choices, ref, ckpt, checkpoint_dir)
    notes = ([pruned] if pruned else []) + _allow_unsupported_notes(ckpt) + ([padding] if padding else [])

    # Quantized checkpoints: the float base first (the quantization's effect is measured against it), then
    # the same transformers model quantized as the checkpoint is (quant/emulate.py)
    spec, emulation, float_logits, float_greedy = _quantized_reference(hf, ref, ckpt, model_dir, prompts,
                                                                       max_new_tokens, notes, quiet, calibration)

    # Phase 1, transformers alone: its logits, hidden states, activation range, greedy continuations
    # and the heads' logits from their source. Its model is then freed, so that it and the executor's
    # weights are never in memory together (peak: one float32 model, not two).
    status(f"transformers' logits and hidden states on {len(prompts)} prompt(s)")
    hf_runs, activations = _hf_runs(hf, prompts)
    effect = _arithmetic_effect(hf, arithmetic, prompts, hf_runs)
    from tqdm import tqdm

    expected_tokens = [] if spec.any else [
        hf_greedy(hf, p, max_new_tokens)
        for p in tqdm(prompts, desc="transformers greedy", unit="prompt", disable=quiet, file=sys.stderr)]
    source = medusa_model_dir or (ckpt.config.get("medusa_ports") or {}).get("heads_source")
    heads_source = None
    if source and Path(source).exists():
        heads_source = source_heads_for(Path(source), hf, ref, [hs[-1] for _, hs in hf_runs], dtype)
    model_bytes = sum(t.numel() * t.element_size() for t in hf.parameters())
    if emulation is not None:
        emulation.close()
    del hf, arithmetic
    if model_bytes > 64 * 2**20:  # a full collection costs ~0.3 s in a long-lived process: only when it frees much
        gc.collect()
    if emulation is not None:  # the calibration run loads the base again: only now that this copy is freed
        status("re-deriving the activation / KV-cache scales (the recorded calibration, run again)")
        emulation.rederive()

    # Phase 2, the checkpoint on the reference executor. 1. parity
    status(f"logits parity of the checkpoint on the reference executor ({len(prompts)} prompt(s))")
    parity, max_diff, tolerance, divergence, runs = _parity_pass(ref, prompts, hf_runs, model_dir, ckpt)
    exact_logits = [rl for _, _, rl, _ in runs] if spec.any else []
    if spec.any:  # greedy equivalence is against the quantized base's own greedy text (the executor's)
        expected_tokens = [plain_generate(ref, p, max_new_tokens) for p in prompts]
    del runs

    # 1b. the heads, against their source (recorded at conversion unless given)
    heads = _heads_check(heads_source, source, medusa_model_dir, ref, hf_runs)

    # 2. greedy equivalence, 3. speculation quality
    ref.moe_activity = [] if ref.semantics.moe_num_experts else None  # (tokens, distinct experts) per MoE layer call
    g = _greedy_runs(ref, prompts, tree, max_new_tokens, expected_tokens, ends, quiet)
    tree_calls = [n for tokens, n in ref.moe_activity or [] if tokens == tree.num_nodes + 1]
    ref.moe_activity = None
    proof = None
    if not skip_tree_proof:
        status(f"tree proof: every node of the {tree.num_nodes}-node tree accepted with greedy's own drafts")
        proof = tree_proof(ref, prompts[0], tree, rtol=PARITY_RTOL,
                           max_positions=ckpt.config.get("max_position_embeddings")).to_dict()
    quant_effect = _quant_effect(ref, spec, prompts, float_logits, float_greedy, tree, max_new_tokens,
                                 exact_logits, expected_tokens) if spec.any else None
    status("the heads' hit rates and the tree's predicted tokens per step")
    top1, topk = head_hit_rates(ref, g.seqs, [len(p) for p in prompts])
    predicted = predicted_tokens_per_step(ref, tree, g.seqs, [len(p) for p in prompts])
    return VerifyReport(
        parity=parity,
        logits_max_abs_diff=max_diff,
        tolerance=tolerance,
        greedy_equal=g.equal,
        tokens_generated=g.generated,
        steps=g.steps,
        mean_accepted_tokens_per_step=sum(g.accepted) / len(g.accepted) if g.accepted else 0.0,
        head_top1=top1,
        head_topk=topk,
        checkpoint_dtype=str(ckpt.config.get("dtype")),
        prompts=prompts,
        first_divergence=g.first,
        parity_divergence=divergence,
        adjustments=adjustments,
        engine_arithmetic_effect_max_abs_diff=effect,
        per_prompt=g.per_prompt,
        max_activation=activations.max,
        max_activation_at=activations.where,
        notes=notes,
        heads_parity=heads["ok"],
        heads_max_abs_diff=heads["max_abs_diff"],
        heads_tolerance=heads["tolerance"],
        heads_source=str(source) if heads["ok"] is not None else None,
        heads_detail=heads["why"],
        predicted_tokens_per_step=predicted[0],
        predicted_tokens_per_step_joint=predicted[1],
        tree_nodes=tree.num_nodes,
        tokens_per_step_until_end=g.until_end[0] / g.until_end[1] if g.until_end[1] else None,
        prompts_ending_early=g.ending_early,
        quantization=format_name(spec) if spec.any else None,
        quant_scales_checked=emulation.scales_checked if emulation else 0,
        quant_scale_mismatches=emulation.scale_mismatches if emulation else [],
        quant_scales_not_rederived=emulation.not_rederived if emulation else None,
        unchecked_scales_accepted=accept_unchecked_scales,
        quant_effect=quant_effect,
        max_quant_error=max_quant_error,
        moe_num_experts=ref.semantics.moe_num_experts or None,
        moe_experts_per_tree_step=sum(tree_calls) / len(tree_calls) if tree_calls else None,
        moe_experts_per_plain_step=ref.semantics.moe_top_k or None,
        tree_proof=proof,
    )


def _vocab_padding(hf_vocab: int, ref: ReferenceModel, ckpt, model_dir) -> str | None:
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


def _allow_unsupported_notes(ckpt) -> list[str]:
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


def _hf_runs(hf, prompts: list[list[int]]):
    """transformers' logits and hidden states per prompt, and the largest activation met on the way."""
    activations = ActivationRange(hf)
    runs = [_hf_hidden_states(hf, p) for p in prompts]
    activations.close()
    return runs, activations


def _arithmetic_effect(hf, arithmetic, prompts: list[list[int]], hf_runs) -> float | None:
    """How far the same model with transformers' own arithmetic is from the engine's (the logits ``hf_runs`` hold
    were computed with the engine's); None when no adjustment was made."""
    if not arithmetic:
        return None
    for a in arithmetic:
        a.undo()
    with torch.no_grad():
        effect = max(float((hf(input_ids=torch.tensor([p])).logits[0] - hl).abs().max())
                     for p, (hl, _) in zip(prompts, hf_runs, strict=True))
    for a in arithmetic:
        a.redo()
    return effect


def _quantized_reference(hf, ref: ReferenceModel, ckpt, model_dir: str | Path, prompts: list[list[int]],
                         max_new_tokens: int, notes: list[str], quiet: bool, calibration=None):
    """For a quantized checkpoint: the float base's logits and greedy text first (the quantization's effect is
    measured against them), then the transformers model quantized as the checkpoint is (quant/emulate.py).
    Returns ``(spec, emulation or None, float logits, float greedy)``; ``notes`` gets what was done."""
    spec = QuantSpec.from_config(ckpt.config)
    emulation = None
    float_logits: list[torch.Tensor] = []
    float_greedy: list[list[int]] = []
    if spec.any:
        from trtllm_medusa_ports.quant import emulate

        with torch.no_grad():
            float_logits = [hf(input_ids=torch.tensor([p])).logits[0] for p in prompts]
        float_greedy = [hf_greedy(hf, p, max_new_tokens) for p in prompts]
        emulation = emulate.apply(hf, model_dir, ckpt, ref.adapter, quiet=quiet, activations=False,
                                  fused=ref.fused_gate_mlp, gemm=ref.fp8_gemm, defer_rederive=True,
                                  calibration=calibration)
        notes.append(f"{format_name(spec)}: {emulation.description}")
        if spec.quant_algo == "FP8":
            notes.append(
                f"FP8 GEMMs as built with --gemm_plugin {ref.fp8_gemm} ("
                + ("scales cast to the model dtype, operands dequantized in it" if ref.fp8_gemm == "auto" else
                   "the FP8 GEMM plugin: the product scaled by s_w * s_a in float32")
                + ("; mlp.fc and mlp.gate fused as trtllm-build's default --use_fused_mlp enable does: both moved to "
                   "the larger of their weight and activation scales" if ref.fused_gate_mlp else "") + ")")
        if spec.quant_algo in ("FP8", "W8A8_SQ_PER_CHANNEL") or spec.kv_cache_quant_algo:
            # FP8 / INT8 activation and KV-cache rounding turn float-order noise (another summation order, a tree step
            # against a single token) into visible differences: parity and greedy equivalence are judged on
            # the checkpoint's exact weights and scales without those two roundings, which are re-derived
            # (scales) and measured apart (quant_effect: with them, against float and Medusa against plain)
            ref.quantize_activations = ref.quantize_kv = False
            notes.append("parity and greedy equivalence without the FP8 / INT8 activation and KV-cache rounding (it amplifies "
                         "float noise); its effect is reported under 'against float'")

    return spec, emulation, float_logits, float_greedy


def _prompts_and_tree(prompts: list[list[int]] | None, medusa_choices: str | None, ref: ReferenceModel, ckpt,
                      checkpoint_dir: str | Path) -> tuple[list[list[int]], MedusaTree, str | None]:
    """The prompts (inside the vocabulary) and the tree (within the checkpoint's max_draft_len) to verify with."""
    prompts = prompts or default_prompts(ref.vocab)
    check_ids(prompts, ref.vocab, error=ModelError, fix="pass --prompt_ids with valid token ids")
    if medusa_choices is None:
        medusa_choices = "mc_sim_7b_63"
    tree, pruned = _tree_for(medusa_choices, ref.num_medusa_heads)
    draft = ckpt.config.get("max_draft_len")
    if isinstance(draft, int) and tree.num_nodes > draft:  # TensorRT-LLM sizes the tree buffers by it
        raise ModelError(f"the tree has {tree.num_nodes} nodes, the checkpoint's max_draft_len is {draft}: the engine "
                         "could not run it", where=str(Path(checkpoint_dir) / "config.json"),
                         fix=f"verify with a tree of at most {draft} nodes, or convert with --max_draft_len "
                             f"{tree.num_nodes}")
    return prompts, tree, pruned


def _parity_pass(ref: ReferenceModel, prompts: list[list[int]], hf_runs: list, model_dir: str | Path, ckpt):
    """Logits parity of every prompt against transformers' (``hf_runs``), and where the first failing one
    parts ways; the runs ``(hf logits, hf states, executor logits, executor states)``."""
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
            divergence["first_differing_tensor"] = first_differing_tensor(model_dir, ckpt)
            break
    parity = max_diff <= tolerance
    return parity, max_diff, tolerance, divergence, runs


def _heads_check(heads_source, source, medusa_model_dir, ref: ReferenceModel, hf_runs: list) -> dict:
    """The checkpoint's heads against the heads read from their source, or why they were not compared."""
    heads = {"ok": None, "max_abs_diff": None, "tolerance": None, "why": None}
    if heads_source is not None:
        heads = heads_parity_of(heads_source, ref, [hs[-1] for _, hs in hf_runs])
        if heads["worst_head"] is not None:
            heads["why"] = f"head {heads['worst_head']} differs most"
    elif source:
        heads["why"] = (f"the heads' source {source} recorded at conversion is gone" if not medusa_model_dir else
                        f"{medusa_model_dir} does not exist") + "; pass --medusa_model_dir"
    else:
        heads["why"] = "the heads' source was not recorded; pass --medusa_model_dir to compare them"
    return heads


@dataclass
class _GreedyRuns:
    equal: bool
    first: dict | None
    steps: int
    accepted: list[int]
    generated: int
    per_prompt: list[dict]
    seqs: list[list[int]]
    until_end: list[int]  # tokens, steps
    ending_early: int


def _greedy_runs(ref: ReferenceModel, prompts: list[list[int]], tree: MedusaTree, max_new_tokens: int,
                 expected_tokens: list[list[int]], ends: set[int], quiet: bool) -> _GreedyRuns:
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
    return _GreedyRuns(equal, first, steps, accepted, generated, per_prompt, seqs, until_end, ending_early)


def _quant_effect(ref: ReferenceModel, spec: QuantSpec, prompts: list[list[int]], float_logits: list[torch.Tensor],
                  float_greedy: list[list[int]], tree: MedusaTree, max_new_tokens: int,
                  exact_logits: list[torch.Tensor], exact_greedy: list[list[int]]) -> dict:
    """The quantized model as the engine computes it - every rounding on - against the float base: logits and
    greedy text; and Medusa against plain decoding with those roundings (where float noise can flip a near tie)."""
    rounding = spec.quant_algo in ("FP8", "W8A8_SQ_PER_CHANNEL") or bool(spec.kv_cache_quant_algo)
    ref.quantize_activations = ref.quantize_kv = True
    # without those roundings the exact pass already computed the engine's logits and greedy text; with them, the
    # logits come from generation steps, one token at a time, each reading the quantized KV cache the earlier
    # ones wrote (a context pass attends to its own unquantized K/V and would hide a KV scale that clips)
    logits = [_stepwise_logits(ref, p) for p in prompts] if rounding else exact_logits
    diffs = [q - f for q, f in zip(logits, float_logits, strict=True)]
    agree = [(q.argmax(-1) == f.argmax(-1)).float() for q, f in zip(logits, float_logits, strict=True)]
    plain = [plain_generate(ref, p, max_new_tokens) for p in prompts] if rounding else exact_greedy

    def agreed(a: list[int], b: list[int]) -> int:
        return next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))

    total = sum(len(q) for q in plain)
    effect = {
        "top1_agreement": float(torch.cat(agree).mean()),
        "max_abs_diff": max(float(d.abs().max()) for d in diffs),
        "mean_abs_diff": float(torch.cat([d.abs().reshape(-1) for d in diffs]).mean()),
        "greedy_equal_prompts": sum(q == f for q, f in zip(plain, float_greedy, strict=True)),
        "greedy_agreed_fraction": sum(agreed(q, f) for q, f in zip(plain, float_greedy, strict=True)) / total,
    }
    if rounding:
        medusa = [medusa_generate(ref, p, tree, max_new_tokens).tokens for p in prompts]
        effect["medusa_vs_plain_with_rounding"] = sum(agreed(m, q) for m, q in zip(medusa, plain, strict=True)) / total
    return effect


def _stepwise_logits(ref: ReferenceModel, prompt: list[int]) -> torch.Tensor:
    """The logits of every prompt position, the first from a one-token context step and each later one from a
    generation step that reads the (quantized) KV cache."""
    cache = ref.new_cache()
    rows = [ref.forward(prompt[:1], cache)[0]]
    rows += [ref.forward([t], cache)[0] for t in prompt[1:]]
    return torch.cat(rows)


def _tree_for(spec: str, num_heads: int) -> tuple[MedusaTree, str | None]:
    """The tree; a preset deeper than the heads is pruned (and the note says so), any other
    tree deeper than the heads is refused, never cut."""
    paths, pruned = resolve_choices(spec, num_heads)
    return MedusaTree.from_spec(paths, num_heads=num_heads), pruned


def _checkpoint_dtype(cfg: dict) -> str:
    """The checkpoint's dtype by name (float32 where config.json names none a checkpoint uses)."""
    dtype = cfg.get("dtype")
    return dtype if dtype in CHECKPOINT_DTYPES else "float32"


def first_differing_tensor(model_dir: str | Path, ckpt) -> dict | None:
    """The first checkpoint tensor (in conversion order) that differs from what the converter
    makes of the Hugging Face weights today, or None when every base tensor matches.

    Names the tensor itself ("transformer.layers.3.post_layernorm.weight, rank 1") where the
    hidden-state comparison can only name a layer.
    """
    from trtllm_medusa_ports.files.hf_model import HFModel
    from trtllm_medusa_ports.plan import base_jobs, job_inputs, shard_for

    adapter = adapter_for(ckpt.config.get("base_architecture") or "")
    if adapter is None:
        return None
    dtype = _checkpoint_dtype(ckpt.config)
    try:
        jobs = base_jobs(HFModel(model_dir), adapter, ckpt.config, dtype)
    except Exception as exc:  # the weights cannot even be planned: say so in the hint
        return {"tensor": None, "rank": None, "why": f"the conversion cannot be replayed ({exc})"}
    for job in jobs:
        job, inputs = job_inputs(job, dtype)
        for rank, name in job.targets:
            expected = shard_for(job, inputs, ckpt.config, rank).float()
            if not ckpt.has(rank, name):
                return {"tensor": name, "rank": rank, "why": "missing from the checkpoint"}
            stored = ckpt.tensor(rank, name).float()
            if stored.shape != expected.shape:
                return {"tensor": name, "rank": rank,
                        "why": f"shape {tuple(stored.shape)}, expected {tuple(expected.shape)}"}
            if not torch.equal(stored, expected):
                return {"tensor": name, "rank": rank,
                        "why": f"values differ by up to {float((stored - expected).abs().max()):.3g}"}
    return None




@dataclass
class SourceHeads:
    """The heads read from their source and their logits on the prompts' hidden states (or why not)."""

    directory: Path
    logits: list[torch.Tensor]  # per prompt: [heads, tokens, vocab]
    mismatch: str | None = None  # the source's heads do not have the checkpoint's shape


def source_heads_for(heads_dir: Path, hf, ref: ReferenceModel, hidden_states: list[torch.Tensor],
                     dtype: torch.dtype) -> SourceHeads:
    """What the checkpoint's heads must reproduce, computed with the transformers model's lm_head where
    the heads share it (so that the transformers model can be freed before the executor runs)."""
    from trtllm_medusa_ports.heads import load_heads

    heads = load_heads(heads_dir)
    if heads.num_heads != ref.num_medusa_heads or heads.num_layers != ref.num_medusa_layers:
        return SourceHeads(heads_dir, [], f"{heads_dir} holds {heads.num_heads} heads x {heads.num_layers} layers, "
                                          f"the checkpoint {ref.num_medusa_heads} x {ref.num_medusa_layers}")
    shared = bool(ref.config.get("medusa_shared_lm_head"))
    return SourceHeads(heads_dir, [source_heads_logits(heads, hidden, dtype, hf.get_output_embeddings(), shared,
                                                       ref.vocab) for hidden in hidden_states])


def heads_parity_of(source: SourceHeads, ref: ReferenceModel, hidden_states: list[torch.Tensor]) -> dict:
    """The checkpoint's Medusa heads against the source's logits, on the same hidden states."""
    if source.mismatch:
        return {"ok": False, "max_abs_diff": float("inf"), "tolerance": 0.0, "worst_head": None,
                "why": source.mismatch}
    worst, worst_head, scale = 0.0, None, 1.0
    for want, hidden in zip(source.logits, hidden_states, strict=True):
        got = ref.medusa_logits(hidden)
        diff = (want - got).abs().amax(dim=tuple(range(1, want.dim())))
        scale = max(scale, float(want.abs().max()))
        if float(diff.max()) > worst:
            worst, worst_head = float(diff.max()), int(diff.argmax())
    tol = PARITY_RTOL * scale
    return {"ok": worst <= tol, "max_abs_diff": worst, "tolerance": tol,
            "worst_head": worst_head if worst > tol else None, "why": None}


def heads_parity(heads_dir: Path, hf, ref: ReferenceModel, hidden_states: list[torch.Tensor],
                 dtype: torch.dtype) -> dict:
    """The checkpoint's Medusa heads against the heads read from ``heads_dir``, on the same hidden states."""
    return heads_parity_of(source_heads_for(heads_dir, hf, ref, hidden_states, dtype), ref, hidden_states)


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


@torch.no_grad()
def head_hit_rates(ref: ReferenceModel, seqs: list[list[int]], prompt_lens: list[int]) -> tuple[list[float], list[float]]:
    """Per head k: how often its top-1 / top-k at position t holds the token at t + k + 2."""
    H = ref.num_medusa_heads
    hits1 = [0] * H
    hitsk = [0] * H
    counts = [0] * H
    for seq, plen in zip(seqs, prompt_lens, strict=True):
        _, hidden = ref.forward(seq, ref.new_cache(), compute_logits=False)
        logits = ref.medusa_logits(hidden)  # [H, S, V]
        top = logits.topk(HIT_TOP_K, dim=-1).indices
        for k in range(H):
            for t in range(plen - 1, len(seq) - k - 2):
                target = seq[t + k + 2]
                counts[k] += 1
                hits1[k] += int(top[k, t, 0] == target)
                hitsk[k] += int((top[k, t] == target).any())
    return ([h / c if c else 0.0 for h, c in zip(hits1, counts, strict=True)],
            [h / c if c else 0.0 for h, c in zip(hitsk, counts, strict=True)])


def predicted_tokens_per_step(ref: ReferenceModel, tree: MedusaTree, seqs: list[list[int]],
                              prompt_lens: list[int]) -> tuple[float | None, float | None]:
    """What the tree should give on these sequences, from the checkpoint heads' ranks (tune.py)."""
    from trtllm_medusa_ports.acceptance import (
        accuracy_table,
        expected_tokens_per_step,
        joint_values,
        reference_ranks,
    )

    if not ref.num_medusa_heads:
        return None, None
    ranks = reference_ranks(ref, seqs, prompt_lens, tree.top_k)
    if ranks.shape[0] == 0:
        return None, None
    return (expected_tokens_per_step(tree.paths, accuracy_table(ranks, tree.top_k)),
            expected_tokens_per_step(tree.paths, joint=joint_values(ranks, tree.top_k)))


def report_json(report: VerifyReport) -> str:
    return json.dumps(report.to_dict(), indent=2)
