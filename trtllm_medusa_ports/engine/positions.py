"""Every tree token's position id, rebuilt inside the engine for bases with learned absolute positions.

In a Medusa generation step TensorRT-LLM's runtime packs the batch as the context requests' tokens first, then
each generation request's root and draft tokens (``max_draft_len + 1`` of them: Medusa's generation length is
fixed, ``spec_decoding_is_generation_length_variable`` false). ``position_ids`` holds one id per context token
but **one per generation request** - its root's position, ``numTokens - 1`` - because only lookahead and
explicit-draft modes update position ids per token (cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp;
``SpeculativeDecodingMode::updatesPositionIds``, cpp/include/tensorrt_llm/runtime/speculativeDecodingMode.h).
The tree tokens' depths come separately, as ``spec_decoding_position_offsets`` ``[generation requests,
max_draft_len + 1]`` (the root 0, each node its depth; cpp/tensorrt_llm/runtime/medusaModule.cpp), which only
the attention op reads (for RoPE). ``GPTModel.forward`` adds ``position_embedding(position_ids)`` to the token
embeddings (tensorrt_llm/models/gpt/model.py), so without this every tree token of a one-request batch is
embedded at the root's position, and a batch of several fails on mismatched lengths.

:func:`tree_position_ids` builds, with the network's own shape operations, ``position_ids`` of one entry per
packed token: the context part as given, then for each generation request ``root + offsets``. It runs inside
the engine graph (tensorrt_llm.functional), and on the stand-in numerically in the tests. Its shape arithmetic is
int64, as TensorRT 10's shape tensors are (tensorrt_llm/functional.py ``shape``, ``constants_to_tensors_``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any


def tree_position_ids(position_ids: Any, position_offsets: Any) -> Any:
    """``[context tokens + generation requests]`` runtime ids and ``[generation requests, tokens per step]``
    offsets -> ``[context tokens + generation requests x tokens per step]`` ids (see the module doc)."""
    F = import_module("tensorrt_llm.functional")
    generation = F.shape(position_offsets, 0)  # 0-D: requests in the generation phase
    per_step = F.shape(position_offsets, 1)  # max_draft_len + 1
    context = F.shape(position_ids, 0) - generation
    # a static start beside the dynamic size: ``F.concat([0])`` would be an int32 start beside the int64 size that
    # TensorRT 10's shape arithmetic gives, which its slice layer refuses (one type for start, size and stride)
    context_ids = F.slice(position_ids, starts=[0], sizes=F.concat([context]))
    roots = F.slice(position_ids, starts=F.concat([context]), sizes=F.concat([generation]))
    tree = F.unsqueeze(roots, 1) + position_offsets  # [generation, per_step]: root position + depth
    return F.concat([context_ids, F.view(tree, F.concat([generation * per_step]))], dim=0)
