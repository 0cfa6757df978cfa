"""Hostile mixture-of-experts inputs, by category: the Hugging Face base's expert tensors against config.json, the
MoE fields of config.json, and a TensorRT-LLM checkpoint's expert tensors against its own config.json.

Every case is parametrised over the MoE families of the registry (``family_test_cases()["moe"]``) and differs from
a good tiny base or checkpoint (``fixtures.synthetic``) in one way; each asserts the exit code, the message (the
file, the tensor or field, the shape found and the one expected, the config field it comes from), that the inputs
are byte-identical afterwards, and that nothing is left beside the output.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import convert_to, tiny_base
from safetensors.torch import load_file, save_file

from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import EXIT_FOUND
from trtllm_medusa_ports.files.hf_model import HFConfig, assign, lookup
from trtllm_medusa_ports.fixtures.synthetic import (
    TINY_CONFIGS,
    random_heads,
    save_heads,
    tiny_config,
)

MOE = family_test_cases()["moe"]
#: each MoE family's tiny config.json fields, as save_pretrained writes them (nested objects kept)
TINY_CONFIGS_JSON = {a: {**TINY_CONFIGS[a], "architectures": [a]} for a in MOE}


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _hidden(arch: str) -> int:
    return tiny_config(arch).hidden_size


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-heads")
    sizes = {(_hidden(a), TINY_CONFIGS[a]["vocab_size"]) for a in MOE}
    return {s: save_heads(random_heads(*s, num_heads=2, seed=5), root / f"h{s[0]}-{s[1]}") for s in sizes}


def _heads_of(heads: dict, arch: str) -> Path:
    return heads[(_hidden(arch), TINY_CONFIGS[arch]["vocab_size"])]


def _base(store: Path, tmp_path: Path, arch: str) -> Path:
    d = tmp_path / "in" / "base"
    shutil.copytree(tiny_base(store, arch), d)
    return d


def _edit_config(path: Path, fn: Callable[[dict], None]) -> None:
    cfg = json.loads(path.read_text())
    fn(cfg)
    path.write_text(json.dumps(cfg))


def _edit_tensors(path: Path, fn: Callable[[dict], None]) -> None:
    t = load_file(str(path))
    fn(t)
    save_file(t, str(path), metadata={"format": "pt"})


def _keys(arch: str, base: Path) -> tuple[str, str, str]:
    """The family's expert count, expert intermediate size and hidden size fields (ArchAdapter.expert_field_keys)."""
    return adapter_for(arch).expert_field_keys(HFConfig.read(base))


def _refused(argv: list[str], capsys, inputs: list[Path], out: Path | None = None) -> str:
    """Run ``argv``, expect exit 1 (check: 3, NOT COMPATIBLE) without a traceback, the inputs unchanged and no
    output (nor anything beside it); the message (stdout and stderr)."""
    before = {p: _digest(p) for p in inputs}
    around = sorted(out.parent.iterdir()) if out is not None and out.parent.exists() else None
    assert main(argv) == (EXIT_FOUND if argv[0] == "check" else 1)
    text = "".join(capsys.readouterr())
    assert "Traceback" not in text
    assert {p: _digest(p) for p in inputs} == before
    if out is not None:
        assert not out.exists()
        assert (sorted(out.parent.iterdir()) if out.parent.exists() else None) == around
    return text


# -- the Hugging Face base's expert tensors against config.json --------------------------------------------------
def _expert_sources(arch: str, t: dict, layer: int, trtllm_name: str) -> list[str]:
    """The stored tensors the family's rule for ``trtllm_name`` reads in ``layer`` (its declared sources)."""
    ad = adapter_for(arch)
    rule = next(r for r in ad.layer_rules(HFConfig(TINY_CONFIGS_JSON[arch], Path("config.json")))
                if r.name == trtllm_name)
    names = [s.replace("{i}", str(layer)) for s in rule.sources]
    return [n for n in names if n in t] or sorted(n for n in t if n.startswith(ad.layer_prefix.format(i=layer))
                                                 and ".experts." in n)


def _layer0_expert(arch: str, t: dict) -> str:
    """A stored expert matrix of layer 0 that feeds ``mlp.fc`` (a per-expert linear of expert 1, Granite's 3-D
    input_linear, DBRX's 2-D v1)."""
    names = _expert_sources(arch, t, 0, "mlp.fc.weight")
    return next((n for n in names if ".experts.1." in n), names[0])


def _router(arch: str, t: dict, layer: int) -> str:
    return _expert_sources(arch, t, layer, "mlp.router.weight")[0]


def _narrowed(t: dict, name: str) -> tuple[list[int], list[int]]:
    found, want = list(t[name][..., :-2].shape), list(t[name].shape)
    t[name] = t[name][..., :-2].contiguous()
    return found, want


def _grown(t: dict, name: str) -> tuple[list[int], list[int]]:
    import torch

    want = list(t[name].shape)
    t[name] = torch.cat([t[name], t[name][:1]])
    return list(t[name].shape), want


SOURCE_CHANGES = {
    "expert-matrix-narrower": lambda a, t: (_layer0_expert(a, t), *_narrowed(t, _layer0_expert(a, t))),
    "router-with-an-extra-expert": lambda a, t: (_router(a, t, 1), *_grown(t, _router(a, t, 1))),
    "shared-expert-narrower": lambda a, t: ("model.layers.1.mlp.shared_expert.up_proj.weight",
                                            *_narrowed(t, "model.layers.1.mlp.shared_expert.up_proj.weight")),
}
SOURCE_CASES = [(a, c) for a in MOE for c in SOURCE_CHANGES
                if c != "shared-expert-narrower" or "shared_expert_intermediate_size" in TINY_CONFIGS[a]]


@pytest.mark.parametrize("arch, change", SOURCE_CASES, ids=[f"{a}-{c}" for a, c in SOURCE_CASES])
def test_expert_source_shapes_are_checked_before_writing(store, tmp_path, heads, capsys, arch, change):
    """One expert tensor of the base in a shape other than config.json implies: convert refuses before writing
    and check reports it, both naming the shard, the tensor, the shape found, the one expected and the fields."""
    base = _base(store, tmp_path, arch)
    cfg = json.loads((base / "config.json").read_text())
    holder: dict = {}
    _edit_tensors(base / "model.safetensors", lambda t: holder.update(zip(("name", "found", "want"),
                                                                           SOURCE_CHANGES[change](arch, t),
                                                                           strict=True)))
    out, hd = tmp_path / "out" / "ckpt", _heads_of(heads, arch)
    text = _refused(["convert", "--model_dir", str(base), "--medusa_model_dir", str(hd), "--output_dir", str(out),
                     "--quiet"], capsys, [base, hd], out)
    count, _, hidden = _keys(arch, base)
    fields = ("shared_expert_intermediate_size" if "shared" in change else f"{count} {lookup(cfg, count)}")
    for says in (holder["name"], "model.safetensors", f"has shape {holder['found']}", f"implies {holder['want']}",
                 fields, f"{hidden} {_hidden(arch)}"):
        assert says in text, (says, text)
    text = _refused(["check", "--model_dir", str(base)], capsys, [base])
    assert "weights-config-mismatch" in text and holder["name"] in text and fields in text


@pytest.mark.parametrize("arch", MOE)
def test_expert_count_of_the_base_is_checked_against_its_tensors(store, tmp_path, heads, capsys, arch):
    """config.json says one expert fewer than the shards hold: refused, naming the expert count's field."""
    base = _base(store, tmp_path, arch)
    key = _keys(arch, base)[0]
    experts = lookup(json.loads((base / "config.json").read_text()), key)
    _edit_config(base / "config.json", lambda c: assign(c, key, experts - 1))
    out, hd = tmp_path / "out" / "ckpt", _heads_of(heads, arch)
    text = _refused(["convert", "--model_dir", str(base), "--medusa_model_dir", str(hd), "--output_dir", str(out),
                     "--quiet"], capsys, [base, hd], out)
    assert "contradict config.json" in text and "model.safetensors" in text and f"{key} {experts - 1}" in text
    assert re.search(r"holds expert\(s\) 3 beyond the 3 experts|implies \[3, ", text), text
    text = _refused(["check", "--model_dir", str(base)], capsys, [base])
    assert "weights-config-mismatch" in text and f"{key} {experts - 1}" in text


# -- config.json's MoE fields -----------------------------------------------------------------------------------
FIELD_CHANGES = {  # "top_k": the family's experts_per_token_key; "count": its expert count's key
    "top_k-0": ("top_k", 0),
    "top_k-negative": ("top_k", -1),
    "top_k-bool": ("top_k", True),
    "top_k-above-the-experts": ("top_k", "experts+1"),
    "experts-0": ("count", 0),
    "experts-1": ("count", 1),
    "experts-missing": ("count", None),
}
FIELD_CASES = [(a, c) for a in MOE for c in FIELD_CHANGES]


@pytest.mark.parametrize("arch, change", FIELD_CASES, ids=[f"{a}-{c}" for a, c in FIELD_CASES])
def test_moe_config_fields_are_typed_and_in_range(store, tmp_path, heads, capsys, arch, change):
    """num_experts_per_tok 0, negative, a bool or above the expert count, an expert count of 0 or 1 or none:
    refused where config.json is read, naming the field, by convert and by check."""
    base = _base(store, tmp_path, arch)
    key, value = FIELD_CHANGES[change]
    cfg = json.loads((base / "config.json").read_text())
    ad, count = adapter_for(arch), _keys(arch, base)[0]
    field = count if key == "count" else ad.experts_per_token_key
    if value is None:
        for k in ad.expert_count_keys:
            *parents, last = k.split(".")
            (lookup(cfg, ".".join(parents)) if parents else cfg).pop(last, None)
    else:
        assign(cfg, field, lookup(cfg, count) + 1 if value == "experts+1" else value)
    (base / "config.json").write_text(json.dumps(cfg))
    says = (" or ".join(repr(k) for k in ad.expert_count_keys) + " is missing" if value is None else
            f"field '{field}' is missing or not int (found True)" if value is True else
            f"field {field} is {lookup(cfg, field)}")
    out, hd = tmp_path / "out" / "ckpt", _heads_of(heads, arch)
    text = _refused(["convert", "--model_dir", str(base), "--medusa_model_dir", str(hd), "--output_dir", str(out),
                     "--quiet"], capsys, [base, hd], out)
    assert says in text and "config.json" in text, text
    text = _refused(["check", "--model_dir", str(base)], capsys, [base])
    assert says in text, text


# -- a checkpoint's expert tensors against its config.json ------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(store, heads, tmp_path_factory) -> dict[str, Path]:
    """Each MoE family's tiny base converted at tp 2 (moe_tp_size 2), with heads."""
    root = tmp_path_factory.mktemp("moe-ckpts")
    return {a: convert_to(root / a, tiny_base(store, a), _heads_of(heads, a), tp_size=2, dtype="float32")
            for a in MOE}


def _moe(cfg: dict, **changes) -> None:
    cfg["moe"].update(changes)


def _halve_intermediate(cfg: dict) -> None:
    key = "moe_intermediate_size" if "moe_intermediate_size" in cfg else "intermediate_size"
    cfg[key] //= 2


CHECKPOINT_CHANGES: dict[str, tuple[Callable[[dict], None] | None, tuple[str, ...]]] = {
    "config-says-fewer-experts": (lambda c: _moe(c, num_experts=c["moe"]["num_experts"] - 1),
                                  ("rank0.safetensors", "transformer.layers.0.mlp.", "is [4, ", "implies [3, ",
                                   "moe.num_experts 3")),
    "top_k-0": (lambda c: _moe(c, top_k=0), ("config.json", "moe.top_k is 0")),
    "top_k-above-the-experts": (lambda c: _moe(c, top_k=c["moe"]["num_experts"] + 1),
                                ("config.json", "moe.top_k is 5 with moe.num_experts 4")),
    "top_k-bool": (lambda c: _moe(c, top_k=True), ("config.json", "moe.top_k is true")),
    "num_experts-string": (lambda c: _moe(c, num_experts="4"), ("config.json", 'moe.num_experts is "4"')),
    "no-moe-block": (lambda c: c.pop("moe"), ("rank0.safetensors", "is an MoE expert tensor", "moe.num_experts is 0",
                                              "dense MLP")),
    "intermediate-size-halved": (
        _halve_intermediate,
        ("rank0.safetensors", "transformer.layers.0.mlp.", "intermediate_size", "mapping.moe_tp_size 2")),
    "expert-parallel-mapping": (lambda c: c["mapping"].update(moe_tp_size=1, moe_ep_size=2),
                                ("rank0.safetensors", "mapping.moe_ep_size 2", "implies [2, ")),
    "rank1-proj-narrower": (None, ("rank1.safetensors", "transformer.layers.1.mlp.proj.weight", "hidden_size",
                                   "mapping.moe_tp_size 2")),
}
CHECKPOINT_CASES = [(a, c) for a in MOE for c in CHECKPOINT_CHANGES]


def _without_heads(ckpt: Path, dest: Path) -> Path:
    """The checkpoint as a tool writes a base (no heads), for add-heads (``convert --base_checkpoint_dir``)."""
    dest.mkdir(parents=True)
    cfg = json.loads((ckpt / "config.json").read_text())
    for k in ("num_medusa_heads", "num_medusa_layers", "max_draft_len", "medusa_hidden_act", "medusa_shared_lm_head",
              "trtllm_base_architecture", "medusa_ports"):
        cfg.pop(k, None)
    cfg["architecture"] = cfg.pop("base_architecture")
    (dest / "config.json").write_text(json.dumps(cfg))
    for f in sorted(ckpt.glob("rank*.safetensors")):
        t = {n: v for n, v in load_file(str(f)).items() if not n.startswith("medusa_heads")}
        save_file(t, str(dest / f.name), metadata={"format": "pt"})
    return dest


@pytest.mark.parametrize("arch, change", CHECKPOINT_CASES, ids=[f"{a}-{c}" for a, c in CHECKPOINT_CASES])
def test_checkpoint_expert_tensors_match_config(store, tmp_path, heads, checkpoints, capsys, arch, change):
    """config.json's moe block typed and in range, and the rank files' router / fc / proj against it (headers
    only): verify and add-heads refuse the checkpoint, naming the rank file, the tensor and the fields."""
    ckpt = tmp_path / "in" / "ckpt"
    shutil.copytree(checkpoints[arch], ckpt)
    edit, says = CHECKPOINT_CHANGES[change]
    if edit is not None:
        _edit_config(ckpt / "config.json", edit)
    else:
        _edit_tensors(ckpt / "rank1.safetensors", lambda t: _narrowed(t, "transformer.layers.1.mlp.proj.weight"))
    base, hd = tiny_base(store, arch), _heads_of(heads, arch)
    text = _refused(["verify", "--model_dir", str(base), "--checkpoint_dir", str(ckpt), "--quiet",
                     "--max_new_tokens", "2"], capsys, [ckpt, base, hd])
    for s in says:
        assert s in text, (s, text)
    tool = _without_heads(ckpt, tmp_path / "in" / "tool")
    out = tmp_path / "out" / "with-heads"
    text = _refused(["convert", "--base_checkpoint_dir", str(tool), "--medusa_model_dir", str(hd), "--output_dir",
                     str(out), "--quiet"], capsys, [tool, hd], out)
    for s in says:
        assert s in text, (s, text)


@pytest.mark.parametrize("arch", MOE)
def test_a_good_expert_checkpoint_reads_at_tensor_and_expert_parallelism(store, tmp_path, heads, checkpoints, arch):
    """No false refusal: the tp-2 checkpoint reads, and so does one converted with --moe_ep_size 2."""
    from trtllm_medusa_ports.files.checkpoint import read_checkpoint

    assert read_checkpoint(checkpoints[arch]).config["mapping"]["moe_tp_size"] == 2
    ep = convert_to(tmp_path / "ep", tiny_base(store, arch), _heads_of(heads, arch), tp_size=2, moe_ep_size=2,
                    dtype="float32")
    ck = read_checkpoint(ep)
    assert ck.config["mapping"]["moe_ep_size"] == 2
    assert ck.ranks[1]["transformer.layers.0.mlp.fc.weight"].shape[0] == ck.config["moe"]["num_experts"] // 2
