"""The Hugging Face base model in transformers, as ``train-heads``, ``tune-tree``, calibration and ``verify`` use
it: loading it (in float32, or on weights rounded as the checkpoint stores them), its final-norm hidden states
(what the engine's heads see), its vocabulary projection, its end tokens and its greedy continuations.

Below ``quant`` and ``verify``; it may import the adapters and the file layer, nothing that converts or
verifies."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.weights import ValueTransform, layer_sources
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig


# -- the base -------------------------------------------------------------------------------
def load_base(model_dir: str | Path, device: str = "cpu", *, device_map: str | None = None,
              dtype: torch.dtype | None = None):
    """The base model in float32 (or ``dtype``), checked against the supported families.

    ``device_map="auto"``: spread over the GPUs this process sees, by transformers' ``from_pretrained(device_map=...)``
    (accelerate places the layers; the first GPU gets the inputs), for a base bigger than one device; under
    torchrun each rank takes its own block of the node's GPUs (devices.rank_gpus). Not proven here: the
    machines this project is tested on have one GPU or none."""
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
    placed = _device_map_kwargs(device_map, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype or torch.float32, **placed)
    except Exception as exc:  # a damaged or incomplete model directory
        raise ModelError(f"transformers cannot load the base ({type(exc).__name__}: {str(exc)[:200]})",
                         where=str(model_dir), fix="pass a complete Hugging Face model directory") from None
    return (model if placed else model.to(device)).eval()


def _device_map_kwargs(device_map: str | None, device: str) -> dict:
    """``from_pretrained``'s placement arguments for ``device_map`` (none without one)."""
    if device_map is None:
        return {}
    if device_map != "auto":
        raise ModelError(f"device_map {device_map!r} is not 'auto'", fix="pass --device_map auto, or leave it out")
    import importlib.util
    import os

    if importlib.util.find_spec("accelerate") is None:
        raise ModelError("--device_map auto needs the accelerate package (transformers places the layers with it)",
                         fix="pip install accelerate, or leave --device_map out")
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return {"device_map": "auto"}
    from trtllm_medusa_ports.devices import rank_gpus

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    gpus = rank_gpus(local_rank, local_world, torch.cuda.device_count())
    # accelerate fills only the devices max_memory names, in order: this rank's block, a tenth of each kept free
    # for the activations
    return {"device_map": "auto",
            "max_memory": {i: int(torch.cuda.get_device_properties(i).total_memory * 0.9) for i in gpus}}


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


def value_transforms(model_dir: str | Path, architecture: str | None) -> dict[str, ValueTransform]:
    """HF tensor name -> the value transform the converter applied to it (Gemma's ``w + 1``)."""
    adapter = adapter_for(architecture or "")
    if adapter is None:
        return {}
    hf = HFConfig.read(model_dir)
    rules = adapter.embedding_rules(hf) + adapter.final_rules(hf)
    for i in range(adapter.num_hf_layers(hf)):
        rules += layer_sources(adapter.layer_rules(hf), i)
    return {r.sources[0]: r.combine for r in rules if isinstance(r.combine, ValueTransform)}


def load_hf_model(model_dir: str | Path, dtype: torch.dtype, transforms: dict[str, ValueTransform] | None = None,
                  full_precision: tuple[str, ...] = ()):
    """The transformers model in float32 on weights that equal the checkpoint's values.

    Each weight is rounded to the checkpoint dtype, but those the checkpoint stores in float32 whatever its
    dtype (``full_precision``: regexes of transformers' parameter names, the adapter's
    ``full_precision_parameters``, e.g. an MoE router); one the converter transformed first
    (``transforms``) is rounded as the converter stored it, so that e.g. Gemma's norm computes
    ``1 + (round(w + 1) - 1) = round(w + 1)``, the engine's multiplier, not ``1 + round(w)``.
    """
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    except Exception as exc:  # transformers raises many types; keep the message
        raise ModelError(
            f"transformers could not load the base model ({type(exc).__name__}: {str(exc)[:300]})",
            where=str(model_dir),
            fix="pass the Hugging Face model directory the checkpoint was converted from",
        ) from None
    # Round the *weights* to the checkpoint's dtype, compute in float32 (see module doc).
    # Buffers stay float32: rounding e.g. RoPE's inv_freq would change the reference itself.
    import re

    transforms = transforms or {}
    kept = [re.compile(k) for k in full_precision]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k.fullmatch(name) for k in kept):
                continue
            t = transforms.get(name)
            p.copy_(t.as_stored(p, dtype) if t is not None else p.to(dtype).to(torch.float32))
    return model.eval()
