"""trtllm-medusa-ports: Medusa speculative decoding in TensorRT-LLM for non-Llama bases.

Nothing here imports ``tensorrt_llm``; only :mod:`trtllm_medusa_ports.engine`
does, lazily.
"""

__version__ = "0.1.0"
