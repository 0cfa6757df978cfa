"""The Hugging Face base model in transformers, as ``train-heads``, ``tune-tree`` and ``verify`` use it: loading
it, its final-norm hidden states (what the engine's heads see), its vocabulary projection, its end tokens and
its greedy continuations."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import ModelError


# -- the base -------------------------------------------------------------------------------
def load_base(model_dir: str | Path, device: str = "cpu"):
    """The base model in float32, checked against the supported families."""
    from transformers import AutoModelForCausalLM

    from trtllm_medusa_ports.archs import adapter_for
    from trtllm_medusa_ports.files.jsonfile import read_json

    model_dir = Path(model_dir)
    cfg = read_json(model_dir / "config.json", ModelError, fix="pass the Hugging Face model directory as --model_dir")
    arch = (cfg.get("architectures") or [None])[0]
    if arch is None or adapter_for(arch) is None:
        from trtllm_medusa_ports.archs import supported_architectures

        raise ModelError(f"architecture {arch!r} is not a supported base family", where=str(model_dir / "config.json"),
                         fix="supported: " + ", ".join(supported_architectures()))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    except Exception as exc:  # a damaged or incomplete model directory
        raise ModelError(f"transformers cannot load the base ({type(exc).__name__}: {str(exc)[:200]})",
                         where=str(model_dir), fix="pass a complete Hugging Face model directory") from None
    return model.to(device).eval()


def lm_head_of(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The base's vocabulary projection (weight ``[V, H]``, bias or None), as the engine's heads use it."""
    out = model.get_output_embeddings()
    bias = getattr(out, "bias", None)
    return out.weight.detach().float(), (bias.detach().float() if bias is not None else None)


@torch.no_grad()
def final_hidden(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hidden states after the final norm ``[B, S, H]`` (what the lm_head and the engine's heads see)."""
    out = model.base_model(input_ids=ids, attention_mask=attention_mask)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def end_token_ids(model) -> set[int]:
    """The end tokens of a transformers model, or of its ``GenerationConfig`` (``eos_token_id``)."""
    eos = getattr(getattr(model, "generation_config", model), "eos_token_id", None)
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


@torch.no_grad()
def continue_greedily(model, prompts: list[list[int]], new_tokens: int, *, batch: int = 64,
                      quiet: bool = True) -> list[list[int]]:
    """The base's greedy continuation of each prompt (cut after an end token), prompts left-padded."""
    from tqdm import tqdm

    device = next(model.parameters()).device
    eos = end_token_ids(model)
    pad = min(eos) if eos else 0
    out: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    bar = tqdm(total=len(prompts), desc="greedy continuations", unit="prompt", disable=quiet, file=sys.stderr)
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, width - len(prompts[i]):] = 1
        gen = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad, top_p=None, top_k=None, temperature=None)
        for r, i in enumerate(idx):
            cont = gen[r, width:].tolist()
            for j, t in enumerate(cont):
                if t in eos:
                    cont = cont[: j + 1]
                    break
            out[i] = cont
        bar.update(len(idx))
    bar.close()
    return out
