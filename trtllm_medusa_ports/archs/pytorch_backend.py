"""What TensorRT-LLM's PyTorch backend has for a base architecture, for EAGLE-3 drafts.

TensorRT-LLM removed its TensorRT engine flow after 1.3.0rc20; on the PyTorch backend, the only one left, Medusa
does not exist (``MedusaDecodingConfig.supports_backend`` refuses ``pytorch``, tensorrt_llm/llmapi/llm_args.py)
and a trained draft runs as EAGLE-3. Whether a base can serve one depends on its model class in
tensorrt_llm/_torch/models/ (NVIDIA/TensorRT-LLM):

* **one-model**: the class is a ``SpecDecOneEngineForCausalLM`` (modeling_speculative.py), which runs the draft in
  the target's own engine (the default, ``eagle3_one_model=True``);
* **two-model**: a plain ``DecoderModelForCausalLM`` whose decoder layers call
  ``spec_metadata.maybe_capture_hidden_states``: the draft runs as a second model, a mode upstream deprecates
  ("Eagle3 2-model is deprecated and will be removed in release 1.4");
* **no capture hook**: a class whose layers never hand their hidden states to the drafter;
* **no class**: ``register_auto_model`` registers no class for the architecture.

Each family declares, for each HF architecture it registers, a :class:`PyTorchModel` (``pytorch_models``); the
check for the PyTorch backend reads that declaration, never a family's name.

May import: the standard library alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: the folder of upstream's PyTorch model classes
MODELS_DIR = "tensorrt_llm/_torch/models/"
#: the file whose registry refuses an architecture no class is registered for
AUTO_MODEL_FILE = MODELS_DIR + "modeling_auto.py"


class Eagle3Support(enum.Enum):
    """How the PyTorch backend's class for an architecture serves an EAGLE-3 draft."""

    ONE_MODEL = "one-model"
    TWO_MODEL = "two-model"
    NO_CAPTURE = "no capture hook"
    NO_CLASS = "no PyTorch class"

    @property
    def serves(self) -> bool:
        return self in (Eagle3Support.ONE_MODEL, Eagle3Support.TWO_MODEL)


@dataclass(frozen=True)
class PyTorchModel:
    """One architecture on the PyTorch backend: its EAGLE-3 support and the upstream file that shows it (a path in
    NVIDIA/TensorRT-LLM: the module registering the class, or modeling_auto.py where none is). Upstream registers a
    class under the HF architecture's own name (``register_auto_model("Qwen2ForCausalLM")``), so the declaration's
    key names the class."""

    support: Eagle3Support
    upstream: str = AUTO_MODEL_FILE

    def __post_init__(self) -> None:
        if not self.upstream.startswith(MODELS_DIR):
            raise ValueError(f"upstream file {self.upstream!r}: a path in NVIDIA/TensorRT-LLM's {MODELS_DIR}")
        if (self.support is Eagle3Support.NO_CLASS) != (self.upstream == AUTO_MODEL_FILE):
            raise ValueError(f"{self.support.value}: cite the module registering the class, or "
                             f"{AUTO_MODEL_FILE} where no class is registered")


def one_model(module: str) -> PyTorchModel:
    """``module``: the file in tensorrt_llm/_torch/models/ registering the class."""
    return PyTorchModel(Eagle3Support.ONE_MODEL, MODELS_DIR + module)


def two_model(module: str) -> PyTorchModel:
    return PyTorchModel(Eagle3Support.TWO_MODEL, MODELS_DIR + module)


def no_capture(module: str) -> PyTorchModel:
    return PyTorchModel(Eagle3Support.NO_CAPTURE, MODELS_DIR + module)


#: an architecture no PyTorch class is registered for
NO_CLASS = PyTorchModel(Eagle3Support.NO_CLASS)
