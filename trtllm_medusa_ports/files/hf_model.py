"""A Hugging Face base model directory: its config.json, read field by field, and lazy weights."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from trtllm_medusa_ports.errors import ModelError, PortError
from trtllm_medusa_ports.files.dtypes import CHECKPOINT_DTYPES
from trtllm_medusa_ports.files.jsonfile import is_int, is_number, read_json
from trtllm_medusa_ports.files.lazy_tensors import LazyTensor, read_tensor_files, weight_files

_MISSING = object()


def transformers_load_kwargs(model_dir: str | Path) -> dict:
    """``from_pretrained`` arguments that load a base as transformers' own PyTorch modules and nothing else.

    From transformers 5.25, ``from_pretrained`` defaults to ``use_kernels=True``: it hands the model to the
    ``kernels`` package, which may swap layer forwards for kernels fetched from the Hugging Face Hub and refuses
    a model whose weights sit on ``meta`` (a streamed base). The reference this project compares against is the
    modules' own code, so every load passes ``use_kernels=False`` where transformers knows the argument (the
    ``use_kernels`` property of ``PreTrainedModel`` came after the argument, 4.53; older releases get nothing).

    A base whose attention scores are soft-capped (``attn_logit_softcapping``: Gemma 2) loads with the modules' own
    ``eager`` attention: before transformers 5, ``from_pretrained`` picks ``sdpa`` for it, which skips the capping
    (transformers 4.57's Gemma 2 logits then differ from the model's own by tens), so the reference would not be
    the model. Every other base keeps transformers' default (the same arithmetic, less memory at long context).
    """
    from transformers import PreTrainedModel

    out = {"use_kernels": False} if hasattr(PreTrainedModel, "use_kernels") else {}
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return out  # from_pretrained says what is wrong with it
    if isinstance(cfg, dict) and any(isinstance(c, dict) and c.get("attn_logit_softcapping")
                                     for c in (cfg, cfg.get("text_config"))):
        out["attn_implementation"] = "eager"
    return out


def lookup(data: dict, name: str, default: Any = None) -> Any:
    """``data[name]``, where ``name`` may be a path into nested objects (``"attn_config.rope_theta"``: DBRX and MPT
    keep their attention and MLP settings in objects of their own); ``default`` where any step is missing or not
    an object."""
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def assign(data: dict, name: str, value: Any) -> None:
    """``data[name] = value``, where ``name`` may be a path into nested objects (made where missing): the writer
    of :func:`lookup`'s paths, for configs built from a family's declared keys (tests, fixtures)."""
    *parents, last = name.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


#: config.json fields that must be positive integers when present (the name is the fix's subject); a dotted name is
#: a path into a nested object (:func:`lookup`)
_POSITIVE_INTS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
                  "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings", "n_layer", "n_head",
                  "n_embd", "d_model", "n_layers", "n_heads", "num_kv_heads", "ffn_hidden_size", "n_inner",
                  "n_positions", "n_ctx", "rotary_dim", "kv_channels", "decoder_sparse_step",
                  "attn_config.kv_n_heads", "ffn_config.ffn_hidden_size", "ffn_dim", "word_embed_proj_dim")  # expert counts: archs/experts.py  # the experts' sizes: archs/experts.py
#: scalars a family's adapter multiplies or divides by (Cohere, Granite, Nemotron, MPT): a number, never null, when
#: present (but ``logit_scale``: MPT's null means none; Cohere's adapter refuses a null); the divisors also above 0
_FACTORS = ("logit_scale", "logits_scaling", "residual_multiplier", "embedding_multiplier", "attention_multiplier",
            "norm_eps", "expansion_ratio")
_DIVISORS = ("logits_scaling",)
#: a list of strings (Gemma 3's per-layer attention kinds) or of layer indices (Qwen MoE's dense layers), or a JSON
#: object (MPT's attention settings), or null
_LISTS = {"layer_types": (str, "strings"), "mlp_only_layers": (int, "layer indices")}
_OBJECTS = ("attn_config", "ffn_config")
#: config.json sizes that may be 0 (or null) but nothing else when present
_NON_NEGATIVE_INTS = ("sliding_window", "max_window_layers", "first_k_dense_replace")
_NUMBERS = ("rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon",
            "partial_rotary_factor", "rotary_pct", "rotary_emb_base", "query_pre_attn_scalar",
            "attn_config.rope_theta", "attn_config.clip_qkv", "attn_config.alibi_bias_max")
#: config.json fields the adapters read as switches: JSON true or false when present, as transformers' config classes
#: type them (a "false" string, a 1 or a null would otherwise be read as its truth value, silently)
_BOOLEANS = ("norm_topk_prob", "multi_query", "tie_word_embeddings", "attention_bias", "mlp_bias", "bias", "use_bias",
             "new_decoder_architecture", "parallel_attn", "alibi", "use_parallel_residual", "use_qk_norm",
             "use_sliding_window", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "attn_config.alibi",
             "do_layer_norm_before", "enable_bias", "layer_norm_elementwise_affine")


def _validate_fields(data: dict, path: Path) -> None:
    """Type-check the fields every adapter reads, naming the field (a string layer count, a zero
    KV head count taken for multi-head attention, ...)."""
    for key in _POSITIVE_INTS:
        v = lookup(data, key)
        if v is not None and not is_int(v, 1):
            raise ModelError(f"field {key} is {v!r}; expected a positive integer", where=str(path),
                             fix=f"correct {key} in config.json (the original model's value)")
    for key in _NON_NEGATIVE_INTS:
        v = lookup(data, key)
        if v is not None and not is_int(v, 0):
            raise ModelError(f"field {key} is {v!r}; expected a non-negative integer (or null)", where=str(path),
                             fix=f"correct {key} in config.json (the original model's value)")
    for key in _NUMBERS:
        v = lookup(data, key)
        if v is not None and (not is_number(v) or v != v):
            raise ModelError(f"field {key} is {v!r}; expected a number", where=str(path),
                             fix=f"correct {key} in config.json")
    for key in _FACTORS:
        v = lookup(data, key, 1)
        if v is None and key == "logit_scale":
            continue
        if not is_number(v) or v != v or abs(v) == float("inf") or (
                key in _DIVISORS and v <= 0):
            expected = "a number above 0" if key in _DIVISORS else "a finite number"
            raise ModelError(f"field {key} is {json.dumps(v)}; expected {expected}", where=str(path),
                             fix=f"correct {key} in config.json (the original model's value), or remove it for the "
                                 "family's default")
    for key, (kind, named) in _LISTS.items():
        v = lookup(data, key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool)
                                                              for x in v)):
            raise ModelError(f"field {key} is {json.dumps(v)}; expected a list of {named} (or null)", where=str(path),
                             fix=f"correct {key} in config.json (the original model's value)")
    for key in _OBJECTS:  # before the fields inside them
        v = lookup(data, key)
        if v is not None and not isinstance(v, dict):
            raise ModelError(f"field {key} is {json.dumps(v)}; expected a JSON object (or null)", where=str(path),
                             fix=f"correct {key} in config.json (the original model's value)")
    for key in _BOOLEANS:
        v = lookup(data, key, _MISSING)
        if v is not _MISSING and not isinstance(v, bool):
            raise ModelError(f"field {key} is {json.dumps(v)}; expected true or false", where=str(path),
                             fix=f"write {key} as a JSON boolean (true or false), as transformers saves it")
    arch = data.get("architectures")
    if arch is not None and not (isinstance(arch, list) and arch and all(isinstance(a, str) for a in arch)):
        raise ModelError(f"field architectures is {arch!r}; expected a list of names", where=str(path),
                         fix='write e.g. "architectures": ["Qwen2ForCausalLM"]')


@dataclass
class HFConfig:
    """Raw ``config.json`` with accessors that name the file and field on error.

    Works on the dict, not on transformers' config classes, so that any
    transformers version (4.x ``rope_theta``/``rope_scaling`` or 5.x
    ``rope_parameters``) and any family can be read without importing its code.
    """

    data: dict
    path: Path

    @classmethod
    def read(cls, model_dir: str | Path) -> HFConfig:
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not model_dir.is_dir():
            raise ModelError(
                "no such directory",
                where=str(model_dir),
                fix="pass --model_dir DIR with the Hugging Face base model (config.json + weights)",
            )
        if not path.is_file():
            raise ModelError(
                "no config.json: not a Hugging Face model directory",
                where=str(model_dir),
                fix="pass the directory that save_pretrained() wrote",
            )
        data = read_json(path, ModelError, fix="pass the config.json that save_pretrained() wrote")
        _validate_fields(data, path)
        # Multimodal wrappers (Gemma3ForConditionalGeneration, ...) keep the LM in text_config.
        return cls(data, path)

    # -- access --------------------------------------------------------------------------
    def get(self, name: str, default: Any = None) -> Any:
        """A field, or ``default``; ``name`` may be a path into nested objects (``"attn_config.rope_theta"``)."""
        return lookup(self.data, name, default)

    def require(self, name: str, kind: type | tuple = int, *alternatives: str) -> Any:
        for n in (name,) + alternatives:
            v = lookup(self.data, n, _MISSING)
            if v is not _MISSING and v is not None:
                if kind is int and not is_int(v):
                    break
                if kind is float and not isinstance(v, (int, float)):
                    break
                return v
        names = " or ".join(repr(n) for n in (name,) + alternatives)
        raise ModelError(
            f"field {names} is missing or not {getattr(kind, '__name__', kind)} "
            f"(found {self.get(name)!r})",
            where=str(self.path),
            fix="use the config.json that came with the weights",
        )

    @property
    def architecture(self) -> str:
        archs = self.data.get("architectures")
        if not archs or not isinstance(archs, list):
            raise ModelError(
                "field 'architectures' is missing; cannot tell the model family",
                where=str(self.path),
                fix='add e.g. "architectures": ["Qwen2ForCausalLM"] or pass --model_type',
            )
        return str(archs[0])

    @property
    def model_type(self) -> str:
        return str(self.data.get("model_type", ""))

    @property
    def dtype_name(self) -> str | None:
        """The weights' dtype as config.json names it (``torch_dtype``, or transformers 5's ``dtype``),
        when it is one a checkpoint can use; None otherwise."""
        v = self.data.get("torch_dtype") or self.data.get("dtype")
        return v if v in CHECKPOINT_DTYPES else None

    @property
    def rope_theta(self) -> float:
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and "rope_theta" in params:
            return float(params["rope_theta"])
        if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
            return float(params["full_attention"].get("rope_theta", 10000.0))
        v = self.data.get("rope_theta", self.data.get("rotary_emb_base"))  # GPT-NeoX's old name
        return float(v) if v is not None else 10000.0

    def partial_rotary_factor(self, default: float) -> float:
        """Fraction of each head that RoPE rotates (Phi-2, GPT-NeoX, Nemotron, ...): transformers 5's
        ``rope_parameters``, else ``partial_rotary_factor`` or ``rotary_pct``, else ``default`` - the family's
        config class's own (0.25 for GPT-NeoX, 0.5 for Phi and Nemotron: ``save_pretrained`` may leave it out),
        which the caller names (``ArchAdapter.rotary_fraction``)."""
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and params.get("partial_rotary_factor") is not None:
            return float(params["partial_rotary_factor"])
        for key in ("partial_rotary_factor", "rotary_pct"):
            if self.data.get(key) is not None:
                return float(self.data[key])
        return float(default)

    def rope_theta_for(self, layer_type: str, default: float) -> float:
        """Per-layer-type RoPE base (transformers 5 nests rope_parameters by layer type: Gemma3)."""
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
            return float(params[layer_type].get("rope_theta", default))
        return default

    @property
    def rope_scaling(self) -> dict | None:
        """The whole scaling dict (type and factor and the rest), or None for plain RoPE."""
        return self.rope_scaling_for("full_attention")

    @property
    def rope_original_max_positions(self):
        """``original_max_position_embeddings`` (the context a scaled RoPE was pretrained at) as written: at the top
        level in Phi-3's configs, in ``rope_parameters`` where transformers 5 keeps it; None where neither has it."""
        top = self.get("original_max_position_embeddings")
        return top if top is not None else (self.rope_scaling or {}).get("original_max_position_embeddings")

    def rope_scaling_for(self, layer_type: str) -> dict | None:
        """The scaling of one layer type where transformers 5 nests rope_parameters by layer type
        (Gemma3: ``full_attention`` / ``sliding_attention``); the one scaling otherwise. A
        transformers 4 Gemma3 config's ``rope_scaling`` applies to global layers only
        (modeling_gemma3.py builds the local rotary embedding unscaled)."""
        raw = self.data.get("rope_scaling")
        if raw is not None and layer_type == "sliding_attention" and "rope_local_base_freq" in self.data:
            return None
        if raw is None:
            params = self.data.get("rope_parameters")
            if isinstance(params, dict):
                raw = {k: v for k, v in params.items() if k != "rope_theta"}
        if not raw:
            return None
        if all(isinstance(v, dict) for v in raw.values()):  # per layer type (Gemma3)
            raw = raw.get(layer_type) or {}
        raw = {k: v for k, v in raw.items() if k not in ("rope_theta", "partial_rotary_factor")}
        raw = dict(raw)
        kind = raw.get("rope_type", raw.get("type"))
        if kind in (None, "default"):
            return None
        raw.pop("rope_type", None)
        raw["type"] = kind
        return raw


#: dtypes a base model's weights may have
WEIGHT_DTYPES = CHECKPOINT_DTYPES


class HFModel:
    """A base model directory: config + lazily indexed weights."""

    def __init__(self, model_dir: str | Path):
        self.path = Path(model_dir)
        self.config = HFConfig.read(self.path)

    @cached_property
    def tensors(self) -> dict[str, LazyTensor]:
        try:
            files = weight_files(self.path)
        except ModelError:
            raise
        except PortError as exc:
            raise ModelError(exc.what, where=exc.where or str(self.path), fix=exc.fix) from None
        if not files:
            raise ModelError(
                "no weights found (*.safetensors, an index json, or pytorch_model*.bin)",
                where=str(self.path),
                fix="save the model with save_pretrained() into this directory",
            )
        return read_tensor_files(files, ModelError)

    def weight_problems(self, ignored: tuple[str, ...] = (),
                        expert_keys: tuple[str, str, str] | None = None) -> list[str]:
        """Base tensors that contradict config.json: a dtype other than float32/float16/bfloat16,
        or a shape other than the one transformers builds from the config (compared on the
        ``meta`` device: nothing is allocated) - the experts of an MoE layer against the fused parameters
        transformers 5 builds for them (:func:`stored_expert_problems`), each message naming the config.json
        fields (:func:`expert_fields`; ``expert_keys``: the family's, ``ArchAdapter.expert_field_keys``).
        ``ignored`` are regexes of non-weight buffers."""
        import re

        patterns = [re.compile(p) for p in ignored]
        out = []
        for name, t in self.tensors.items():
            if t.dtype_name not in WEIGHT_DTYPES and not any(p.fullmatch(name) for p in patterns):
                out.append(f"{name} is {t.dtype_name} ({t.file.name}); "
                           "expected float32, float16 or bfloat16")
        expected = self.expected_shapes()
        for name, shape in expected.items():
            t = self.tensors.get(name)
            if t is not None and tuple(t.shape) != shape:
                out.append(f"{name} has shape {list(t.shape)} in {t.file.name}, but config.json implies {list(shape)}"
                           + expert_fields(name, self.config.data, expert_keys))
        return out + stored_expert_problems(self.tensors, expected, self.config.data, expert_keys)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter shapes of the transformers model of this config, built on the meta device;
        empty when transformers cannot build it (custom code, a config it rejects).

        Building the model means importing its modelling code (seconds); the shapes depend only on
        config.json and the transformers version, so they are kept in :func:`shape_cache_dir` and a
        later conversion of the same config reads them back.
        """
        cache = _shape_cache_file(self.path / "config.json")
        if cache is not None:
            try:
                return {k: tuple(v) for k, v in json.loads(cache.read_text()).items()}
            except (OSError, ValueError, AttributeError, TypeError):
                pass
        try:
            import warnings

            import torch
            from transformers import AutoConfig, AutoModelForCausalLM
            from transformers.utils import logging as hf_logging

            level = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = AutoConfig.from_pretrained(str(self.path))
                    with torch.device("meta"):
                        model = AutoModelForCausalLM.from_config(cfg)
            finally:
                hf_logging.set_verbosity(level)
        except Exception:  # noqa: BLE001 - any failure means "no shapes to compare", not an error
            return {}
        shapes = {n: tuple(p.shape) for n, p in model.state_dict().items()}
        if cache is not None and shapes:
            _write_quietly(cache, json.dumps({k: list(v) for k, v in shapes.items()}))
        return shapes


#: How the experts of an MoE layer are stored, against the parameters transformers 5 builds: two 3-D tensors per
#: layer, ``experts.gate_up_proj`` ``[experts, 2 x inter, hidden]`` and ``experts.down_proj`` ``[experts, hidden,
#: inter]`` (``router.weight`` / ``gate.weight`` ``[experts, hidden]`` beside them), which its conversion mapping
#: fills from the layouts checkpoints hold (transformers/src/transformers/conversion_mapping.py, "mixtral": per-expert
#: ``w1``/``w3``/``w2`` under ``block_sparse_moe``, renamed ``mlp``; "qwen2_moe", which Qwen3-MoE shares: per-expert
#: ``gate_proj``/``up_proj``/``down_proj``; "granitemoe": ``input_linear``/``output_linear``/``router.layer`` renamed).
#: Each pattern: a stored name, the parameters it goes into (under ``mlp.`` or ``block_sparse_moe.``) and what part
#: of it it is - ``half``: one expert's half of gate_up_proj, ``expert``: one expert, ``whole``: the parameter itself.
#: (transformers 4.x builds the stored names themselves, which :meth:`HFModel.weight_problems` compares directly.)
_STORED_EXPERTS = (
    (re.compile(r"(.+\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(?:w1|w3|gate_proj|up_proj)\.weight"),
     ("experts.gate_up_proj",), "half"),
    (re.compile(r"(.+\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(?:w2|down_proj)\.weight"),
     ("experts.down_proj",), "expert"),
    (re.compile(r"(.+\.)block_sparse_moe\.input_linear\.weight"), ("experts.gate_up_proj",), "whole"),
    (re.compile(r"(.+\.)block_sparse_moe\.output_linear\.weight"), ("experts.down_proj",), "whole"),
    (re.compile(r"(.+\.)block_sparse_moe\.(?:gate|router\.layer)\.weight"), ("gate.weight", "router.weight"), "whole"),
)


def _fused_parameter(name: str, expected: dict[str, tuple[int, ...]]):
    """``(match, fused shape, part)`` of the stored expert tensor ``name`` (:data:`_STORED_EXPERTS`), or None."""
    for pattern, params, part in _STORED_EXPERTS:
        m = pattern.fullmatch(name)
        fused = m and next((expected[k] for mod in ("mlp.", "block_sparse_moe.") for p in params
                            if (k := m.group(1) + mod + p) in expected), None)
        if fused:
            return m, fused, part
    return None


def stored_expert_problems(tensors: dict[str, LazyTensor], expected: dict[str, tuple[int, ...]],
                           data: dict, expert_keys: tuple[str, str, str] | None = None) -> list[str]:
    """The stored expert tensors (:data:`_STORED_EXPERTS`) that contradict the fused parameters transformers builds
    from config.json: a shape other than the part of the parameter they fill, an expert index beyond the expert
    count, or a layer whose per-expert tensors are not the experts ``0 .. count - 1`` (one expert's tensor missing
    would otherwise be found only when the conversion plans it)."""
    out: list[str] = []
    seen: dict[str, tuple[int, set[int], set[str]]] = {}  # per-expert name with ``*``: count, experts, files
    for name, t in tensors.items():
        found = None if name in expected else _fused_parameter(name, expected)
        if found is None:
            continue
        m, fused, part = found
        if part == "whole":
            want = fused
        else:
            expert = int(m.group(2))
            entry = seen.setdefault(name.replace(f".experts.{expert}.", ".experts.*.", 1), (fused[0], set(), set()))
            entry[1].add(expert)
            entry[2].add(t.file.name)
            want = (fused[1] // 2,) + fused[2:] if part == "half" else fused[1:]
        if tuple(t.shape) != want:
            out.append(f"{name} has shape {list(t.shape)} in {t.file.name}, but config.json implies {list(want)}"
                       + expert_fields(name, data, expert_keys))
    for name, (count, experts, files) in sorted(seen.items()):
        if experts != set(range(count)):
            beyond, missing = sorted(experts - set(range(count))), sorted(set(range(count)) - experts)
            held = (f"holds expert(s) {', '.join(map(str, beyond[:4]))} beyond" if beyond else
                    f"lacks expert(s) {', '.join(map(str, missing[:4]))} of")
            out.append(f"{name} (in {', '.join(sorted(files)[:3])}) {held} the {count} experts config.json implies"
                       + expert_fields(name, data, expert_keys))
    return out


def expert_fields(name: str, data: dict, keys: tuple[str, str, str] | None = None) -> str:
    """The config.json fields an MoE tensor's shape comes from, as `` (field value, ...)``; empty for a tensor of no
    expert (or a config without experts, or no ``keys``). ``keys``: the family's expert count, expert intermediate
    size and hidden size fields (``ArchAdapter.expert_field_keys``, where the family's names live; paths allowed:
    DBRX's ``ffn_config.moe_num_experts``)."""
    if keys is None:
        return ""
    count, inter, hidden = keys
    if count is None or lookup(data, count) is None or not re.search(
            r"expert|block_sparse_moe|router|\.mlp\.gate\.weight$", name):
        return ""
    if "shared_expert_gate" in name:
        named = [hidden]
    elif "shared_expert" in name:
        named = ["shared_expert_intermediate_size", hidden]
    elif re.search(r"(\.gate|router(\.layer)?)\.weight$", name):
        named = [count, hidden]
    else:
        named = [count, inter, hidden]
    return " (from config.json's " + ", ".join(f"{k} {lookup(data, k)!r}" for k in named) + ")"


def shape_cache_dir() -> Path:
    """Where parameter shapes built by transformers are kept: ``$TRTLLM_MEDUSA_CACHE`` or
    ``$XDG_CACHE_HOME/trtllm-medusa-ports`` (``~/.cache/trtllm-medusa-ports``), ``/shapes``."""
    root = os.environ.get("TRTLLM_MEDUSA_CACHE")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trtllm-medusa-ports")
    return Path(root) / "shapes"


def _shape_cache_file(config: Path) -> Path | None:
    """The cache entry of this config.json's exact bytes under the installed transformers; None
    where transformers is not installed or the config cannot be read."""
    try:
        tf = _transformers_version()
        if tf is None:
            return None
        digest = hashlib.sha256(config.read_bytes() + b"\0transformers " + tf.encode()).hexdigest()
    except OSError:
        return None
    return shape_cache_dir() / f"{digest}.json"


def _transformers_version() -> str | None:
    """The installed transformers' ``__version__``, read from its ``__init__.py`` without importing
    it or ``importlib.metadata`` (0.02 s, a tenth of a small conversion's start); None where
    transformers is not installed. An ``__init__.py`` without the line gives its size and mtime."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.origin:
        return None
    with open(spec.origin, encoding="utf-8", errors="replace") as f:
        head = f.read(1 << 16)
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", head, re.MULTILINE)
    if found:
        return found.group(1)
    st = os.stat(spec.origin)
    return f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}"


def _write_quietly(path: Path, text: str) -> None:
    """Write a cache entry atomically; a cache that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


@contextlib.contextmanager
def progress_bars_off(off: bool = True):
    """transformers' own progress bars (loading shards) off while the block runs where ``off`` (``--quiet``), and as
    they were after it: an API call leaves the process as it found it."""
    if not off:
        yield
        return
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
