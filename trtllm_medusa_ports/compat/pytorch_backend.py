"""The rules of ``trtllm-medusa check --backend pytorch``: can TensorRT-LLM's PyTorch backend (1.3 and later, where
the TensorRT engine flow and Medusa are gone) serve an EAGLE-3 draft over this base?

The verdict reads the family's declaration (``pytorch_models``, archs/pytorch_backend.py) and the base's layer
count; nothing here names a family.

May import: ``archs`` (the declarations), ``findings``, ``files.hf_model``.
"""

from __future__ import annotations

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.pytorch_backend import Eagle3Support
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.findings import ERROR, INFO, RULES, WARNING, Finding

PYTORCH_RULES = ("pytorch-eagle3-one-model", "pytorch-two-model-only", "pytorch-no-capture-hook",
                 "pytorch-no-model-class", "pytorch-capture-layers", "pytorch-no-medusa", "pytorch-unknown-architecture")
RULES.update(PYTORCH_RULES)

#: where the default capture is chosen, and refused below 6 layers ("Not enough hidden layers for default EAGLE3
#: capture": Eagle3SpecMetadata.__post_init__)
CAPTURE_FILE = "tensorrt_llm/_torch/speculative/eagle3.py"
#: fewer decoder layers than this: no default capture layers (upstream raises for num_layers <= 5)
MIN_CAPTURE_LAYERS = 6
#: stay on the TensorRT backend: the fix of every refusal
STAY_ON_12 = ("stay on TensorRT-LLM 1.2.x with Medusa heads where `trtllm-medusa check --model_dir B` (the TensorRT "
              "backend) passes")


def default_capture_layers(num_layers: int) -> tuple[int, int, int] | None:
    """The target layers whose outputs an EAGLE-3 draft reads by default: 1, L // 2 - 1 and L - 4 (None below
    :data:`MIN_CAPTURE_LAYERS`, where upstream refuses)."""
    if num_layers < MIN_CAPTURE_LAYERS:
        return None
    return (1, num_layers // 2 - 1, num_layers - 4)


def _support_finding(arch: str, adapter: ArchAdapter) -> Finding:
    model = adapter.pytorch_models[arch]
    where = f"NVIDIA/TensorRT-LLM {model.upstream}"
    if model.support is Eagle3Support.ONE_MODEL:
        return Finding("pytorch-eagle3-one-model", INFO,
                       f"{arch} is a SpecDecOneEngineForCausalLM ({where}): the EAGLE-3 draft runs in the "
                       "target's own engine (eagle3_one_model, the default)", "nothing to do")
    if model.support is Eagle3Support.TWO_MODEL:
        return Finding("pytorch-two-model-only", WARNING,
                       f"{arch}'s decoder layers capture hidden states but the class is a plain "
                       f"DecoderModelForCausalLM ({where}): EAGLE-3 runs only as a second model "
                       "(eagle3_one_model: false), which upstream warns 'is deprecated and will be removed in "
                       "release 1.4'", "serve with `eagle3_one_model: false` on TensorRT-LLM 1.3, or " + STAY_ON_12)
    if model.support is Eagle3Support.NO_CAPTURE:
        return Finding("pytorch-no-capture-hook", ERROR,
                       f"{arch}'s decoder layers never call spec_metadata.maybe_capture_hidden_states "
                       f"({where}): no EAGLE-3 draft can read its hidden states", STAY_ON_12)
    return Finding("pytorch-no-model-class", ERROR,
                   f"TensorRT-LLM's PyTorch backend registers no model class for {arch} "
                   f"(register_auto_model in tensorrt_llm/_torch/models/; {model.upstream} refuses it)", STAY_ON_12)


def check_pytorch(hf: HFConfig, adapter: ArchAdapter | None, *, medusa_given: tuple[str, ...] = ()) -> list[Finding]:
    """Findings for serving an EAGLE-3 draft over this base on the PyTorch backend. ``medusa_given``: the Medusa
    flags the caller was given (heads, a tree), refused by name."""
    out: list[Finding] = []
    if medusa_given:
        out.append(Finding("pytorch-no-medusa", ERROR,
                           f"{', '.join(medusa_given)} with --backend pytorch: the PyTorch backend has no Medusa "
                           "(MedusaDecodingConfig.supports_backend refuses 'pytorch', tensorrt_llm/llmapi/llm_args.py)",
                           "check Medusa heads without --backend (TensorRT-LLM 1.2.x), or train an EAGLE-3 draft "
                           "for the PyTorch backend"))
    arch = (hf.get("architectures") or ["(none)"])[0]
    if adapter is None or arch not in adapter.pytorch_models:
        out.append(Finding("pytorch-unknown-architecture", ERROR,
                           f"no declaration of TensorRT-LLM's PyTorch backend for architecture {arch!r}",
                           "docs/porting-guide.md: a family declares `pytorch_models` in its module of archs/"))
        return out
    out.append(_support_finding(arch, adapter))
    layers = hf.get("num_hidden_layers")
    if isinstance(layers, int) and default_capture_layers(layers) is None:
        out.append(Finding("pytorch-capture-layers", ERROR,
                           f"num_hidden_layers is {layers}: an EAGLE-3 draft reads layers 1, L // 2 - 1 and L - 4, "
                           f"and upstream refuses fewer than {MIN_CAPTURE_LAYERS} layers ('Not enough hidden layers "
                           f"for default EAGLE3 capture', {CAPTURE_FILE})", STAY_ON_12))
    return out
