"""Dtype rules: float16's range against the measured activations, and a quantized float32 checkpoint.

May import: ``findings`` only.
"""

from __future__ import annotations

from trtllm_medusa_ports.findings import ERROR, INFO, WARNING, Finding

#: the largest finite float16 value
FLOAT16_MAX = 65504.0


def activation_range_finding(max_activation: float, where: str, dtype: str | None) -> Finding:
    """What the measured activation range means for the serving dtype."""
    if max_activation <= FLOAT16_MAX:
        return Finding("float16-range", INFO, f"the largest activation on the prompts is {max_activation:.3g} "
                       f"({where}), within float16's range", "nothing to do")
    msg = (f"activations reach {max_activation:.3g} on the prompts ({where}), beyond float16's {FLOAT16_MAX:g}: "
           "a float16 engine computes inf/NaN there")
    if dtype in ("bfloat16", "float32"):
        return Finding("float16-range", INFO, msg, f"nothing to do in {dtype}")
    return Finding("float16-range", ERROR if dtype == "float16" else WARNING, msg,
                   "serve in bfloat16 (--dtype bfloat16)")


def quantized_float32(quantization, dtype: str | None) -> list[Finding]:
    """convert refuses a quantized float32 checkpoint (convert.py): a check must not say COMPATIBLE for it."""
    if dtype != "float32":
        return []
    return [Finding("dtype-float32", ERROR,
                    f"{quantization.quant_algo or quantization.kv_cache_quant_algo} from a float32 checkpoint: "
                    "TensorRT-LLM serves quantized Medusa engines in float16 or bfloat16 (and refuses float32 with "
                    "speculative decoding), so convert refuses it", "pass --dtype float16 or bfloat16")]
