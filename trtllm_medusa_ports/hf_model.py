"""A Hugging Face base model directory: its config.json, read field by field, and lazy weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.lazy_tensors import LazyTensor, read_tensor_files, weight_files

_MISSING = object()


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
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ModelError(f"invalid JSON ({exc})", where=str(path)) from None
        if not isinstance(data, dict):
            raise ModelError("config.json must hold a JSON object", where=str(path))
        # Multimodal wrappers (Gemma3ForConditionalGeneration, ...) keep the LM in text_config.
        return cls(data, path)

    # -- access --------------------------------------------------------------------------
    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    def require(self, name: str, kind: type | tuple = int, *alternatives: str) -> Any:
        for n in (name,) + alternatives:
            v = self.data.get(n, _MISSING)
            if v is not _MISSING and v is not None:
                if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
                    break
                if kind is float and not isinstance(v, (int, float)):
                    break
                return v
        names = " or ".join(repr(n) for n in (name,) + alternatives)
        raise ModelError(
            f"field {names} is missing or not {getattr(kind, '__name__', kind)} "
            f"(found {self.data.get(name)!r})",
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
    def torch_dtype(self) -> torch.dtype | None:
        v = self.data.get("torch_dtype") or self.data.get("dtype")
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(v)

    @property
    def rope_theta(self) -> float:
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and "rope_theta" in params:
            return float(params["rope_theta"])
        if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
            return float(params["full_attention"].get("rope_theta", 10000.0))
        v = self.data.get("rope_theta", self.data.get("rotary_emb_base"))  # GPT-NeoX's old name
        return float(v) if v is not None else 10000.0

    @property
    def partial_rotary_factor(self) -> float:
        """Fraction of each head that RoPE rotates (Phi-2, GPT-NeoX, Phi-3.5-MoE ...)."""
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and "partial_rotary_factor" in params:
            return float(params["partial_rotary_factor"])
        for key in ("partial_rotary_factor", "rotary_pct"):
            if self.data.get(key) is not None:
                return float(self.data[key])
        return 1.0

    def rope_theta_for(self, layer_type: str, default: float) -> float:
        """Per-layer-type RoPE base (transformers 5 nests rope_parameters by layer type: Gemma3)."""
        params = self.data.get("rope_parameters")
        if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
            return float(params[layer_type].get("rope_theta", default))
        return default

    @property
    def rope_scaling(self) -> dict | None:
        """The whole scaling dict (type and factor and the rest), or None for plain RoPE."""
        raw = self.data.get("rope_scaling")
        if raw is None:
            params = self.data.get("rope_parameters")
            if isinstance(params, dict):
                raw = {k: v for k, v in params.items() if k != "rope_theta"}
        if not raw:
            return None
        if all(isinstance(v, dict) for v in raw.values()):  # per layer type (Gemma3): the global one
            raw = raw.get("full_attention") or {}
        raw = {k: v for k, v in raw.items() if k not in ("rope_theta", "partial_rotary_factor")}
        raw = dict(raw)
        kind = raw.get("rope_type", raw.get("type"))
        if kind in (None, "default"):
            return None
        raw.pop("rope_type", None)
        raw["type"] = kind
        return raw


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
        except Exception as exc:
            raise ModelError(str(exc), where=str(self.path)) from None
        if not files:
            raise ModelError(
                "no weights found (*.safetensors, an index json, or pytorch_model*.bin)",
                where=str(self.path),
                fix="save the model with save_pretrained() into this directory",
            )
        return read_tensor_files(files, ModelError)
