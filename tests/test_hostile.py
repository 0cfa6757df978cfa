"""Hostile input: each case differs from a valid run in one way.

Every case asserts the exit code, the message (what, where, and for errors a fix), that no
traceback escapes, and that every input file is byte-identical afterwards; a failed convert
leaves no output directory. Property tests feed random bytes and random headers to the
safetensors reader and random text to the tree parser.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import tiny_base
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import EXIT_FOUND, HeadsError, PortError
from trtllm_medusa_ports.files.lazy_tensors import read_safetensors
from trtllm_medusa_ports.fixtures.synthetic import TINY_CONFIGS, random_heads, save_heads
from trtllm_medusa_ports.trees.tree import parse_choices, validate_choices

ARCH = "LlamaForCausalLM"
#: the family's tiny config as declared (the transformers config built from it has the same numbers; building it
#: here would import transformers' config classes at collection)
CFG = TINY_CONFIGS[ARCH]
H, V = CFG["hidden_size"], CFG["vocab_size"]


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    root = tmp_path_factory.mktemp("valid")
    base = tiny_base(root, ARCH)
    heads = save_heads(random_heads(H, V, num_heads=3, seed=2), root / "heads", "fasterdecoding-safetensors")
    return base, heads


@pytest.fixture
def ws(tmp_path, valid):
    """A fresh workspace: ws/base, ws/heads (copies), ws/out is where outputs go."""
    shutil.copytree(valid[0], tmp_path / "base")
    shutil.copytree(valid[1], tmp_path / "heads")
    return tmp_path


def _convert(ws: Path, *extra: str, out: str | Path = "out") -> list[str]:
    return ["convert", "--model_dir", str(ws / "base"), "--medusa_model_dir", str(ws / "heads"),
            "--output_dir", str(ws / out) if isinstance(out, str) else str(out), "--quiet", *extra]


def _header(entries: dict) -> bytes:
    return json.dumps(entries).encode()


def _raw_safetensors(path: Path, header: bytes, data: bytes = b"", declared: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if declared is None else declared) + header + data)


def _edit_config(ws: Path, **changes) -> None:
    p = ws / "base" / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


def _edit_weights(ws: Path, fn: Callable[[dict], None], where: str = "base/model.safetensors") -> None:
    p = ws / where
    sd = load_file(str(p))
    fn(sd)
    save_file(sd, str(p))


def _nan_pt_heads(path: Path) -> None:
    save_heads(random_heads(H, V, num_heads=2, seed=1), path, "fasterdecoding-pt")
    sd = torch.load(path / "medusa_lm_head.pt", weights_only=True)
    sd["0.0.linear.weight"].view(-1)[3] = float("nan")
    torch.save(sd, path / "medusa_lm_head.pt")


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def _drop_config_field(ws: Path, key: str) -> None:
    p = ws / "base" / "config.json"
    cfg = json.loads(p.read_text())
    cfg.pop(key)
    p.write_text(json.dumps(cfg))


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _vllm_heads(ws: Path, token_map: list[int]) -> None:
    shutil.rmtree(ws / "heads")
    save_heads(random_heads(H, V, num_heads=2, seed=3), ws / "heads", "vllm")
    n = len(token_map)
    _edit_weights(ws, lambda sd: (sd.update({k: v[:n].contiguous() for k, v in sd.items() if k.startswith("lm_heads")}),
                                  sd.__setitem__("token_map", torch.tensor(token_map, dtype=torch.int64))),
                  "heads/model.safetensors")
    cfg = json.loads((ws / "heads" / "config.json").read_text())
    cfg.update(truncated_vocab_size=n, vocab_size=V)
    (ws / "heads" / "config.json").write_text(json.dumps(cfg))


@dataclass
class Case:
    id: str
    setup: Callable[[Path], list[str]]
    code: int
    says: tuple[str, ...]


def _c(id_, setup, code, *says):
    return Case(id_, setup, code, says)


def _st_case(id_, header, data=b"", declared=None, *says):
    def setup(ws):
        _raw_safetensors(ws / "base" / "model.safetensors", header if isinstance(header, bytes) else _header(header),
                         data, declared)
        return _convert(ws)
    return _c(id_, setup, 1, "model.safetensors", *says)


def _index(ws: Path, weight_map) -> None:
    (ws / "base" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _outside_index(ws: Path, name: str) -> list[str]:
    shutil.copy(ws / "base" / "model.safetensors", ws / "elsewhere.safetensors")
    names = load_file(str(ws / "base" / "model.safetensors"))
    _index(ws, {k: name for k in names})
    return _convert(ws)


def _symlink_out(ws: Path) -> list[str]:
    os.symlink(ws / "base", ws / "link")
    return _convert(ws, "--overwrite", out="link")


def _cwd_out(ws: Path) -> list[str]:
    (ws / "cwd").mkdir()
    os.chdir(ws / "cwd")
    return ["convert", "--model_dir", str(ws / "base"), "--medusa_model_dir", str(ws / "heads"),
            "--output_dir", ".", "--overwrite", "--quiet"]


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _train(ws: Path, *extra: str) -> list[str]:
    data = [] if "--prompts" in extra or "--data" in extra else ["--data", str(_ids_file(ws))]
    return ["train-heads", "--model_dir", str(ws / "base"), "--output_dir", str(ws / "out"), "--num_heads", "2",
            "--steps", "2", "--new_tokens", "4", "--batch_size", "16", *data, "--quiet", *extra]


def _ids_file(ws: Path) -> Path:
    p = ws / "ids.jsonl"
    if not p.exists():
        p.write_text("".join(json.dumps({"prompt_ids": [(5 * j + i) % V for i in range(6)]}) + "\n" for j in range(4)))
    return p


def _tune(ws: Path, *extra: str, out: Path | None = None, ids: str | None = "1,2,3;4,5,6") -> list[str]:
    return ["tune-tree", "--model_dir", str(ws / "base"), "--medusa_model_dir", str(ws / "heads"),
            "--output", str(out or ws / "out" / "tree.json"), "--new_tokens", "4", "--max_nodes", "4", "--quiet",
            *(["--prompt_ids", ids] if ids else []), *extra]


def _ckpt_args(ws: Path) -> list[str]:
    return ["verify", "--model_dir", str(ws / "base"), "--checkpoint_dir", str(ws / "ck"), "--quiet",
            "--max_new_tokens", "2"]


def _ckpt(ws: Path, **changes) -> list[str]:
    assert main(_convert(ws, out="ck")) == 0
    p = ws / "ck" / "config.json"
    cfg = json.loads(p.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    p.write_text(json.dumps(cfg))
    return ["verify", "--model_dir", str(ws / "base"), "--checkpoint_dir", str(ws / "ck"), "--quiet",
            "--max_new_tokens", "2"]


CASES = [
    # -- never touch an input ------------------------------------------------------------------
    _c("out-is-model-dir", lambda ws: _convert(ws, "--overwrite", out=ws / "base"), 1,
       "is the input --model_dir", "choose an --output_dir outside"),
    _c("out-is-heads-dir", lambda ws: _convert(ws, "--overwrite", out=ws / "heads"), 1,
       "is the input --medusa_model_dir"),
    _c("out-contains-inputs", lambda ws: _convert(ws, "--overwrite", out=ws), 1, "contains the input"),
    _c("out-inside-model-dir", lambda ws: _convert(ws, out=ws / "base" / "ckpt"), 1, "lies inside the input"),
    _c("out-symlink-to-model-dir", _symlink_out, 1, "is the input --model_dir"),
    _c("out-is-working-dir", _cwd_out, 1, "is the working directory"),
    _c("out-is-a-file", lambda ws: ((ws / "out").write_text("x"), _convert(ws))[1], 1, "not a directory"),
    _c("out-not-empty", lambda ws: ((ws / "out").mkdir(), (ws / "out" / "keep").write_text("x"), _convert(ws))[2],
       1, "not empty", "--overwrite"),
    _c("model-dir-missing", lambda ws: ["convert", "--model_dir", str(ws / "nope"), "--medusa_model_dir",
                                        str(ws / "heads"), "--output_dir", str(ws / "out")], 1, "no such directory"),
    _c("heads-dir-missing", lambda ws: ["convert", "--model_dir", str(ws / "base"), "--medusa_model_dir",
                                        str(ws / "nope"), "--output_dir", str(ws / "out")], 1, "nope"),
    # -- the shard index ---------------------------------------------------------------------------
    _c("index-parent-path", lambda ws: _outside_index(ws, "../elsewhere.safetensors"), 1,
       "outside the model directory", "index.json"),
    _c("index-absolute-path", lambda ws: _outside_index(ws, "/etc/hostname"), 1, "outside the model directory"),
    _c("index-weight-map-list", lambda ws: (_index(ws, ["model.safetensors"]), _convert(ws))[1], 1,
       "weight_map is list"),
    _c("index-not-json", lambda ws: ((ws / "base" / "model.safetensors.index.json").write_text("{x"),
                                     _convert(ws))[1], 1, "is not valid JSON", "index.json"),
    _c("index-too-deep", lambda ws: ((ws / "base" / "model.safetensors.index.json").write_text(_nested(100000)),
                                     _convert(ws))[1], 1, "deeper than can be read"),
    _c("index-missing-shard", lambda ws: (_index(ws, {"x": "model-2.safetensors"}), _convert(ws))[1], 1,
       "not there"),
    # -- safetensors headers -------------------------------------------------------------------------
    _c("st-truncated", lambda ws: ((ws / "base" / "model.safetensors").write_bytes(
        (ws / "base" / "model.safetensors").read_bytes()[:-100]), _convert(ws))[1], 1, "truncated"),
    _st_case("st-header-length-huge", b"{}", b"", 10**12, "header of"),
    _st_case("st-header-not-json", b"{nope", b"", None, "is not valid JSON"),
    _st_case("st-header-list", b"[1]", b"", None, "must hold a JSON object"),
    _st_case("st-offsets-strings", {"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}},
             b"\0" * 4, None, "bad header entry"),
    _st_case("st-overlap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None,
             "overlap"),
    _st_case("st-beyond-file", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None,
             "outside the file"),
    _st_case("st-size-mismatch", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None,
             "wrong byte size"),
    _st_case("st-unknown-dtype", {"a": {"dtype": "F8_E9", "shape": [1], "data_offsets": [0, 1]}}, b"\0", None,
             "does not read"),
    _st_case("st-negative-offset", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, b"\0" * 4, None,
             "bad header entry"),
    _st_case("st-shape-bool", {"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4, None,
             "bad header entry"),
    _st_case("st-too-deep", _nested(100000).encode(), b"", None, "deeper than can be read"),
    _st_case("st-not-utf8", b"{\"\xff\": 1}", b"", None, "is not UTF-8"),
    _c("st-fifo", lambda ws: (_fifo(ws / "base" / "model.safetensors"), _convert(ws))[1], 1,
       "is not a regular file"),
    # -- config.json ---------------------------------------------------------------------------------
    _c("config-not-json", lambda ws: ((ws / "base" / "config.json").write_text("{"), _convert(ws))[1], 1,
       "config.json", "is not valid JSON"),
    _c("config-not-utf8", lambda ws: ((ws / "base" / "config.json").write_bytes(b"{\"a\": \"\xfe\"}"),
                                      _convert(ws))[1], 1, "is not UTF-8"),
    _c("config-too-deep", lambda ws: ((ws / "base" / "config.json").write_text(_nested(100000)), _convert(ws))[1],
       1, "deeper than can be read"),
    _c("config-list", lambda ws: ((ws / "base" / "config.json").write_text("[]"), _convert(ws))[1], 1,
       "must hold a JSON object"),
    _c("config-layers-string", lambda ws: (_edit_config(ws, num_hidden_layers="2"), _convert(ws))[1], 1,
       "num_hidden_layers", "expected a positive integer"),
    _c("config-kv-heads-zero", lambda ws: (_edit_config(ws, num_key_value_heads=0), _convert(ws))[1], 1,
       "num_key_value_heads is 0"),
    _c("config-hidden-size-missing", lambda ws: (_drop_config_field(ws, "hidden_size"), _convert(ws))[1], 1,
       "field 'hidden_size'", "is missing"),
    _c("config-vocab-size-missing", lambda ws: (_drop_config_field(ws, "vocab_size"), _convert(ws))[1], 1,
       "field 'vocab_size'"),
    _c("config-hidden-negative", lambda ws: (_edit_config(ws, hidden_size=-64), _convert(ws))[1], 1,
       "hidden_size is -64"),
    _c("config-rope-string", lambda ws: (_edit_config(ws, rope_theta="big"), _convert(ws))[1], 1,
       "rope_theta", "expected a number"),
    _c("config-architectures-string", lambda ws: (_edit_config(ws, architectures=ARCH), _convert(ws))[1], 1,
       "architectures", "expected a list"),
    _c("config-unknown-architecture", lambda ws: (_edit_config(ws, architectures=["FooForCausalLM"]),
                                                  _convert(ws))[1], 1, "no adapter for architecture 'FooForCausalLM'"),
    _c("config-hidden-size-wrong", lambda ws: (_edit_config(ws, hidden_size=96, head_dim=16), _convert(ws))[1], 1,
       "contradict config.json", "config.json implies"),
    _c("config-vocab-wrong", lambda ws: (_edit_config(ws, vocab_size=300), _convert(ws))[1], 1,
       "model.embed_tokens.weight has shape [251, 64]", "implies [300, 64]"),
    _c("config-more-layers", lambda ws: (_edit_config(ws, num_hidden_layers=3), _convert(ws))[1], 1,
       "not found"),
    # -- tensors -------------------------------------------------------------------------------------
    _c("tensor-int32", lambda ws: (_edit_weights(ws, lambda sd: sd.__setitem__(
        "model.norm.weight", sd["model.norm.weight"].to(torch.int32))), _convert(ws))[1], 1,
       "model.norm.weight is int32", "expected float32, float16 or bfloat16"),
    _c("tensor-float64-auto", lambda ws: (_edit_weights(ws, lambda sd: sd.update(
        {k: v.double() for k, v in sd.items()})), _edit_config(ws, torch_dtype="float64", dtype="float64"),
        _convert(ws, "--dtype", "auto"))[2], 1, "float64"),
    _c("tensor-nan", lambda ws: (_edit_weights(ws, lambda sd: sd["model.norm.weight"].__setitem__(0, float("nan"))),
                                 _convert(ws))[1], 1, "NaN/Inf", "model.safetensors [model.norm.weight]"),
    _c("tensor-extra", lambda ws: (_edit_weights(ws, lambda sd: sd.__setitem__("model.extra.weight", torch.ones(3))),
                                   _convert(ws))[1], 1, "have no place", "model.extra.weight"),
    _c("tensor-missing", lambda ws: (_edit_weights(ws, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight")),
                                     _convert(ws))[1], 1, "model.layers.1.mlp.up_proj.weight", "not found"),
    # -- heads -----------------------------------------------------------------------------------------
    _c("heads-are-a-base", lambda ws: ["convert", "--model_dir", str(ws / "base"), "--medusa_model_dir",
                                       str(ws / "base"), "--output_dir", str(ws / "out"), "--quiet"], 1,
       "this is a base model", "--medusa_model_dir"),
    _c("heads-wrong-hidden", lambda ws: (shutil.rmtree(ws / "heads"), save_heads(random_heads(32, V, num_heads=2),
                                         ws / "heads", "fasterdecoding-safetensors"), _convert(ws))[2], 1,
       "hidden"),
    _c("heads-nan", lambda ws: (_edit_weights(ws, lambda sd: sd["0.0.linear.bias"].__setitem__(0, float("inf")),
                                              "heads/medusa_lm_head.safetensors"), _convert(ws))[1], 1, "NaN/Inf"),
    _c("heads-empty-dir", lambda ws: (shutil.rmtree(ws / "heads"), (ws / "heads").mkdir(), _convert(ws))[2], 1,
       "no weights found"),
    _c("heads-config-list", lambda ws: ((ws / "heads" / "config.json").write_text("[1]"), _convert(ws))[1], 1,
       "must hold a JSON object"),
    _c("heads-config-not-json", lambda ws: ((ws / "heads" / "config.json").write_text("{"), _convert(ws))[1], 1,
       "is not valid JSON"),
    _c("heads-token-map-negative", lambda ws: (_vllm_heads(ws, [-1] + list(range(1, 100))), _convert(ws))[1], 1,
       "token id -1"),
    _c("heads-token-map-beyond-vocab", lambda ws: (_vllm_heads(ws, list(range(99)) + [V]), _convert(ws))[1], 1,
       f"token id {V}", "outside the vocabulary"),
    _c("heads-token-map-duplicate", lambda ws: (_vllm_heads(ws, [5] + list(range(5, 104))), _convert(ws))[1], 1,
       "twice"),
    # -- flags ------------------------------------------------------------------------------------------
    _c("workers-negative", lambda ws: _convert(ws, "--workers", "-3"), 2, "--workers -3"),
    _c("tp-zero", lambda ws: _convert(ws, "--tp_size", "0"), 1, "parallel-size"),
    _c("draft-len-zero", lambda ws: _convert(ws, "--max_medusa_token_len", "0"), 2, "must be positive"),
    _c("tree-deeper-than-heads", lambda ws: _convert(ws, "--medusa_choices", "[[0],[0,0],[0,0,0],[0,0,0,0]]"), 1,
       "tree-deeper-than-heads"),
    _c("tree-file-too-deep", lambda ws: ((ws / "t.json").write_text(_nested(100000)),
                                         ["tree", "--choices", f"@{ws / 't.json'}"])[1], 1, "deeper than can be read"),
    _c("tree-file-fifo", lambda ws: (_fifo(ws / "t.json"), ["tree", "--choices", f"@{ws / 't.json'}"])[1], 1,
       "is not a regular file"),
    _c("tree-file-not-utf8", lambda ws: ((ws / "t.json").write_bytes(b"\xff\xfe"),
                                         ["tree", "--choices", f"@{ws / 't.json'}"])[1], 1, "not UTF-8"),
    _c("tree-top-k-zero", lambda ws: ["tree", "--choices", "[[0]]", "--top_k", "0"], 1, "positive integer"),
    _c("tree-top-k-huge", lambda ws: ["tree", "--choices", "[[0],[1]]", "--top_k", "1000000000000"], 0),
    _c("verify-zero-tokens", lambda ws: _ckpt(ws) + ["--max_new_tokens", "0"], 2, "--max_new_tokens 0"),
    _c("verify-config-missing-field", lambda ws: _ckpt(ws, vocab_size=None), 1, "lacks vocab_size"),
    _c("verify-config-bad-mapping", lambda ws: _ckpt(ws, mapping={"tp_size": "x"}), 1, "not a valid"),
    _c("verify-prompt-beyond-vocab", lambda ws: _ckpt(ws) + ["--prompt_ids", f"1,{V + 5}"], 1,
       "outside the vocabulary"),
    _c("build-config-not-json", lambda ws: ((ws / "c").mkdir(), (ws / "c" / "config.json").write_text("nope"),
                                            ["build", "--checkpoint_dir", str(ws / "c")])[2], 1,
       "is not valid JSON"),
    _c("demo-workdir-not-creatable", lambda ws: ["demo", "--workdir", "/proc/no-such-dir/demo"], 1,
       "cannot create the demo's --workdir", "--workdir /tmp/demo-output"),
    _c("demo-foreign-workdir", lambda ws: ["demo", "--workdir", str(ws / "heads")], 1,
       "was not made by the demo"),
    _c("check-prompt-beyond-vocab", lambda ws: ["check", "--model_dir", str(ws / "base"), "--prompt_ids", "999999"],
       1, "outside the vocabulary"),
    # -- quantized conversion ----------------------------------------------------------------------------
    _c("quant-calib-fifo", lambda ws: (_fifo(ws / "calib.txt"),
                                       _convert(ws, "--qformat", "fp8", "--calib_dataset", str(ws / "calib.txt")))[1],
       1, "not a regular file", "calib.txt"),
    _c("quant-calib-hub-name", lambda ws: _convert(ws, "--qformat", "fp8", "--calib_dataset", "ccdv/cnn_dailymail"),
       1, "is not fetched", "omit --calib_dataset"),
    _c("quant-calib-missing", lambda ws: _convert(ws, "--qformat", "fp8", "--calib_dataset", str(ws / "nope.jsonl")),
       1, "not a regular file"),
    _c("quant-calib-not-utf8", lambda ws: ((ws / "calib.txt").write_bytes(b"\xff\xfe\xfa"),
                                           _convert(ws, "--qformat", "fp8", "--calib_dataset", str(ws / "calib.txt")))[1],
       1, "cannot read", "UTF-8"),
    _c("quant-calib-bad-json-line", lambda ws: ((ws / "c.jsonl").write_text('{"input_ids": [1, 2]}\n{x\n'),
                                                _convert(ws, "--qformat", "fp8", "--calib_dataset", str(ws / "c.jsonl"),
                                                         "--calib_size", "2"))[1], 1, "line 2 is not JSON"),
    _c("quant-calib-ids-beyond-vocab", lambda ws: ((ws / "c.jsonl").write_text('{"input_ids": [1, 999999]}\n'),
                                                   _convert(ws, "--qformat", "fp8", "--calib_dataset",
                                                            str(ws / "c.jsonl"), "--calib_size", "1"))[1],
       1, "outside the vocabulary"),
    _c("quant-calib-too-few", lambda ws: ((ws / "c.jsonl").write_text('{"input_ids": [1, 2]}\n'),
                                          _convert(ws, "--qformat", "fp8", "--calib_dataset", str(ws / "c.jsonl"),
                                                   "--calib_size", "4"))[1], 1, "asks for 4", "--calib_size 1"),
    _c("quant-no-tokenizer-for-packaged-prompts", lambda ws: _convert(ws, "--qformat", "fp8", "--calib_size", "2"), 1,
       "no tokenizer there (none of tokenizer.json", "--tokenizer_dir"),
    _c("quant-two-formats", lambda ws: _convert(ws, "--qformat", "fp8", "--use_weight_only"), 2, "two formats"),
    _c("quant-precision-without-weight-only", lambda ws: _convert(ws, "--weight_only_precision", "int4"), 2,
       "without --use_weight_only"),
    _c("quant-kv-contradiction", lambda ws: _convert(ws, "--kv_cache_dtype", "fp8", "--int8_kv_cache"), 2,
       "contradict"),
    _c("quant-weight-only-unpadded-widths", lambda ws: _convert(ws, "--qformat", "int8_wo"), 1,
       "[quant-weight-only-shape]", "64 x tp_size"),
    _c("quant-from-float32", lambda ws: ((ws / "c.jsonl").write_text('{"input_ids": [1, 2]}\n'),
                                         _convert(ws, "--qformat", "fp8", "--dtype", "float32", "--calib_dataset",
                                                  str(ws / "c.jsonl"), "--calib_size", "1"))[1], 1,
       "from a float32 checkpoint", "--dtype float16"),
    _c("quant-out-is-calib-file", lambda ws: ((ws / "c.jsonl").write_text('{"input_ids": [1, 2]}\n'),
                                              _convert(ws, "--qformat", "fp8", "--calib_dataset", str(ws / "c.jsonl"),
                                                       "--calib_size", "1", "--overwrite", out=ws / "c.jsonl"))[1],
       1, "is the input --calib_dataset"),
    _c("base-checkpoint-missing", lambda ws: ["convert", "--base_checkpoint_dir", str(ws / "nope"),
                                              "--medusa_model_dir", str(ws / "heads"), "--output_dir",
                                              str(ws / "out"), "--quiet"], 1, "nope: no such directory"),
    _c("base-checkpoint-has-heads", lambda ws: (main(_convert(ws, out="ck")),
                                                ["convert", "--base_checkpoint_dir", str(ws / "ck"),
                                                 "--medusa_model_dir", str(ws / "heads"), "--output_dir",
                                                 str(ws / "out"), "--quiet"])[1], 1, "has Medusa heads already"),
    # -- train-heads, tune-tree, verify, check: inputs untouched, wrong results refused --------------------------
    _c("train-work-dir-is-model-dir", lambda ws: _train(ws, "--work_dir", str(ws / "base")), 1,
       "--work_dir", "is the input --model_dir"),
    _c("train-work-dir-inside-model-dir", lambda ws: _train(ws, "--work_dir", str(ws / "base" / "w")), 1,
       "lies inside the input --model_dir"),
    _c("train-work-dir-is-a-file", lambda ws: ((ws / "w").write_text("x"), _train(ws, "--work_dir", str(ws / "w")))[1],
       1, "not a directory"),
    _c("train-work-dir-is-output", lambda ws: _train(ws, "--work_dir", str(ws / "out")), 1, "--work_dir is the --output_dir"),
    _c("train-prompts-fifo", lambda ws: (_fifo(ws / "p.txt"), _train(ws, "--prompts", str(ws / "p.txt")))[1], 1,
       "is not a regular file"),
    _c("train-data-fifo", lambda ws: (_fifo(ws / "d.jsonl"), _train(ws, "--data", str(ws / "d.jsonl")))[1], 1,
       "is not a regular file"),
    _c("train-lr-diverges", lambda ws: _train(ws, "--lr", "1e30", "--steps", "3"), 1, "NaN/Inf", "lower --lr"),
    _c("train-data-deeply-nested", lambda ws: ((ws / "d.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n"),
                                               _train(ws, "--data", str(ws / "d.jsonl")))[1], 1,
       "nests JSON deeper than can be read"),
    _c("train-prompt-beyond-positions", lambda ws: ((ws / "d.jsonl").write_text(
        json.dumps({"prompt_ids": [1] * (CFG["max_position_embeddings"] + 1)}) + "\n"),
        _train(ws, "--data", str(ws / "d.jsonl")))[1], 1, "max_position_embeddings", "shorten the prompt"),
    _c("tree-file-utf8-bom", lambda ws: ((ws / "t.json").write_bytes(b"\xef\xbb\xbf[[0], [1]]"),
                                         ["tree", "--choices", f"@{ws / 't.json'}"])[1], 0),
    _c("tree-file-huge-sparse", lambda ws: (_sparse(ws / "t.json", 1 << 22),
                                            ["tree", "--choices", f"@{ws / 't.json'}"])[1], 1,
       "more than any tree needs"),
    _c("heads-pt-with-nan-names-the-source-tensor", lambda ws: (shutil.rmtree(ws / "heads"),
                                                               _nan_pt_heads(ws / "heads"), _convert(ws))[2], 1,
       "medusa_lm_head.pt [0.0.linear.weight]", "holds NaN/Inf"),
    _c("tune-output-inside-model-dir", lambda ws: _tune(ws, out=ws / "base" / "tree.json"), 1,
       "inside the input --model_dir"),
    _c("tune-output-is-heads-config", lambda ws: _tune(ws, "--overwrite", out=ws / "heads" / "config.json"), 1,
       "inside the input --medusa_model_dir"),
    _c("tune-heads-of-another-vocab", lambda ws: (shutil.rmtree(ws / "heads"),
                                                  save_heads(random_heads(H, V + 7, num_heads=2), ws / "heads"),
                                                  _tune(ws))[2], 1, "do not fit the base"),
    _c("tune-heads-of-another-hidden-size", lambda ws: (shutil.rmtree(ws / "heads"),
                                                        save_heads(random_heads(H * 2, V, num_heads=2), ws / "heads"),
                                                        _tune(ws))[2], 1, "do not fit the base"),
    _c("tune-prompt-ids-beyond-vocab", lambda ws: _tune(ws, ids=f"1,2;{V + 3}"), 1, "outside the vocabulary"),
    _c("tune-prompts-fifo", lambda ws: (_fifo(ws / "p.txt"), _tune(ws, "--prompts", str(ws / "p.txt"), ids=None))[1],
       1, "is not a regular file"),
    _c("verify-trailing-bytes-in-rank-file", lambda ws: (_ckpt(ws), open(ws / "ck" / "rank0.safetensors", "ab").write(
        b"\0" * 16), _ckpt_args(ws))[2], 1, "16 byte(s) after the last tensor", "rank0.safetensors"),
    _c("verify-tree-beyond-max-draft-len", lambda ws: _ckpt(ws, max_draft_len=2) + ["--medusa_choices",
                                                                                   "[[0],[1],[0,0]]"], 1,
       "max_draft_len is 2", "--max_draft_len 3"),
    _c("verify-non-finite-unused-embedding-row", lambda ws: (_ckpt(ws), _edit_weights(
        ws, lambda sd: sd["transformer.vocab_embedding.weight"].__setitem__((V - 1, 0), float("nan")),
        "ck/rank0.safetensors"), _ckpt_args(ws))[2], 1, "transformer.vocab_embedding.weight", "holds NaN/Inf"),
    _c("verify-prompts-file-fifo", lambda ws: (_fifo(ws / "p.txt"), _ckpt(ws) + ["--prompts_file",
                                                                               str(ws / "p.txt")])[1], 1,
       "is not a regular file"),
    # verify --calib_dataset (a tool's checkpoint's calibration samples): a FIFO, a missing file, a directory, and a
    # file inside an input (the checkpoint's own config.json) - read only, refused before any model is loaded
    _c("verify-calib-dataset-fifo", lambda ws: (_fifo(ws / "c.txt"), _ckpt(ws) + ["--calib_dataset",
                                                                              str(ws / "c.txt")])[1], 1,
       "not a regular file"),
    _c("verify-calib-dataset-missing", lambda ws: _ckpt(ws) + ["--calib_dataset", str(ws / "nope.jsonl")], 1,
       "not a regular file"),
    _c("verify-calib-dataset-directory", lambda ws: _ckpt(ws) + ["--calib_dataset", str(ws / "heads")], 1,
       "not a regular file"),
    _c("verify-calib-dataset-inside-the-checkpoint", lambda ws: _ckpt(ws) + ["--calib_dataset",
                                                                             str(ws / "ck" / "config.json")], 1,
       "read as JSON lines"),
    _c("check-prompts-file-fifo", lambda ws: (_fifo(ws / "p.txt"), ["check", "--model_dir", str(ws / "base"),
                                                                     "--prompts_file", str(ws / "p.txt")])[1], 1,
       "is not a regular file"),
    _c("convert-tied-config-with-distinct-lm-head", lambda ws: (_edit_config(ws, tie_word_embeddings=True),
                                                                _edit_weights(ws, lambda sd: sd.__setitem__(
                                                                    "lm_head.weight",
                                                                    torch.randn(V, H))), _convert(ws))[2], 1,
       "tie_word_embeddings: true", "differs from"),
    _c("base-checkpoint-and-model-dir", lambda ws: _convert(ws, "--base_checkpoint_dir", str(ws / "heads")), 2,
       "one of them"),
]


def _digest(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p.is_fifo() or "out" in p.relative_to(root).parts[:1]:
                continue
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "-"
    return out


#: a command's status line (a phase without a progress bar of its own begins)
STATUS = re.compile(r"^(verify|check|train-heads|tune-tree): ")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(ws, case, capsys, monkeypatch):
    monkeypatch.chdir(ws)
    argv = case.setup(ws)
    capsys.readouterr()
    inputs = {k: v for k, v in _digest(ws).items() if not k.startswith(("ck/", "out/"))}
    out = Path(argv[argv.index("--output_dir") + 1]) if "--output_dir" in argv else None
    out_before = sorted(p.name for p in out.iterdir()) if out is not None and out.is_dir() else None
    out_existed = out is not None and (out.exists() or out.is_symlink())
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == case.code, err
    assert "Traceback" not in err
    for s in case.says:
        assert s in err, (s, err)
    if case.code:  # the error comes first, after at most the status lines and progress bars of work begun
        before, _, rest = err.partition("error:")
        assert rest and ("fix:" in rest or "[" in rest), err
        for line in before.replace("\r", "\n").splitlines():
            assert not line.strip() or STATUS.match(line) or "%|" in line, (line, err)
    after = {k: v for k, v in _digest(ws).items() if k in inputs}
    assert after == inputs  # every input byte-identical
    if case.code and out is not None:  # a failed convert leaves the output as it found it
        assert (out.exists() or out.is_symlink()) == out_existed
        assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else None) == out_before
        assert not list(ws.glob(".*partial*")) and not list(ws.glob(".*.lock"))


def test_at_least_sixty_hostile_cases():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


# -- environment faults, in process -------------------------------------------------------------------
@pytest.mark.parametrize("errno_name", ["ENOSPC", "EROFS", "EACCES", "EBUSY"])
def test_write_faults_are_one_message_and_leave_nothing(ws, capsys, monkeypatch, errno_name):
    import errno

    from trtllm_medusa_ports.files import checkpoint

    def failing(*a, **k):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(checkpoint.os, "pwrite", failing)
    rc = main(_convert(ws))
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and os.strerror(getattr(errno, errno_name)) in err
    assert not (ws / "out").exists() and not list(ws.glob(".out.partial-*"))


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(ws, capsys):
    import fcntl

    lock = os.open(ws / ".out.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        assert main(_convert(ws)) == 1
        assert "another trtllm-medusa convert is writing this directory" in capsys.readouterr().err
        assert not (ws / "out").exists()
    finally:
        os.close(lock)


def test_stale_partial_directories_are_removed_and_umask_followed(ws):
    stale = ws / ".out.partial-dead"
    stale.mkdir()
    (stale / "rank0.safetensors").write_bytes(b"x" * 100)
    old = os.umask(0o022)
    try:
        assert main(_convert(ws)) == 0
    finally:
        os.umask(old)
    assert not stale.exists() and (ws / "out" / "config.json").is_file()
    assert (ws / "out").stat().st_mode & 0o777 == 0o755


def test_overwrite_swaps_atomically(ws):
    assert main(_convert(ws)) == 0
    before = (ws / "out" / "config.json").stat().st_ino
    assert main(_convert(ws, "--overwrite")) == 0
    assert (ws / "out" / "config.json").stat().st_ino != before
    assert [p.name for p in ws.iterdir() if p.name.startswith(".out")] == []


def test_demo_clears_only_what_it_made(tmp_path):
    from trtllm_medusa_ports.demo import MARKER

    work = tmp_path / "demo"
    work.mkdir()
    (work / MARKER).write_text("")
    (work / "base").mkdir()
    (work / "notes.txt").write_text("mine")
    with pytest.raises(PortError, match="has no tiny demo model"):
        from trtllm_medusa_ports.demo import run_demo

        run_demo(work, quiet=True, architecture="Nope")
    assert (work / "base").is_dir() and (work / "notes.txt").read_text() == "mine"


# -- properties -------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_safetensors_reader_on_random_bytes(tmp_path, data):
    p = tmp_path / "x.safetensors"
    p.write_bytes(data)
    try:
        read_safetensors(p, PortError)
    except PortError:
        pass


_entry = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F16", "BF16", "I8", "X", 3]),
    "shape": st.lists(st.one_of(st.integers(-2, 4), st.booleans(), st.text(max_size=1)), max_size=3),
    "data_offsets": st.lists(st.one_of(st.integers(-8, 64), st.text(max_size=1)), min_size=0, max_size=3),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(min_size=1, max_size=3), _entry, max_size=4), st.integers(0, 64))
def test_safetensors_reader_on_valid_looking_headers(tmp_path, header, data_len):
    """A clean error, or tensors whose bytes lie inside the file, never overlap, and load."""
    p = tmp_path / "x.safetensors"
    _raw_safetensors(p, _header(header), bytes(range(data_len % 256)) * 1)
    try:
        tensors = read_safetensors(p, PortError)
    except PortError:
        return
    spans = sorted((header[n]["data_offsets"][0], header[n]["data_offsets"][1]) for n in tensors)
    assert all(e0 <= b1 or b1 == e1 for (_, e0), (b1, e1) in zip(spans, spans[1:], strict=False))
    for t in tensors.values():
        assert tuple(t.load().shape) == t.shape


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
@example(text="@\x00")  # a choices file name with a NUL byte (os.stat raises ValueError, not OSError)
@example(text="@")
def test_tree_parser_on_random_text(text):
    try:
        paths = parse_choices(text)
    except PortError:
        return
    assert all(isinstance(p, list) and p and all(isinstance(v, int) for v in p) for p in paths)
    validate_choices(paths)


@pytest.mark.parametrize("argv, says", [
    (["train-heads", "--model_dir", "m", "--output_dir", "o", "--batch_size", "-1"], "-1 must be at least 0"),
    (["train-heads", "--model_dir", "m", "--output_dir", "o", "--steps", "0"], "0 must be at least 1"),
    (["train-heads", "--model_dir", "m", "--output_dir", "o", "--num_heads", "x"], "'x' is not an integer"),
    (["tune-tree", "--model_dir", "m", "--medusa_model_dir", "h", "--output", "t", "--top_k", "0"], "outside 1..1000"),
    (["tune-tree", "--model_dir", "m", "--medusa_model_dir", "h", "--output", "t", "--top_k", "10000000"],
     "outside 1..1000"),
    (["tune-tree", "--model_dir", "m", "--medusa_model_dir", "h", "--output", "t", "--new_tokens", "-1"],
     "-1 is outside"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--max_quant_error", "nan"], "must be a number >= 0"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--min_quant_agreement", "nan"], "nan is outside 0..1"),
    # every float option refuses infinity by the one rule (--max_memory inf was an OverflowError deep in verify)
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--max_memory", "inf"], "inf must be a number above 0, and finite"),
    (["train-heads", "--model_dir", "m", "--output_dir", "o", "--max_memory", "1e400"], "inf must be a number above 0"),
    (["train-heads", "--model_dir", "m", "--output_dir", "o", "--lr", "inf"], "inf must be a number above 0, and finite"),
    (["check", "--model_dir", "m", "--gpu_memory_gb", "inf"], "and finite"),
    (["deploy", "--checkpoint_dir", "c", "--tokenizer_dir", "t", "--output_dir", "o", "--max_batch_size", "0"],
     "0 must be at least 1"),
    (["deploy", "--checkpoint_dir", "c", "--tokenizer_dir", "t", "--output_dir", "o", "--max_seq_len", "x"],
     "'x' is not an integer"),
    (["deploy", "--checkpoint_dir", "c", "--tokenizer_dir", "t", "--output_dir", "o", "--gpu_memory_gb", "nan"],
     "must be a number >= 0"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--min_quant_agreement", "1.5"], "1.5 is outside 0..1"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--min_quant_agreement", "-0.1"], "-0.1 is outside"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--min_quant_agreement", "half"], "'half' is not a number"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--min_quant_agreement", "inf"], "inf is outside 0..1"),
    (["convert", "--model_dir", "m", "--medusa_model_dir", "h", "--calib_size", "-3"], "must be at least 1"),
    (["check", "--model_dir", "m", "--gpu_memory_gb", "-1"], "must be a number >= 0"),
    (["convert", "--model_dir", "m", "--medusa_model_dir", "h", "--threads", "0"], "must be at least 1"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--gemm_plugin", "bogus"], "invalid choice"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--calib_size", "0"], "must be at least 1"),
    (["verify", "--model_dir", "m", "--checkpoint_dir", "c", "--calib_max_seq_length", "x"], "'x' is not an integer"),
])
def test_numeric_flags_are_range_checked_by_the_parser(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_train_heads_refuses_a_device_torch_does_not_have(ws, capsys):
    assert main(_train(ws, "--device", "bogus")) == 2  # a usage error, found by computing on it (devices.py)
    err = capsys.readouterr().err
    assert "--device 'bogus' is not a torch device" in err and "Traceback" not in err
    assert not (ws / "out").exists()


def test_a_closed_stdout_is_not_a_traceback(ws, monkeypatch):
    class Closed:
        def write(self, _):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr("sys.stdout", Closed())
    assert main(["tree", "--choices", "mc_sim_7b_63", "--json"]) == 141


def test_a_tensorrt_llm_that_imports_badly_is_one_line(ws, capsys, monkeypatch):
    import importlib

    real = importlib.import_module

    def broken(name, *a, **k):
        if name == "tensorrt_llm":
            raise OSError("libcuda.so.1: cannot open shared object file")
        return real(name, *a, **k)

    assert main(_convert(ws, out="ck")) == 0
    monkeypatch.setattr(importlib, "import_module", broken)
    assert main(["build", "--checkpoint_dir", str(ws / "ck"), "--output_dir", str(ws / "eng")]) == 1
    err = capsys.readouterr().err
    assert "its import failed (OSError: libcuda.so.1" in err and "Traceback" not in err and err.count("error:") == 1


def test_a_second_train_heads_on_one_work_dir_is_refused(ws, capsys):
    import fcntl

    work = ws / "out.train"
    work.mkdir()
    fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a first run holds it
    try:
        assert main(_train(ws)) == 1
        err = capsys.readouterr().err
        assert "another train-heads is running with this --work_dir" in err and "Traceback" not in err
        assert not (ws / "out").exists()
    finally:
        os.close(fd)
    assert main(_train(ws)) == 0 and (ws / "out" / "medusa_lm_head.safetensors").is_file()


# -- the text readers added for train-heads, tune-tree and calibration, on arbitrary bytes ----------------
_lines = st.lists(st.one_of(st.binary(max_size=40), st.sampled_from([
    b'{"prompt_ids": [1, 2]}', b'{"input_ids": []}', b'{"text": 3}', b'{"prompt": "hi"}', b"[1, 2]", b"{",
    b'{"input_ids": [1, 99999999999999999999]}', b'{"input_ids": [true, 2]}', b"\xef\xbb\xbfhello", b"\x00"])),
    max_size=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_lines, st.integers(1, 4))
def test_prompt_data_and_calibration_readers_on_arbitrary_bytes(tmp_path, lines, size):
    """Each reader gives its items or one PortError naming the file; never another exception."""
    from trtllm_medusa_ports.files.prompts import read_data_file, read_prompts_file
    from trtllm_medusa_ports.quant.calibrate import read_calibration_samples

    p = tmp_path / "f.txt"
    p.write_bytes(b"\n".join(lines))

    def tokenize(text: str) -> list[int]:
        return [ord(c) % 97 for c in text] or [0]

    for read in (read_prompts_file, lambda q: read_data_file(q, tokenize)):
        try:
            items = read(p)
        except PortError as exc:
            assert exc.where == str(p)
        else:
            assert items
    try:
        samples, source = read_calibration_samples(p, tmp_path, size=size, max_seq_length=8)
    except PortError as exc:
        assert exc.where in (str(p.resolve()), str(p)) or "tokenizer" in exc.what
    else:
        assert len(samples) == size and all(1 <= len(s) <= 8 and all(isinstance(t, int) for t in s) for s in samples)


def test_ctrl_c_while_the_corpus_is_built_claims_no_saved_state(ws, capsys, monkeypatch):
    import trtllm_medusa_ports.heads.train as train_mod

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "build_corpus", interrupted)
    assert main(_train(ws)) == 130
    err = capsys.readouterr().err
    assert "no training state was saved" in err and "--resume" not in err and not (ws / "out").exists()


def test_a_state_write_cut_short_leaves_the_last_whole_state(ws, tmp_path):
    """SIGKILL during a save: the state is written to a temporary file and renamed, so the last whole state
    stands and --resume continues from it (what a killed save leaves is a stray .tmp, ignored)."""
    from trtllm_medusa_ports.heads.fit import FitOptions, fit_heads

    g = torch.Generator().manual_seed(0)
    hidden, lm = torch.randn(200, 16, generator=g), torch.randn(30, 16, generator=g)
    targets = torch.randint(0, 30, (200, 2), generator=g)
    opts = FitOptions(num_heads=2, steps=6, lr=1e-2, batch_size=32, share_lm_head=True, save_every=2)
    straight, _ = fit_heads(hidden, targets, lm, None, opts)
    state = tmp_path / "state.pt"
    fit_heads(hidden, targets, lm, None, opts, state_path=state, stop_after=4)
    state.with_suffix(".tmp").write_bytes(b"\x80half a pickle")  # the killed save's leftover
    resumed, hist = fit_heads(hidden, targets, lm, None, opts, state_path=state, resume=True)
    assert hist[-1]["step"] == 6
    assert all(torch.equal(a[0][0], b[0][0]) for a, b in zip(resumed.blocks, straight.blocks, strict=True))


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EROFS"])
def test_train_heads_on_a_full_or_read_only_disk_is_one_message_and_keeps_the_state(ws, capsys, monkeypatch,
                                                                                   errno_name):
    import errno

    import safetensors.torch as st_torch

    def failing(*a, **k):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(st_torch, "save_file", failing)
    assert main(_train(ws)) == 1
    err = capsys.readouterr().err
    assert "could not write the heads" in err and "--resume" in err and "Traceback" not in err
    assert not (ws / "out").exists() and (ws / "out.train" / "state.pt").is_file()
    assert not list(ws.glob(".out.partial*"))


def test_an_output_dir_that_is_a_file_is_named_so_and_never_replaced(ws, capsys):
    """A regular file as train-heads' --output_dir is not 'not empty' with an --overwrite fix: --overwrite replaces a
    directory, never a file (issue 57, 10)."""
    f = ws / "a-file"
    f.write_text("mine")
    argv = _train(ws)
    argv[argv.index("--output_dir") + 1] = str(f)
    assert main([*argv, "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "exists and is not a directory" in err and "--overwrite" not in err and f.read_text() == "mine"


def test_a_bare_at_sign_names_no_tree_file(capsys):
    assert main(["tree", "--choices", "@"]) == 2  # the command line's own text (user guide, "Exit codes")
    err = capsys.readouterr().err
    assert "'@' names no file" in err and "@tree.json" in err and "is not a regular file" not in err


@pytest.mark.parametrize("arch, field, value", [
    ("Qwen2MoeForCausalLM", "norm_topk_prob", "false"), ("Qwen2MoeForCausalLM", "norm_topk_prob", None),
    ("Qwen2MoeForCausalLM", "norm_topk_prob", 1), ("GPTBigCodeForCausalLM", "multi_query", "false"),
    ("LlamaForCausalLM", "tie_word_embeddings", "no"),
])
def test_a_switch_of_another_json_type_is_refused_not_read_as_its_truth_value(tmp_path, store, capsys, arch, field,
                                                                             value):
    """One typed reader (files/hf_model.py): "false" is truthy, 1 and null are not booleans; transformers' config
    classes refuse them, and a port that read them would silently pick the other routing or attention layout."""
    import shutil

    from conftest import tiny_base

    from trtllm_medusa_ports.files.hf_model import assign
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

    base = tmp_path / "base"
    shutil.copytree(tiny_base(store, arch), base)
    cfg = json.loads((base / "config.json").read_text())
    assign(cfg, field, value)
    (base / "config.json").write_text(json.dumps(cfg))
    c = tiny_config(arch)
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2), tmp_path / "heads")
    assert main(["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                 str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"field {field} is {json.dumps(value)}; expected true or false" in err and "config.json" in err
    assert "JSON boolean" in err and not (tmp_path / "out").exists()


def test_a_resume_on_another_corpus_is_refused_naming_it(ws, capsys):
    """The corpus dtype is part of what the saved state was fitted on (issue 57, 3): resuming a float32 run with
    another --dtype built a new corpus and continued the old state on it without a word."""
    from trtllm_medusa_ports import api

    opts = dict(model_dir=ws / "base", output_dir=ws / "out", work_dir=ws / "work", prompts=api.PromptInputs(
        data=_ids_file(ws)), new_tokens=4, stop_after=1,
        fit=api.FitOptions(num_heads=2, steps=4, batch_size=16, quiet=True, save_every=1))
    api.train_heads(api.TrainOptions(dtype="float32", **opts))
    assert (ws / "work" / "state.pt").is_file()
    with pytest.raises(HeadsError, match=r"the saved run used other settings \(corpus\); the corpus differs") as e:
        api.train_heads(api.TrainOptions(dtype="bfloat16", resume=True, **opts))
    assert "--dtype as the saved run resolved it" in e.value.fix
    api.train_heads(api.TrainOptions(dtype="float32", resume=True, **{**opts, "stop_after": None}))  # same: goes on


def test_convert_without_dtype_keeps_the_base_dtype_where_float16_overflows(tmp_path, store, capsys):
    """convert's default --dtype float16 on a bfloat16 base whose activations leave float16's range wrote a
    checkpoint build refuses (issue 57, 8): without --dtype, such a family keeps the base's own dtype, and says so;
    an explicit --dtype float16 still carries the finding, said once."""
    from conftest import tiny_base

    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

    base = tiny_base(store, "Gemma3ForCausalLM")
    c = tiny_config("Gemma3ForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2), tmp_path / "heads")
    args = ["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--quiet"]
    assert main([*args, "--output_dir", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert "the base's own dtype (--dtype auto), not float16" in err and cfg["dtype"] != "float16"
    assert not [w for w in cfg["medusa_ports"]["warnings"] if w.startswith("[float16-range]")]
    assert main([*args, "--output_dir", str(tmp_path / "b"), "--dtype", "float16"]) == 0
    err = capsys.readouterr().err
    assert err.count("hidden states exceed float16's range") == 1  # the finding, once
    plain = tiny_base(store, "LlamaForCausalLM")
    lc = tiny_config("LlamaForCausalLM")
    lheads = save_heads(random_heads(lc.hidden_size, lc.vocab_size, num_heads=2), tmp_path / "lheads")
    assert main(["convert", "--model_dir", str(plain), "--medusa_model_dir", str(lheads), "--output_dir",
                 str(tmp_path / "c"), "--quiet"]) == 0
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "float16"  # upstream's default
    assert "from a bfloat16 base" not in capsys.readouterr().err  # a float32 base: nothing to say
    # a bfloat16 base of another family: convert cannot measure its activations (it never runs the base), so the
    # default says where the range is checked and names the fix up front
    from trtllm_medusa_ports.fixtures.synthetic import save_tiny_base

    bf16 = save_tiny_base("LlamaForCausalLM", tmp_path / "llama-bf16", seed=0, dtype=torch.bfloat16)
    assert main(["convert", "--model_dir", str(bf16), "--medusa_model_dir", str(lheads), "--output_dir",
                 str(tmp_path / "d"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "float16, as upstream's script, from a bfloat16 base" in err and "--dtype bfloat16" in err
    assert json.loads((tmp_path / "d" / "config.json").read_text())["dtype"] == "float16"


@pytest.mark.parametrize("arch, field, value, says", [
    ("GPT2LMHeadModel", "n_inner", "x", "expected a positive integer"),
    ("MixtralForCausalLM", "sliding_window", "3", "expected a non-negative integer (or null)"),
    ("CohereForCausalLM", "logit_scale", None, "field logit_scale is null; Cohere multiplies its logits by it"),
    ("CohereForCausalLM", "logit_scale", "x", "field logit_scale is \"x\"; expected a finite number"),
    ("GraniteForCausalLM", "logits_scaling", 0, "field logits_scaling is 0; expected a number above 0"),
    ("GraniteForCausalLM", "residual_multiplier", [], "expected a finite number"),
    ("NemotronForCausalLM", "norm_eps", {}, "expected a finite number"),
    ("MptForCausalLM", "expansion_ratio", "4", "expected a finite number"),
    ("MptForCausalLM", "attn_config", "x", "field attn_config is \"x\"; expected a JSON object (or null)"),
    # fields inside nested objects, named by their path (issue 66: HFConfig reads paths)
    ("MptForCausalLM", "attn_config.alibi", "yes", "field attn_config.alibi is \"yes\"; expected true or false"),
    ("MptForCausalLM", "attn_config.alibi_bias_max", "8", "field attn_config.alibi_bias_max is '8'; expected a number"),
    ("MptForCausalLM", "attn_config.kv_n_heads", 0, "field attn_config.kv_n_heads is 0; expected a positive integer"),
    ("Gemma3ForCausalLM", "layer_types", True, "expected a list of strings (or null)"),
    ("Qwen2MoeForCausalLM", "mlp_only_layers", 1.5, "expected a list of layer indices (or null)"),
    ("Qwen2MoeForCausalLM", "decoder_sparse_step", "1", "expected a positive integer"),
])
def test_a_family_field_of_another_json_type_is_named_not_a_traceback(tmp_path, store, capsys, arch, field, value,
                                                                      says):
    """Issue 63, 2: the base config.json fields the families' adapters read, typed by the one reader
    (files/hf_model.py) for check and convert alike: each of these was a TypeError, ValueError, AttributeError or
    ZeroDivisionError where the adapter first used it."""
    import shutil

    from conftest import tiny_base

    from trtllm_medusa_ports.files.hf_model import assign
    from trtllm_medusa_ports.fixtures.synthetic import random_heads, save_heads, tiny_config

    base = tmp_path / "base"
    shutil.copytree(tiny_base(store, arch), base)
    cfg = json.loads((base / "config.json").read_text())
    assign(cfg, field, value)
    (base / "config.json").write_text(json.dumps(cfg))
    c = tiny_config(arch)
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2), tmp_path / "heads")
    for argv in (["check", "--model_dir", str(base), "--medusa_model_dir", str(heads)],
                 ["convert", "--model_dir", str(base), "--medusa_model_dir", str(heads), "--output_dir",
                  str(tmp_path / "out"), "--quiet"]):
        capsys.readouterr()
        # check cannot read the base (1), or reads it and reports the field as invalid-config (3: NOT COMPATIBLE)
        assert main(argv) in ((1, EXIT_FOUND) if argv[0] == "check" else (1,))
        said = capsys.readouterr()
        said = said.out + said.err  # check's findings are its report (stdout); convert's error is on stderr
        assert says in said and str(base / "config.json") in said and "Traceback" not in said, said
    assert not (tmp_path / "out").exists()
