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
#: verify's damage verdict on a quantized checkpoint: the fraction of the float base's greedy tokens the quantized
#: model, every engine rounding on, predicts (top-1) reading the float base's own text up to each - teacher-forced,
#: the same plain decoding on both sides, tokens where the text copies itself left out (verify/quantization.py
#: novel_positions) - so it neither falls nor climbs with --max_new_tokens as the share of tokens before two
#: free-running texts first differ fell (that share, the verdict before, failed INT8 weight-only on SmolLM2 at 0.39
#: of 32 tokens and 0.05 of 256). Below this verify fails by default (``--min_quant_agreement`` overrides it, 0 turns
#: it off). Set from benchmarks/results/quant_agreement_smollm2.json (SmolLM2-135M-Instruct in bfloat16, 8 prompts,
#: 32 / 256 new tokens): int8_wo 0.96 / 0.97, FP8 KV 0.93 / 0.96, INT8 KV 0.90 / 0.94, int8_wo + INT8 KV 0.89 /
#: 0.93, FP8 + FP8 KV 0.86 / 0.90, FP8 0.83 / 0.90 - usable formats, each a cost - against INT4 weight-only
#: (per channel, no AWQ) 0.57 / 0.61, which loses the base's text. 0.75 lies between, clear of both at either
#: length; a stricter deployment passes a higher one (0.9 fails FP8 on this base).
MIN_QUANT_AGREEMENT = 0.75
#: the verdict is decided by evidence: the agreement's 95 % interval (Wilson's, over the counted positions) must lie
#: above the threshold to pass and below it to fail; while it straddles it, verify reads a longer float text (twice
#: the new tokens, up to this many a prompt) and, still undecided there, fails naming the interval
DAMAGE_MAX_NEW_TOKENS = 256
#: the normal quantile of a two-sided 95 % interval
Z95 = 1.959964
