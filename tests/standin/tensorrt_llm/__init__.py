"""An executable model of TensorRT-LLM 1.2.x's *build route*, for testing without it.

TensorRT-LLM cannot be installed where this project is tested, so this package stands
in for the parts ``trtllm_medusa_ports.engine`` touches. It is only worth what it
mirrors: every behaviour here is upstream's, cited by file and function in
``tests/standin/LEDGER.md``, and where upstream is strict (required tensors,
shapes, keyword-only signatures, missing ``config_class``) this is strict too.

What it does not model: TensorRT itself, kernels, numbers inside attention. Linear
layers and activations compute with torch when weights and inputs carry values
(enough to check a weight layout); everything else is symbolic and recorded in
:data:`CALLS`.
"""

__version__ = "1.2.0+standin"

#: what happened, in order: ("attention", layer_idx, spec_decoding_params), ("mark_output", name),
#: ("warning", text), ("build", architecture, class name), ...
CALLS: list[tuple] = []
