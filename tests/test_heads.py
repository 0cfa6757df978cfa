import json
import pickle

import pytest
import torch
from safetensors.torch import save_file

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.errors import HeadsError
from trtllm_medusa_ports.fixtures.synthetic import HEAD_LAYOUTS, random_heads, save_heads
from trtllm_medusa_ports.heads import load_heads

H, V = 32, 50


@pytest.fixture
def heads():
    return random_heads(H, V, num_heads=3, num_layers=2, seed=3)


def fd_state(heads, prefix=""):
    sd = {}
    for h, row in enumerate(heads.blocks):
        for layer, (w, b) in enumerate(row):
            sd[f"{prefix}{h}.{layer}.linear.weight"] = w.clone()
            sd[f"{prefix}{h}.{layer}.linear.bias"] = b.clone()
        sd[f"{prefix}{h}.{len(row)}.weight"] = heads.lm_heads[h].clone()
    return sd


@pytest.mark.parametrize("layout", HEAD_LAYOUTS)
def test_every_layout_loads_the_same_heads(tmp_path, heads, layout, llama_base):
    kw = {"base_dir": llama_base} if layout == "axolotl" else {}
    if layout == "axolotl":
        heads = random_heads(64, 251, num_heads=3, num_layers=2, seed=3)
    d = save_heads(heads, tmp_path / layout, layout, **kw)
    got = load_heads(d)
    assert got.num_heads == 3 and got.num_layers == 2
    assert got.hidden_size == heads.blocks[0][0][0].shape[0]
    assert got.dtype == torch.float32
    assert got.warnings == []
    for h in range(3):
        for layer in range(2):
            w, b = heads.blocks[h][layer]
            assert torch.equal(got.blocks[h][layer].weight.load(), w)
            assert torch.equal(got.blocks[h][layer].bias.load(), b)
    if layout == "fasterdecoding-v2":
        assert got.shares_base_lm_head and got.lm_heads is None and got.layout == "fasterdecoding-v2"
    else:
        assert not got.shares_base_lm_head
        assert got.vocab_size == heads.lm_heads[0].shape[0]
        assert torch.equal(got.lm_heads[2].load(), heads.lm_heads[2])
    expected = {"fasterdecoding-pt": "fasterdecoding", "fasterdecoding-safetensors": "fasterdecoding",
                "fasterdecoding-v2": "fasterdecoding-v2", "axolotl": "axolotl", "modelopt": "modelopt",
                "vllm": "vllm"}[layout]
    assert got.layout == expected


def test_loading_is_lazy(tmp_path, heads, monkeypatch):
    d = save_heads(heads, tmp_path / "st", "fasterdecoding-safetensors")
    import os

    reads = []
    real = os.preadv

    def spy(fd, buffers, offset):
        reads.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", spy)
    got = load_heads(d)
    assert got.lm_heads[0].shape == (V, H) and reads == []
    assert torch.equal(got.lm_heads[0].load(), heads.lm_heads[0])
    assert len(reads) == 1


def test_vllm_shared_and_truncated_vocab(tmp_path, heads):
    sd = {}
    for h, row in enumerate(heads.blocks):
        for layer, (w, _) in enumerate(row):
            sd[f"blocks.{h}.layers.{layer}.weight"] = w  # biases dropped, as vLLM conversions often did
    sd["lm_head.weight"] = torch.randn(V, H)
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "medusa", "num_heads": 3, "num_hidden_layers": 2, "hidden_size": H,
         "vocab_size": V, "original_lm_head": True, "medusa_fc_bias": False}))
    got = load_heads(tmp_path)
    assert got.layout == "vllm" and got.shares_base_lm_head and got.shared_lm_head is not None
    assert got.blocks[0][0].bias is None
    assert any("no bias" in w and "medusa_fc_bias: false" in w for w in got.warnings)

    t = tmp_path / "trunc"
    t.mkdir()
    sd2 = {f"blocks.{h}.layers.0.weight": torch.randn(H, H) for h in range(2)}
    sd2.update({f"blocks.{h}.layers.0.bias": torch.zeros(H) for h in range(2)})
    sd2.update({f"lm_heads.{h}.weight": torch.randn(10, H) for h in range(2)})
    sd2["token_map"] = torch.arange(0, 40, 4)
    save_file(sd2, str(t / "model.safetensors"))
    (t / "config.json").write_text(json.dumps({"model_type": "medusa", "num_heads": 2, "num_hidden_layers": 1,
                                               "vocab_size": V, "truncated_vocab_size": 10}))
    got = load_heads(t)
    assert got.token_map is not None and got.vocab_size == V
    assert any("truncated vocabulary" in w for w in got.warnings)


def test_axolotl_zero_layers(tmp_path):
    sd = {f"medusa_head.{h}.0.weight": torch.randn(V, H) for h in range(4)}
    sd["model.embed_tokens.weight"] = torch.randn(V, H)
    save_file(sd, str(tmp_path / "model.safetensors"))
    got = load_heads(tmp_path)
    assert got.layout == "axolotl" and got.num_heads == 4 and got.num_layers == 0 and got.hidden_size == H


def test_config_disagreeing_with_weights_warns(tmp_path, heads):
    # the published medusa-vicuna-7b-v1.3 says medusa_num_heads 2 while holding 5 heads
    save_heads(heads, tmp_path, "fasterdecoding-pt", config_extra={"medusa_num_heads": 2, "medusa_num_layers": 1})
    got = load_heads(tmp_path)
    assert got.num_heads == 3 and got.num_layers == 2
    assert any("says 2 heads but the weights hold 3" in w for w in got.warnings)
    assert any("1 layer(s) per head but the weights hold 2" in w for w in got.warnings)


def _write_fd(tmp_path, sd):
    torch.save(sd, tmp_path / "medusa_lm_head.pt")
    return tmp_path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda sd: sd.update({"1.0.linear.weight": torch.randn(H + 1, H + 1)}), "expected [32, 32]"),
        (lambda sd: sd.update({"2.2.weight": torch.randn(V + 3, H)}), "projects to 53 tokens"),
        (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("1.")], "not contiguous: found [0, 2]"),
        (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("1.0.")], "layer indices must be 0..L-1"),
        (lambda sd: sd.update({"0.extra": torch.zeros(1)}), "unexpected tensor(s) for the fasterdecoding layout: 0.extra"),
        (lambda sd: sd.pop("1.2.weight"), "heads [1] have no lm_head"),
        (lambda sd: sd.update({"0.1.linear.bias": torch.randn(H + 2)}), "expected [32]"),
        (lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("2.1.")], "different numbers of ResBlock layers"),
    ],
)
def test_validation_errors(tmp_path, heads, mutate, message):
    sd = fd_state(heads)
    mutate(sd)
    with pytest.raises(HeadsError) as exc:
        load_heads(_write_fd(tmp_path, sd))
    assert message in str(exc.value)
    assert "medusa_lm_head.pt" in str(exc.value)


def test_nan_is_refused(tmp_path, heads, capsys):
    sd = fd_state(heads)
    sd["1.1.linear.weight"][3, 3] = float("nan")
    d = _write_fd(tmp_path, sd)
    with pytest.raises(HeadsError, match="'1.1.linear.weight' holds 1 NaN/Inf"):
        load_heads(d).check_finite()
    assert main(["inspect-heads", str(d), "--json"]) == 1
    assert "NaN/Inf" in capsys.readouterr().err


class _Payload:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")  # torch's, on this plain pickle.dump
def test_pickle_with_code_is_refused_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "medusa_lm_head.pt", "wb") as f:
        pickle.dump({"0.0.linear.weight": _Payload()}, f)
    with pytest.raises(HeadsError, match="refused to unpickle"):
        load_heads(tmp_path)
    assert not (tmp_path / "PWNED").exists()


def test_pickle_with_non_tensor_values_is_refused(tmp_path):
    torch.save({"0.0.linear.weight": torch.zeros(2, 2), "step": 7}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(HeadsError, match="entry 'step' is a int, not a tensor"):
        load_heads(tmp_path)


def test_truncated_and_corrupt_files(tmp_path, heads):
    d = save_heads(heads, tmp_path / "st", "fasterdecoding-safetensors")
    f = d / "medusa_lm_head.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(HeadsError, match="truncated or corrupt"):
        load_heads(d)
    f.write_bytes(b"garbage" * 10)
    with pytest.raises(HeadsError, match="not a readable safetensors file"):
        load_heads(d)
    p = save_heads(heads, tmp_path / "pt", "fasterdecoding-pt") / "medusa_lm_head.pt"
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(HeadsError, match="truncated or corrupt"):
        load_heads(p.parent)


def test_missing_and_empty(tmp_path):
    with pytest.raises(HeadsError, match="no such file or directory"):
        load_heads(tmp_path / "nope")
    with pytest.raises(HeadsError, match="no weights found"):
        load_heads(tmp_path)
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadsError, match="no Medusa head tensors found"):
        load_heads(tmp_path)


def test_inspect_heads_cli(tmp_path, heads, capsys):
    d = save_heads(heads, tmp_path / "h", "fasterdecoding-v2")
    assert main(["inspect-heads", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"] == "fasterdecoding-v2"
    assert out["num_heads"] == 3 and out["num_layers"] == 2 and out["hidden_size"] == H
    assert out["shares_base_lm_head"] is True and out["vocab_size"] is None  # one type per key: null or an int
    assert "base" in out["vocab_size_note"]
    assert out["dtype"] == "float32" and out["warnings"] == []
    assert main(["inspect-heads", str(tmp_path / "missing")]) == 1
    assert "no such file" in capsys.readouterr().err
