"""The Medusa heads' logits as read from their source (any layout), computed as the engine's heads compute them.

Used by ``verify`` (the converted heads must reproduce them) and ``tune-tree`` (the heads' ranks of the
base's tokens).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def source_heads_logits(heads, hidden: torch.Tensor, dtype: torch.dtype, base_lm_head: torch.nn.Module,
                        use_base_lm_head: bool, vocab: int) -> torch.Tensor:
    """``[heads, tokens, vocab]`` computed from the heads as read from their source, in float32 on
    weights rounded to the checkpoint dtype: what the converted heads must reproduce."""
    from trtllm_medusa_ports.heads.loader import expand_truncated

    def rounded(t: torch.Tensor) -> torch.Tensor:  # on the hidden states' device (verify --device)
        return t.to(dtype).float().to(hidden.device)

    outs = []
    for h in range(heads.num_heads):
        x = hidden
        for block in heads.blocks[h]:
            w = rounded(block.weight.load())
            b = rounded(block.bias.load()) if block.bias is not None else torch.zeros(w.shape[0], device=w.device)
            x = x + torch.nn.functional.silu(x @ w.T + b)
        if use_base_lm_head:
            y = base_lm_head(x)
        else:
            ref = heads.lm_heads[h] if heads.lm_heads is not None else heads.shared_lm_head
            proj = ref.load()
            if heads.token_map is not None:
                with torch.device("cpu"):  # beside the files' tensors; rounded() moves the result
                    proj = expand_truncated(proj, heads.token_map.load(), vocab)
            y = x @ rounded(proj).T
        outs.append(y[..., :vocab])
    return torch.stack(outs)
