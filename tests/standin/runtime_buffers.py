"""The inputs TensorRT-LLM's C++ runtime gives a Medusa engine in one step, as it fills them (a model, not code:
cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp ``setFromInputs``, cpp/tensorrt_llm/runtime/medusaModule.cpp,
cpp/tensorrt_llm/batch_manager/medusaBuffers.cpp; tests/standin/LEDGER.md).

The batch is packed context requests first, then generation requests. A context request feeds its chunk's tokens
with one position id each (``beginCompute + i``). A generation request feeds its last token and its draft tokens
(``max_draft_len + 1`` under Medusa) but gets **one** position id, ``numTokens - 1``: only lookahead and explicit
draft tokens update position ids per token (``SpeculativeDecodingMode::updatesPositionIds``). Each generation
request's row of ``spec_decoding_position_offsets`` is the tree's depths (root 0), the same for every request.
"""

from dataclasses import dataclass

import torch


@dataclass
class ContextRequest:
    tokens: list  # the chunk's tokens
    begin: int = 0  # tokens of the prompt already computed (chunked context)


@dataclass
class GenerationRequest:
    num_tokens: int  # the sequence's tokens so far (prompt and generated), the root the last of them
    root: int
    drafts: list


def medusa_step_inputs(requests, tree_offsets):
    """``(input_ids, position_ids, spec_decoding_position_offsets, expected)``: the packed inputs as the runtime
    fills them, and the position each packed token really has (what a model with learned positions must embed)."""
    ctx = [r for r in requests if isinstance(r, ContextRequest)]
    gen = [r for r in requests if isinstance(r, GenerationRequest)]
    ids, positions, expected, offsets = [], [], [], []
    for r in ctx:
        ids += r.tokens
        positions += [r.begin + i for i in range(len(r.tokens))]
        expected += [r.begin + i for i in range(len(r.tokens))]
    for r in gen:
        assert len(r.drafts) + 1 == len(tree_offsets), "Medusa feeds every draft slot (fixed generation length)"
        ids += [r.root] + list(r.drafts)
        positions.append(r.num_tokens - 1)
        expected += [r.num_tokens - 1 + o for o in tree_offsets]
        offsets.append(list(tree_offsets))
    i32 = torch.int32
    return (torch.tensor(ids, dtype=i32), torch.tensor(positions, dtype=i32),
            torch.tensor(offsets, dtype=i32).reshape(len(gen), len(tree_offsets)), expected)
