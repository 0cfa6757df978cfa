"""The Hugging Face base model in transformers, as ``train-heads``, ``tune-tree``, calibration and ``verify`` use
it: loading it (in float32, or on weights rounded as the checkpoint stores them), its final-norm hidden states
(what the engine's heads see), its vocabulary projection, its end tokens and its greedy continuations.

Below ``quant`` and ``verify``; it may import the adapters and the file layer, nothing that converts or
verifies."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.weights import ValueTransform, layer_sources
from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import HFConfig, transformers_load_kwargs


# -- the base -------------------------------------------------------------------------------
def load_base(model_dir: str | Path, device: str = "cpu", *, device_map: str | None = None,
              dtype: torch.dtype | None = None, streaming: bool = False, offload_dir: str | Path | None = None):
    """The base model in float32 (or ``dtype``), checked against the supported families.

    ``streaming``: in float32 with its weights read one decoder layer (or other module) at a time as it runs
    (streaming.load_streamed; ``offload_dir``: where their temporary file goes), the same values.

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
    if streaming:
        from trtllm_medusa_ports.huggingface.streaming import load_streamed

        return load_streamed(model_dir, device=device, offload_dir=offload_dir)
    placed = _device_map_kwargs(device_map, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype or torch.float32, **placed,
                                                     **transformers_load_kwargs(model_dir))
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
    from trtllm_medusa_ports.machine.devices import rank_gpus

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    gpus = rank_gpus(local_rank, local_world, torch.cuda.device_count())
    # accelerate fills only the devices max_memory names, in order: this rank's block, a tenth of each kept free
    # for the activations
    return {"device_map": "auto",
            "max_memory": {i: int(torch.cuda.get_device_properties(i).total_memory * 0.9) for i in gpus}}


def lm_head_of(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The base's vocabulary projection (weight ``[V, H]``, bias or None), as the engine's heads use it (read in
    place for the call where the model is streamed)."""
    import contextlib

    from trtllm_medusa_ports.huggingface.streaming import streamed_weights

    out = model.get_output_embeddings()
    streamed = streamed_weights(model)
    with streamed.materialized(out) if streamed is not None else contextlib.nullcontext():
        bias = getattr(out, "bias", None)
        return out.weight.detach().float(), (bias.detach().float() if bias is not None else None)


def model_device(model) -> torch.device:
    """Where a model computes and its inputs go: its first weight's device, a streamed model's own."""
    from trtllm_medusa_ports.huggingface.streaming import streamed_weights

    streamed = streamed_weights(model)
    return streamed.device if streamed is not None else next(model.parameters()).device


@torch.no_grad()
def final_hidden(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Hidden states after the final norm ``[B, S, H]`` (what the lm_head and the engine's heads see): the lm_head's
    input at every position, whichever module computes it - transformers 4.57's ``Gemma3ForCausalLM.base_model`` is
    the causal LM itself (its output the logits), OPT's causal-LM class calls its decoder, not its base model.
    The forward stops there (the lm_head never runs: no logits over the vocabulary, no streamed lm_head read)."""
    def stop(module, args):  # noqa: ARG001  (first of the lm_head's pre-hooks: before a streamed read)
        raise _Reached(args[0])

    hook = model.get_output_embeddings().register_forward_pre_hook(stop, prepend=True)
    try:
        model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    except _Reached as reached:
        return reached.state
    finally:
        hook.remove()
    raise ModelError(f"{type(model).__name__}'s forward never reached its lm_head: no final hidden states",
                     fix="report this base's class: its causal-LM forward does not end in get_output_embeddings()")


class _Reached(Exception):  # noqa: N818  (not an error: the final states, carried out of the forward)
    def __init__(self, state: torch.Tensor):
        super().__init__("reached the lm_head")
        self.state = state


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
    return [c for c, _ in continuations(model, prompts, new_tokens, batch=batch, quiet=quiet)]


@torch.no_grad()
def continuations(model, prompts: list[list[int]], new_tokens: int, *, batch: int = 64, quiet: bool = True,
                  hidden: bool = False) -> list[tuple[list[int], torch.Tensor | None]]:
    """Each prompt's greedy continuation (cut after an end token) and, with ``hidden``, the final-norm hidden states
    the generation computed on the way (``[n, H]`` for a continuation of n tokens: those of the prompt's last token
    and of each continuation token but the last, the inputs of the n steps that chose them), taken from the base
    model's output at each step rather than computed again; None where the generation's calls were not the
    expected ones (one prefill, then one token a call), which the caller then computes itself."""
    from tqdm import tqdm

    device = model_device(model)
    eos = end_token_ids(model)
    pad = min(eos) if eos else 0
    out: list[tuple[list[int], torch.Tensor | None]] = [([], None) for _ in prompts]
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
        calls: list[torch.Tensor] = []
        # the lm_head's input at each call: the state the heads read, whichever module computed it (OPT's
        # causal-LM class calls its decoder, not its base model)
        hook = model.get_output_embeddings().register_forward_pre_hook(_recorder(calls)) if hidden else None
        try:
            gen = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=pad, top_p=None, top_k=None, temperature=None)
        finally:
            if hook is not None:
                hook.remove()
        steps = _step_states(calls, len(idx), width) if hidden else None
        for r, i in enumerate(idx):
            cont = gen[r, width:].tolist()
            for j, t in enumerate(cont):
                if t in eos:
                    cont = cont[: j + 1]
                    break
            states = None
            if steps is not None and len(cont) <= steps.shape[1]:
                states = steps[r, :len(cont)].float()
            out[i] = (cont, states)
        bar.update(len(idx))
    bar.close()
    return out


def _recorder(calls: list[torch.Tensor]):
    def record(module, args) -> None:  # noqa: ARG001
        calls.append(args[0])
    return record


def _step_states(calls: list[torch.Tensor], rows: int, width: int) -> torch.Tensor | None:
    """``[rows, steps, H]``: each generation step's input state (the prefill's last position, then each call's
    one token), or None where the calls are not one prefill (of ``width`` positions, or its last alone where
    generate keeps only the last position's logits) then one token each."""
    if not calls or calls[0].dim() != 3 or tuple(calls[0].shape[:2]) not in ((rows, width), (rows, 1)) or any(
            c.dim() != 3 or tuple(c.shape[:2]) != (rows, 1) for c in calls[1:]):
        return None
    return torch.cat([calls[0][:, -1:], *calls[1:]], dim=1)


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


def weight_rounding(dtype: torch.dtype, transforms: dict[str, ValueTransform] | None = None,
                    full_precision: tuple[str, ...] = ()) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """``(name, float32 weight) -> the weight as the checkpoint stores it`` (in ``dtype``, or float32: copy it into a
    float32 tensor, which holds it exactly): rounded to ``dtype``,
    but those the checkpoint stores in float32 whatever its dtype (``full_precision``: regexes of transformers'
    parameter names, the adapter's ``full_precision_parameters``, e.g. an MoE router); one the converter
    transformed first (``transforms``) is rounded as the converter stored it, so that e.g. Gemma's norm computes
    ``1 + (round(w + 1) - 1) = round(w + 1)``, the engine's multiplier, not ``1 + round(w)``."""
    import re

    transforms = transforms or {}
    kept = [re.compile(k) for k in full_precision]

    def rounded(name: str, w: torch.Tensor) -> torch.Tensor:
        if any(k.fullmatch(name) for k in kept):
            return w
        t = transforms.get(name)
        return t.as_stored(w, dtype) if t is not None else w.to(dtype)
    return rounded


def load_hf_model(model_dir: str | Path, dtype: torch.dtype, transforms: dict[str, ValueTransform] | None = None,
                  full_precision: tuple[str, ...] = (), *, streaming: bool = False, device: str = "cpu",
                  offload_dir: str | Path | None = None):
    """The transformers model in float32 on weights that equal the checkpoint's values (:func:`weight_rounding`).

    Buffers stay float32: rounding e.g. RoPE's inv_freq would change the reference itself. ``streaming``: the
    weights are read one decoder layer (or other module) at a time as the model runs, the same values
    (huggingface/streaming.py; ``offload_dir``: where their temporary file goes); ``device``: where the model computes
    (in memory on ``cuda`` with several GPUs and accelerate installed, a model larger than the first GPU's free
    memory is spread over them by transformers' ``device_map="auto"``).
    """
    rounded = weight_rounding(dtype, transforms, full_precision)
    if streaming:
        from trtllm_medusa_ports.huggingface.streaming import load_streamed

        return load_streamed(model_dir, value=rounded, device=device, offload_dir=offload_dir)
    from transformers import AutoModelForCausalLM

    placement = _device_map(model_dir, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **placement,
                                                     **transformers_load_kwargs(model_dir))
    except Exception as exc:  # transformers raises many types; keep the message
        raise ModelError(
            f"transformers could not load the base model ({type(exc).__name__}: {str(exc)[:300]})",
            where=str(model_dir),
            fix="pass the Hugging Face model directory the checkpoint was converted from",
        ) from None
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(rounded(name, p))
    if not placement and torch.device(device).type != "cpu":
        model = model.to(device)
    return model.eval()


def release(model) -> None:
    """Free what a streamed model holds outside Python's reach at once (its weight file); a no-op in memory."""
    from trtllm_medusa_ports.huggingface.streaming import streamed_weights

    streamed = streamed_weights(model)
    if streamed is not None:
        streamed.close()


def _device_map(model_dir: str | Path, device: str) -> dict:
    """transformers' ``device_map="auto"`` placement (:func:`_device_map_kwargs`) where a model in memory on
    ``cuda`` does not fit the first GPU's free memory and there are more; else ``{}`` (the model is moved whole).
    Not proven here: the machines this project is tested on have one GPU or none."""
    if device != "cuda" or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return {}
    import importlib.util

    need = base_float32_bytes(model_dir)
    free, _ = torch.cuda.mem_get_info(0)
    if need <= free:
        return {}
    if importlib.util.find_spec("accelerate") is None:
        raise ModelError(f"the base needs {need / 1e9:.1f} GB in float32, the first GPU has {free / 1e9:.1f} GB "
                         "free, and spreading it over the GPUs needs accelerate", where=str(model_dir),
                         fix="pip install accelerate, or verify with --streaming (one layer on the GPU at a time)")
    return _device_map_kwargs("auto", device)


def base_float32_bytes(model_dir: str | Path) -> int:
    """The base's weights in float32 (4 bytes a value, from the weight files' headers: nothing is read)."""
    from trtllm_medusa_ports.files.lazy_tensors import read_tensor_files, weight_files

    total = 0
    for t in read_tensor_files(weight_files(Path(model_dir)), ModelError).values():
        n = 1
        for s in t.shape:
            n *= s
        total += 4 * n
    return total
