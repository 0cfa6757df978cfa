"""The base-model check: the architecture (an adapter, or a known refusal), then every base rule in report
order (``BASE_RULES``; importing this module fails if a registered rule is missing from it).

May import: the compat rule modules (``registry``, ``positions``, ``xqa_kernels``, ``engine_class``, ``heads``),
``archs``, ``findings``, ``errors``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import supported_architectures
from trtllm_medusa_ports.compat.engine_class import (
    engine_class_limit,
    engine_divergence,
    gelu_approximation,
    port_limit,
    spec_decoding_plumbing,
    transformers_divergence,
)
from trtllm_medusa_ports.compat.heads import medusa_head_activation
from trtllm_medusa_ports.compat.positions import (
    alibi_finding,
    alibi_reason,
    rope_scaling,
    sliding_window,
)
from trtllm_medusa_ports.compat.registry import BaseFacts, registered_base_rules
from trtllm_medusa_ports.compat.xqa_kernels import (
    attention_scale,
    attention_softcapping,
    gqa_group_size,
    xqa_head_size,
)
from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, Finding, errors_of

#: the base-model rules in the order their findings report (every one registered with ``@base_rule``)
BASE_RULES: tuple[Callable[[BaseFacts], list[Finding]], ...] = (
    xqa_head_size, engine_class_limit, port_limit, engine_divergence, transformers_divergence, gqa_group_size,
    rope_scaling, attention_scale, sliding_window, gelu_approximation, attention_softcapping, spec_decoding_plumbing, medusa_head_activation,
)
if set(BASE_RULES) != set(registered_base_rules()):  # a rule registered with @base_rule and never run, or the reverse
    raise AssertionError(f"compat.base.BASE_RULES misses {set(registered_base_rules()) - set(BASE_RULES)} or has "
                         f"unregistered {set(BASE_RULES) - set(registered_base_rules())}")


@functools.cache
def tiny_config_errors(name: str) -> tuple[Finding, ...]:
    """The base rules' errors for architecture ``name`` in its usual configuration (its adapter's tiny config, shaped
    like the published models, under this name: an alias such as MPTForCausalLM is judged as itself); an adapter
    without a tiny config gives none."""
    from trtllm_medusa_ports.archs.registry import adapter_for

    adapter = adapter_for(name)
    if adapter.tiny_config is None:
        return ()
    return tuple(errors_of(check_base(HFConfig({**adapter.tiny_config, "architectures": [name]}, Path("config.json")),
                                      adapter)))


@functools.cache
def served_rope_families() -> tuple[str, ...]:
    """The rotary families this check passes in their usual configuration (:func:`tiny_config_errors`): what the
    ALiBi refusal recommends. Gemma 2, whose published configs soft-cap attention logits (rule
    attention-softcapping), is not one of them."""
    from trtllm_medusa_ports.archs.registry import adapter_for, tiny_configs

    return tuple(sorted(name for name in tiny_configs()
                        if adapter_for(name).position_embedding.is_rope and not tiny_config_errors(name)))


def check_base(hf: HFConfig, adapter: ArchAdapter | None) -> list[Finding]:
    out: list[Finding] = []
    reason = alibi_reason(hf)
    if reason:
        out.append(alibi_finding(reason, served_rope_families()))
    if adapter is None:
        arch = hf.get("architectures") or ["(none)"]
        if not reason:
            out.append(
                Finding(
                    "unsupported-architecture",
                    ERROR,
                    f"no adapter for architecture {arch[0]!r}",
                    "supported: " + ", ".join(supported_architectures())
                    + "; docs/porting-guide.md shows how to add a family in one file",
                )
            )
        return out
    try:
        facts = BaseFacts(hf, adapter, adapter.head_size(hf), adapter.num_attention_heads(hf), adapter.num_kv_heads(hf))
    except PortError as exc:
        out.append(Finding("invalid-config", ERROR, exc.what, exc.fix or "fix config.json"))
        return out
    for rule_fn in BASE_RULES:
        try:
            out += rule_fn(facts)
        except PortError as exc:  # a value the rule cannot read: named, as convert names it, never a traceback
            out.append(Finding("invalid-config", ERROR, exc.what, exc.fix or "fix config.json"))
    return list(dict.fromkeys(out))  # one value several rules read is named once
