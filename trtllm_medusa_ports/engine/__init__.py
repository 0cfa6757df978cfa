"""Engine adapters: the only code that uses TensorRT-LLM, imported lazily.

Nothing in this package imports ``tensorrt_llm`` at module import time; every
entry point takes the ``tensorrt_llm`` module from :func:`require_tensorrt_llm`,
which raises :class:`EngineUnavailable` (with an install hint) when it is missing.
TensorRT-LLM cannot be installed on the machines this project is developed and
tested on: this code is exercised against a stand-in of the upstream classes in
``tests/standin`` and on GPU machines by ``scripts/validate_on_gpu.sh``.

May import: ``archs``, ``compat`` (build's re-checks), ``quant``, ``weights``, ``files``, ``machine``, ``errors``;
never the entries (cli, api) or verify.
"""

from trtllm_medusa_ports.engine.installed import (
    SUPPORTED_TRTLLM,
    EngineUnavailable,
    require_tensorrt_llm,
    version_warning,
)

__all__ = ["SUPPORTED_TRTLLM", "EngineUnavailable", "require_tensorrt_llm", "version_warning"]
