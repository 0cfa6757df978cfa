"""The numbers verify judges by: the parity tolerance, the hit-rate top-k, float16's range.

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
