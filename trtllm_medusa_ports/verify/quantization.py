"""The quantization checks: the float base's logits and greedy text, the transformers model quantized as the
checkpoint is (``quant/emulate.py``), and the quantization's effect with every engine rounding on.

May import: ``huggingface.streaming``, ``files``, ``quant``, ``reference``, ``tree``, ``verify.hf_side``, ``verify.limits``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from trtllm_medusa_ports.huggingface.streaming import streamed_weights
from trtllm_medusa_ports.quant import QuantSpec, format_name
from trtllm_medusa_ports.reference.decoding import medusa_generate, plain_generate
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.trees.tree import MedusaTree
from trtllm_medusa_ports.verify.hf_side import hf_greedy
from trtllm_medusa_ports.verify.limits import Z95


def quantized_reference(hf, ref: ReferenceModel, ckpt, model_dir: str | Path, prompts: list[list[int]],
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
        options = dict(quiet=quiet, activations=False, fused=ref.fused_gate_mlp, gemm=ref.fp8_gemm,
                       defer_rederive=True, calibration=calibration)
        streamed = streamed_weights(hf)
        emulation = (emulate.apply(hf, model_dir, ckpt, ref.adapter, **options) if streamed is None else
                     _emulate_streamed(hf, streamed, model_dir, ckpt, ref, options))
        notes.append(f"{format_name(spec)}: {emulation.description}")
        if spec.quant_algo == "FP8":
            notes.append(
                f"FP8 GEMMs as built with --gemm_plugin {ref.fp8_gemm} ("
                + ("scales cast to the model dtype, operands dequantized in it" if ref.fp8_gemm == "auto" else
                   "the FP8 GEMM plugin: the product scaled by s_w * s_a in float32")
                + ("; mlp.fc and mlp.gate fused as trtllm-build's default --use_fused_mlp enable does: both moved to "
                   "the larger of their weight and activation scales" if ref.fused_gate_mlp else "") + ")")
        if spec.rounds_activations:
            # FP8 / INT8 activation and KV-cache rounding, and AWQ / SmoothQuant's smoothed input rounded to the
            # model dtype, turn float-order noise (another summation order or attention kernel, another CPU path, a
            # tree step against a single token) into visible differences: parity and greedy equivalence are judged
            # on the checkpoint's exact weights and scales without those roundings, whose scales are re-derived and
            # whose effect is measured apart (quant_effect: with them, against float and Medusa against plain)
            ref.quantize_activations = ref.quantize_kv = False
            notes.append("parity and greedy equivalence without the engine's roundings of activations (FP8 / INT8 "
                         "inputs, the KV cache, AWQ / SmoothQuant's smoothed input in the model dtype: they amplify "
                         "float noise); their effect is reported under 'against float'")

    return spec, emulation, float_logits, float_greedy


def _emulate_streamed(hf, streamed, model_dir: str | Path, ckpt, ref: ReferenceModel, options: dict):
    """:func:`quant.emulate.apply` on a streamed model, one decoder layer at a time: each layer's weights read, its
    linears quantized as the checkpoint's are, and the result kept as that layer's weights from then on (streaming
    runs the weight-only formats only, whose layers are quantized independently: ``verify.mode``)."""
    from trtllm_medusa_ports.files.hf_model import HFConfig
    from trtllm_medusa_ports.quant import emulate
    from trtllm_medusa_ports.quant.calibrate import hf_linears

    modules = dict(hf.named_modules())
    by_layer: dict[int, list[torch.nn.Module]] = {}
    for lin in hf_linears(modules, ref.adapter, HFConfig.read(model_dir), str(model_dir)):
        by_layer.setdefault(lin.layer, []).extend(modules[n] for n in lin.modules)
    out = None
    for layer, held in sorted(by_layer.items()):
        with streamed.materialized(*held):
            part = emulate.apply(hf, model_dir, ckpt, ref.adapter, layers={layer}, **options)
            streamed.persist(*held)
        if out is None:
            out = part
        else:
            out.scales_checked += part.scales_checked
            out.scale_mismatches += part.scale_mismatches
            out.handles += part.handles
    return out if out is not None else emulate.apply(hf, model_dir, ckpt, ref.adapter, layers=set(), **options)


def quant_effect_against_float(ref: ReferenceModel, spec: QuantSpec, prompts: list[list[int]], float_logits: list[torch.Tensor],
                  float_greedy: list[list[int]], tree: MedusaTree, max_new_tokens: int,
                  exact_logits: list[torch.Tensor], exact_greedy: list[list[int]]) -> dict:
    """The quantized model as the engine computes it - every rounding on - against the float base: logits and
    greedy text; and Medusa against plain decoding with those roundings (where float noise can flip a near tie).

    ``teacher_forced_agreement`` (verify's damage verdict) is the fraction of the float base's greedy tokens the
    quantized model predicts (its top-1) when it reads the float base's own text up to each of them: both sides
    plain decoding of the same prefix, every generated position weighed alike, so it does not fall with the
    generation's length. Positions where the float text copies itself (:func:`novel_positions`) are left out, so
    it does not rise with the length either as a long generation falls into a loop
    (``teacher_forced_agreement_all_positions`` counts them too). ``greedy_agreed_fraction`` (the tokens before each prompt's first difference of the two
    free-running texts) is reported beside it: one early near tie ends that run, however long the text."""
    rounding = spec.rounds_activations
    forced = read_float_text(ref, spec, prompts, float_greedy)
    logits = [f[:len(p)] for f, p in zip(forced, prompts, strict=True)] if rounding else exact_logits
    diffs = [q - f for q, f in zip(logits, float_logits, strict=True)]
    agree = [(q.argmax(-1) == f.argmax(-1)).float() for q, f in zip(logits, float_logits, strict=True)]
    damage = _damage(forced, prompts, float_greedy, max_new_tokens)
    plain = [plain_generate(ref, p, max_new_tokens) for p in prompts] if rounding else exact_greedy

    def agreed(a: list[int], b: list[int]) -> int:
        return next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))

    total = sum(len(q) for q in plain)
    effect = {
        "top1_agreement": float(torch.cat(agree).mean()),
        **damage,
        "max_abs_diff": max(float(d.abs().max()) for d in diffs),
        "mean_abs_diff": float(torch.cat([d.abs().reshape(-1) for d in diffs]).mean()),
        "greedy_equal_prompts": sum(q == f for q, f in zip(plain, float_greedy, strict=True)),
        "greedy_agreed_fraction": sum(agreed(q, f) for q, f in zip(plain, float_greedy, strict=True)) / total,
    }
    if rounding:
        medusa = [medusa_generate(ref, p, tree, max_new_tokens).tokens for p in prompts]
        effect["medusa_vs_plain_with_rounding"] = sum(agreed(m, q) for m, q in zip(medusa, plain, strict=True)) / total
    return effect


def agreement_interval(hits: int, positions: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of an agreement of ``hits`` in ``positions`` (95 % for the default ``z``): unlike the
    plain one it stays inside [0, 1] and is not a point at 0 or all hits."""
    if positions <= 0:
        return 0.0, 1.0
    p = hits / positions
    centre = (p + z * z / (2 * positions)) / (1 + z * z / positions)
    half = z * math.sqrt(p * (1 - p) / positions + z * z / (4 * positions * positions)) / (1 + z * z / positions)
    return max(0.0, centre - half), min(1.0, centre + half)


def _damage(forced: list[torch.Tensor], prompts: list[list[int]], float_greedy: list[list[int]],
            new_tokens: int) -> dict:
    """The damage measure's fields of :func:`quant_effect_against_float` from the quantized model's logits reading
    the float text: the agreement on the counted positions (copies left out), its hits, positions and interval."""
    hits = teacher_forced_hits(forced, prompts, float_greedy)
    novel = [novel_positions(p, g) for p, g in zip(prompts, float_greedy, strict=True)]
    counted = torch.cat([h[m] for h, m in zip(hits, novel, strict=True)])
    if not len(counted):  # every position a copy: the float text is one loop
        counted = torch.cat(hits)
    k, n = int(counted.sum()), len(counted)
    return {"teacher_forced_agreement": k / n if n else 0.0, "teacher_forced_hits": k, "teacher_forced_positions": n,
            "teacher_forced_interval": list(agreement_interval(k, n)), "teacher_forced_new_tokens": new_tokens,
            "teacher_forced_agreement_all_positions": float(torch.cat(hits).mean())}


def damage_undecided(effect: dict, threshold: float) -> bool:
    """Whether the agreement's interval straddles ``threshold`` (neither wholly at or above it nor below it)."""
    lo, hi = effect["teacher_forced_interval"]
    return lo < threshold <= hi


def measure_damage_on(ref: ReferenceModel, spec: QuantSpec, prompts: list[list[int]],
                      float_greedy: list[list[int]]) -> dict:
    """The damage measure again, on a longer float text (``float_greedy``: the float base's greedy continuations,
    each the same text as before, longer)."""
    forced = read_float_text(ref, spec, prompts, float_greedy)
    return _damage(forced, prompts, float_greedy, max(len(g) for g in float_greedy))


def read_float_text(ref: ReferenceModel, spec: QuantSpec, prompts: list[list[int]],
                    float_greedy: list[list[int]]) -> list[torch.Tensor]:
    """The quantized model's logits, every rounding on, over each prompt followed by the float base's greedy text
    (all of it but its last token): with activation or KV roundings, one token at a time, each generation step
    reading the quantized KV cache the earlier ones wrote (a context pass attends to its own unquantized K/V and
    would hide a KV scale that clips); without them, one context pass."""
    ref.quantize_activations = ref.quantize_kv = True
    return [_stepwise_logits(ref, p + g[:-1]) if spec.rounds_activations else ref.forward(p + g[:-1], ref.new_cache())[0]
            for p, g in zip(prompts, float_greedy, strict=True)]


#: :func:`novel_positions`' n-gram: a generated token and the three before it
REPEAT_NGRAM = 4


def novel_positions(prompt: list[int], greedy: list[int], n: int = REPEAT_NGRAM) -> torch.Tensor:
    """Per generated token, False where it and the ``n - 1`` tokens before it already appeared together earlier in
    the text (prompt included): a copy the text makes of itself, predicted from the copy rather than by what the
    model knows. A small base's long greedy generation falls into loops (SmolLM2-135M: 35-87 % of 256 tokens on
    five of eight prompts, 6 % at most of the first 32), where any format agrees, so counting them makes the agreement
    rise with --max_new_tokens (INT4 weight-only on SmolLM2: 0.57 over 32 tokens, 0.73 over 256; 0.57 and 0.61
    without the copies)."""
    seq = prompt + greedy
    seen: set[tuple[int, ...]] = set()
    out = []
    for i in range(len(seq)):
        gram = tuple(seq[max(0, i - n + 1):i + 1])
        if i >= len(prompt):
            out.append(len(gram) < n or gram not in seen)
        if len(gram) == n:
            seen.add(gram)
    return torch.tensor(out, dtype=torch.bool)


def teacher_forced_hits(forced: list[torch.Tensor], prompts: list[list[int]],
                        float_greedy: list[list[int]]) -> list[torch.Tensor]:
    """Per prompt, 1.0 where the quantized model's top-1 reading the float text (:func:`read_float_text`) is the
    float base's own next greedy token, else 0.0: one value per generated position."""
    return [(f[len(p) - 1:].argmax(-1) == torch.tensor(g)).float()
            for f, p, g in zip(forced, prompts, float_greedy, strict=True)]


def _stepwise_logits(ref: ReferenceModel, prompt: list[int]) -> torch.Tensor:
    """The logits of every prompt position, the first from a one-token context step and each later one from a
    generation step that reads the (quantized) KV cache."""
    cache = ref.new_cache()
    rows = [ref.forward(prompt[:1], cache)[0]]
    rows += [ref.forward([t], cache)[0] for t in prompt[1:]]
    return torch.cat(rows)
