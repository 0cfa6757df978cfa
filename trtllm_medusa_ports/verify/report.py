"""The verify report: its fields, its verdict (``ok``), its text (``render``) and its JSON.

May import: ``verify.limits`` only (the report is plain data; nothing here computes).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from trtllm_medusa_ports.verify.limits import FLOAT16_MAX, HIT_TOP_K


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
    #: mean accepted tokens per step the tree should give, from the heads' top-k accuracy on these prompts'
    #: greedy text (Medusa paper's product estimate, trees/tune.py) and from joint counts (no independence)
    predicted_mean_accepted_tokens_per_step: float | None = None
    predicted_mean_accepted_tokens_per_step_joint: float | None = None
    tree_nodes: int = 0
    #: where the tree came from: recorded at conversion, given, or mc_sim_7b_63 for want of either
    tree_source: str | None = None
    #: tokens per step had every run stopped at the base's end token, as TensorRT-LLM's runtime
    #: stops at ``end_id`` (reference/decoding.py ``MedusaRun.until_end``); the runs go on past it
    #: so that greedy equivalence compares every token
    tokens_per_step_until_end: float | None = None
    prompts_ending_early: int = 0
    #: what was done with text prompts (files/tokenizer.py CHAT_*: the chat template applied or not, and why); None:
    #: no text prompt (token ids, or verify's default prompts)
    chat_template: str | None = None
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
    #: the least greedy agreement with the float base a quantized checkpoint may have (limits.MIN_QUANT_AGREEMENT)
    min_quant_agreement: float | None = None
    #: mixture-of-experts bases: distinct experts a Medusa tree step wakes per layer, on average over the steps,
    #: against a plain decoding step's (one token: its top-k), of ``moe_num_experts`` - the tree's extra cost
    moe_num_experts: int | None = None
    moe_experts_per_tree_step: float | None = None
    moe_experts_per_plain_step: int | None = None
    #: the tree proof (reference/tree_proof.py): steps whose drafts are greedy's own tokens along each branch in
    #: turn, so that every node is accepted and its logits checked; None: not run (``skip_tree_proof``)
    tree_proof: dict | None = None
    #: every base tensor against the converted Hugging Face weights, parity or not (checkpoint_side.py
    #: base_tensor_check): ``compared``, ``skipped`` (stored quantized), ``first_differing``; None: not compared
    base_tensors: dict | None = None
    #: where and how verify ran (verify/mode.py ``MemoryMode``): ``mode`` "in-memory" or "streaming", ``reason``,
    #: ``device``, the estimates it chose by; the other fields are the same in either mode
    memory_mode: dict | None = None
    #: what ``build`` refuses in the checkpoint's config.json (compat/checkpoint.py: float32, ALiBi, no heads):
    #: ``[rule] message (fix: ...)`` each; a checkpoint no engine is built from is not OK, whatever its proof says
    build_refusals: list[str] = field(default_factory=list)
    #: the build command the checkpoint needs (deploy/commands.py), engine directory left to fill
    build_command: str | None = None

    @property
    def base_tensors_differ(self) -> bool:
        return self.base_tensors is not None and self.base_tensors["first_differing"] is not None

    @property
    def float16_overflow(self) -> bool:
        return self.checkpoint_dtype == "float16" and self.max_activation > FLOAT16_MAX

    @property
    def quant_error_exceeded(self) -> bool:
        return (self.max_quant_error is not None and self.quant_effect is not None
                and self.quant_effect["max_abs_diff"] > self.max_quant_error)

    @property
    def quant_agreement_verdict(self) -> str | None:
        """``pass`` where the 95 % interval of the agreement (the quantized model's top-1 reading the float base's
        greedy text: ``teacher_forced_agreement``) lies at or above ``min_quant_agreement``, ``fail`` where it lies
        below, ``undecided`` where it straddles it after verify measured as much as it does (verify/limits.py
        DAMAGE_MAX_NEW_TOKENS); None without a threshold."""
        if self.min_quant_agreement is None or self.quant_effect is None:
            return None
        lo, hi = self.quant_effect["teacher_forced_interval"]
        return "pass" if lo >= self.min_quant_agreement else "fail" if hi < self.min_quant_agreement else "undecided"

    @property
    def quant_agreement_too_low(self) -> bool:
        """Not shown to clear ``min_quant_agreement``: below it, or undecided at the measure's cap (an agreement
        read off a few positions says OK only when even its interval's lower bound clears the threshold)."""
        return self.quant_agreement_verdict in ("fail", "undecided")

    @property
    def heads_unaccounted(self) -> bool:
        """The heads could not be compared with their source: it was recorded at conversion and is gone (a head
        changed after conversion would pass greedy equivalence unseen)."""
        return self.heads_parity is None and bool(self.heads_detail) and "is gone" in self.heads_detail

    @property
    def proof_ok(self) -> bool:
        """Every check of the checkpoint against the base passed: it computes the base model (and Medusa its greedy
        text). A float32 or ALiBi checkpoint can pass them; :attr:`ok` also asks that an engine is built from it."""
        return (self.parity and self.greedy_equal and not self.float16_overflow and self.heads_parity is not False
                and not self.heads_unaccounted and not self.quant_scale_mismatches and not self.quant_error_exceeded
                and not self.quant_agreement_too_low
                and (self.tree_proof is None or self.tree_proof["ok"]) and not self.base_tensors_differ
                and not (self.quant_scales_not_rederived and not self.unchecked_scales_accepted))

    @property
    def ok(self) -> bool:
        """The verdict (and verify's exit code): the proof holds and ``build`` refuses nothing in the checkpoint."""
        return self.proof_ok and not self.build_refusals

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["proof_ok"] = self.proof_ok
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
        lines += self._base_tensors_lines()
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
        if self.chat_template:
            lines.append(f"  prompts         : chat template {self.chat_template}")
        if self.first_divergence:
            d = self.first_divergence
            lines.append(f"  first divergence: prompt {d['prompt']}, position {d['position']}: "
                         f"base model {d['expected']}, Medusa {d['got']}")
        if self.tree_source:
            lines.append(f"tree              : {self.tree_nodes} nodes, {self.tree_source}")
        lines.append(self._tree_proof_line())
        if self.tokens_per_step_until_end is not None:
            ending = (f"{self.prompts_ending_early} of {len(self.prompts)} prompt(s) emit the end token, where a runtime "
                      "stops" if self.prompts_ending_early else "no prompt emits the end token")
            lines.append(f"speculation       : {self.tokens_per_step_until_end:.2f} tokens per step until the end token "
                         f"(what a server sees; {ending})")
        lines.append(f"  mean accepted   : {self.mean_accepted_tokens_per_step:.2f} tokens per step over all {self.steps} "
                     "steps (each run goes on past the end token, to compare every token)")
        if self.predicted_mean_accepted_tokens_per_step is not None:
            lines.append(f"  predicted       : {self.predicted_mean_accepted_tokens_per_step:.2f} mean accepted tokens per "
                         f"step for this {self.tree_nodes}-node tree from the heads' top-k accuracy (joint counts: "
                         f"{self.predicted_mean_accepted_tokens_per_step_joint:.2f}); measured "
                         f"{self.mean_accepted_tokens_per_step:.2f}")
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
                lines.append(f"  against float   : top-1 agreement {e['top1_agreement']:.3f} on the prompts, "
                             f"{e['teacher_forced_agreement']:.3f} on the float base's greedy text; logits max |diff| "
                             f"{e['max_abs_diff']:.3g}, mean {e['mean_abs_diff']:.3g}; greedy equal to the float base "
                             f"on {e['greedy_equal_prompts']} of {len(self.prompts)} prompt(s), the first "
                             f"{e['greedy_agreed_fraction']:.2f} of the tokens agree before the texts part"
                             + (f"; with the activation rounding Medusa and plain decoding agree on "
                                f"{e['medusa_vs_plain_with_rounding']:.2f} of the tokens"
                                if "medusa_vs_plain_with_rounding" in e else "")
                             + (f" (limit --max_quant_error {self.max_quant_error:g}: "
                                f"{'FAIL' if self.quant_error_exceeded else 'PASS'})"
                                if self.max_quant_error is not None else ""))
                if self.min_quant_agreement is not None:
                    verdict = self.quant_agreement_verdict
                    lo, hi = e["teacher_forced_interval"]
                    lines.append(
                        f"  greedy agreement: {'PASS' if verdict == 'pass' else 'FAIL'}  "
                        f"{e['teacher_forced_agreement']:.3f} of the float base's greedy tokens predicted reading "
                        f"its text, 95 % interval [{lo:.3f}, {hi:.3f}] over {e['teacher_forced_positions']} counted "
                        f"positions ({e['teacher_forced_new_tokens']} new tokens a prompt; least: "
                        f"{self.min_quant_agreement:g}, --min_quant_agreement)"
                        + (f": {self.quantization} changes the base's next token on "
                           f"{1 - e['teacher_forced_agreement']:.0%} of its text; serve a gentler format (an FP8 or "
                           "float KV cache before an INT8 one), or pass --min_quant_agreement 0 to accept it"
                           if verdict == "fail" else "")
                        + (f": undecided, the interval straddles {self.min_quant_agreement:g} after the longest "
                           "measure verify makes; measure on more text (more prompts: --data or --prompt_ids), or "
                           "pass a --min_quant_agreement you accept, or 0 to accept it"
                           if verdict == "undecided" else ""))
        if self.memory_mode:
            m = self.memory_mode
            lines.append(f"memory            : {m['mode']} on {m['device']} ({m['reason']})")
        lines.append("head top-1 hits   : " + ", ".join(f"{x:.2f}" for x in self.head_top1))
        lines.append(f"head top-{HIT_TOP_K} hits   : " + ", ".join(f"{x:.2f}" for x in self.head_topk))
        for refusal in self.build_refusals:
            lines.append(f"engine build      : FAIL  {refusal}")
        if self.build_command and not self.build_refusals:
            lines.append(f"build with        : {self.build_command}")
        lines.append("RESULT: " + ("OK" if self.ok else "FAILED")
                     + (" (the checkpoint computes the base model, but no engine is built from it: see 'engine build')"
                        if self.proof_ok and not self.ok else "")
                     + (" (with scales it could not re-derive, accepted by --accept_unchecked_scales)"
                        if self.ok and self.quant_scales_not_rederived and self.unchecked_scales_accepted else "")
                     + (" (the tree proof was skipped: nodes below the root are proven only where the heads' drafts "
                        "were accepted)" if self.tree_proof is None else ""))
        return "\n".join(lines)

    def _base_tensors_lines(self) -> list[str]:
        b = self.base_tensors
        if b is None or self.parity_divergence:  # a parity failure names the tensor below
            return []
        t = b["first_differing"]
        if t is None:
            return [f"base tensors      : PASS  {b['compared']} equal the converted HF weights"
                    + (f" ({b['skipped']} stored quantized: checked by the quantization checks)" if b["skipped"] else "")]
        what = f"{t['tensor']} (rank {t['rank']}: {t['why']})" if t.get("tensor") else t["why"]
        return [f"base tensors      : FAIL  {what}"]

    def _tree_proof_line(self) -> str:
        p = self.tree_proof
        if p is None:
            return "tree proof        : not run (--skip_tree_proof)"
        depths = ", ".join(f"{d['accepted']}/{d['nodes']}" for d in p["per_depth"])
        line = (f"tree proof        : {'PASS' if p['ok'] else 'FAIL'}  {p['nodes_accepted']} of {p['tree_nodes']} nodes "
                f"accepted with greedy's own drafts in {p['steps']} steps (by depth: {depths}), logits max |diff| "
                f"{p['max_abs_diff']:.3g} against plain decoding (tolerance {p['tolerance']:.3g}; rounding noise "
                f"{p['rounding_noise']:.3g})")
        return line + (f"\n  {p['failure']}" if p["failure"] else "")


def report_json(report: VerifyReport) -> str:
    return json.dumps(report.to_dict(), indent=2)
