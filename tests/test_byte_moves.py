"""The conversion's fast path (files/byte_moves.py): the bytes it writes, where it is taken, and that
it runs without torch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_base
from safetensors.torch import load_file, save_file

import trtllm_medusa_ports
from trtllm_medusa_ports.archs import adapter_for
from trtllm_medusa_ports.archs.registry import family_test_cases
from trtllm_medusa_ports.archs.weights import Place, ValueTransform
from trtllm_medusa_ports.conversion.convert import ConvertOptions, convert
from trtllm_medusa_ports.errors import HeadsError, ModelError
from trtllm_medusa_ports.files import byte_moves
from trtllm_medusa_ports.files.hf_model import HFConfig
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_base,
    tiny_config,
)

ALL = [("LlamaForCausalLM", {}), ("MistralForCausalLM", {}), ("Qwen2ForCausalLM", {}),
       ("BloomForCausalLM", {}), ("MptForCausalLM", {})] + family_test_cases()["variants"]


def _heads(base, path, layout="fasterdecoding-safetensors"):
    hf = HFConfig.read(base)
    hidden = adapter_for(hf.architecture).hidden_size(hf)
    return save_heads(random_heads(hidden, hf.get("vocab_size"), num_heads=2, seed=3), path, layout)


def _both(tmp_path, base, heads, **kw):
    """Rank files written with the fast path and with every tensor through torch; the fast run's result."""
    kw.setdefault("allow_unsupported", True)
    out = {}
    for fast in (True, False):
        res = convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / f"fast{fast}",
                                     quiet=True, fast_path=fast, **kw))
        out[fast] = res
    world = out[True].num_ranks
    for r in range(world):
        a = (tmp_path / "fastTrue" / f"rank{r}.safetensors").read_bytes()
        b = (tmp_path / "fastFalse" / f"rank{r}.safetensors").read_bytes()
        assert a == b, f"rank {r} differs between the byte path and the tensor path"
    assert set(out[False].moves.values()) == {"tensor"}
    return out[True]


#: one base per q/k/v layout (separate, [q;k;v] fused, per-head interleaved, grouped) and the value transform
CAST = [("LlamaForCausalLM", {}), ("Phi3ForCausalLM", {}), ("GPTNeoXForCausalLM", {}), ("FalconForCausalLM", {}),
        ("GemmaForCausalLM", {})]


@pytest.mark.parametrize("arch, overrides", ALL, ids=[f"{a}-{i}" for i, (a, _) in enumerate(ALL)])
def test_byte_path_writes_the_tensor_paths_bytes_for_every_family(tmp_path, store, arch, overrides):
    base = tiny_base(store, arch, **overrides)
    heads = _heads(base, tmp_path / "h")
    same = _both(tmp_path / "same", base, heads, tp_size=2)  # float32 -> float32: bytes only
    assert "byte-copy" in same.moves.values() and "convert" not in same.moves.values()
    # every base tensor, fused 3-D experts (Granite-MoE) and shared experts (Qwen2-MoE) included, moves as bytes,
    # but for value transforms (Gemma's w + 1 norms); the heads are made in memory from their own layout
    hf = HFConfig.read(base)
    ad = adapter_for(arch)
    # value transforms, and combines a family declares tensor-path (weights.tensor_path: GPT-2's Conv1D transposes)
    transformed = tuple(r.name for place in Place for r in ad.rules_at(place, hf)
                        if isinstance(r.combine, ValueTransform) or hasattr(r.combine, "tensor_path_reason"))
    assert not [n for n, how in same.moves.items()
                if how == "tensor" and not n.startswith("medusa_heads.") and not n.endswith(transformed)]


@pytest.mark.parametrize("arch, overrides", CAST, ids=[a for a, _ in CAST])
def test_converting_path_writes_the_tensor_paths_bytes(tmp_path, store, arch, overrides):
    base = tiny_base(store, arch, **overrides)
    cast = _both(tmp_path, base, _heads(base, tmp_path / "h"), tp_size=2, dtype="bfloat16")
    assert "convert" in cast.moves.values() and "byte-copy" not in cast.moves.values()


@pytest.mark.parametrize("source, dtype, path", [
    (None, "auto", "strided"), (None, "bfloat16", "convert"), (None, "float16", "convert"),
    (torch.bfloat16, "float16", "convert"),  # the field-moving bfloat16 -> float16 cast, block by block
])
def test_chunked_paths_in_many_small_chunks_and_blocks_write_the_tensor_paths_bytes(tmp_path, store, monkeypatch,
                                                                                    source, dtype, path):
    """Chunks of a few rows and numpy blocks of a few elements: every piece spans many chunks and
    every chunk many blocks, through buffers reused from chunk to chunk and piece to piece."""
    from trtllm_medusa_ports.files import dtypes

    monkeypatch.setattr(byte_moves, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(byte_moves, "_CHECK_BLOCK", 37)
    monkeypatch.setattr(dtypes, "_BLOCK", 53)
    if source is None:
        base = tiny_base(store, "LlamaForCausalLM")
    else:
        base = save_tiny_base("LlamaForCausalLM", tmp_path / "base", seed=5, dtype=source)
    res = _both(tmp_path, base, _heads(base, tmp_path / "h"), tp_size=2, dtype=dtype)
    assert path in res.moves.values()


def test_the_non_finite_check_finds_a_value_in_any_block(monkeypatch):
    import numpy as np

    monkeypatch.setattr(byte_moves, "_CHECK_BLOCK", 16)
    for np_dtype, mask, nan in ((np.uint16, 0x7C00, 0x7E00), (np.uint32, 0x7F800000, 0x7FC00000)):
        bits = np.full(100, 0x3C00 if np_dtype is np.uint16 else 0x3F800000, dtype=np_dtype)
        assert not byte_moves._non_finite(bits, mask)
        for at in (0, 15, 16, 50, 99):  # first and last of a block, a block's start, the ragged last block
            bad = bits.copy()
            bad[at] = nan
            assert byte_moves._non_finite(bad, mask), (np_dtype, at)
            bad[at] = mask  # infinity
            assert byte_moves._non_finite(bad, mask), (np_dtype, at)


@pytest.mark.parametrize("tp, pp, dtype, kw", [
    (4, 1, "float16", {}),  # 1 KV head over 4 ranks: duplicated KV rows
    (2, 2, "auto", {"use_parallel_embedding": True}),  # vocab-padded embedding rows
    (2, 1, "auto", {"use_parallel_embedding": True, "embedding_sharding_dim": 1}),  # embedding split on dim 1
    (3, 1, "auto", {}),  # vocab 251 padded to 252 rows
])
def test_byte_path_matches_on_parallel_layouts(tmp_path, store, tp, pp, dtype, kw):
    arch = "MistralForCausalLM" if tp == 4 else "LlamaForCausalLM"
    overrides = {"num_hidden_layers": 2} if pp > 1 else {}
    if tp == 3:
        arch, overrides = "LlamaForCausalLM", {"num_attention_heads": 6, "num_key_value_heads": 3,
                                                "hidden_size": 96, "intermediate_size": 96}
    base = tiny_base(store, arch, **overrides)
    heads = _heads(base, tmp_path / "h")
    _both(tmp_path, base, heads, tp_size=tp, pp_size=pp, dtype=dtype, **kw)


def test_plan_marks_each_job_with_its_path(tmp_path, store):
    base = tiny_base(store, "Qwen2ForCausalLM", tie_word_embeddings=False)
    st = _heads(base, tmp_path / "st")
    res = _both(tmp_path / "a", base, st, tp_size=2)
    moves = res.moves
    # dim-0 splits, the q/k/v concatenation, replicas and the vocab pad are byte ranges
    for label in ("layers.0.attention.qkv.weight", "layers.0.attention.qkv.bias", "layers.0.mlp.fc.weight",
                  "layers.0.input_layernorm.weight", "lm_head.weight", "transformer.vocab_embedding.weight",
                  "medusa_heads.0.medusa_layers.0.linear.weight", "medusa_heads.1.lm_head.weight"):
        assert moves[label] == "byte-copy", label
    # dim-1 splits take a column range of every row
    for label in ("layers.0.attention.dense.weight", "layers.1.mlp.proj.weight"):
        assert moves[label] == "strided", label
    # a dtype change goes through torch's cast, chunk by chunk
    cast = _both(tmp_path / "b", base, st, tp_size=2, dtype="float16")
    assert {cast.moves[k] for k in moves} == {"convert"}
    # pickled heads are no byte range: the tensor path
    pt = _both(tmp_path / "c", base, _heads(base, tmp_path / "pt", "fasterdecoding-pt"), tp_size=2)
    assert pt.moves["medusa_heads.0.lm_head.weight"] == "tensor"
    assert pt.moves["layers.0.attention.qkv.weight"] == "byte-copy"


def test_value_transforms_and_fused_layouts_take_their_paths(tmp_path, store):
    gemma = tiny_base(store, "GemmaForCausalLM")
    res = _both(tmp_path / "g", gemma, _heads(gemma, tmp_path / "gh"), tp_size=2)
    assert res.moves["layers.0.input_layernorm.weight"] == "tensor"  # w + 1 in float32, then the cast
    assert res.moves["layers.0.attention.qkv.weight"] == "byte-copy"
    bloom = tiny_base(store, "BloomForCausalLM")
    res = _both(tmp_path / "b", bloom, _heads(bloom, tmp_path / "bh"), tp_size=2)
    assert res.moves["layers.0.attention.qkv.weight"] == "byte-copy"  # per-head interleaved rows, reordered


def test_trace_follows_the_rules_own_split():
    src = byte_moves.Source(path=None, offset=0, shape=(8, 4), dtype="float16")
    from trtllm_medusa_ports.weights.sharding import Split, shard

    def run(rule, rank):
        return byte_moves.trace([src], [(rank, "w")], lambda ins, r: shard(rule, ins[0], tp_size=2, tp_rank=r),
                                lambda r, n: shard(rule, torch.empty(8, 4, device="meta"), tp_size=2, tp_rank=r).shape,
                                "float16", 2)

    col = run(Split.COLUMN, 1)
    assert col.kind is byte_moves.MoveKind.BYTE_COPY
    assert [(p.row_start, p.row_end, p.col_start, p.col_end, p.dest_offset) for p in col.pieces] == [(4, 8, 0, 4, 0)]
    row = run(Split.ROW, 1)
    assert row.kind is byte_moves.MoveKind.STRIDED
    assert [(p.row_start, p.row_end, p.col_start, p.col_end) for p in row.pieces] == [(0, 8, 2, 4)]


@pytest.mark.parametrize("tensor, at, value, dtype, label", [
    ("model.layers.0.mlp.up_proj.weight", (1, 1), float("inf"), "auto", "layers.0.mlp.gate.weight"),  # byte copy
    # the last row: in rank 1's half, which rank 1's lane checks
    ("model.layers.0.mlp.up_proj.weight", (-1, -1), float("nan"), "auto", "layers.0.mlp.gate.weight"),
    # replicated to both ranks: checked once, by rank 0's lane
    ("model.layers.0.input_layernorm.weight", (-1,), float("nan"), "auto", "layers.0.input_layernorm.weight"),
    ("model.layers.0.self_attn.o_proj.weight", (1, 1), float("nan"), "auto", "layers.0.attention.dense.weight"),
    ("model.layers.0.self_attn.o_proj.weight", (2, -1), float("inf"), "auto", "layers.0.attention.dense.weight"),
    ("model.layers.0.mlp.down_proj.weight", (1, 1), 1e6, "float16", "layers.0.mlp.proj.weight"),  # overflows the cast
    ("model.layers.0.mlp.down_proj.weight", (-1, -1), 1e6, "float16", "layers.0.mlp.proj.weight"),
])
def test_non_finite_values_are_refused_on_every_path(tmp_path, store, tensor, at, value, dtype, label):
    base = tiny_base(store, "LlamaForCausalLM", num_hidden_layers=1)
    bad = tmp_path / "bad"
    bad.mkdir()
    sd = {}
    for f in sorted(base.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    sd[tensor][at] = value
    save_file(sd, str(bad / "model.safetensors"))
    (bad / "config.json").write_text((base / "config.json").read_text())
    c = tiny_config("LlamaForCausalLM")
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size), tmp_path / "h", "fasterdecoding-safetensors")
    with pytest.raises(ModelError, match=f"{label} holds NaN/Inf"):
        convert(ConvertOptions(model_dir=bad, medusa_model_dir=heads, output_dir=tmp_path / "out", dtype=dtype,
                               tp_size=2, quiet=True))
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_small_moves_take_one_thread_and_two_lanes_write_the_same_bytes_and_stop_at_a_failure(tmp_path, store,
                                                                                                monkeypatch):
    """A tiny base's byte moves are written on the calling thread (rank_writer.lane_threads); the two lanes a large
    conversion takes (here: the threshold lowered to nothing) write the same bytes, and a NaN in one lane fails the
    conversion with its tensor named and nothing left behind."""
    import concurrent.futures

    from trtllm_medusa_ports.conversion import rank_writer

    pools = []

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers=None, **kw):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers, **kw)

    monkeypatch.setattr(rank_writer, "ThreadPoolExecutor", Pool)
    base = tiny_base(store, "LlamaForCausalLM")
    heads = _heads(base, tmp_path / "h")

    def run(out, model=base):
        return convert(ConvertOptions(model_dir=model, medusa_model_dir=heads, output_dir=tmp_path / out, tp_size=2,
                                      quiet=True))
    assert "byte-copy" in run("one").moves.values() and pools == []
    monkeypatch.setattr(rank_writer, "TWO_LANES_MIN_BYTES", 0)
    run("two")
    assert pools == [2]
    _same_files(tmp_path / "two", tmp_path / "one")
    bad = tmp_path / "bad"
    bad.mkdir()
    sd = {}
    for f in sorted(base.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    sd["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    save_file(sd, str(bad / "model.safetensors"))
    (bad / "config.json").write_text((base / "config.json").read_text())
    with pytest.raises(ModelError, match=r"layers\.1\.mlp\.proj.* holds NaN/Inf"):
        run("out", bad)
    assert pools == [2, 2] and not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_non_finite_heads_on_the_byte_path_blame_the_heads(tmp_path, store):
    base = tiny_base(store, "LlamaForCausalLM")
    c = tiny_config("LlamaForCausalLM")
    heads = random_heads(c.hidden_size, c.vocab_size, num_heads=2)
    heads.lm_heads[1][3, 3] = float("nan")
    hdir = save_heads(heads, tmp_path / "h", "fasterdecoding-safetensors")
    with pytest.raises(HeadsError, match="medusa_heads.1.lm_head.weight holds NaN/Inf"):
        convert(ConvertOptions(model_dir=base, medusa_model_dir=hdir, output_dir=tmp_path / "o", quiet=True))


@pytest.mark.parametrize("window", [1000, 1512])  # check windows that end mid-row, at varying places
def test_byte_copies_checked_in_small_windows_write_the_same_bytes_and_check_every_window(tmp_path, store,
                                                                                         monkeypatch, window):
    monkeypatch.setattr(byte_moves, "CHECK_WINDOW", window)
    base = tiny_base(store, "Qwen2ForCausalLM")
    heads = _heads(base, tmp_path / "h")
    _both(tmp_path, base, heads, tp_size=2)
    # a NaN at the end of rank 1's half of a dim-0 split and one mid-tensor, each alone
    sd = {}
    for f in sorted(base.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    name = "model.layers.0.mlp.up_proj.weight"
    for at in [(-1, -1), (sd[name].shape[0] // 2 - 1, 3)]:
        bad = tmp_path / f"bad{at[0]}"
        bad.mkdir()
        one = dict(sd)
        one[name] = sd[name].clone()
        one[name][at] = float("nan")
        save_file(one, str(bad / "model.safetensors"))
        (bad / "config.json").write_text((base / "config.json").read_text())
        with pytest.raises(ModelError, match="layers.0.mlp.gate.weight holds NaN/Inf"):
            convert(ConvertOptions(model_dir=bad, medusa_model_dir=heads, output_dir=tmp_path / "out", tp_size=2,
                                   quiet=True))
        assert not (tmp_path / "out").exists()


def test_without_copy_file_range_bytes_are_moved_by_hand(tmp_path, store, monkeypatch):
    import errno
    import os

    def unsupported(*a, **k):
        raise OSError(errno.EXDEV, "cross-device")

    base = tiny_base(store, "Qwen2ForCausalLM")
    heads = _heads(base, tmp_path / "h")
    monkeypatch.setattr(os, "copy_file_range", unsupported)
    _both(tmp_path, base, heads, tp_size=2)


def test_the_shape_cache_key_reads_transformers_version_without_importing_it():
    from importlib.metadata import version

    from trtllm_medusa_ports.files.hf_model import _transformers_version

    assert _transformers_version() == version("transformers")


def test_transformers_shapes_are_cached_per_config_and_still_checked(tmp_path, store, monkeypatch):
    import json
    import shutil

    from trtllm_medusa_ports.files.hf_model import HFModel, shape_cache_dir

    monkeypatch.setenv("TRTLLM_MEDUSA_CACHE", str(tmp_path / "cache"))  # the run's is shared with other workers
    base = tmp_path / "base"
    shutil.copytree(tiny_base(store, "LlamaForCausalLM", num_hidden_layers=1), base)
    cfg = json.loads((base / "config.json").read_text())
    cfg["_note"] = "a config no other test has"  # its own cache entry
    (base / "config.json").write_text(json.dumps(cfg))
    before = set(shape_cache_dir().glob("*.json")) if shape_cache_dir().exists() else set()
    fresh = HFModel(base).expected_shapes()
    added = set(shape_cache_dir().glob("*.json")) - before
    assert len(added) == 1 and fresh["model.embed_tokens.weight"] == (cfg["vocab_size"], cfg["hidden_size"])
    assert HFModel(base).expected_shapes() == fresh  # read back
    # the weights are still compared with the (cached) shapes: a config that no longer fits them is refused
    cfg["vocab_size"] += 1
    (base / "config.json").write_text(json.dumps(cfg))
    problems = HFModel(base).weight_problems()
    assert any("model.embed_tokens.weight" in p and "config.json implies" in p for p in problems)


# -- byte moves without torch ---------------------------------------------------------------
_PACKAGE_ROOT = Path(trtllm_medusa_ports.__file__).resolve().parent.parent
#: runs convert/convert_checkpoint.py as a user does, then reports which heavy modules it imported
_REPORT = """
import json, runpy, sys
script, *args = sys.argv[1:]
sys.argv = [script, *args]
try:
    runpy.run_path(script, run_name="__main__")
    rc = 0
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "imported": sorted(m for m in ("torch", "transformers", "safetensors", "tqdm")
                                              if m in sys.modules)}))  # tqdm: only for a progress bar, none with --quiet
"""


def _cli_convert(base: Path, heads: Path, out: Path, *flags: str) -> tuple[int, list[str], str]:
    """``convert_checkpoint.py`` in a fresh interpreter: exit code, heavy modules imported, stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    script = _PACKAGE_ROOT / "convert" / "convert_checkpoint.py"
    r = subprocess.run([sys.executable, "-c", _REPORT, str(script), "--model_dir", str(base), "--medusa_model_dir",
                        str(heads), "--output_dir", str(out), "--tp_size", "2", "--quiet", *flags],
                       capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(r.stdout.strip().splitlines()[-1])
    return report["rc"], report["imported"], r.stderr


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and "config.json" in names and "rank1.safetensors" in names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs"


@pytest.mark.parametrize("arch, dtype", [("Qwen2ForCausalLM", "float16"), ("Phi3ForCausalLM", "float32"),
                                         ("GPTNeoXForCausalLM", "float32"), ("FalconForCausalLM", "float32"),
                                         ("DbrxForCausalLM", "float32")])  # experts' transposed down-projection
def test_a_conversion_that_only_moves_bytes_never_imports_torch(tmp_path, store, arch, dtype):
    # separate q/k/v, [q; k; v] fused with Phi-3's [gate; up] -> [up; gate], per-head interleaved, grouped:
    # every layout combine is traced on numpy stand-ins
    if dtype == "float16":
        base = save_tiny_base(arch, tmp_path / "base", seed=5, dtype=torch.float16)
        c = tiny_config(arch)
        heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=3), tmp_path / "h",
                           "fasterdecoding-safetensors", dtype=torch.float16)
    else:
        base = tiny_base(store, arch)
        heads = _heads(base, tmp_path / "h")
    # the reference: every tensor through torch; it also fills the shape cache, as any first conversion does
    ref = convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "ref", dtype=dtype,
                                 tp_size=2, quiet=True, fast_path=False))
    fast = convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "fast", dtype=dtype,
                                  tp_size=2, quiet=True))
    assert set(fast.moves.values()) <= {"byte-copy", "strided", "transposed"} and "byte-copy" in fast.moves.values()
    assert ref.config["dtype"] == dtype
    rc, imported, err = _cli_convert(base, heads, tmp_path / "cli", "--dtype", dtype)
    assert rc == 0, err
    assert imported == [], f"a byte-move conversion imported {imported}"
    _same_files(tmp_path / "cli", tmp_path / "ref")


def test_a_dtype_change_is_cast_without_torch_and_pickles_still_need_it(tmp_path, store):
    base = tiny_base(store, "Qwen2ForCausalLM")  # float32 -> bfloat16 and -> float16
    heads = _heads(base, tmp_path / "h")
    for dtype in ("bfloat16", "float16"):
        convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / f"ref-{dtype}",
                               dtype=dtype, tp_size=2, quiet=True, fast_path=False))
        rc, imported, err = _cli_convert(base, heads, tmp_path / f"cli-{dtype}", "--dtype", dtype)
        assert rc == 0, err
        assert imported == [], f"a converting conversion imported {imported}"  # numpy casts, torch's bits
        _same_files(tmp_path / f"cli-{dtype}", tmp_path / f"ref-{dtype}")
    # where torch's faster cast pays for its import it is used: same bytes
    from trtllm_medusa_ports.files import byte_moves

    def no_numpy_cast(*a):
        raise AssertionError("numpy cast used where torch's pays")

    old = byte_moves.TORCH_IMPORT_S, byte_moves.cast_bits
    byte_moves.TORCH_IMPORT_S, byte_moves.cast_bits = 0, no_numpy_cast
    try:
        res = convert(ConvertOptions(model_dir=base, medusa_model_dir=heads, output_dir=tmp_path / "torch-cast",
                                     dtype="bfloat16", tp_size=2, quiet=True))
    finally:
        byte_moves.TORCH_IMPORT_S, byte_moves.cast_bits = old
    assert "convert" in res.moves.values()
    _same_files(tmp_path / "torch-cast", tmp_path / "ref-bfloat16")
    # pickled heads need torch to be read at all, even in the checkpoint's own dtype
    pt = _heads(base, tmp_path / "pt", "fasterdecoding-pt")
    rc, imported, err = _cli_convert(base, pt, tmp_path / "pt-out", "--dtype", "float32")
    assert rc == 0 and "torch" in imported, err


@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32"])
def test_numpy_casts_give_torchs_bits(src):
    """Every float16 / bfloat16 bit pattern, and float32 values around every rounding edge."""
    import numpy as np

    from trtllm_medusa_ports.files.dtypes import cast_bits

    names = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if src == "float32":
        g = torch.Generator().manual_seed(0)
        scales = (1e-40, 1e-7, 1e-3, 1.0, 1e3, 6.5e4, 1e30)
        vals = torch.cat([torch.randn(20000, generator=g) * s for s in scales]
                         + [torch.tensor([65504.0, 65519.0, 65520.0, -65520.0, 2.98e-8, 2.99e-8, 1e-45, 0.0, -0.0])])
        ties = torch.randint(0, 2**31 - 2**24, (20000,), generator=g, dtype=torch.int64) & ~0xFFFF | 0x8000
        vals = torch.cat([vals, ties.to(torch.int32).view(torch.float32)])  # bfloat16 midpoints: ties to even
    else:
        vals = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(names[src])
    raw = vals.contiguous().view(torch.uint8).numpy().tobytes()
    for dst, dt in names.items():
        if dst == src:
            continue
        want = vals.to(dt)
        got = cast_bits(raw, src, dst)
        finite = torch.isfinite(want).numpy()
        want_bits = want.view(torch.int16 if dt.itemsize == 2 else torch.int32).numpy().view(got.dtype)
        assert np.array_equal(got[finite], want_bits[finite]), (src, dst)
        got_t = torch.from_numpy(got.view(np.int16 if dt.itemsize == 2 else np.int32).copy()).view(dt)
        assert not torch.isfinite(got_t[torch.from_numpy(~finite)]).any(), (src, dst)  # NaN/Inf stay so
    with pytest.raises(ValueError, match="float64"):
        cast_bits(b"\0" * 8, "float64", "float16")


@pytest.mark.parametrize("size, chunks", [(8, 2), (7, 3), (5, 4), (3, 5), (0, 2)])
def test_array_helpers_give_torchs_pieces_on_numpy(size, chunks):
    import numpy as np

    from trtllm_medusa_ports.weights import arrays

    t = torch.arange(size * 6).reshape(size, 6)
    for dim in (0, 1):
        want = [c.numpy() for c in torch.chunk(t, chunks, dim=dim)]
        got = arrays.chunk(t.numpy(), chunks, dim)
        assert [g.shape for g in got] == [w.shape for w in want] and all(map(np.array_equal, got, want))
        assert np.array_equal(arrays.cat(got, dim), t.numpy())
    assert np.array_equal(arrays.cat([t.numpy(), arrays.zeros_like_rows(t.numpy(), 2)]),
                          torch.cat([t, torch.zeros(2, 6, dtype=t.dtype)]).numpy())


def test_each_written_row_is_checked_once_by_one_rank():
    """A rank's lane checks the rows it writes that no lower rank writes: split rows once each,
    a replicated tensor once (by rank 0), partly shared rows by the lowest rank taking them."""
    from trtllm_medusa_ports.files.byte_moves import (
        MoveKind,
        MovePlan,
        Piece,
        Source,
        _rows_to_check,
    )

    src = [Source(Path("x"), 0, (10, 4), "float16")]

    def plan(*ranges):
        return MovePlan(MoveKind.BYTE_COPY, src, [Piece(0, a, b, 0, 4, r, "t", 0) for r, a, b in ranges])

    split = plan((0, 0, 5), (1, 5, 10))
    assert _rows_to_check(split, 0) == {0: [(0, 5)]} and _rows_to_check(split, 1) == {0: [(5, 10)]}
    replicated = plan((0, 0, 10), (1, 0, 10))
    assert _rows_to_check(replicated, 0) == {0: [(0, 10)]} and _rows_to_check(replicated, 1) == {0: []}
    shared = plan((0, 2, 4), (0, 6, 8), (1, 0, 10))  # rank 1 checks what rank 0 leaves
    assert _rows_to_check(shared, 1) == {0: [(0, 2), (4, 6), (8, 10)]}
    assert _rows_to_check(shared, None) == {0: [(0, 10)]}
    for p in (split, replicated, shared):  # together: every written row, no row twice
        rows = [i for r in (0, 1) for a, b in _rows_to_check(p, r)[0] for i in range(a, b)]
        assert sorted(rows) == list(range(10))


def test_lanes_give_each_rank_file_one_writer_and_balance_one_file():
    from trtllm_medusa_ports.conversion.rank_writer import write_lanes as _lanes
    from trtllm_medusa_ports.files.byte_moves import MoveKind, MovePlan, Source

    class Job:
        def __init__(self, label, ranks):
            self.label, self.targets = label, [(r, label) for r in ranks]

    def move(rows):
        return MovePlan(MoveKind.BYTE_COPY, [Source(Path("x"), 0, (rows, 8), "float16")])

    fast = [(Job(f"j{i}", [0, 1, 2, 3]), move(10)) for i in range(3)]
    lanes = _lanes(fast, [0, 1, 2, 3], 2)
    assert [sorted({rank for _, _, rank in lane}) for lane in lanes] == [[0, 2], [1, 3]]
    assert sum(len(lane) for lane in lanes) == 12
    one = [(Job(f"j{i}", [0]), move(n)) for i, n in enumerate([100, 60, 50, 10])]
    lanes = _lanes(one, [0], 2)
    assert [[job.label for job, _, _ in lane] for lane in lanes] == [["j0", "j3"], ["j1", "j2"]]
    assert all(rank is None for lane in lanes for _, _, rank in lane)


def test_torch_is_imported_for_casts_only_where_its_speed_pays_for_the_import():
    from trtllm_medusa_ports.files.byte_moves import (
        CAST_RATES,
        MoveKind,
        MovePlan,
        Source,
        torch_casts_pay,
    )

    def plan(kind, src, dst, gb):
        rows = int(gb * 1e9) // 8192
        return MovePlan(kind, [Source(Path("x"), 0, (rows, 4096), src)], dtype=dst)

    for loaded in (False, True):
        assert not torch_casts_pay([plan(MoveKind.BYTE_COPY, "float16", "float16", 1000)], torch_loaded=loaded)
        assert not torch_casts_pay([plan(MoveKind.STRIDED, "float16", "float16", 1000)], torch_loaded=loaded)
    for (src, dst), (numpy_rate, torch_rate) in CAST_RATES.items():
        small, large = plan(MoveKind.CONVERT, src, dst, 0.001), plan(MoveKind.CONVERT, src, dst, 1000)
        assert not torch_casts_pay([small], torch_loaded=False), (src, dst)  # too small to pay for the import
        # where numpy casts as fast, never; where torch is faster, once enough is cast
        assert torch_casts_pay([large], torch_loaded=False) == (torch_rate > numpy_rate), (src, dst)
        # torch already loaded (issue 65, 8): nothing to pay for, so torch's faster cast whatever the size
        assert torch_casts_pay([small], torch_loaded=True) == (torch_rate > numpy_rate), (src, dst)
    fast_torch = max(CAST_RATES, key=lambda k: CAST_RATES[k][1] / CAST_RATES[k][0])
    sizes = [0.01 * 2**i for i in range(20)]
    first = {lanes: next(gb for gb in sizes if torch_casts_pay([plan(MoveKind.CONVERT, *fast_torch, gb)], lanes,
                                                               torch_loaded=False))
             for lanes in (1, 2)}
    assert first[2] > first[1]  # two lanes cast side by side: torch has half the time to save
    import sys

    assert "torch" in sys.modules and torch_casts_pay([plan(MoveKind.CONVERT, *fast_torch, 0.001)])  # the default


@pytest.mark.parametrize("block", [1 << 14, 1 << 16])
def test_bfloat16_to_float16_in_blocks_gives_torchs_bits_across_block_edges(monkeypatch, block):
    """The cast works in blocks through reused temporaries: every pattern, shuffled over several
    blocks and a ragged end, into a fresh array and into a reused ``out`` that held other values."""
    import numpy as np

    from trtllm_medusa_ports.files import dtypes

    monkeypatch.setattr(dtypes, "_BLOCK", block)
    g = torch.Generator().manual_seed(2)
    vals = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    vals = torch.cat([vals[torch.randperm(65536, generator=g)] for _ in range(3)])[: 3 * 65536 - 7]
    assert vals.numel() > 2 * dtypes._BLOCK and vals.numel() % dtypes._BLOCK
    want = vals.view(torch.bfloat16).to(torch.float16)
    finite = torch.isfinite(want).numpy()
    stale = np.full(vals.numel(), 0x3C00, dtype=np.uint16)
    for got in (dtypes.cast_bits(vals.numpy().tobytes(), "bfloat16", "float16"),
                dtypes.cast_bits(vals.numpy().tobytes(), "bfloat16", "float16", out=stale)):
        assert np.array_equal(got[finite], want.view(torch.int16).numpy().view(np.uint16)[finite])
        assert not np.isfinite(got[~finite].view(np.float16)).any()
    assert np.shares_memory(got, stale)


def test_scratch_arrays_are_per_thread_reused_and_grown():
    import threading

    import numpy as np

    from trtllm_medusa_ports.files.dtypes import scratch

    a = scratch("t", 100, np.uint16)
    assert a.shape == (100,) and a.dtype == np.uint16
    assert np.shares_memory(scratch("t", 50, np.uint16), a)  # reused while it is large enough
    b = scratch("t", 1000, np.float32)
    assert b.shape == (1000,) and b.dtype == np.float32 and not np.shares_memory(a, b)  # grown
    other = []
    t = threading.Thread(target=lambda: other.append(scratch("t", 1000, np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], b)  # another thread's own


def test_stacked_moe_experts_take_the_byte_path(tmp_path, store):
    """The experts' fc and proj are pure layouts of the per-expert tensors: byte copies and strided reads, as
    dense linears are, and the router is cast to its float32 chunk by chunk; bytes equal the tensor path's."""
    base = tiny_base(store, "MixtralForCausalLM")
    res = _both(tmp_path, base, _heads(base, tmp_path / "h"), tp_size=2)
    assert res.moves["layers.1.mlp.fc.weight"] == "byte-copy"
    assert res.moves["layers.1.mlp.proj.weight"] == "strided"
    assert res.moves["layers.1.mlp.router.weight"] == "byte-copy"  # float32 already
    half = _both(tmp_path / "f16", base, _heads(base, tmp_path / "h16"), tp_size=2, dtype="float16")
    assert half.moves["layers.1.mlp.router.weight"] == "byte-copy"  # float16 checkpoint, the router kept float32
    assert half.moves["layers.1.mlp.fc.weight"] == "convert"


MOE = family_test_cases()["moe"]


@pytest.mark.parametrize("arch", MOE)
@pytest.mark.parametrize("tp, ep", [(2, 2), (4, 2)])
def test_experts_move_as_bytes_under_expert_parallelism(tmp_path, store, arch, tp, ep):
    """tp 2 as moe_ep_size 2: each rank's whole experts are row ranges of the sources (one fused 3-D tensor
    for Granite-MoE); tp 4 as 2 x 2: each expert's down-projection is also cut in two column ranges. Bytes
    equal to the tensor path's, and no expert tensor made in memory."""
    base = tiny_base(store, arch)
    res = _both(tmp_path, base, _heads(base, tmp_path / "h"), tp_size=tp, moe_ep_size=ep)
    experts = {n: how for n, how in res.moves.items() if ".mlp.fc." in n or ".mlp.proj." in n or "router" in n}
    assert experts and "tensor" not in experts.values(), experts


@pytest.mark.parametrize("dtype, tile, chunk", [("float32", 1 << 30, 1 << 30), ("float16", 200, 100),
                                                ("bfloat16", 64, 40)])
def test_transposed_expert_blocks_are_written_transposed_through_bounded_tiles(tmp_path, monkeypatch, dtype, tile,
                                                                               chunk):
    """Issue 66, 1: a per-expert matrix stored transposed (DBRX's w2 ``[experts x inter, hidden]``) moves as bytes:
    each expert block of rows is written ``[hidden, rows]`` in its place, through tiles of its columns (several
    passes when a block exceeds TRANSPOSE_TILE_BYTES) and rows read in chunks, cast and checked as it goes;
    pieces that are not whole blocks are left to the tensor path."""
    import numpy as np
    from safetensors.numpy import save_file as save_numpy

    from trtllm_medusa_ports.files.byte_moves import (
        ByteMover,
        MoveKind,
        MovePlan,
        Piece,
        Source,
        as_transposed,
    )

    monkeypatch.setattr(byte_moves, "TRANSPOSE_TILE_BYTES", tile)
    monkeypatch.setattr(byte_moves, "CHUNK_BYTES", chunk)
    experts, inter, hidden = 3, 10, 7
    w = np.random.default_rng(0).standard_normal((experts * inter, hidden)).astype(np.float32)
    save_numpy({"w": w}, str(tmp_path / "src.safetensors"))
    raw = (tmp_path / "src.safetensors").read_bytes()
    offset = 8 + int.from_bytes(raw[:8], "little")
    src = Source(tmp_path / "src.safetensors", offset, (experts * inter, hidden), "float32")
    # experts 1 and 2 (rows 10..30) to one rank file, in the untransposed layout's place
    traced = MovePlan(MoveKind.CONVERT if dtype != "float32" else MoveKind.BYTE_COPY, [src],
                      [Piece(0, inter, 3 * inter, 0, hidden, 0, "proj", 0)], [(0, "proj")], dtype)
    plan = as_transposed(traced, inter)
    assert plan.kind is MoveKind.TRANSPOSED and plan.block_rows == inter and plan.casts == (dtype != "float32")
    out = tmp_path / "rank0.bin"
    out.write_bytes(b"\0" * (2 * inter * hidden * byte_moves.itemsize(dtype)))
    fd = os.open(out, os.O_RDWR)
    try:
        mover = ByteMover(lambda rank, name: 0, lambda rank: fd)
        mover.run(plan)
    finally:
        os.close(fd)
    want = torch.from_numpy(w).reshape(experts, inter, hidden)[1:].transpose(1, 2).contiguous()
    want = want.to(getattr(torch, dtype))
    got = torch.frombuffer(bytearray(out.read_bytes()), dtype=getattr(torch, dtype)).reshape(2, hidden, inter)
    assert torch.equal(got, want)
    # half an expert block, or a block starting mid-expert: not whole blocks, so the tensor path
    for piece in (Piece(0, 0, inter // 2, 0, hidden, 0, "proj", 0), Piece(0, 5, 5 + inter, 0, hidden, 0, "proj", 0)):
        odd = as_transposed(MovePlan(MoveKind.BYTE_COPY, [src], [piece], [(0, "proj")], "float32"), inter)
        assert odd.kind is MoveKind.TENSOR and "whole expert blocks" in odd.why
