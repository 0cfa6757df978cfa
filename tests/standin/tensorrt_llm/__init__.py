"""A stand-in for TensorRT-LLM 1.2.x, for testing trtllm_medusa_ports.engine without it.

It reproduces only the signatures and call structure of the upstream classes the
engine adapters derive from (tensorrt_llm/models/modeling_utils.py
DecoderModelForCausalLM / DecoderLayerList, tensorrt_llm/layers/attention.py
Attention, tensorrt_llm/models/<family>/model.py layer and model forwards) and
records calls. It computes nothing: no attention, no kernels, no numbers.
"""

__version__ = "1.2.0-standin"
CALLS: list[tuple] = []  # (what, detail) in call order
