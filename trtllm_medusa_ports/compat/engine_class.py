"""Engine-class rules: what the family's TensorRT-LLM class cannot build or computes otherwise (its limits,
the port's, its divergences, its GELU, its missing speculative-decoding plumbing), as the adapter declares it.

May import: ``compat.registry``, ``findings``.
"""

from __future__ import annotations

import functools

from trtllm_medusa_ports.compat.registry import BaseFacts, base_rule
from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding


@base_rule("engine-class-limit")
def engine_class_limit(f: BaseFacts) -> list[Finding]:
    return [Finding("engine-class-limit", ERROR, problem, fix) for problem, fix in f.adapter.engine_limits(f.hf)]


@base_rule("port-limit")
def port_limit(f: BaseFacts) -> list[Finding]:
    return [Finding("port-limit", ERROR, problem, fix) for problem, fix in f.adapter.port_limits(f.hf)]


@base_rule("engine-divergence")
def engine_divergence(f: BaseFacts) -> list[Finding]:
    return [Finding("engine-divergence", ERROR, problem, fix, overridable=True)
            for problem, fix in f.adapter.engine_divergences(f.hf)]


@functools.cache
def installed_transformers() -> str | None:
    """The installed transformers' version from its metadata (check does not import transformers), read once per
    process: finding it scans the installed distributions, a few milliseconds every check and conversion paid."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


@base_rule("transformers-divergence")
def transformers_divergence(f: BaseFacts) -> list[Finding]:
    installed = installed_transformers()
    if installed is None:
        return []
    return [Finding("transformers-divergence", WARNING, problem, fix)
            for problem, fix in f.adapter.transformers_divergences(f.hf, installed)]


@base_rule("gelu-approximation")
def gelu_approximation(f: BaseFacts) -> list[Finding]:
    out = []
    if f.adapter.exact_gelu(f.hf):
        out.append(
            Finding(
                "gelu-approximation",
                WARNING,
                "this base uses the exact (erf) GELU; TensorRT-LLM's gelu is the tanh approximation "
                "(tensorrt_llm/functional.py), so the engine's logits differ slightly from transformers' "
                "with or without Medusa",
                "nothing to convert differently; `verify` compares against transformers with the same "
                "approximation and reports the size of the effect",
            )
        )
    return out


@base_rule("spec-decoding-plumbing")
def spec_decoding_plumbing(f: BaseFacts) -> list[Finding]:
    adapter, out = f.adapter, []
    if not adapter.upstream_spec_decoding_plumbing:
        out.append(
            Finding(
                "spec-decoding-plumbing",
                INFO,
                f"upstream {adapter.trtllm_base_class} does not pass spec_decoding_params to its "
                "attention layers; plain trtllm-build cannot build Medusa over it",
                "build with `trtllm-medusa build` (our engine adapter adds the plumbing)",
            )
        )
    return out
