"""Hub ids where a directory is taken (issue 65, 1): read from a local Hugging Face cache laid out as the Hub lays it
(``models--owner--name/refs``, ``snapshots/<commit>`` of links into ``blobs/``), with HF_HUB_OFFLINE set: no test
reaches the network."""

import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import tiny_base

from trtllm_medusa_ports.cli import main
from trtllm_medusa_ports.fixtures.synthetic import (
    random_heads,
    save_heads,
    save_tiny_tokenizer,
    tiny_config,
)

ARCH = "Qwen2ForCausalLM"


def _cache_repo(hf_home: Path, repo: str, files: Path, ref: str = "main") -> Path:
    """``files`` (a directory) as revision ``ref`` of ``repo`` in the Hub cache under ``hf_home``: each file a blob
    named by its hash, linked from the snapshot of a commit, the ref naming the commit (huggingface_hub's layout)."""
    root = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(f"{repo}@{ref}".encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for f in sorted(files.iterdir()):
        blob = root / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, store, monkeypatch):
    """An offline cache holding acme/tiny-qwen2 (a base with its tokenizer, at main and at tag v2: two layers more)
    and acme/tiny-heads; the working directory empty, so no local path shadows an id."""
    hf_home = tmp_path / "hf"
    base = tmp_path / "base"
    shutil.copytree(tiny_base(store, ARCH), base)
    save_tiny_tokenizer(base, tiny_config(ARCH).vocab_size)
    snapshots = {"main": _cache_repo(hf_home, "acme/tiny-qwen2", base)}
    v2 = tmp_path / "base-v2"
    shutil.copytree(tiny_base(store, ARCH, num_hidden_layers=4), v2)
    snapshots["v2"] = _cache_repo(hf_home, "acme/tiny-qwen2", v2, ref="v2")
    c = tiny_config(ARCH)
    heads = save_heads(random_heads(c.hidden_size, c.vocab_size, num_heads=2, seed=3), tmp_path / "heads")
    snapshots["heads"] = _cache_repo(hf_home, "acme/tiny-heads", heads)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return snapshots


def test_every_directory_flag_takes_a_hub_id_from_the_cache(hub, tmp_path, capsys):
    assert main(["check", "--model_dir", "acme/tiny-qwen2", "--medusa_model_dir", "acme/tiny-heads", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"] == ARCH
    assert main(["convert", "--model_dir", "acme/tiny-qwen2", "--medusa_model_dir", "acme/tiny-heads",
                 "--output_dir", str(tmp_path / "ckpt"), "--quiet"]) == 0
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["num_medusa_heads"] == 2  # main, not v2
    capsys.readouterr()
    assert main(["deploy", "--checkpoint_dir", str(tmp_path / "ckpt"), "--tokenizer_dir", "acme/tiny-qwen2",
                 "--output_dir", str(tmp_path / "serve")]) == 0
    assert (tmp_path / "serve" / "tokenizer" / "tokenizer.json").is_file()
    assert not any(p.suffix == ".safetensors" for p in (tmp_path / "serve" / "tokenizer").iterdir())


def test_revision_picks_the_tag_and_the_api_takes_ids_too(hub, tmp_path, capsys):
    from trtllm_medusa_ports import api

    assert main(["convert", "--model_dir", "acme/tiny-qwen2", "--revision", "v2", "--medusa_model_dir",
                 "acme/tiny-heads", "--output_dir", str(tmp_path / "ckpt"), "--quiet"]) == 0
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["num_hidden_layers"] == 4
    res = api.check(api.CheckOptions(model_dir="acme/tiny-qwen2", revision="v2", medusa_model_dir="acme/tiny-heads"))
    assert res.architecture == ARCH and res.compatible
    assert main(["check", "--model_dir", "acme/tiny-qwen2", "--revision", "v3"]) == 1
    err = capsys.readouterr().err
    assert "--model_dir acme/tiny-qwen2 (revision v3): no local directory acme/tiny-qwen2, and acme/tiny-qwen2 is not" \
           " in the local Hub cache" in err and "while HF_HUB_OFFLINE is set" in err and "Traceback" not in err


def test_port_takes_a_hub_id_at_its_revision_to_a_bundle(hub, tmp_path, capsys):
    """port MODEL with MODEL a Hub id (issue 78, 1): every stage reads the base's snapshot (the fixture's tokenizer
    is at main), the heads' id too, the bundle's tokenizer comes from the base's snapshot."""
    out = tmp_path / "port"
    assert main(["port", "acme/tiny-qwen2", "--medusa_model_dir", "acme/tiny-heads",
                 "--medusa_choices", "[[0],[1],[0,0]]", "--output_dir", str(out), "--max_new_tokens", "4",
                 "--quiet", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verified"] and [s["status"] for s in got["stages"]] == ["ran", "skipped", "skipped", "ran", "ran",
                                                                        "ran"]
    cfg = json.loads((out / "checkpoint" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["num_medusa_heads"] == 2  # main, and the heads' id
    assert (out / "serve" / "tokenizer" / "tokenizer.json").is_file()


def test_an_id_not_in_the_cache_offline_is_one_error_naming_the_flag(hub, capsys):
    assert main(["check", "--model_dir", "acme/tiny-qwen2", "--medusa_model_dir", "acme/nowhere"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --medusa_model_dir acme/nowhere: no local directory acme/nowhere, and acme/nowhere "
                          "is not in the local Hub cache (")
    assert "hf download acme/nowhere" in err and "Traceback" not in err


def test_a_local_directory_of_the_ids_name_wins(hub, store, capsys):
    local = Path("acme") / "tiny-qwen2"  # relative to the working directory, as from_pretrained reads it
    shutil.copytree(tiny_base(store, ARCH, num_hidden_layers=3), local)
    assert main(["check", "--model_dir", "acme/tiny-qwen2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"] == ARCH
    from trtllm_medusa_ports.files.hub import is_hub_id, local_dir

    assert not is_hub_id("acme/tiny-qwen2") and local_dir("acme/tiny-qwen2", "base", flag="--model_dir") == local
    assert is_hub_id("acme/tiny-heads") and not is_hub_id("./x/y") and not is_hub_id("a/b/c")
    assert not is_hub_id("acme/a--b") and not is_hub_id("acme/x.")


@pytest.mark.parametrize("name, said, fix", [
    ("GatedRepoError", "acme/llama is a gated repository on the Hugging Face Hub",
     "accept its license on https://huggingface.co/acme/llama"),
    ("RepositoryNotFoundError", "no local directory acme/llama, and no model repository acme/llama on the Hugging "
                                "Face Hub (or it is private)", "hf auth login"),
    ("RevisionNotFoundError", "acme/llama has no revision 'v9' on the Hugging Face Hub", "--revision"),
])
def test_what_the_hub_refuses_is_said_with_its_fix(monkeypatch, tmp_path, capsys, name, said, fix):
    """huggingface_hub's error classes moved between releases: they are told apart by name."""
    import huggingface_hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    error = type(name, (Exception,), {})

    def refuse(*a, **k):
        raise error("401 Client Error")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    assert main(["check", "--model_dir", "acme/llama", "--revision", "v9"]) == 1
    err = capsys.readouterr().err
    assert said in err and fix in err and "Traceback" not in err


def test_only_the_files_the_step_reads_are_fetched(monkeypatch, tmp_path):
    """A base: config, safetensors and their index, tokenizer files - not another precision, ONNX or GGUF; its
    *.bin only where the repository has no safetensors. A tokenizer: its files alone."""
    import huggingface_hub

    from trtllm_medusa_ports.files.hub import local_dir

    monkeypatch.chdir(tmp_path)
    asked = []
    repo_files = ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                  "tokenizer.json", "tokenizer_config.json", "pytorch_model.bin", "model.onnx", "model-q4.gguf",
                  "README.md", "original/consolidated.00.pth"]

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    def fetch(repo, *, allow_patterns, **kw):  # a snapshot in the cache, as huggingface_hub lays it out
        asked.append(allow_patterns)
        out = tmp_path / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / f"snap{len(asked)}"
        out.mkdir(parents=True)
        for f in repo_files:
            if "/" not in f and any(fnmatch.fnmatch(f, p) for p in allow_patterns):
                (out / f).write_text("x")
        return str(out)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch)
    got = sorted(p.name for p in local_dir("acme/base", "base", flag="--model_dir").iterdir())
    assert got == ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                   "tokenizer.json", "tokenizer_config.json"] and len(asked) == 1
    repo_files[1:3] = []  # a repository of PyTorch weights only
    got = sorted(p.name for p in local_dir("acme/old", "base", flag="--model_dir").iterdir())
    assert "pytorch_model.bin" in got and "model.onnx" not in got and len(asked) == 3
    got = sorted(p.name for p in local_dir("acme/tok", "tokenizer", flag="--tokenizer_dir").iterdir())
    assert got == ["config.json", "tokenizer.json", "tokenizer_config.json"]


def test_the_cache_is_found_as_huggingface_hub_finds_it(hub, tmp_path, monkeypatch, capsys):
    """HUGGINGFACE_HUB_CACHE (huggingface_hub's older name, still honoured after HF_HUB_CACHE and before HF_HOME): a
    repository cached there is found offline, and a missing one is named with the cache resolved."""
    from trtllm_medusa_ports.files.hub import cache_dir

    moved = tmp_path / "elsewhere"
    shutil.move(str(tmp_path / "hf" / "hub"), str(moved))
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(moved))
    assert cache_dir() == moved
    assert main(["check", "--model_dir", "acme/tiny-qwen2", "--json"]) == 0
    capsys.readouterr()
    assert main(["check", "--model_dir", "acme/nowhere"]) == 1
    err = capsys.readouterr().err
    assert f"is not in the local Hub cache ({moved})" in err and f"with the same cache: {moved}" in err
    monkeypatch.setenv("HF_HUB_CACHE", "$HOME_OF_CACHE/hub")  # the newer name first, variables expanded
    monkeypatch.setenv("HOME_OF_CACHE", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "hub"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_an_endpoint_that_never_answers_is_a_network_error_not_a_hang(tmp_path):
    """A timeout on every Hub request (issue 76, C): huggingface_hub's repository listing passes none and waited
    forever on an endpoint that accepts the connection and never answers; now it is one error naming the network.
    The command runs in a process of its own (huggingface_hub reads HF_ENDPOINT at import); the test's limit is
    far above the request timeout set here (1 s), so the machine's load does not decide it."""
    import socket
    import subprocess
    import sys

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the connections; nothing ever reads or answers
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}", "HF_HUB_ETAG_TIMEOUT": "1",
           "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_CACHE", None)
    try:
        run = subprocess.run([sys.executable, "-m", "trtllm_medusa_ports", "check", "--model_dir", "acme/silent"],
                             env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    finally:
        silent.close()
    assert run.returncode == 1, run.stderr
    assert "--model_dir acme/silent: no local directory acme/silent" in run.stderr
    assert "the Hub could not be reached" in run.stderr and "Traceback" not in run.stderr


def test_the_timeout_is_set_only_where_a_request_has_none_and_put_back_after():
    """huggingface_hub 1.x (httpx: a request hook) here; 0.x (requests: a mounted adapter) in TensorRT-LLM 1.2's
    environment (ci/trtllm-1.2.sh): each sets the timeout a request lacks, keeps the one it has, and is put back."""
    import huggingface_hub

    from trtllm_medusa_ports.files.hub import request_timeout, timed_requests

    session = huggingface_hub.get_session()
    if isinstance(getattr(session, "event_hooks", None), dict):  # httpx
        class Req:
            extensions = {"timeout": {"connect": None, "read": 3.0, "write": None, "pool": None}}

        before = list(session.event_hooks["request"])
        with timed_requests():
            hook = session.event_hooks["request"][-1]
            hook(Req)
        assert Req.extensions["timeout"] == {"connect": request_timeout(), "read": 3.0, "write": request_timeout(),
                                             "pool": request_timeout()}
        assert list(session.event_hooks["request"]) == before
        return
    from requests.adapters import BaseAdapter  # requests (huggingface_hub 0.x)

    sent = []

    class Inner(BaseAdapter):
        def send(self, request, timeout=None, **kw):
            sent.append(timeout)

        def close(self):
            pass

    before = dict(session.adapters)
    session.mount("https://", Inner())
    try:
        mounted = dict(session.adapters)
        with timed_requests():
            adapter = session.get_adapter("https://example.org")
            assert not isinstance(adapter, Inner)
            adapter.send(object())
            adapter.send(object(), timeout=3.0)
        assert sent == [request_timeout(), 3.0]
        assert dict(session.adapters) == mounted
    finally:
        session.adapters.clear()
        session.adapters.update(before)


@pytest.mark.parametrize("spelling", ["./acme/tiny-qwen2", "acme/tiny-qwen2/"])
def test_a_path_spelled_as_a_path_is_never_read_from_the_hub_cache(hub, spelling, capsys):
    """``./acme/tiny-qwen2`` and ``acme/tiny-qwen2/`` are paths (issue 76, D): with no such directory, the error
    says so; the cached repository of that id is not read (in the CLI, nor in the API given a Path)."""
    from trtllm_medusa_ports import api
    from trtllm_medusa_ports.errors import PortError

    assert main(["check", "--model_dir", spelling]) == 1
    err = capsys.readouterr().err
    assert "acme/tiny-qwen2" in err and "Hub" not in err and "Traceback" not in err, err
    with pytest.raises(PortError) as exc:
        api.check(api.CheckOptions(model_dir=Path(spelling)))
    assert "Hub" not in str(exc.value)


def test_a_revision_for_a_local_directory_is_said_unused(hub, store, capsys):
    base = tiny_base(store, ARCH)
    assert main(["check", "--model_dir", str(base), "--revision", "v2"]) == 0
    err = capsys.readouterr().err
    assert err.count("--revision v2 is not used") == 1 and f"--model_dir {base} is a local path" in err
