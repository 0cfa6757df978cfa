"""The base-model rules' registration: :class:`BaseFacts` (what every base rule reads) and ``@base_rule``,
which adds a rule's ids to the one rule-id registry (``findings.RULES``, the one docs/compatibility-rules.md is
checked against) and records the function (``compat.base`` runs them, in its own report order).

May import: ``findings``, ``archs.base``, ``files.hf_model``; no other compat module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import RULES, Finding


@dataclass(frozen=True)
class BaseFacts:
    """What every base-model rule reads: the config, its adapter and the attention shape."""

    hf: HFConfig
    adapter: ArchAdapter
    head_size: int
    heads: int
    kv: int


#: every base-model rule registered (each takes :class:`BaseFacts`); compat.base orders them
_BASE_RULES: list[Callable[[BaseFacts], list[Finding]]] = []


def base_rule(*ids: str) -> Callable:
    """Register a base-model rule function producing findings with these rule ids."""

    def deco(fn: Callable[[BaseFacts], list[Finding]]) -> Callable[[BaseFacts], list[Finding]]:
        for rule_id in ids:
            RULES.add(rule_id)
        _BASE_RULES.append(fn)
        return fn

    return deco


def registered_base_rules() -> list[Callable[[BaseFacts], list[Finding]]]:
    """Every function ``@base_rule`` registered, in registration order."""
    return list(_BASE_RULES)
