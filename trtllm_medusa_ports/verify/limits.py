"""The numbers verify judges by: the parity tolerance, the hit-rate top-k, float16's range, a quantized format's
least greedy agreement with the float base.

May import: nothing (every verify module reads these).
"""

#: max |logit difference| accepted between HF and the executor (both float32 on the same weights),
#: relative to the logits' scale: max(1, max |logit|) x PARITY_RTOL. Real models carry hidden
#: states of 1e4 and more ("massive activations"), where float32 summation order alone moves
#: the logits by ~1e-5 of their scale; a wrong port moves them by far more.
PARITY_RTOL = 1e-4
#: top-k used for the heads' top-k hit rate
HIT_TOP_K = 5
#: the largest finite float16 value: an activation beyond it is inf in a float16 engine
FLOAT16_MAX = 65504.0
#: a quantized checkpoint's greedy text against the float base's, as the engine computes it (every rounding on):
#: the fraction of generated tokens before each prompt's first difference. Below this, verify fails by default
#: (``--min_quant_agreement`` overrides it, 0 turns it off): the format costs most of the text. Measured on a real
#: 270M base: FP8 KV cache 0.84, INT8 KV cache 0.20-0.34. A near tie can flip one token early in any format, so
#: judge on several prompts of real text, not on one.
MIN_QUANT_AGREEMENT = 0.5
