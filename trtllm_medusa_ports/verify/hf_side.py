"""The Hugging Face side: the transformers model made to compute as the engine does (GELU, q/k norm
epsilon), its greedy text, logits and hidden states, and its activation range.

May import: ``huggingface``, ``archs``, ``errors``, ``files.prompts``, ``files.hf_model``; no other verify module (the checkpoint
side never reaches transformers through here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_medusa_ports.archs.semantics import Semantics
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFModel
from trtllm_medusa_ports.files.prompts import check_ids
from trtllm_medusa_ports.huggingface.model import load_hf_model


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


@torch.inference_mode()
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


@torch.inference_mode()
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


@torch.inference_mode()
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


def hf_logits_and_states(hf, prompts: list[list[int]]):
    """transformers' logits and hidden states per prompt, and the largest activation met on the way."""
    activations = ActivationRange(hf)
    runs = [_hf_hidden_states(hf, p) for p in prompts]
    activations.close()
    return runs, activations


def arithmetic_effect(hf, arithmetic, prompts: list[list[int]], hf_runs) -> float | None:
    """How far the same model with transformers' own arithmetic is from the engine's (the logits ``hf_runs`` hold
    were computed with the engine's); None when no adjustment was made."""
    if not arithmetic:
        return None
    for a in arithmetic:
        a.undo()
    try:
        with torch.inference_mode():  # as the rest of the transformers side
            return max(float((hf(input_ids=torch.tensor([p])).logits[0] - hl).abs().max())
                       for p, (hl, _) in zip(prompts, hf_runs, strict=True))
    finally:
        for a in arithmetic:  # the engine's arithmetic back, whatever the pass did
            a.redo()


def check_base_weights(model_dir: str | Path, ignored: tuple[str, ...] = (),
                       expert_keys: tuple[str, str, str] | None = None) -> None:
    """The base's weight headers against its config.json, as convert and check read them
    (``HFModel.weight_problems``: dtypes, shapes, MoE experts against their config fields), before transformers
    loads anything: a wrong tensor is named by file and field, not by transformers' own load error."""
    problems = HFModel(model_dir).weight_problems(ignored, expert_keys)
    if problems:
        raise ModelError(f"{len(problems)} base tensor(s) contradict config.json, e.g. " + "; ".join(problems[:3]),
                         where=str(model_dir),
                         fix="pass the Hugging Face model directory the checkpoint was converted from (its weights "
                             "and config.json as the model's authors wrote them)")
