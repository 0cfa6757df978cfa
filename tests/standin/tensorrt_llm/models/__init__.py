from ..models.bloom.model import BloomForCausalLM
from ..models.falcon.model import FalconForCausalLM
from ..models.gemma.model import GemmaForCausalLM
from ..models.gpt.model import GPTForCausalLM
from ..models.gptneox.model import GPTNeoXForCausalLM
from ..models.llama.model import LLaMAForCausalLM
from ..models.mpt.model import MPTForCausalLM
from ..models.phi.model import PhiForCausalLM
from ..models.phi3.model import Phi3ForCausalLM
from ..models.qwen.model import QWenForCausalLM

# upstream's MODEL_MAP (tensorrt_llm/models/__init__.py), only the names these tests use
MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM, "MistralForCausalLM": LLaMAForCausalLM,
    "Qwen2ForCausalLM": QWenForCausalLM, "GemmaForCausalLM": GemmaForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM, "PhiForCausalLM": PhiForCausalLM,
    "GPTNeoXForCausalLM": GPTNeoXForCausalLM, "FalconForCausalLM": FalconForCausalLM,
    "Starcoder2ForCausalLM": GPTForCausalLM, "BloomForCausalLM": BloomForCausalLM,
    "MPTForCausalLM": MPTForCausalLM, "MedusaForCausalLM": None,
}
