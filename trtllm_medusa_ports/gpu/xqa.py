"""Which XQA kernels serve a Medusa generation step, per GPU: the route TensorRT-LLM 1.2's runner takes and the
limits of each kernel family. Data and arithmetic only (imports nothing of the package); the rules (compat/,
quant/rules.py) and ``trtllm-medusa build`` (engine/build.py) read it."""

from __future__ import annotations

from dataclasses import dataclass

# -- which XQA kernels serve Medusa generation ------------------------------------------
# With speculative decoding (multi_query_tokens), decoderXQARunner::getImplFromXQAParams
# (cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/decoderXQARunner.cpp, the 1.2 copy read) checks
# TRTLLM_ENABLE_XQA_JIT first (1: JIT, 0: precompiled, outright); without it the JIT kernels are chosen on
# SM 9.0 with an E4M3 KV cache and group size <= 64, or when 64 % group size == 0 (MLA aside), the precompiled
# ones otherwise. An older copy had only the SM 9.0 + E4M3 clause and ignored the variable here.
#: the environment variable the runner reads first
XQA_JIT_ENV = "TRTLLM_ENABLE_XQA_JIT"
#: GPUs the route is worked out for: those the precompiled Medusa cubins of xqa_kernel_cubin.h are built for
XQA_ROUTE_SMS = (80, 86, 89, 90)
#: head sizes of the precompiled multi-query-token (Medusa) XQA cubins (decoderMaskedMultiheadAttention/cubin/
#: xqa_kernel_cubin.h: head size 128 only, beam 1, any group); other multiples of 16 up to 256 need the JIT kernels
XQA_PRECOMPILED_MEDUSA_HEAD_SIZES = (128,)
#: tokens per KV-cache block the precompiled kernels take: DecoderXQAImplPrecompiled::shouldUse accepts 32, 64
#: and 128 (the cubin table of the copy read lists Medusa cubins for pages of 64 and 128, and linear caches)
XQA_PRECOMPILED_TOKENS_PER_BLOCK = (32, 64, 128)
#: decoderXQAImplJIT/kernelUtils.cpp: supportConfigHMMA (SM 8.0+) and supportConfigQGMMA (SM 9.0, E4M3 KV only)
XQA_JIT_HMMA_TOKENS_PER_BLOCK = (16, 32, 64, 128)
XQA_JIT_QGMMA_TOKENS_PER_BLOCK = (8, 16, 32, 64, 128)
#: the largest group size (query heads per KV head) the JIT kernels take
XQA_JIT_MAX_GROUP = 32
#: SM 9.0 with an E4M3 cache: the runner picks JIT up to this group size ("supportedByHopperXqa")
XQA_HOPPER_JIT_MAX_GROUP = 64
#: what a runner without the precompiled kernels means for a group over XQA_JIT_MAX_GROUP
XQA_JIT_ONLY = (f"TensorRT-LLM after 1.2 makes the XQA JIT kernels the runner's default (PR #10335, \"Use XQA JIT impl "
                "by default\") and later keeps only them in DecoderXQARunner; whether a 1.2.x release carries that is "
                f"not confirmed here. A JIT-only runner takes at most {XQA_JIT_MAX_GROUP} query heads per KV head, so "
                f"there this base's generation finds no XQA kernel whatever {XQA_JIT_ENV} says: serve it on a runner "
                f"that keeps the precompiled kernels (1.2's) with {XQA_JIT_ENV}=0")


@dataclass(frozen=True)
class XqaKernels:
    """The kernels of one XQA implementation that accept an attention shape on one GPU."""

    names: tuple[str, ...]
    tokens_per_block: tuple[int, ...]
    #: why none accepts it ("" when one does)
    missing: str = ""


@dataclass(frozen=True)
class XqaRoute:
    """How TensorRT-LLM serves Medusa generation attention on one GPU (SM) for one attention shape."""

    sm: int
    #: what the runner picks without TRTLLM_ENABLE_XQA_JIT: "JIT" or "precompiled"
    impl: str
    #: why it picks that
    why: str
    jit: XqaKernels
    precompiled: XqaKernels

    @property
    def picked(self) -> XqaKernels:
        return self.jit if self.impl == "JIT" else self.precompiled

    @property
    def served(self) -> bool:
        """A kernel serves it with default settings."""
        return bool(self.picked.names)

    @property
    def served_with_jit_env(self) -> bool:
        """A kernel serves it with TRTLLM_ENABLE_XQA_JIT=1."""
        return bool(self.jit.names)

    @property
    def served_with_jit_off(self) -> bool:
        """A kernel serves it with TRTLLM_ENABLE_XQA_JIT=0 (the runner then takes the precompiled kernels outright)."""
        return bool(self.precompiled.names)

    @property
    def env_needed(self) -> str | None:
        """The TRTLLM_ENABLE_XQA_JIT value this GPU needs: "" where the default serves it, "1" where only the JIT
        kernels do, "0" where only the precompiled ones do and the runner would pick JIT, None where none does."""
        if self.served:
            return ""
        if self.served_with_jit_env:
            return "1"
        return "0" if self.served_with_jit_off else None


def _kv_kind(kv_dtype: str | None) -> str:
    kind = str(kv_dtype or "").upper()
    if kind in ("FP8", "E4M3", "FP8_E4M3"):
        return "FP8"
    return "INT8" if kind == "INT8" else "float"


def sm_names(sms) -> str:
    """``SM 8.9`` or ``SM 8.0/8.6``."""
    return "SM " + "/".join(f"{s // 10}.{s % 10}" for s in sms)


def xqa_medusa_route(group: int, head_size: int, kv_dtype: str | None = None, sm: int | None = None, *,
                     q_scaling_one: bool = True) -> dict[int, XqaRoute]:
    """Which XQA kernels serve Medusa generation, per GPU: ``{sm: XqaRoute}`` for ``sm`` or every
    :data:`XQA_ROUTE_SMS`.

    ``group`` is query heads per KV head, ``kv_dtype`` the KV-cache quantization (``None``/``"float"``,
    ``"INT8"``, ``"FP8"``). The runner's choice is the one described above :data:`XQA_JIT_ENV`; the JIT kernels
    (decoderXQAImplJIT/kernelUtils.cpp) are QGMMA (SM 9.0, E4M3 cache only) and HMMA (SM 8.0+, fp16/bf16, INT8 or
    E4M3 cache), both for head sizes that are multiples of 16 in [16, 256] and group sizes up to 32; the
    precompiled Medusa cubins (xqa_kernel_cubin.h) are for head size 128, any group, fp16/bf16 or INT8 caches on
    SM 8.0/8.6 and also E4M3 on SM 8.9/9.0, and need q_scaling == 1 (DecoderXQAImplPrecompiled::shouldUse).
    With no kernel the engine fails at run time: "No available XQA kernels are found for speculative decoding
    mode" (cpp/tensorrt_llm/common/attentionOp.cpp).
    """
    kv = _kv_kind(kv_dtype)
    return {s: _route_on(s, group, head_size, kv, q_scaling_one) for s in ((sm,) if sm else XQA_ROUTE_SMS)}


def _route_on(sm: int, group: int, head_size: int, kv: str, q_scaling_one: bool) -> XqaRoute:
    head_ok = head_size % 16 == 0 and 16 <= head_size <= 256
    if not head_ok:
        jit = XqaKernels((), (), f"the JIT kernels take head sizes that are multiples of 16 up to 256, not {head_size}")
    elif group > XQA_JIT_MAX_GROUP:
        jit = XqaKernels((), (), f"the JIT kernels take at most {XQA_JIT_MAX_GROUP} query heads per KV head")
    elif sm < 80:
        jit = XqaKernels((), (), "the JIT kernels need SM 8.0 or later")
    elif sm == 90 and kv == "FP8":
        jit = XqaKernels(("QGMMA", "HMMA"), XQA_JIT_QGMMA_TOKENS_PER_BLOCK)
    else:
        jit = XqaKernels(("HMMA",), XQA_JIT_HMMA_TOKENS_PER_BLOCK)
    if head_size not in XQA_PRECOMPILED_MEDUSA_HEAD_SIZES:
        pre = XqaKernels((), (), "the precompiled Medusa kernels exist for head size "
                         + "/".join(map(str, XQA_PRECOMPILED_MEDUSA_HEAD_SIZES)) + " only")
    elif sm not in XQA_ROUTE_SMS:
        pre = XqaKernels((), (), f"no precompiled Medusa kernels were read for {sm_names([sm])}")
    elif kv == "FP8" and sm < 89:
        pre = XqaKernels((), (), f"the precompiled Medusa kernels have no E4M3 cache on {sm_names([sm])}")
    elif not q_scaling_one:
        pre = XqaKernels((), (), "the precompiled kernels require q_scaling == 1")
    else:
        pre = XqaKernels(("head-size-128",), XQA_PRECOMPILED_TOKENS_PER_BLOCK)
    if sm == 90 and kv == "FP8" and group <= XQA_HOPPER_JIT_MAX_GROUP:
        impl, why = "JIT", f"an FP8 KV cache on SM 9.0 with a group size up to {XQA_HOPPER_JIT_MAX_GROUP}"
    elif 64 % group == 0:
        impl, why = "JIT", f"group size {group} divides 64"
    else:
        impl, why = "precompiled", f"group size {group} does not divide 64"
    return XqaRoute(sm, impl, why, jit, pre)


def xqa_serving_routes(group: int, head_size: int, kv_dtype: str | None = None, *,
                       q_scaling_one: bool = True) -> dict[int, XqaRoute]:
    """:func:`xqa_medusa_route` on the GPUs that hold this KV cache at all: an E4M3 (FP8) cache from SM 8.9 on."""
    routes = xqa_medusa_route(group, head_size, kv_dtype, q_scaling_one=q_scaling_one)
    if _kv_kind(kv_dtype) == "FP8":
        routes = {sm: r for sm, r in routes.items() if sm >= 89}
    return routes


def relies_on_precompiled(routes: dict[int, XqaRoute]) -> bool:
    """Whether only the precompiled kernels serve this shape on some GPU (the JIT kernels take none of it there): a
    runner whose default or only implementation is JIT (:data:`XQA_JIT_ONLY`) would fail it."""
    return any(r.served_with_jit_off and not r.served_with_jit_env for r in routes.values())


def xqa_environment(routes: dict[int, XqaRoute]) -> dict[str, str]:
    """The :data:`XQA_JIT_ENV` setting under which every GPU of ``routes`` has a kernel, where the default leaves
    one without: ``{XQA_JIT_ENV: "1"}`` or ``{XQA_JIT_ENV: "0"}``; also ``"0"`` where the default serves every GPU
    but only through the precompiled kernels on some (a group over 32 with head size 128: the setting pins them,
    should a runner's default move to JIT); ``{}`` where the default serves every GPU otherwise, or no one setting
    serves them all. (With one attention shape the JIT kernels take it on every GPU of :data:`XQA_ROUTE_SMS` or on
    none, so the GPUs never need opposite settings.)"""
    needed = {r.env_needed for r in routes.values()}
    for value, serves in (("1", "served_with_jit_env"), ("0", "served_with_jit_off")):
        if value in needed and all(getattr(r, serves) for r in routes.values()):
            return {XQA_JIT_ENV: value}
    if all(r.served_with_jit_off for r in routes.values()) and relies_on_precompiled(routes):
        return {XQA_JIT_ENV: "0"}
    return {}


def describe_xqa_routes(routes: dict[int, XqaRoute]) -> str:
    """The routes in words, GPUs with the same outcome together: "on SM 9.0 ...; on SM 8.0/8.6/8.9 ..."."""
    by_outcome: dict[tuple, list[int]] = {}
    for sm, r in routes.items():
        by_outcome.setdefault((r.impl, r.why, r.jit, r.precompiled), []).append(sm)
    parts = []
    for (impl, why, jit, pre), sms in by_outcome.items():
        picked = jit if impl == "JIT" else pre
        text = f"on {sm_names(sms)} the runner picks the {impl} XQA kernels ({why})"
        if picked.names:
            text += (f", whose {' and '.join(picked.names)} kernels take it "
                     f"({', '.join(map(str, picked.tokens_per_block))} tokens per block)")
        else:
            text += f", and none takes it ({picked.missing})"
            if impl == "precompiled":
                text += (f"; with {XQA_JIT_ENV}=1 the JIT {' and '.join(jit.names)} kernels would" if jit.names
                         else f"; nor do the JIT kernels ({jit.missing})")
            else:
                text += (f"; with {XQA_JIT_ENV}=0 the precompiled {' and '.join(pre.names)} kernels would"
                         if pre.names else f"; nor do the precompiled kernels ({pre.missing})")
        parts.append(text)
    return "; ".join(parts)
