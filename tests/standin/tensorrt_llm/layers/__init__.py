from ..layers.attention import Attention, SpecDecodingParams
from ..layers.linear import ColumnLinear

__all__ = ["Attention", "ColumnLinear", "SpecDecodingParams"]
