"""Code that uses TensorRT-LLM. Nothing here imports ``tensorrt_llm`` at module import time."""
