"""``verify``: prove that a converted checkpoint is the base model, and that Medusa greedy = base greedy.

1. Logits parity: Hugging Face transformers vs the reference executor on the prompts.
   The HF model computes in float32 on its weights *rounded to the checkpoint's dtype*,
   and so does the executor, so any difference is the conversion's, not the dtype's:
   one tolerance holds for float32, float16 and bfloat16 checkpoints: ``PARITY_RTOL`` times the
   largest |logit| (at least 1), i.e. float32 rounding through a deep network, not a port bug.
2. Greedy equivalence: HF greedy decoding vs reference Medusa decoding with the tree,
   token for token.
3. Speculation quality: mean tokens per step; per-head top-1 / top-k hit rates on the text.

The package, by what each module proves (imports run down this list's dependencies, never back up to here):

* ``limits``: the tolerance and constants; ``report``: :class:`VerifyReport`, its text and JSON;
* ``inputs``: the prompts, the tree, the checkpoint's dtype;
* ``hf_side``: transformers computing as the engine does, its greedy text and activation range;
* ``checkpoint_side``: the checkpoint on the reference executor (parity, where it parts ways, greedy runs);
* ``heads``: the checkpoint's heads against their source; ``quantization``: the quantized checks;
* ``measures``: the heads' hit rates and the tree's predicted tokens per step;
* ``run``: :func:`verify`, the phases in order.

May import: its own modules only (this file re-exports their public names; no verify module imports it).
"""

from trtllm_medusa_ports.huggingface.model import end_token_ids, load_hf_model, value_transforms
from trtllm_medusa_ports.verify.checkpoint_side import first_differing_tensor
from trtllm_medusa_ports.verify.heads import (
    SourceHeads,
    heads_parity,
    heads_parity_of,
    source_heads_for,
)
from trtllm_medusa_ports.verify.hf_side import (
    ActivationRange,
    EngineArithmetic,
    engine_arithmetic,
    hf_greedy,
    measure_activation_range,
    restore_modules,
    use_engine_gelu,
)
from trtllm_medusa_ports.verify.inputs import default_prompts, tree_for
from trtllm_medusa_ports.verify.limits import (
    FLOAT16_MAX,
    HIT_TOP_K,
    MIN_QUANT_AGREEMENT,
    PARITY_RTOL,
)
from trtllm_medusa_ports.verify.measures import (
    head_hit_rates,
    predicted_mean_accepted_tokens_per_step,
)
from trtllm_medusa_ports.verify.report import VerifyReport, report_json
from trtllm_medusa_ports.verify.run import verify

__all__ = [
    "FLOAT16_MAX", "HIT_TOP_K", "MIN_QUANT_AGREEMENT", "PARITY_RTOL", "ActivationRange", "EngineArithmetic", "SourceHeads", "VerifyReport",
    "default_prompts", "end_token_ids", "engine_arithmetic", "first_differing_tensor", "head_hit_rates",
    "heads_parity", "heads_parity_of", "hf_greedy", "load_hf_model", "measure_activation_range",
    "predicted_mean_accepted_tokens_per_step", "report_json", "restore_modules", "source_heads_for", "tree_for",
    "use_engine_gelu", "value_transforms", "verify",
]
