"""Max calibration of a base: the largest |input| of every linear TensorRT-LLM quantizes and the largest
|K| and |V| each layer's KV cache holds, measured on the transformers model in float32 on weights rounded
to the checkpoint dtype (what the checkpoint computes with), over the calibration samples once.

ModelOpt's max calibration (``modelopt/torch/quantization/calib/max.py`` ``MaxCalibrator``) keeps the
running max of |x| per quantizer. The KV-cache scale is measured on what the cache holds: the attention
kernel quantizes K after the q/k norms (``layers/attention.py`` applies ``q_layernorm`` / ``k_layernorm``
before ``gpt_attention``) and after RoPE (``applyBiasRopeUpdateKVCacheV2`` rotates, then stores), and V as
projected, with one scale for both. TensorRT-LLM's own INT8 converter and ModelOpt 0.21 take the q, k, v
projection outputs instead (``tensorrt_llm/models/llama/convert.py`` ``capture_activation_range``; ModelOpt
``get_kv_cache_scaling_factor``), which for a q/k-norm family (Qwen3, Gemma 3) says nothing about the cached
range: Gemma 3's normalised K overflowed such a scale 8.8x. transformers hands the cache exactly that K and V
(``Cache.update`` is called after the norms and RoPE), so that is where it is read. HF modules are
found from the family's weight table: each checkpoint linear's source tensors name the HF modules whose
input it takes (q/k/v all read one input, as do gate and up), so no family needs calibration code.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtllm_medusa_ports.archs.base import ArchAdapter
from trtllm_medusa_ports.archs.registry import base_context
from trtllm_medusa_ports.archs.weights import layer_sources
from trtllm_medusa_ports.errors import ModelError, PortError
from trtllm_medusa_ports.files.hf_model import HFConfig, progress_bars_off
from trtllm_medusa_ports.files.prompts import check_ids
from trtllm_medusa_ports.files.tokenizer import TOKENIZER_FILES
from trtllm_medusa_ports.quant import linear_of
from trtllm_medusa_ports.weights.sharding import Split

#: upstream's defaults (examples/quantization/quantize.py --calib_size 512 --calib_max_seq_length 512)
DEFAULT_CALIB_SIZE = 512
DEFAULT_CALIB_MAX_SEQ_LENGTH = 512


@dataclass
class Calibration:
    """Ranges by HF layer index and checkpoint linear name (``attention.qkv``, ``mlp.fc``, ...)."""

    inputs: dict[tuple[int, str], float] = field(default_factory=dict)
    #: largest |q, k, v projection output| per layer (upstream's INT8 KV convention; kept for comparison)
    qkv_outputs: dict[int, float] = field(default_factory=dict)
    #: largest |K| (after q/k norms and RoPE) and |V| the layer's KV cache holds: the KV scale's amax
    kv_cached: dict[int, float] = field(default_factory=dict)
    #: per input channel, the largest |input| of each linear (SmoothQuant's smoothed activation range is
    #: ``max_c amax_c * pre_quant_scale_c``); not kept by :meth:`to_json`
    input_channels: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0
    source: str = ""
    digest: str = ""
    #: the tokenizer text samples went through (:func:`tokenizer_record`); None: the samples were token ids
    tokenizer: dict | None = None
    #: the base's context (tokens), the samples cut to it or to --calib_max_seq_length, and what a user should know
    #: (samples cut at the context); see :class:`CalibrationSamples`
    context: int | None = None
    cut: int = 0
    notes: list[str] = field(default_factory=list)
    #: what was done with the tokenizer's chat template (files/tokenizer.py CHAT_*; "" for token ids or an older
    #: record): verify reads the samples again the same way
    chat_template: str = ""

    def to_json(self) -> str:
        """The whole calibration as JSON (:meth:`from_json` reads it back): calibrate once, convert elsewhere."""
        d = {"inputs": [[i, name, v] for (i, name), v in sorted(self.inputs.items())],
             "qkv_outputs": [[i, v] for i, v in sorted(self.qkv_outputs.items())],
             "kv_cached": [[i, v] for i, v in sorted(self.kv_cached.items())],
             **{k: getattr(self, k) for k in ("samples", "tokens", "seconds", "source", "digest", *_READ_FIELDS)}}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        return cls(inputs={(int(i), str(n)): float(v) for i, n, v in d["inputs"]},
                   qkv_outputs={int(i): float(v) for i, v in d["qkv_outputs"]},
                   kv_cached={int(i): float(v) for i, v in d.get("kv_cached", [])},
                   **{k: d[k] for k in ("samples", "tokens", "seconds", "source", "digest")},
                   **{k: d[k] for k in _READ_FIELDS if k in d})

    def record(self) -> dict:
        """What config.json keeps of it (``medusa_ports.calibration``): enough for ``verify`` to redo it, and to
        tell a different tokenizer (``tokenizer``, :func:`recorded_tokenizer_matches`) from different samples."""
        out = {"source": self.source, "samples": self.samples, "tokens": self.tokens, "sha256": self.digest,
               "seconds": round(self.seconds, 3), "cut": self.cut}
        out.update({k: getattr(self, k) for k in ("context", "tokenizer", "notes", "chat_template") if getattr(self, k)})
        return out


#: what reading the samples found, kept by :class:`Calibration` (and its JSON) beside the ranges
_READ_FIELDS = ("tokenizer", "context", "cut", "notes", "chat_template")


class CalibrationSamples(list):
    """The calibration samples: a list of token-id lists, with what reading them found, which
    :func:`calibrate` keeps in the :class:`Calibration` (and so in config.json): ``source``; ``context``, the
    base's context in tokens (None: unknown) and ``limit``, the tokens kept per sample (--calib_max_seq_length
    or the context, the smaller); ``cut``, the samples longer than ``limit``; ``notes``; ``tokenizer``, the
    :func:`tokenizer_record` of the tokenizer text went through (None: every sample was token ids)."""

    def __init__(self, samples=(), *, source: str = "", limit: int = 0, context: int | None = None):
        super().__init__(samples)
        self.source, self.limit, self.context = source, limit, context
        self.cut = 0
        self.notes: list[str] = []
        self.tokenizer: dict | None = None
        self.chat_template = ""


@dataclass(frozen=True)
class HFLinear:
    layer: int  # HF layer index
    short: str  # checkpoint linear within the layer: attention.qkv, mlp.fc, ...
    split: Split
    modules: tuple[str, ...]  # the transformers modules whose weights it is made of


def hf_linears(modules: dict[str, torch.nn.Module], adapter: ArchAdapter, hf: HFConfig, where: str) -> list[HFLinear]:
    """Every checkpoint linear TensorRT-LLM may quantize, with the transformers modules it comes from (the
    family's weight table: a linear's source tensors name them; used by calibration and by verify)."""
    out = []
    for i in range(adapter.num_hf_layers(hf)):
        for rule in layer_sources(adapter.layer_rules(hf), i):
            lin = linear_of(f"transformer.layers.{i}.{rule.name}")
            if rule.experts:  # stacked MoE experts: weight-only needs no calibration, FP8 ones are refused (port-limit)
                continue
            if lin is None or f"transformer.layers.{i}.{rule.name}" != lin + ".weight":
                continue
            names = next((c for c in rule.candidates() if all(n[: -len(".weight")] in modules for n in c)), None)
            if names is None:
                raise ModelError(f"no transformers module holds {', '.join(rule.sources)} (layer {i})", where=where,
                                 fix="the base's modelling code differs from its family's")
            out.append(HFLinear(i, rule.name[: -len(".weight")], rule.split,
                                tuple(n[: -len(".weight")] for n in names)))
    return out


def samples_digest(samples: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(samples, separators=(",", ":")).encode()).hexdigest()


#: a long text is cut before it is tokenized: first to this many characters per token wanted (real tokenizers
#: average 3-5), doubled until the cut text gives enough tokens (a 200,000-token line costs a few thousand)
_CHARS_PER_TOKEN = 8
#: tokens past the limit the cut text must still give, so that the cut, which may split a word, changes none
#: of the tokens kept
_CUT_MARGIN = 16
#: a text line is read up to max(1 MiB, 2 KiB per token kept): its rest could add no token
_LINE_BYTES_PER_TOKEN, _MIN_LINE_BYTES = 2048, 1 << 20


def first_tokens(tokenize: Callable[[str], list[int]], text: str, limit: int) -> list[int]:
    """The first ``limit + 1`` tokens of ``text`` (all of them, when it has fewer), tokenizing a prefix of it
    where one is enough: a sample is cut to ``limit`` tokens, the one more says that it was. TensorRT-LLM cuts
    the tokenized text the same way (``tensorrt_llm/quantization/quantize_by_modelopt.py``
    ``get_calib_dataloader``: ``truncation=True, max_length=calib_max_seq_length``), after tokenizing it whole."""
    want = limit + 1 + _CUT_MARGIN
    chars = _CHARS_PER_TOKEN * want
    while chars < len(text):
        ids = tokenize(text[:chars])
        if len(ids) >= want:
            return ids[: limit + 1]
        chars *= 2
    return tokenize(text)[: limit + 1]




def tokenizer_record(tok_dir: str | Path) -> dict:
    """Which tokenizer text samples went through: its folder (``path``, ``name``) and the sha256 of its files
    (files/tokenizer.py :data:`TOKENIZER_FILES` present, names and bytes; ``files`` lists them), so that two folders holding the
    same tokenizer match and an edited vocabulary does not."""
    d = Path(tok_dir).resolve()
    h, files = hashlib.sha256(), []
    for name in TOKENIZER_FILES:
        f = d / name
        if not f.is_file():
            continue
        files.append(name)
        h.update(name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return {"path": str(d), "name": d.name, "sha256": h.hexdigest(), "files": files}


def recorded_tokenizer_matches(record: dict, tokenizer_dir: str | Path) -> str | None:
    """Whether the calibration ``record`` (config.json ``medusa_ports.calibration``) was tokenized with the
    tokenizer in ``tokenizer_dir``: None when it was (or the record names none: its samples were token ids, or it
    predates tokenizer records), else why not, in words (verify: "re-derived with a different tokenizer", not
    "different samples")."""
    rec = record.get("tokenizer")
    if not isinstance(rec, dict) or not rec.get("sha256"):
        return None
    now = tokenizer_record(tokenizer_dir)
    if now["sha256"] == rec["sha256"]:
        return None
    return (f"the calibration text was tokenized with the tokenizer in {rec.get('path')} (sha256 "
            f"{str(rec['sha256'])[:12]}, files {', '.join(rec.get('files') or []) or 'none'}), and {now['path']} "
            f"holds another (sha256 {now['sha256'][:12]}, files {', '.join(now['files']) or 'none'})")


def recorded_tokenizer_dir(record: dict, model_dir: str | Path) -> Path:
    """The folder to tokenize a recorded calibration's text with again: the recorded tokenizer's, where it still
    exists, else ``model_dir`` (the default at conversion)."""
    rec = record.get("tokenizer")
    path = rec.get("path") if isinstance(rec, dict) else None
    return Path(path) if path and Path(path).is_dir() else Path(model_dir)


def recorded_chat_mode(record: dict) -> str:
    """The ``chat_template`` mode that reads a recorded calibration's text again as conversion read it."""
    from trtllm_medusa_ports.files.tokenizer import CHAT_APPLIED

    return "auto" if record.get("chat_template") == CHAT_APPLIED else "none"


def read_calibration_samples(path: str | Path | None, model_dir: str | Path, *, size: int | None, max_seq_length: int,
                             tokenizer_dir: str | Path | None = None,
                             chat_template: str = "none") -> tuple[CalibrationSamples, str]:
    """The calibration samples (token ids, one per line or prompt) and their source.

    ``path`` (``--calib_dataset``): text lines (one sample each, ``\\n`` for a line break), read as
    ``--prompts_file``, or JSON lines with ``text``, ``prompt``, ``input_ids`` or ``prompt_ids``, read as
    ``--data`` (ids used as they are, no token added; files/prompts.py); None: the packaged prompts.
    Fewer samples than ``size`` is an error, never a silent smaller calibration; ``size`` None: every sample.
    The file is read line by line and no further than the ``size`` samples (a file over the text-input limit is
    refused unread). Each sample is cut to ``max_seq_length`` tokens, or to the base's context where that is
    shorter (:func:`base_context`; a note says so and names the first sample cut, as upstream's quantize.py
    cuts to ``--calib_max_seq_length``); text is cut before it is tokenized (:func:`first_tokens`).
    ``chat_template`` ``auto``: prompts (the packaged ones, text lines, JSON ``prompt``) go through the tokenizer's
    chat template where it has one, as the base is served (JSON ``text`` and ids as they are); what was done is
    ``samples.chat_template``.
    """
    if (size is not None and size < 1) or max_seq_length < 1:
        raise PortError(f"--calib_size {size} and --calib_max_seq_length {max_seq_length} must be at least 1",
                        fix="e.g. --calib_size 512 --calib_max_seq_length 512 (upstream's defaults)", usage=True)
    context = base_context(model_dir)
    limit = min(max_seq_length, context[0]) if context else max_seq_length
    tok = _SampleTokenizer(Path(tokenizer_dir or model_dir), limit, chat_template)
    source = "packaged prompts" if path is None else _calibration_file(path)
    samples = CalibrationSamples(source=source, limit=limit, context=context[0] if context else None)
    at_context: list[str] = []
    read = _packaged_samples(tok, size) if path is None else _file_samples(Path(path), tok, limit)
    try:
        for label, ids, longer in read:
            if not ids:
                continue
            if longer or len(ids) > limit:
                samples.cut += 1
                if limit < max_seq_length:
                    at_context.append(label)
            samples.append(ids[:limit])
            if size is not None and len(samples) == size:
                break
    finally:
        read.close()  # the file is closed where reading stopped
    size = len(samples) if size is None else size
    if not samples:  # blank lines only: no --calib_size helps (the parser refuses 0)
        raise PortError("the calibration set has no non-empty sample", where=source,
                        fix="pass a --calib_dataset with text or token ids in it")
    if len(samples) < size:
        raise PortError(f"the calibration set has {len(samples)} non-empty sample(s), --calib_size asks for {size}",
                        where=source, fix=f"pass --calib_size {len(samples)} or a larger --calib_dataset")
    if at_context:
        samples.notes.append(
            f"calibration: {len(at_context)} of {len(samples)} sample(s) ({', '.join(at_context[:3])}"
            f"{', ...' if len(at_context) > 3 else ''}) are longer than the base's context of {limit} tokens "
            f"({context[1]}) and were cut to it: --calib_max_seq_length {max_seq_length} is above the context")
    samples.tokenizer = tokenizer_record(tok.tok_dir) if tok.used else None
    samples.chat_template = tok.chat if tok.used else ""
    return samples, source


class _SampleTokenizer:
    """Text -> its first ``limit + 1`` tokens (:func:`first_tokens`) through the tokenizer of ``tok_dir``, loaded
    at the first text; ``prompt``: a prompt's, through the chat template where ``chat_template`` asks and the
    tokenizer has one; ``used``: whether any text was tokenized; ``chat``: what was done with the template."""

    def __init__(self, tok_dir: Path, limit: int, chat_template: str = "none"):
        from trtllm_medusa_ports.files.prompts import lazy_tokenizer

        self.tok_dir, self.limit, self.used = tok_dir, limit, False
        self._tokenize = lazy_tokenizer(tok_dir, chat_template)

    @property
    def chat(self) -> str:
        return self._tokenize.chat

    def __call__(self, text: str) -> list[int]:
        self.used = True
        return first_tokens(self._tokenize, text, self.limit)

    def prompt(self, text: str) -> list[int]:
        self.used = True
        return first_tokens(self._tokenize.prompt, text, self.limit)


def _calibration_file(path: str | Path) -> str:
    """The source a --calib_dataset names (its resolved path), or the error where it is not a regular file."""
    p = Path(path)
    if not p.is_file():
        hub = not p.exists() and "/" in str(path) and not str(path).startswith((".", "/"))
        raise PortError("the calibration dataset is not a regular file"
                        + (" (a dataset name like upstream's ccdv/cnn_dailymail is not fetched: no hub access)"
                           if hub else ""), where=str(p),
                        fix="pass a text file (one sample per line) or JSON lines with text / input_ids"
                            + ("; omit --calib_dataset for the packaged prompts" if hub else ""))
    return str(p.resolve())


def _packaged_samples(tok: _SampleTokenizer, size: int | None) -> Iterator[tuple[str, list[int], bool]]:
    from trtllm_medusa_ports.files.prompts import packaged_prompts

    for n, text in enumerate(packaged_prompts()[:size] if size else packaged_prompts(), 1):
        yield f"prompt {n}", tok.prompt(text), False


def _file_samples(p: Path, tok: _SampleTokenizer, limit: int) -> Iterator[tuple[str, list[int], bool]]:
    """``(label, ids, cut)`` of each line of a calibration file, read as asked for: JSON lines by its first
    character (files/prompts.py ``looks_like_json_lines``, which says so in its errors), else text lines, each
    read up to the bytes its tokens can need (``cut``: the line was longer)."""
    from trtllm_medusa_ports.files.jsonfile import MAX_JSON_FILE_BYTES
    from trtllm_medusa_ports.files.prompts import (
        data_file_items,
        looks_like_json_lines,
        prompt_file_lines,
    )

    if looks_like_json_lines(p):
        for n, item in data_file_items(p, tok, max_line_bytes=MAX_JSON_FILE_BYTES):
            yield f"line {n}", item.ids, False
        return
    for n, text, cut in prompt_file_lines(p, max_line_bytes=max(_MIN_LINE_BYTES, _LINE_BYTES_PER_TOKEN * limit)):
        yield f"line {n}", tok.prompt(text), cut


def calibrate(model_dir: str | Path, adapter: ArchAdapter, dtype: str, samples: list[list[int]], *,
              source: str = "", device: str = "cpu", quiet: bool = True) -> Calibration:
    """Run the base once over ``samples`` and keep the ranges (see the module doc)."""
    from tqdm import tqdm

    from trtllm_medusa_ports.files.dtypes import to_torch
    from trtllm_medusa_ports.huggingface.model import load_hf_model, value_transforms

    hf = HFConfig.read(model_dir)
    vocab = int(hf.require("vocab_size"))
    # before the model is loaded: a bad sample costs nothing
    check_ids(samples, vocab, "calibration sample", where=source, fix="tokenize with the base's own tokenizer")
    with progress_bars_off(quiet):
        model = load_hf_model(model_dir, to_torch(dtype), value_transforms(model_dir, hf.architecture),
                              full_precision=adapter.full_precision_parameters)
    if device != "cpu":
        try:
            model = model.to(device)
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise PortError(f"--device {device}: {exc}", fix="use --device cpu or a device torch can reach") from None
    modules = dict(model.named_modules())
    cal = Calibration(source=source, digest=samples_digest(samples), samples=len(samples),
                      tokens=sum(len(s) for s in samples))
    if isinstance(samples, CalibrationSamples):
        cal.tokenizer, cal.context, cal.cut, cal.notes = samples.tokenizer, samples.context, samples.cut, list(samples.notes)
        cal.chat_template = samples.chat_template

    def keep(store: dict, key, value: float) -> None:
        store[key] = max(store.get(key, 0.0), value)

    handles = []
    for lin in hf_linears(modules, adapter, hf, str(model_dir)):
        for name in lin.modules:
            def hook(_m, args, out, i=lin.layer, short=lin.short):
                keep(cal.inputs, (i, short), float(args[0].detach().abs().max()))
                chans = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float().cpu()
                prev = cal.input_channels.get((i, short))
                cal.input_channels[(i, short)] = chans if prev is None else torch.maximum(prev, chans)
                if short == "attention.qkv":
                    keep(cal.qkv_outputs, i, float(out.detach().abs().max()))
            handles.append(modules[name].register_forward_hook(hook))
    t0 = time.monotonic()
    try:
        # the cache argument's name: transformers 5 calls it cache (past_key_values deprecated), 4.x past_key_values
        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        with torch.no_grad():
            for ids in tqdm(samples, desc="calibrate", unit="sample", disable=quiet):
                model(input_ids=torch.tensor([ids], device=next(model.parameters()).device), use_cache=True,
                      **{cache_arg: _recording_cache(model, cal.kv_cached)})
    finally:
        for h in handles:
            h.remove()
    cal.seconds = time.monotonic() - t0
    return cal


def _recording_cache(model, store: dict[int, float]):
    """The KV cache the model would make for itself (``DynamicCache(config=...)``, as every family's forward does
    when given none), whose own ``update`` - called with the keys after the q/k norms and RoPE - also records, per
    layer, the largest |K| and |V| into ``store``. An instance's method, not a patch of transformers' class: nothing
    outside this one forward sees it, and a cache class whose ``update`` overrides ``Cache.update`` records too."""
    from transformers.cache_utils import DynamicCache

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    cache = DynamicCache(config=config)
    update = cache.update

    def recording(key_states, value_states, layer_idx, *args, **kwargs):
        amax = max(float(key_states.detach().abs().max()), float(value_states.detach().abs().max()))
        store[int(layer_idx)] = max(store.get(int(layer_idx), 0.0), amax)
        return update(key_states, value_states, layer_idx, *args, **kwargs)

    cache.update = recording
    return cache
