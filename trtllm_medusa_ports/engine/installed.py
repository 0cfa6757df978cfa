"""Whether TensorRT-LLM is here, and which: ``require_tensorrt_llm`` imports it (lazily, the only place that does)
or raises :class:`EngineUnavailable` with the install hint; ``version_warning`` says when the installed version is
not the line the engine adapters follow (gpu_machine.py ``SUPPORTED_TRTLLM``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.machine.gpu_machine import INSTALL_HINT, SUPPORTED_TRTLLM

# SUPPORTED_TRTLLM (gpu_machine.py): files read at 1.2.0rc2/rc3 (models/modeling_utils.py, mapping.py,
# models/medusa/model.py) and the newest 1.x copies of the family models and commands/build.py;
# tests/standin/LEDGER.md lists them.


class EngineUnavailable(PortError):
    """TensorRT-LLM is not importable here."""


def version_warning(trtllm: ModuleType) -> str | None:
    """A warning when the installed TensorRT-LLM is not a version the adapters were checked against."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    found = str(getattr(trtllm, "__version__", "unknown"))
    try:
        ok = Version(found) in SpecifierSet(SUPPORTED_TRTLLM, prereleases=True)
    except InvalidVersion:
        ok = False
    if ok:
        return None
    return (f"TensorRT-LLM {found} is outside {SUPPORTED_TRTLLM}, the versions whose source these engine "
            "adapters follow; the build may fail or differ (validate with scripts/validate_on_gpu.sh)")


#: the parts of TensorRT-LLM the engine adapters use beyond the package itself: an incomplete or older install
#: without them ended in ModuleNotFoundError deep in a build
REQUIRED_MODULES = ("tensorrt_llm.commands.build", "tensorrt_llm.models", "tensorrt_llm.functional")


def require_tensorrt_llm() -> ModuleType:
    trtllm = _import_tensorrt_llm()
    for name in REQUIRED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise EngineUnavailable(
                f"TensorRT-LLM {getattr(trtllm, '__version__', '(version unknown)')} is installed without {name} "
                f"({exc}): an incomplete install, or a line without the TensorRT engine flow (1.3 removed it)",
                fix=f"install tensorrt_llm{SUPPORTED_TRTLLM} whole: {INSTALL_HINT}") from None
    return trtllm


def _import_tensorrt_llm() -> ModuleType:
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        if getattr(exc, "name", None) not in (None, "tensorrt_llm"):  # installed, but a library of it is missing
            raise EngineUnavailable(
                f"TensorRT-LLM is installed but cannot be imported ({exc})",
                fix="run on a machine with an NVIDIA GPU, its driver and CUDA libraries, and TensorRT-LLM's own "
                    "dependencies; convert, check and verify work without it") from None
        raise EngineUnavailable(
            f"TensorRT-LLM is not installed ({exc})",
            fix=f"{INSTALL_HINT}; convert, check and verify work without it",
        ) from None
    except Exception as exc:  # its import runs CUDA and plugin initialisation: any error is the environment's
        raise EngineUnavailable(f"TensorRT-LLM is installed but its import failed ({type(exc).__name__}: {exc})",
                                fix="run on a machine with an NVIDIA GPU and a working CUDA installation") from None
