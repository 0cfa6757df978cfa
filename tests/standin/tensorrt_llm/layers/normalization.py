"""tensorrt_llm/layers/normalization.py ``LayerNorm`` (weight, bias; eps 1e-5) and ``RmsNorm``
(weight only; eps 1e-6). Shapes are ``normalized_shape``, never split by tp."""

from ..functional import Tensor
from ..module import Module
from ..parameter import Parameter


def _shape(n):
    return (n,) if isinstance(n, int) else tuple(n)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-05, elementwise_affine=True, bias=True, dtype=None, tp_size=1,
                 tp_dim=-1):
        super().__init__()
        self.eps = eps
        if elementwise_affine:
            self.weight = Parameter(shape=_shape(normalized_shape), dtype=dtype)
            if bias:
                self.bias = Parameter(shape=_shape(normalized_shape), dtype=dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x, *args, **kwargs):
        return Tensor(f"layernorm({x.name})")


class RmsNorm(Module):
    def __init__(self, normalized_shape, num_groups=1, eps=1e-06, elementwise_affine=True, dtype=None):
        super().__init__()
        self.eps = eps
        if elementwise_affine:
            self.weight = Parameter(shape=_shape(normalized_shape), dtype=dtype)
        else:
            self.register_parameter("weight", None)

    def forward(self, x, *args, **kwargs):
        return Tensor(f"rmsnorm({x.name})")
