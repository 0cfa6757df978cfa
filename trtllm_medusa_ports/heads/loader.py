"""Detect a head checkpoint's layout and read it into :class:`MedusaHeads`.

Each layout is a table of key patterns (data, not code). Layouts and their key
names are listed in docs/heads.md; the facts come from FasterDecoding/Medusa
(``medusa/model/medusa_model.py``), vLLM (``vllm/model_executor/models/medusa.py``,
``vllm/transformers_utils/configs/medusa.py``), axolotl/Medusa-2 full-model
checkpoints and NVIDIA ModelOpt exports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import HeadsError
from trtllm_medusa_ports.files.dtypes import is_floating
from trtllm_medusa_ports.files.jsonfile import is_int, read_json
from trtllm_medusa_ports.files.lazy_tensors import LazyTensor, read_tensor_files, weight_files
from trtllm_medusa_ports.heads.canonical import MedusaHeads, ResBlockRef

if TYPE_CHECKING:
    import torch

# Roles a key can play. "block" groups are (head, layer, weight|bias); "proj" is a
# head's own vocabulary projection (head); "proj_at" is FasterDecoding's
# "{h}.{L}.weight" whose L must equal the head's number of ResBlocks.
_FD_BLOCK = r"(?P<h>\d+)\.(?P<l>\d+)\.linear\.(?P<p>weight|bias)"
_FD_PROJ = r"(?P<h>\d+)\.(?P<at>\d+)\.weight"


@dataclass(frozen=True)
class Layout:
    name: str
    #: keys outside this prefix belong to the base model and are ignored
    prefix: str
    patterns: tuple[tuple[str, str], ...]
    description: str


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        "fasterdecoding",
        "",
        (("block", _FD_BLOCK), ("proj_at", _FD_PROJ)),
        "FasterDecoding/Medusa medusa_lm_head.pt or .safetensors: {h}.{l}.linear.*, {h}.{L}.weight",
    ),
    Layout(
        "axolotl",
        "medusa_head.",
        (("block", _FD_BLOCK), ("proj_at", _FD_PROJ)),
        "axolotl / Medusa-2 full model: medusa_head.{h}.{l}.linear.*, medusa_head.{h}.{L}.weight",
    ),
    Layout(
        "modelopt",
        "medusa_heads.",
        (
            ("block", r"(?P<h>\d+)\.medusa_layers\.(?P<l>\d+)\.linear\.(?P<p>weight|bias)"),
            ("proj", r"(?P<h>\d+)\.lm_head\.weight"),
            ("block", _FD_BLOCK),
            ("proj_at", _FD_PROJ),
        ),
        "NVIDIA ModelOpt export: medusa_heads.{h}.medusa_layers.{l}.linear.*, medusa_heads.{h}.lm_head.weight",
    ),
    Layout(
        "vllm",
        "",
        (
            ("block", r"blocks\.(?P<h>\d+)\.layers\.(?P<l>\d+)\.(?P<p>weight|bias)"),
            ("proj", r"lm_heads\.(?P<h>\d+)\.weight"),
            ("shared_proj", r"lm_head\.weight"),
            ("token_map", r"token_map"),
        ),
        "vLLM MedusaModel: blocks.{h}.layers.{l}.*, lm_heads.{h}.weight or lm_head.weight, token_map",
    ),
)

_FD_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")


def _read_config(path: Path) -> tuple[dict, Path | None]:
    cfg_path = (path if path.is_dir() else path.parent) / "config.json"
    if not cfg_path.is_file():
        return {}, None
    cfg = read_json(cfg_path, HeadsError, fix="repair the file or remove it (the weights alone are enough)")
    return cfg, cfg_path


def require_heads_path(path: Path) -> None:
    """A heads path that is neither a file nor a directory, refused as every command refuses it."""
    if not (path.is_file() or path.is_dir()):
        raise HeadsError(
            "no such file or directory",
            where=str(path),
            fix="pass the directory (or file) holding the Medusa heads",
        )


def _head_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    require_heads_path(path)
    for name in _FD_FILES:
        if (path / name).is_file():
            return [path / name]
    try:
        files = weight_files(path)
    except Exception as exc:  # an unreadable index: keep the message, mark it as ours
        raise HeadsError(str(exc), where=str(path)) from None
    if not files:
        raise HeadsError(
            "no weights found (looked for medusa_lm_head.{safetensors,pt}, *.safetensors, "
            "an index json, pytorch_model*.bin)",
            where=str(path),
            fix="point --medusa_model_dir at the directory the heads were saved to",
        )
    return files


def _match(layout: Layout, key: str) -> tuple[str, dict] | None:
    if not key.startswith(layout.prefix):
        return None
    rest = key[len(layout.prefix) :]
    for role, pattern in layout.patterns:
        m = re.fullmatch(pattern, rest)
        if m:
            return role, m.groupdict()
    return None


def _detect(tensors: dict[str, LazyTensor], cfg: dict) -> Layout:
    scores = []
    for layout in LAYOUTS:
        n = sum(1 for k in tensors if _match(layout, k))
        scores.append((n, layout))
    if cfg.get("model_type") == "medusa" or "num_heads" in cfg and "medusa_num_heads" not in cfg:
        # vLLM's own config; its keys decide only if they are there
        vllm = next(s for s in scores if s[1].name == "vllm")
        if vllm[0]:
            return vllm[1]
    base_like = any(a in k for k in tensors for a in ("self_attn.", ".attention.", "self_attention."))
    if base_like and not any("medusa" in k for k in tensors):  # axolotl full models carry medusa_head.*
        raise HeadsError("this is a base model (it has attention layers and no medusa tensors), not Medusa heads",
                         fix="pass the heads' directory as --medusa_model_dir and the base as --model_dir")
    best = max(scores, key=lambda s: s[0])
    if best[0] == 0:
        sample = ", ".join(sorted(tensors)[:5]) or "(no tensors)"
        raise HeadsError(
            f"no Medusa head tensors found; the keys start with: {sample}",
            fix="expected one of the layouts: " + "; ".join(lay.description for lay in LAYOUTS),
        )
    return best[1]


def load_heads(path: str | Path) -> MedusaHeads:
    """Read a Medusa head checkpoint of any supported layout (lazily)."""
    path = Path(path)
    cfg, cfg_path = _read_config(path)
    files = _head_files(path)
    tensors = read_tensor_files(files, HeadsError)
    try:
        layout = _detect(tensors, cfg)
    except HeadsError as exc:
        raise HeadsError(exc.what, where=str(path), fix=exc.fix) from None
    return _assemble(layout, tensors, cfg, cfg_path, path, files)


def _int(cfg: dict, *names: str) -> int | None:
    for n in names:
        v = cfg.get(n)
        if is_int(v):
            return v
    return None


@dataclass
class _Grouped:
    """The tensors of one layout, grouped by role (group step)."""

    blocks: dict[tuple[int, int], dict[str, LazyTensor]] = field(default_factory=dict)
    projs: dict[int, LazyTensor] = field(default_factory=dict)
    projs_at: dict[int, tuple[int, LazyTensor]] = field(default_factory=dict)
    shared: LazyTensor | None = None
    token_map: LazyTensor | None = None


def _assemble(
    layout: Layout,
    tensors: dict[str, LazyTensor],
    cfg: dict,
    cfg_path: Path | None,
    path: Path,
    files: list[Path],
) -> MedusaHeads:
    """group -> validate (structure, ResBlocks, projections, shapes) -> resolve; detection is done."""
    where = str(files[0]) if len(files) == 1 else str(path)
    warnings: list[str] = []
    g = _group(layout, tensors, where)
    head_ids, num_layers = _structure(g, layout, where)
    num_heads = len(head_ids)
    refs = _resblocks(g, head_ids, num_layers, cfg, where, warnings)
    lm_heads = _projections(g, head_ids, cfg, cfg_path, where, warnings)
    hidden, vocab, dtype = _shapes(layout, tensors, g, refs, lm_heads, num_layers, cfg, cfg_path, where, warnings)
    _config_quirks(layout, cfg, num_heads, num_layers, hidden, warnings)
    shared, token_map = g.shared, g.token_map
    return MedusaHeads(
        layout=layout.name + ("-v2" if layout.name == "fasterdecoding" and lm_heads is None else ""),
        source=path,
        num_heads=num_heads,
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=vocab,
        dtype_name=dtype,
        blocks=refs,
        lm_heads=lm_heads,
        shared_lm_head=shared,
        token_map=token_map,
        warnings=warnings,
    )




def _group(layout: Layout, tensors: dict[str, LazyTensor], where: str) -> _Grouped:
    out = _Grouped()
    blocks, projs, projs_at = out.blocks, out.projs, out.projs_at
    unknown: list[str] = []
    for key, t in tensors.items():
        m = _match(layout, key)
        if m is None:
            if key.startswith(layout.prefix) and (layout.prefix or layout.name != "axolotl"):
                unknown.append(key)
            continue
        role, g = m
        if role == "block":
            blocks.setdefault((int(g["h"]), int(g["l"])), {})[g["p"]] = t
        elif role == "proj":
            projs[int(g["h"])] = t
        elif role == "proj_at":
            h = int(g["h"])
            if h in projs_at:
                unknown.append(key)
            else:
                projs_at[h] = (int(g["at"]), t)
        elif role == "shared_proj":
            out.shared = t
        elif role == "token_map":
            out.token_map = t
    if unknown:
        raise HeadsError(
            f"unexpected tensor(s) for the {layout.name} layout: {', '.join(sorted(unknown)[:5])}"
            + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else ""),
            where=where,
            fix=f"expected only {layout.description}; remove the extra tensors",
        )

    return out


def _structure(g: _Grouped, layout: Layout, where: str) -> tuple[list[int], int]:
    """Head indices 0..H-1 and one ResBlock depth L for all; positional lm_heads sit at index L."""
    blocks, projs, projs_at = g.blocks, g.projs, g.projs_at
    head_ids = sorted({h for h, _ in blocks} | set(projs) | {h for h in projs_at})
    if not head_ids:
        raise HeadsError("no Medusa heads found", where=where, fix=layout.description)
    if head_ids != list(range(len(head_ids))):
        missing = sorted(set(range(max(head_ids) + 1)) - set(head_ids))
        raise HeadsError(
            f"head indices are not contiguous: found {head_ids}, missing {missing}",
            where=where,
            fix="every head 0..H-1 must be present; the checkpoint is incomplete",
        )
    layers_per_head = {h: sorted(layer for hh, layer in blocks if hh == h) for h in head_ids}
    for h, ls in layers_per_head.items():
        if ls != list(range(len(ls))):
            raise HeadsError(
                f"head {h} has ResBlock layers {ls}; layer indices must be 0..L-1 without gaps",
                where=where,
                fix="the checkpoint is incomplete or mixes two trainings",
            )
    depths = {len(ls) for ls in layers_per_head.values()}
    if len(depths) > 1:
        detail = ", ".join(f"head {h}: {len(ls)}" for h, ls in layers_per_head.items())
        raise HeadsError(
            f"heads have different numbers of ResBlock layers ({detail})",
            where=where,
            fix="all heads must have the same number of layers",
        )
    num_layers = depths.pop()
    for h, (at, t) in projs_at.items():
        if at != num_layers:
            raise HeadsError(
                f"tensor {t.name!r} should be head {h}'s lm_head, which sits at index "
                f"{num_layers} (after its {num_layers} ResBlock(s)), not {at}",
                where=where,
                fix="the checkpoint's layer count is inconsistent; check medusa_num_layers",
            )
        projs[h] = t

    return head_ids, num_layers


def _resblocks(g: _Grouped, head_ids: list[int], num_layers: int, cfg: dict, where: str,
               warnings: list[str]) -> list[list[ResBlockRef]]:
    blocks = g.blocks
    refs: list[list[ResBlockRef]] = []
    no_bias: list[str] = []
    for h in head_ids:
        row = []
        for layer in range(num_layers):
            entry = blocks[(h, layer)]
            if "weight" not in entry:
                raise HeadsError(
                    f"head {h} layer {layer} has a bias but no weight ({entry['bias'].name})",
                    where=where,
                    fix="the checkpoint is incomplete",
                )
            if "bias" not in entry:
                no_bias.append(entry["weight"].name)
            row.append(ResBlockRef(entry["weight"], entry.get("bias")))
        refs.append(row)
    if no_bias:
        why = " (config says medusa_fc_bias: false)" if cfg.get("medusa_fc_bias") is False else ""
        warnings.append(
            f"{len(no_bias)} ResBlock(s) have no bias{why}; using zeros "
            f"(TensorRT-LLM's MedusaLayer always has one), first: {no_bias[0]}"
        )

    return refs


def _projections(g: _Grouped, head_ids: list[int], cfg: dict, cfg_path: Path | None, where: str,
                 warnings: list[str]) -> list[LazyTensor] | None:
    """Own lm_head per head, one shared, or none (the base model's)."""
    projs, shared, num_heads = g.projs, g.shared, len(head_ids)
    lm_heads: list[LazyTensor] | None
    if projs:
        if len(projs) != num_heads:
            without = [h for h in head_ids if h not in projs]
            raise HeadsError(
                f"heads {without} have no lm_head while the others have one",
                where=where,
                fix="either every head has its own lm_head or none does (shared lm_head)",
            )
        lm_heads = [projs[h] for h in head_ids]
        if shared is not None:
            raise HeadsError(
                "both per-head lm_heads and a shared lm_head.weight are present",
                where=where,
                fix="keep one of them",
            )
    else:
        lm_heads = None
    version = str(cfg.get("version", ""))
    if version == "2" and lm_heads is not None:
        warnings.append("config says version 2 (shared lm_head) but the weights hold per-head lm_heads; using them")
    if cfg.get("original_lm_head") is False and lm_heads is None:
        raise HeadsError(
            "config says original_lm_head: false but the weights hold no lm_heads.{h}.weight",
            where=str(cfg_path or where),
            fix="the checkpoint is incomplete",
        )

    return lm_heads


def _shapes(layout: Layout, tensors: dict[str, LazyTensor], g: _Grouped, refs: list[list[ResBlockRef]],
            lm_heads: list[LazyTensor] | None, num_layers: int, cfg: dict, cfg_path: Path | None, where: str,
            warnings: list[str]) -> tuple[int, int | None, str]:
    """One hidden size, one vocabulary (a truncated one through its token_map), one dtype."""
    shared, token_map = g.shared, g.token_map
    if num_layers:
        hidden = refs[0][0].weight.shape[-1]
    elif lm_heads:
        hidden = lm_heads[0].shape[-1]
    elif shared is not None:
        hidden = shared.shape[-1]
    else:
        raise HeadsError("the heads have neither ResBlocks nor lm_heads", where=where)
    dtype = (refs[0][0].weight if num_layers else (lm_heads or [shared])[0]).dtype_name
    for row in refs:
        for b in row:
            if b.weight.shape != (hidden, hidden):
                raise HeadsError(
                    f"tensor {b.weight.name!r} has shape {list(b.weight.shape)}, expected "
                    f"[{hidden}, {hidden}] (hidden x hidden)",
                    where=where,
                    fix="all heads must share one hidden size; the checkpoint mixes models",
                )
            if b.bias is not None and b.bias.shape != (hidden,):
                raise HeadsError(
                    f"tensor {b.bias.name!r} has shape {list(b.bias.shape)}, expected [{hidden}]",
                    where=where,
                )
    proj_list = list(lm_heads or []) + ([shared] if shared is not None else [])
    vocab = None
    for t in proj_list:
        if len(t.shape) != 2 or t.shape[1] != hidden:
            raise HeadsError(
                f"tensor {t.name!r} has shape {list(t.shape)}, expected [vocab, {hidden}]",
                where=where,
                fix="the lm_head must project the heads' hidden size to the vocabulary",
            )
        if vocab is None:
            vocab = t.shape[0]
        elif t.shape[0] != vocab:
            raise HeadsError(
                f"tensor {t.name!r} projects to {t.shape[0]} tokens, the first lm_head to {vocab}",
                where=where,
                fix="all heads must share one vocabulary",
            )
    for t in tensors.values():
        if t in proj_list or t is token_map:
            continue
        if t.dtype_name != dtype and _match(layout, t.name):
            warnings.append(f"tensor {t.name!r} is {t.dtype_name}, the heads are {dtype}; it will be cast")
            break
    if token_map is not None:
        vocab = _full_vocab(token_map, vocab, cfg, cfg_path, where, warnings)
    return hidden, vocab, dtype


def _full_vocab(token_map: LazyTensor, vocab: int | None, cfg: dict, cfg_path: Path | None, where: str,
                warnings: list[str]) -> int:
    """The base vocabulary a truncated one (``token_map``: the lm_head's rows' token ids) stands in: a 1-D integer
    map of as many rows as the lm_head, of distinct ids within config.json's ``vocab_size``."""
    if len(token_map.shape) != 1 or is_floating(token_map.dtype_name):
        raise HeadsError(
            f"token_map has shape {list(token_map.shape)} and dtype {token_map.dtype_name}, "
            "expected a 1-D integer tensor",
            where=where,
        )
    if vocab is not None and token_map.shape[0] != vocab:
        raise HeadsError(
            f"token_map maps {token_map.shape[0]} rows but the lm_head has {vocab}",
            where=where,
            fix="truncated_vocab_size, token_map and lm_head rows must agree",
        )
    full = _int(cfg, "vocab_size")
    if full is None:
        raise HeadsError(
            "the heads use a truncated vocabulary (token_map) but config.json gives no vocab_size",
            where=str(cfg_path or where),
            fix="add the base model's vocab_size to the heads' config.json",
        )
    ids = token_map.load().long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= full):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise HeadsError(f"token_map holds token id {bad}, outside the vocabulary 0..{full - 1}",
                         where=where, fix="the token_map must list token ids of the base vocabulary")
    if ids.unique().numel() != ids.numel():
        raise HeadsError("token_map lists a token id twice: two rows would write one token", where=where,
                         fix="the token_map must list distinct token ids")
    warnings.append(
        f"truncated vocabulary: {token_map.shape[0]} of {full} tokens; the other tokens "
        "get zero rows in the converted lm_head (they can still be verified, never guessed)"
    )
    return full


def _config_quirks(layout: Layout, cfg: dict, num_heads: int, num_layers: int, hidden: int,
                   warnings: list[str]) -> None:
    """Where config.json and the weights disagree, trust the weights and say so."""
    cfg_heads = _int(cfg, "medusa_num_heads", "num_heads")
    if cfg_heads is not None and cfg_heads != num_heads:
        warnings.append(
            f"config.json says {cfg_heads} heads but the weights hold {num_heads}; using {num_heads}"
        )
    cfg_layers = _int(cfg, "medusa_num_layers") if layout.name != "vllm" else _int(cfg, "num_hidden_layers")
    if cfg_layers is not None and cfg_layers != num_layers:
        warnings.append(
            f"config.json says {cfg_layers} layer(s) per head but the weights hold {num_layers}; "
            f"using {num_layers}"
        )
    cfg_hidden = _int(cfg, "hidden_size") if layout.name == "vllm" else None
    if cfg_hidden is not None and cfg_hidden != hidden:
        warnings.append(f"config.json says hidden_size {cfg_hidden} but the weights have {hidden}")



def expand_truncated(proj: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Scatter a truncated-vocabulary projection to the full vocabulary (zero rows elsewhere)."""
    import torch

    full = torch.zeros(vocab_size, proj.shape[1], dtype=proj.dtype)
    full[token_map.long()] = proj
    return full
