import sys

from .. import CALLS


def main():
    """trtllm-build's entry point: records the arguments and the architectures it could resolve."""
    from tensorrt_llm.models import MODEL_MAP

    CALLS.append(("trtllm-build", list(sys.argv[1:]), sorted(k for k in MODEL_MAP if k.startswith("MedusaPorts"))))
