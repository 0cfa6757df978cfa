"""tensorrt_llm/quantization/quantize.py ``quantize``, ``quantize_layers``, ``kv_cache_quantize``.

``quantize(model, quant_config)`` runs from ``PretrainedModel.__post_init__``: every ``ColumnLinear`` /
``RowLinear`` whose full dotted module name matches no ``exclude_modules`` pattern
(``fnmatch.fnmatchcase``; the default list is used only when none is given, never merged with one) is
re-created as the quantized layer of ``quant_algo`` with the whole (tp-multiplied) features, and every ``MOE``
layer not excluded declares its experts quantized (weight-only only: ``MOEWeightWrapper``); with a
``kv_cache_quant_algo`` every ``Attention`` gets ``kv_cache_scaling_factor`` and
``kv_cache_rcp_scaling_factor`` float32 ``[1]``.
"""

import fnmatch

from ..layers.attention import Attention
from ..layers.linear import ColumnLinear, RowLinear
from ..layers.moe import MixtureOfExperts
from ..parameter import Parameter
from .layers import FP8Linear, WeightOnlyQuantLinear

DEFAULT_EXCLUDE = ["*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                   "*shared_expert_gate"]
_BITS = {"W8A16": 8, "W4A16": 4}


def _replacement(module, algo):
    row = isinstance(module, RowLinear)
    tp = module.tp_size
    in_f = module.in_features * tp if row else module.in_features
    out_f = module.out_features if row else module.out_features * tp
    bias = module._parameters.get("bias") is not None
    dtype = module.weight.dtype
    if algo in _BITS:
        return WeightOnlyQuantLinear(in_f, out_f, bias=bias, dtype=dtype, tp_size=tp, bits=_BITS[algo], row=row)
    if algo == "FP8":
        return FP8Linear(in_f, out_f, bias=bias, dtype=dtype, tp_size=tp, row=row)
    raise NotImplementedError(f"the stand-in does not model quant_algo {algo}")


def quantize(model, quant_config):
    quant_config = quant_config or {}
    algo, kv = quant_config.get("quant_algo"), quant_config.get("kv_cache_quant_algo")
    if algo:
        exclude = quant_config.get("exclude_modules") or DEFAULT_EXCLUDE
        for name, module in list(model.named_modules()):
            # an MOE layer is rebuilt with the quant mode (its router, a RowLinear child, matches *router)
            if isinstance(module, MixtureOfExperts) and not any(fnmatch.fnmatchcase(name, p) for p in exclude):
                if algo not in _BITS:
                    raise NotImplementedError(f"the stand-in does not model {algo} experts")
                module.quantize_weight_only(_BITS[algo])
            for child_name, child in list(module._modules.items()):
                full = f"{name}.{child_name}" if name else child_name
                if isinstance(child, (ColumnLinear, RowLinear)) and not any(
                        fnmatch.fnmatchcase(full, p) for p in exclude):
                    module._modules[child_name] = _replacement(child, algo)
    if kv:
        for _, module in model.named_modules():
            if isinstance(module, Attention):
                module.kv_cache_scaling_factor = Parameter(shape=(1,), dtype="float32")
                module.kv_cache_rcp_scaling_factor = Parameter(shape=(1,), dtype="float32")
    return model
