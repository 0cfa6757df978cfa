"""tensorrt_llm/layers/embedding.py ``Embedding``.

weight: ``[vocab, hidden]`` at tp 1; with tp > 1, ``[ceil(vocab / tp), hidden]`` for
``sharding_dim`` 0 and ``[vocab, hidden // tp]`` for 1. Models create it unsharded and
``PretrainedModel.__post_init__`` -> ``optimize_model`` -> ``parallelize_embedding``
replaces it when ``use_parallel_embedding`` is set (models/modeling_utils.py).
"""

from ..functional import Tensor
from ..module import Module
from ..parameter import Parameter


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, dtype=None, tp_size=1, tp_group=None, sharding_dim=0,
                 tp_rank=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tp_size, self.tp_group, self.sharding_dim, self.tp_rank, self.dtype = (
            tp_size, tp_group, sharding_dim, tp_rank, dtype)
        if sharding_dim == 0:
            shape = (-(-num_embeddings // tp_size), embedding_dim)
        elif sharding_dim == 1:
            shape = (num_embeddings, embedding_dim // tp_size)
        else:
            raise UnboundLocalError("local variable 'shape' referenced before assignment")
        self.weight = Parameter(shape=shape, dtype=dtype)

    def forward(self, x, *args, **kwargs):
        return Tensor(f"embedding({getattr(x, 'name', x)})")
