"""What every compatibility rule reports: a :class:`Finding` (rule id, severity, message, fix) and the registry
of rule ids the documentation lists. Imports nothing of the package: every rule module (compat/, quant/rules.py)
imports it, and it imports none of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR, WARNING, INFO = "error", "warning", "info"

#: every rule id a finding may carry (docs/compatibility-rules.md documents each; a test checks it)
RULES: set[str] = {"learned-position-range",
    "alibi-position-embedding", "unsupported-architecture", "invalid-config", "heads-unreadable",
    "float16-range", "dtype-float32", "decoding-greedy-only", "not-medusa", "weights-config-mismatch",
    "tree-invalid", "tree-index-range", "tree-pruned", "tree-deeper-than-heads", "tree-too-many-nodes",
    "tree-depth1-gaps", "parallel-size", "tp-attention-heads", "tp-kv-heads", "tp-kv-replication",
    "tp-intermediate-size", "tp-hidden-size", "tp-embedding", "vocab-padding", "pp-layers",
    "engine-pipeline-parallel", "engine-fusion-multiplier", "engine-build-flag",
    "engine-tp-unconfirmed", "quant-weight-only-shape", "quant-fp8-gpu", "quant-int8-blackwell", "quant-kv-cache",
    "serving-size", "memory-does-not-fit", "memory-kv-not-judged", "rope-context-range",
    "heads-checkpoint", "heads-count", "heads-dtype", "heads-hidden-size", "heads-truncated-vocab", "heads-vocab-size",
}


#: the rules whose errors ``--allow_unsupported`` may override (the checkpoint is written, for experiments, though
#: TensorRT-LLM would not serve it correctly); an error of any other rule is never overridable. The documents'
#: list is rendered from this set (``families --write``), and a Finding marked overridable must carry one of them
OVERRIDABLE: frozenset[str] = frozenset({"alibi-position-embedding", "attention-softcapping", "engine-divergence",
                                         "rope-scaling-yarn-option"})


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    message: str
    fix: str
    #: errors that --allow_unsupported may override (the checkpoint can be written, but
    #: TensorRT-LLM would not serve it correctly); structural errors are never overridable
    overridable: bool = False

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise AssertionError(f"finding with unregistered rule id {self.rule!r}")
        if self.overridable and self.rule not in OVERRIDABLE:  # (build still refuses some of them: ALiBi)
            raise AssertionError(f"a finding of rule {self.rule!r} marked overridable, which findings.OVERRIDABLE "
                                 "does not list")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("overridable")
        return d


def errors_of(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == ERROR]
