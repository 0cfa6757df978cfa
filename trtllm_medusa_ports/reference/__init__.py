"""CPU reference executor of TensorRT-LLM checkpoints, including Medusa tree decoding.

May import: ``archs``, ``quant``, ``trees``, ``weights``, ``files``, ``errors``; never verify or a stage.
"""

from trtllm_medusa_ports.reference.decoding import (
    MedusaRun,
    greedy_accept,
    medusa_generate,
    plain_generate,
)
from trtllm_medusa_ports.reference.executor import KVCache, ReferenceModel

__all__ = ["KVCache", "MedusaRun", "ReferenceModel", "greedy_accept", "medusa_generate", "plain_generate"]
