from ..layers.attention import (
    Attention,
    AttentionMaskType,
    AttentionParams,
    KeyValueCacheParams,
    LayerNormType,
    PositionEmbeddingType,
    SpecDecodingParams,
)
from ..layers.embedding import Embedding
from ..layers.linear import ColumnLinear, Linear, RowLinear
from ..layers.mlp import MLP, GatedMLP
from ..layers.moe import MOE, MixtureOfExperts, MoeConfig, SharedMoE
from ..layers.normalization import LayerNorm, RmsNorm

__all__ = ["MLP", "Attention", "AttentionMaskType", "AttentionParams", "ColumnLinear", "Embedding", "GatedMLP",
           "KeyValueCacheParams", "LayerNorm", "MOE", "MixtureOfExperts", "MoeConfig", "SharedMoE", "LayerNormType", "Linear", "PositionEmbeddingType", "RmsNorm",
           "RowLinear", "SpecDecodingParams"]
