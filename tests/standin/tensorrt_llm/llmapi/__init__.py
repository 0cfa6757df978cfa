"""tensorrt_llm/llmapi/__init__.py: the names an LLM API script of the engine flow imports."""

from ..sampling_params import SamplingParams
from .llm_args import KvCacheConfig, MedusaDecodingConfig

__all__ = ["KvCacheConfig", "MedusaDecodingConfig", "SamplingParams"]
