"""The verify run: its phases in the order their memory use requires (transformers freed before the executor
runs the checkpoint), and the report they fill.

May import: every verify module but the package's ``__init__``, ``huggingface``, ``files``, ``quant``,
``reference``, ``threads``, ``huggingface.memory_mode``, ``errors``.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
from pathlib import Path

import torch

from trtllm_medusa_ports.compat.checkpoint import checkpoint_findings
from trtllm_medusa_ports.deploy.commands import build_line
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.checkpoint import read_checkpoint
from trtllm_medusa_ports.files.dtypes import to_torch
from trtllm_medusa_ports.files.hf_model import HFConfig, progress_bars_off
from trtllm_medusa_ports.findings import ERROR
from trtllm_medusa_ports.huggingface.memory_mode import ignored_max_memory
from trtllm_medusa_ports.huggingface.model import (
    end_token_ids,
    load_hf_model,
    release,
    value_transforms,
)
from trtllm_medusa_ports.huggingface.streaming import bound_the_allocator
from trtllm_medusa_ports.machine import log
from trtllm_medusa_ports.machine.threads import default_threads, torch_threads
from trtllm_medusa_ports.quant import FP8_GEMM_PATHS, QuantSpec, format_name
from trtllm_medusa_ports.reference.decoding import plain_generate
from trtllm_medusa_ports.reference.executor import ReferenceModel
from trtllm_medusa_ports.reference.tree_proof import tree_proof
from trtllm_medusa_ports.verify.checkpoint_side import (
    allow_unsupported_notes,
    base_tensor_check,
    greedy_runs,
    parity_pass,
    vocab_padding,
)
from trtllm_medusa_ports.verify.heads import heads_check, source_heads_for
from trtllm_medusa_ports.verify.hf_memo import (
    TransformersSide,
    file_identity,
    keep,
    recall,
    recall_base,
)
from trtllm_medusa_ports.verify.hf_side import (
    arithmetic_effect,
    check_base_weights,
    engine_arithmetic,
    hf_greedy,
    hf_logits_and_states,
)
from trtllm_medusa_ports.verify.inputs import (
    check_position_table,
    checkpoint_dtype,
    prompts_and_tree,
)
from trtllm_medusa_ports.verify.limits import (
    DAMAGE_MAX_NEW_TOKENS,
    MIN_QUANT_AGREEMENT,
    PARITY_RTOL,
)
from trtllm_medusa_ports.verify.measures import (
    final_hidden_states,
    head_hit_rates,
    predicted_mean_accepted_tokens_per_step,
)
from trtllm_medusa_ports.verify.mode import check_device, cpu_scope, default_device
from trtllm_medusa_ports.verify.mode import choose as choose_mode
from trtllm_medusa_ports.verify.quantization import (
    damage_undecided,
    measure_damage_on,
    quant_effect_against_float,
    quantized_reference,
)
from trtllm_medusa_ports.verify.report import VerifyReport

LOG = log.get("verify")


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
    min_quant_agreement: float | None = MIN_QUANT_AGREEMENT,
    override_medusa_choices: bool = False,
    streaming: bool | None = None,
    max_memory: float | None = None,
    device: str = "cpu",
    offload_dir: str | Path | None = None,
) -> VerifyReport:
    """Logits parity, heads parity, greedy equivalence and the tree proof of a checkpoint (see the module doc).

    ``threads``: torch threads to compute with (default :func:`default_threads`). ``streaming`` (None: chosen
    against ``max_memory`` GB, see ``verify.mode``), ``device`` (``cpu``, ``cuda``, ``cuda:N``: both sides compute
    there) and ``offload_dir`` (streaming: where transformers' weights wait on disk) change where and in how much
    memory it runs, never its results. ``min_quant_agreement``: a quantized checkpoint whose greedy text agrees with
    the float base's on less than this fraction fails (``limits.MIN_QUANT_AGREEMENT``; None or 0: not judged).
    ``medusa_choices``: default the tree the checkpoint records; another is refused unless ``override_medusa_choices``.
    """
    device = check_device(device)
    inputs = {"--model_dir": file_identity(model_dir), "--checkpoint_dir": file_identity(checkpoint_dir)}
    with torch_threads(threads or default_threads()), default_device(device), progress_bars_off(quiet):
        report = _verify(model_dir, checkpoint_dir, medusa_choices=medusa_choices, prompts=prompts,
                       max_new_tokens=max_new_tokens, quiet=quiet, medusa_model_dir=medusa_model_dir,
                       max_quant_error=max_quant_error, skip_tree_proof=skip_tree_proof, gemm_plugin=gemm_plugin,
                       calibration=calibration, accept_unchecked_scales=accept_unchecked_scales,
                       min_quant_agreement=min_quant_agreement, override_medusa_choices=override_medusa_choices,
                       placement=(streaming, max_memory, device, offload_dir))
    for (flag, before), path in zip(inputs.items(), (model_dir, checkpoint_dir), strict=True):
        _unchanged(flag, path, before)
    return report


def _unchanged(flag: str, path, before: tuple | None) -> None:
    """A verdict is of one base and one checkpoint: files that changed (size, mtime or inode) while verify read them
    fail it, named."""
    after = file_identity(path)
    if before is None or after is None or before == after:
        return
    was, now = dict((e[0], e[1:]) for e in before[1]), dict((e[0], e[1:]) for e in after[1])
    changed = sorted(n for n in was.keys() | now.keys() if was.get(n) != now.get(n))
    raise ModelError(f"{len(changed)} file(s) of the {flag} changed while verify read them ("
                     + ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
                     + "): its results would mix two versions, so there is no verdict", where=str(path),
                     fix="let the download or copy finish, then run verify again")


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
    min_quant_agreement: float | None = None,
    override_medusa_choices: bool = False,
    placement: tuple = (None, None, "cpu", None),
) -> VerifyReport:
    streaming, max_memory, device, offload_dir = placement
    if max_new_tokens < 1:
        raise ModelError(f"--max_new_tokens {max_new_tokens} must be at least 1", fix="e.g. --max_new_tokens 32",
                         usage=True)
    def status(text: str) -> None:  # the phases without a progress bar of their own
        if not quiet:
            LOG.info(f"verify: {text}")

    status(f"reading {checkpoint_dir} (every tensor checked for NaN/Inf)")
    ckpt = read_checkpoint(checkpoint_dir)
    memory = choose_mode(model_dir, ckpt, streaming=streaming, max_memory_gb=max_memory, device=device)
    status(f"memory: {memory.summary()}")
    if memory.streaming:  # freed weights go back to the system (both sides read and free them all the time)
        bound_the_allocator()
    ref = ReferenceModel(ckpt, streaming=memory.streaming, device=device)
    if gemm_plugin not in FP8_GEMM_PATHS:
        raise ModelError(f"--gemm_plugin {gemm_plugin!r}: verify emulates FP8Linear's GEMM for "
                         + " or ".join(FP8_GEMM_PATHS), fix="pass the --gemm_plugin the engine is built with")
    ref.fp8_gemm = gemm_plugin
    dtype = to_torch(checkpoint_dtype(ckpt.config))
    check_base_weights(model_dir, ref.adapter.ignored_hf_tensors,
                       ref.adapter.expert_field_keys(HFConfig.read(model_dir)))
    load = functools.partial(_load_base, model_dir, dtype, ckpt, ref, memory.streaming, device, offload_dir, status)
    # what the last verify of this very base computed, where nothing it depends on changed (verify/hf_memo.py)
    quantized = QuantSpec.from_config(ckpt.config)
    base_key = None if memory.streaming or quantized.any else _base_key(model_dir, dtype, ckpt, ref, device)
    kept = recall_base(base_key)
    hf = None if kept is not None else load()
    vocab_size, ends = (kept.vocab_size, kept.ends) if kept is not None else (hf.config.vocab_size, end_token_ids(hf))
    padding = vocab_padding(vocab_size, ref, ckpt, model_dir)
    prompts, tree, pruned, tree_source = prompts_and_tree(prompts, medusa_choices, ref, ckpt, checkpoint_dir,
                                                          override_medusa_choices)
    check_position_table(prompts, max_new_tokens, ref, str(Path(checkpoint_dir) / "config.json"))
    notes = ([pruned] if pruned else []) + allow_unsupported_notes(ckpt) + ([padding] if padding else [])
    notes += _ignored_options(quantized, gemm_plugin, max_quant_error, streaming, max_memory)
    source = medusa_model_dir or (ckpt.config.get("medusa_ports") or {}).get("heads_source")
    side_key = None if base_key is None else _side_key(base_key, ref, prompts, max_new_tokens, source, dtype)
    side = recall(side_key)
    spec, emulation, float_logits, float_greedy = quantized, None, [], []
    if side is None:
        side, spec, emulation, float_logits, float_greedy = _transformers_phase(
            hf if hf is not None else load(), ref, ckpt, model_dir, prompts, max_new_tokens, notes, quiet, calibration,
            source, dtype, status, side_key)
        hf = None  # freed before the executor loads the checkpoint
        if side_key is not None:
            keep(side)
        if side.model_bytes > 64 * 2**20:  # a full collection costs ~0.3 s in a long-lived process: only when it frees much
            gc.collect()
    else:
        status(f"transformers' results on {len(prompts)} prompt(s): those of the last verify of this base, unchanged")
    if emulation is not None:  # the calibration run loads the base again: only now that this copy is freed
        status("re-deriving the activation / KV-cache scales (the recorded calibration, run again)")
        with cpu_scope(device):  # a calibration run of its own, on the CPU
            emulation.rederive()
    adjustments, hf_runs, effect = side.adjustments, side.hf_runs, side.effect
    expected_tokens, heads_source = [list(t) for t in side.expected_tokens], side.heads_source

    # Phase 2, the checkpoint on the reference executor. 1. parity
    status(f"logits parity of the checkpoint on the reference executor ({len(prompts)} prompt(s))")
    status("every base tensor against the converted Hugging Face weights")
    with cpu_scope(device):  # file against file: the CPU, whatever --device
        base_tensors = base_tensor_check(model_dir, ckpt)
    parity, max_diff, tolerance, divergence, runs = parity_pass(ref, prompts, hf_runs, base_tensors)
    exact_logits = [rl for _, _, rl, _ in runs] if spec.any else []
    if spec.any:  # greedy equivalence is against the quantized base's own greedy text (the executor's)
        expected_tokens = [plain_generate(ref, p, max_new_tokens) for p in prompts]
    del runs

    # 1b. the heads, against their source (recorded at conversion unless given)
    heads = heads_check(heads_source, source, medusa_model_dir, ref, hf_runs)

    # 2. greedy equivalence, 3. speculation quality
    ref.moe_activity = [] if ref.semantics.moe_num_experts else None  # (tokens, distinct experts) per MoE layer call
    g = greedy_runs(ref, prompts, tree, max_new_tokens, expected_tokens, ends, quiet)
    tree_calls = [n for tokens, n in ref.moe_activity or [] if tokens == tree.num_nodes + 1]
    ref.moe_activity = None
    proof = None
    if not skip_tree_proof:
        status(f"tree proof: every node of the {tree.num_nodes}-node tree accepted with greedy's own drafts")
        proof = tree_proof(ref, prompts[0], tree, rtol=PARITY_RTOL,
                           max_positions=ckpt.config.get("max_position_embeddings")).to_dict()
    quant_effect = quant_effect_against_float(ref, spec, prompts, float_logits, float_greedy, tree, max_new_tokens,
                                 exact_logits, expected_tokens) if spec.any else None
    if quant_effect is not None and min_quant_agreement:
        _settle_damage(quant_effect, min_quant_agreement, ref, spec, prompts, load, status, checkpoint_dir)
    status("the heads' hit rates and the tree's predicted tokens per step")
    hiddens = final_hidden_states(ref, g.seqs)  # both measures read them
    top1, topk = head_hit_rates(ref, g.seqs, [len(p) for p in prompts], hiddens)
    predicted = predicted_mean_accepted_tokens_per_step(ref, tree, g.seqs, [len(p) for p in prompts], hiddens)
    del hiddens
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
        max_activation=side.activation_max,
        max_activation_at=side.activation_at,
        notes=notes,
        heads_parity=heads["ok"],
        heads_max_abs_diff=heads["max_abs_diff"],
        heads_tolerance=heads["tolerance"],
        heads_source=str(source) if heads["ok"] is not None else None,
        heads_detail=heads["why"],
        predicted_mean_accepted_tokens_per_step=predicted[0],
        predicted_mean_accepted_tokens_per_step_joint=predicted[1],
        tree_nodes=tree.num_nodes,
        tree_source=tree_source,
        tokens_per_step_until_end=g.until_end[0] / g.until_end[1] if g.until_end[1] else None,
        prompts_ending_early=g.ending_early,
        quantization=format_name(spec) if spec.any else None,
        quant_scales_checked=emulation.scales_checked if emulation else 0,
        quant_scale_mismatches=emulation.scale_mismatches if emulation else [],
        quant_scales_not_rederived=emulation.not_rederived if emulation else None,
        unchecked_scales_accepted=accept_unchecked_scales,
        quant_effect=quant_effect,
        max_quant_error=max_quant_error,
        min_quant_agreement=min_quant_agreement or None,
        moe_num_experts=ref.semantics.moe_num_experts or None,
        moe_experts_per_tree_step=sum(tree_calls) / len(tree_calls) if tree_calls else None,
        moe_experts_per_plain_step=ref.semantics.moe_top_k or None,
        tree_proof=proof,
        base_tensors=base_tensors,
        memory_mode=memory.to_dict(),
        # float16-range is left to the measured range above (build takes --allow_unsupported for it)
        build_refusals=[f"[{f.rule}] {f.message} (fix: {f.fix})" for f in checkpoint_findings(ckpt.config, True)
                        if f.severity == ERROR],
        build_command=build_line(ckpt.config, Path(checkpoint_dir)),
    )


def _settle_damage(effect: dict, threshold: float, ref: ReferenceModel, spec: QuantSpec, prompts: list[list[int]],
                   load, status, checkpoint_dir) -> None:
    """While the agreement's interval straddles ``threshold``, the damage measure again on a float text twice as
    long (the float base loaded once more: its greedy text, each the same text longer), up to
    :data:`DAMAGE_MAX_NEW_TOKENS` a prompt or the positions the base allows; ``effect`` takes the last measure."""
    where = str(Path(checkpoint_dir) / "config.json")
    while damage_undecided(effect, threshold) and effect["teacher_forced_new_tokens"] < DAMAGE_MAX_NEW_TOKENS:
        more = min(DAMAGE_MAX_NEW_TOKENS, 2 * effect["teacher_forced_new_tokens"])
        try:
            check_position_table(prompts, more, ref, where)
        except ModelError:
            break  # no longer text within the positions verify compares
        lo, hi = effect["teacher_forced_interval"]
        status(f"the agreement {effect['teacher_forced_agreement']:.3f} [{lo:.3f}, {hi:.3f}] straddles "
               f"{threshold:g}: measuring it on {more} new tokens a prompt")
        hf = load()
        engine_arithmetic(hf, ref.semantics)  # the float text as phase 1 read it (verify/quantization.py)
        float_greedy = [hf_greedy(hf, p, more) for p in prompts]
        release(hf)
        effect.update(measure_damage_on(ref, spec, prompts, float_greedy))


def _ignored_options(spec: QuantSpec, gemm_plugin: str, max_quant_error: float | None, streaming: bool | None,
                     max_memory: float | None) -> list[str]:
    """What the run was given and does not use, said in the report rather than dropped without a word."""
    out = []
    if gemm_plugin != "auto" and spec.quant_algo != "FP8":
        out.append(f"--gemm_plugin {gemm_plugin} ignored: it chooses FP8Linear's GEMM, and the checkpoint is not FP8")
    if max_quant_error is not None and not spec.any:
        out.append("--max_quant_error ignored: the checkpoint is not quantized")
    return out + ignored_max_memory(streaming, max_memory)


def _load_base(model_dir, dtype, ckpt, ref: ReferenceModel, streaming: bool, device: str, offload_dir, status):
    status(f"loading the base from {model_dir} with transformers")
    return load_hf_model(model_dir, dtype, value_transforms(model_dir, ckpt.config.get("base_architecture")),
                         full_precision=ref.adapter.full_precision_parameters, streaming=streaming, device=device,
                         offload_dir=offload_dir)


def _base_key(model_dir, dtype, ckpt, ref: ReferenceModel, device: str) -> tuple | None:
    """What the transformers model verify loads is made of (verify/hf_memo.py); None: not kept."""
    files = file_identity(model_dir)
    if files is None:
        return None
    return (files, str(dtype), ckpt.config.get("base_architecture"), tuple(ref.adapter.full_precision_parameters),
            str(device), torch.get_num_threads())


def _side_key(base_key: tuple, ref: ReferenceModel, prompts, max_new_tokens: int, source, dtype) -> tuple:
    """What phase 1 runs on that model (verify/hf_memo.py)."""
    sem = ref.semantics
    heads = None
    if source and Path(source).exists():
        heads = (str(source), file_identity(source), ref.num_medusa_heads, ref.num_medusa_layers,
                 bool(ref.config.get("medusa_shared_lm_head")), str(dtype))
    return (base_key, sem.hidden_act, sem.qk_norm, sem.qk_norm_epsilon, json.dumps(prompts), max_new_tokens,
            ref.vocab, heads)


def _transformers_phase(hf, ref: ReferenceModel, ckpt, model_dir, prompts, max_new_tokens: int, notes: list[str],
                        quiet: bool, calibration, source, dtype, status, key):
    """Phase 1, transformers alone: its logits, hidden states, activation range, greedy continuations and the
    heads' logits from their source; the model is then freed, so that it and the executor's weights are never in
    memory together (peak: one float32 model, not two). Quantized checkpoints first get the float base's logits
    and greedy text (the quantization's effect is measured against them), then the same transformers model
    quantized as the checkpoint is (quant/emulate.py). Returns ``(side, spec, emulation, float logits, float
    greedy)``."""
    from tqdm import tqdm

    arithmetic = engine_arithmetic(hf, ref.semantics)
    spec, emulation, float_logits, float_greedy = quantized_reference(hf, ref, ckpt, model_dir, prompts,
                                                                       max_new_tokens, notes, quiet, calibration)
    status(f"transformers' logits and hidden states on {len(prompts)} prompt(s)")
    hf_runs, activations = hf_logits_and_states(hf, prompts)
    effect = arithmetic_effect(hf, arithmetic, prompts, hf_runs)
    expected_tokens = [] if spec.any else [
        hf_greedy(hf, p, max_new_tokens)
        for p in tqdm(prompts, desc="transformers greedy", unit="prompt", disable=quiet, file=sys.stderr)]
    heads_source = None
    if source and Path(source).exists():
        heads_source = source_heads_for(Path(source), hf, ref, [hs[-1] for _, hs in hf_runs], dtype)
    side = TransformersSide(key, hf.config.vocab_size, end_token_ids(hf), [a.description for a in arithmetic],
                            hf_runs, activations.max, activations.where, effect, expected_tokens, heads_source,
                            sum(t.numel() * t.element_size() for t in hf.parameters()))
    if emulation is not None:
        emulation.close()
    release(hf)
    return side, spec, emulation, float_logits, float_greedy
