"""tensorrt_llm/quantization/quantize.py ``quantize``, ``quantize_layers``, ``kv_cache_quantize``.

``quantize(model, quant_config)`` runs from ``PretrainedModel.__post_init__``: every ``ColumnLinear`` /
``RowLinear`` whose full dotted module name matches no ``exclude_modules`` pattern
(``fnmatch.fnmatchcase``; the default list is used only when none is given - ``None`` -, never merged with one,
and an empty list excludes nothing) is re-created as the quantized layer of ``quant_algo`` with the whole
(tp-multiplied) features; under weight-only every ``Embedding`` not excluded becomes a
``WeightOnlyQuantEmbedding`` (``weight_only_quantize``'s quant_map), and every ``MOE``
layer not excluded declares its experts quantized (weight-only only: ``MOEWeightWrapper``); with a
``kv_cache_quant_algo`` every ``Attention`` gets ``kv_cache_scaling_factor`` and
``kv_cache_rcp_scaling_factor`` float32 ``[1]``. ``W4A16_AWQ`` makes the linears
``WeightOnlyGroupwiseQuant*Linear`` (``weight_only_groupwise_quantize``: the config's ``group_size``,
``pre_quant_scale`` and ``has_zero_point``), ``W8A8_SQ_PER_CHANNEL`` ``Int8SmoothQuant*Linear``
(``smooth_quantize_ootb``); their MoE layers are not modelled.
"""

import fnmatch

from .._utils import get_init_params
from ..layers.attention import Attention
from ..layers.embedding import Embedding
from ..layers.linear import ColumnLinear, RowLinear
from ..layers.moe import MixtureOfExperts
from ..parameter import Parameter
from .layers import (
    FP8Linear,
    Int8SmoothQuantLinear,
    WeightOnlyGroupwiseQuantLinear,
    WeightOnlyQuantEmbedding,
    WeightOnlyQuantLinear,
)
from .mode import from_quant_algo

DEFAULT_EXCLUDE = ["*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                   "*shared_expert_gate"]
_BITS = {"W8A16": 8, "W4A16": 4}


def _replacement(module, algo, quant_config):
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
    if algo == "W4A16_AWQ":  # weight_only_groupwise_quantize's quant_map
        return WeightOnlyGroupwiseQuantLinear(in_f, out_f, group_size=quant_config.group_size,
                                              pre_quant_scale=quant_config.pre_quant_scale,
                                              zero=quant_config.has_zero_point, bias=bias, dtype=dtype, tp_size=tp,
                                              row=row)
    if algo == "W8A8_SQ_PER_CHANNEL":  # smooth_quantize_ootb's quant_map (not in W8A8_SQ_PLUGIN_LIST)
        return Int8SmoothQuantLinear(in_f, out_f, bias=bias, dtype=dtype, tp_size=tp, row=row)
    raise NotImplementedError(f"the stand-in does not model quant_algo {algo}")


def quantize(model, quant_config):
    # upstream's quantize() starts from quant_config.quant_mode: QuantMode.from_quant_algo asserts the names
    from_quant_algo(quant_config.quant_algo, quant_config.kv_cache_quant_algo)
    algo, kv = quant_config.quant_algo, quant_config.kv_cache_quant_algo
    if algo:
        exclude = quant_config.exclude_modules if quant_config.exclude_modules is not None else DEFAULT_EXCLUDE
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
                    module._modules[child_name] = _replacement(child, algo, quant_config)
                elif isinstance(child, Embedding) and algo in _BITS and not any(
                        fnmatch.fnmatchcase(full, p) for p in exclude):
                    # quant_map[type(module)](**get_init_params(module)): the embedding's own arguments
                    module._modules[child_name] = WeightOnlyQuantEmbedding(**get_init_params(child))
    if kv:
        for _, module in model.named_modules():
            if isinstance(module, Attention):
                module.kv_cache_scaling_factor = Parameter(shape=(1,), dtype="float32")
                module.kv_cache_rcp_scaling_factor = Parameter(shape=(1,), dtype="float32")
    return model
