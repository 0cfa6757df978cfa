"""Heads rules: the Medusa heads against the base (hidden size, vocabulary, count, dtype, loader warnings) and
the heads' activation.

May import: ``heads``, ``compat.registry``, ``findings``, ``files.hf_model``.
"""

from __future__ import annotations

from trtllm_medusa_ports.compat.registry import BaseFacts, base_rule
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding
from trtllm_medusa_ports.heads import MedusaHeads


@base_rule("medusa-head-activation")
def medusa_head_activation(f: BaseFacts) -> list[Finding]:
    hf, out = f.hf, []
    key = f.adapter.activation_key if f.adapter is not None else "hidden_act"  # GPT-2: activation_function
    act = hf.get(key) or hf.get("hidden_act")
    if act not in (None, "silu") or hf.get("hidden_activation"):
        out.append(
            Finding(
                "medusa-head-activation",
                INFO,
                f"the base's activation is {act or hf.get('hidden_activation')!r}; "
                "Medusa heads use SiLU, and upstream MedusaForCausalLM would give them the base's",
                "the converter writes medusa_hidden_act = silu; build with `trtllm-medusa build`",
            )
        )
    return out


def check_heads(hf: HFConfig, heads: MedusaHeads, num_medusa_heads: int | None = None, dtype: str | None = None) -> list[Finding]:
    out: list[Finding] = []
    hidden = hf.get("hidden_size", hf.get("d_model", hf.get("n_embd")))
    vocab = hf.get("vocab_size")
    if hidden is not None and heads.hidden_size != hidden:
        out.append(
            Finding(
                "heads-hidden-size",
                ERROR,
                f"the heads' hidden size is {heads.hidden_size}, the base's hidden_size is {hidden}",
                "these heads were trained for another base model; pass the matching --medusa_model_dir",
            )
        )
    if vocab is not None and heads.vocab_size is not None and heads.vocab_size != vocab:
        out.append(
            Finding(
                "heads-vocab-size",
                ERROR,
                f"the heads project to {heads.vocab_size} tokens, the base's vocab_size is {vocab}",
                "these heads were trained for another tokenizer; pass the matching heads",
            )
        )
    if heads.token_map is not None:
        out.append(
            Finding(
                "heads-truncated-vocab",
                WARNING,
                f"the heads guess only {heads.token_map.shape[0]} of {vocab} tokens (vLLM token_map); "
                "the converter scatters them into the full vocabulary with zero rows elsewhere",
                "nothing to do: greedy output stays the base's; acceptance is what the heads give",
            )
        )
    if num_medusa_heads is not None and num_medusa_heads != heads.num_heads:
        out.append(
            Finding(
                "heads-count",
                ERROR,
                f"--num_medusa_heads {num_medusa_heads} but the checkpoint holds {heads.num_heads} heads",
                "omit --num_medusa_heads: it is read from the heads",
            )
        )
    if dtype and dtype != "auto" and heads.dtype_name != dtype:
        out.append(
            Finding(
                "heads-dtype",
                INFO,
                f"the heads are stored as {heads.dtype_name} and will be cast to {dtype}",
                "nothing to do",
            )
        )
    for w in heads.warnings:
        out.append(Finding("heads-checkpoint", WARNING, w, "see docs/heads.md"))
    return out
