"""Engine adapters: the only code that uses TensorRT-LLM, imported lazily.

Nothing in this package imports ``tensorrt_llm`` at module import time; every
entry point takes the ``tensorrt_llm`` module from :func:`require_tensorrt_llm`,
which raises :class:`EngineUnavailable` (with an install hint) when it is missing.
TensorRT-LLM cannot be installed on the machines this project is developed and
tested on: this code is exercised against a stand-in of the upstream classes in
``tests/standin`` and on GPU machines by ``scripts/validate_on_gpu.sh``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trtllm_medusa_ports.errors import PortError

#: TensorRT-LLM versions with the TensorRT engine flow (``trtllm-build``) this targets
SUPPORTED_TRTLLM = ">=0.15,<1.3"


class EngineUnavailable(PortError):
    """TensorRT-LLM is not importable here."""


def require_tensorrt_llm() -> ModuleType:
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise EngineUnavailable(
            f"TensorRT-LLM is not installed ({exc})",
            fix=f"on a machine with an NVIDIA GPU: pip install 'tensorrt_llm{SUPPORTED_TRTLLM}' "
            "--extra-index-url https://pypi.nvidia.com (1.2.x is the last release with trtllm-build); "
            "convert, check and verify work without it",
        ) from None
