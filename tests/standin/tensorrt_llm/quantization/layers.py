"""tensorrt_llm/quantization/layers.py: the parameters the quantized linears declare.

``WeightOnlyQuantLinear`` / ``WeightOnlyQuantRowLinear``: in and out features padded up to a multiple of
``64 * tp_size``; ``weight`` int8 ``[in_local, out_local * bits / 8]`` (the transposed weight; int4 packs two
values per byte), ``per_channel_scale`` ``[out_local]`` in the model dtype. ``FP8Linear`` /
``FP8RowLinear``: ``weight`` fp8 ``[out_local, in_local]``, ``activation_scaling_factor`` and
``weights_scaling_factor`` float32 ``[1]``. ``WeightOnlyQuantEmbedding`` (an ``Embedding``, with its arguments): ``weight`` int8
``[ceil(vocab / tp), hidden]`` (sharding dim 0) or ``[vocab, hidden / tp]``, ``per_token_scale`` ``[vocab]`` in the
model dtype.
``WeightOnlyGroupwiseQuantLinear`` / ``RowLinear`` (INT4 AWQ): in and out features padded up to a multiple of
``max(64, group_size) * tp_size``; ``weight`` ``[in_local, out_local / 4]`` in the model dtype (int4 codes packed
four to a 16-bit element), ``weights_scaling_factor`` ``[in_local / group_size, out_local]`` in the model dtype,
with ``pre_quant_scale`` a ``prequant_scaling_factor`` ``[1, in_local]``, with ``zero`` a ``zero`` of the scales'
shape. ``Int8SmoothQuantLinear`` / ``RowLinear`` (SmoothQuant per channel, not a plugin algorithm): ``weight``
int8 ``[out_local, in_local]``, ``weights_scaling_factor`` float32 ``[out_local]``, ``prequant_scaling_factor``
``[in_local]`` in the model dtype, ``activation_scaling_factor`` float32 ``[1]``.
Forward records the call and computes nothing (kernels are not modelled).
"""

import math

from .. import CALLS
from ..functional import Tensor
from ..layers.embedding import Embedding
from ..module import Module
from ..parameter import Parameter


class _Quantized(Module):
    def forward(self, x, *args, **kwargs):
        CALLS.append(("quantized_linear", type(self).__name__, id(self)))
        return Tensor(f"{type(self).__name__}({x.name})")


def _padded(n, tp_size, least=64):
    multiple = least * tp_size
    return math.ceil(n / multiple) * multiple


def _local(in_features, out_features, tp_size, row):
    return (in_features // tp_size if row else in_features), (out_features if row else out_features // tp_size)


class WeightOnlyQuantLinear(_Quantized):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_size=1, bits=8, row=False):
        super().__init__()
        in_features, out_features = _padded(in_features, tp_size), _padded(out_features, tp_size)
        local_in, local_out = _local(in_features, out_features, tp_size, row)
        self.weight = Parameter(shape=(local_in, local_out * bits // 8), dtype="int8")
        self.per_channel_scale = Parameter(shape=(local_out,), dtype=dtype)
        if bias:
            self.bias = Parameter(shape=(local_out,), dtype=dtype)
        else:
            self.register_parameter("bias", None)


class FP8Linear(_Quantized):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_size=1, row=False):
        super().__init__()
        local_in, local_out = _local(in_features, out_features, tp_size, row)
        self.weight = Parameter(shape=(local_out, local_in), dtype="fp8")
        if bias:
            self.bias = Parameter(shape=(local_out,), dtype=dtype)
        else:
            self.register_parameter("bias", None)
        self.activation_scaling_factor = Parameter(shape=(1,), dtype="float32")
        self.weights_scaling_factor = Parameter(shape=(1,), dtype="float32")


class WeightOnlyQuantEmbedding(Embedding):
    """An ``Embedding`` (upstream subclasses it, so ``parallelize_embedding`` shards it keeping its class) with the
    same arguments and a ``quant_mode``."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None, tp_size=1, tp_group=None, sharding_dim=0,
                 tp_rank=None, quant_mode=None):
        super().__init__(num_embeddings, embedding_dim, dtype, tp_size, tp_group, sharding_dim, tp_rank)
        self.quant_mode = quant_mode
        self.per_token_scale = Parameter(shape=(num_embeddings,), dtype=dtype)
        shape = ((-(-num_embeddings // tp_size), embedding_dim) if sharding_dim == 0 else
                 (num_embeddings, embedding_dim // tp_size))
        self.weight = Parameter(shape=shape, dtype="int8")

    def forward(self, x, *args, **kwargs):
        CALLS.append(("quantized_linear", type(self).__name__, id(self)))
        return Tensor(f"{type(self).__name__}({x.name})")


class WeightOnlyGroupwiseQuantLinear(_Quantized):
    def __init__(self, in_features, out_features, group_size=128, pre_quant_scale=False, zero=False, bias=False,
                 dtype=None, tp_size=1, row=False):
        super().__init__()
        least = max(64, group_size)
        in_features, out_features = _padded(in_features, tp_size, least), _padded(out_features, tp_size, least)
        local_in, local_out = _local(in_features, out_features, tp_size, row)
        self.group_size = group_size
        self.weight = Parameter(shape=(local_in, local_out // 4), dtype=dtype)
        scales = (local_in // group_size, local_out)
        self.weights_scaling_factor = Parameter(shape=scales, dtype=dtype)
        for name, on, shape in (("prequant_scaling_factor", pre_quant_scale, (1, local_in)), ("zero", zero, scales),
                                ("bias", bias, (local_out,))):
            if on:
                setattr(self, name, Parameter(shape=shape, dtype=dtype))
            else:
                self.register_parameter(name, None)


class Int8SmoothQuantLinear(_Quantized):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_size=1, row=False):
        super().__init__()
        local_in, local_out = _local(in_features, out_features, tp_size, row)
        self.weight = Parameter(shape=(local_out, local_in), dtype="int8")
        if bias:
            self.bias = Parameter(shape=(local_out,), dtype=dtype)
        else:
            self.register_parameter("bias", None)
        self.activation_scaling_factor = Parameter(shape=(1,), dtype="float32")
        self.weights_scaling_factor = Parameter(shape=(local_out,), dtype="float32")
        self.prequant_scaling_factor = Parameter(shape=(local_in,), dtype=dtype)
