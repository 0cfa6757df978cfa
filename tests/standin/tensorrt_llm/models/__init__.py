"""tensorrt_llm/models/__init__.py: the classes and the ``MODEL_MAP`` keys this project meets
(upstream's full map has many more; these names and targets are upstream's)."""

from ..models.bloom.model import BloomForCausalLM
from ..models.falcon.model import FalconForCausalLM
from ..models.gemma.model import GemmaForCausalLM
from ..models.gpt.model import GPTForCausalLM
from ..models.gptneox.model import GPTNeoXForCausalLM
from ..models.llama.model import LLaMAForCausalLM
from ..models.medusa.model import MedusaForCausalLm
from ..models.modeling_utils import PretrainedConfig, PretrainedModel
from ..models.mpt.model import MPTForCausalLM
from ..models.phi.model import PhiForCausalLM
from ..models.phi3.model import Phi3ForCausalLM
from ..models.qwen.model import QWenForCausalLM

MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM,
    "MistralForCausalLM": LLaMAForCausalLM,
    "GraniteForCausalLM": LLaMAForCausalLM,
    "QWenForCausalLM": QWenForCausalLM,
    "Qwen2ForCausalLM": QWenForCausalLM,
    "Qwen3ForCausalLM": QWenForCausalLM,
    "GemmaForCausalLM": GemmaForCausalLM,
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "PhiForCausalLM": PhiForCausalLM,
    "GPTNeoXForCausalLM": GPTNeoXForCausalLM,
    "FalconForCausalLM": FalconForCausalLM,
    "RWForCausalLM": FalconForCausalLM,
    "GPTForCausalLM": GPTForCausalLM,
    "Starcoder2ForCausalLM": GPTForCausalLM,
    "BloomForCausalLM": BloomForCausalLM,
    "MPTForCausalLM": MPTForCausalLM,
    "MptForCausalLM": MPTForCausalLM,
    "MedusaForCausalLM": MedusaForCausalLm,
}

__all__ = ["MODEL_MAP", "BloomForCausalLM", "FalconForCausalLM", "GPTForCausalLM", "GPTNeoXForCausalLM",
           "GemmaForCausalLM", "LLaMAForCausalLM", "MPTForCausalLM", "MedusaForCausalLm", "Phi3ForCausalLM",
           "PhiForCausalLM", "PretrainedConfig", "PretrainedModel", "QWenForCausalLM"]
