"""Hugging Face Hub ids where a directory is taken (``--model_dir``, ``--medusa_model_dir``, ``--tokenizer_dir`` and the
API's fields of the same names), as transformers, vLLM and TensorRT-LLM's LLM API take them.

A value that names an existing local path is that path, always (as ``from_pretrained`` reads it). Otherwise a value
of the Hub's ``owner/name`` form is fetched with ``huggingface_hub.snapshot_download`` into the local cache, which
honours ``HF_HOME`` / ``HF_HUB_CACHE`` / ``HUGGINGFACE_HUB_CACHE`` (:func:`cache_dir`), ``HF_HUB_OFFLINE`` (the cache only) and ``HF_TOKEN``, at ``--revision`` (a
branch, tag or commit; default ``main``), and only the files the step reads (:data:`FILES`): a base's config,
weights (safetensors, their index; ``*.bin`` only where the repository has no safetensors) and tokenizer, a heads
repository's config and weights, a tokenizer's files. What cannot be fetched is one error naming the flag, the id
and why: not in the cache while offline, a gated repository (accept its license, log in), no such repository or
revision, the network; no request waits more than :func:`request_timeout` to connect or for its next byte. A value
spelled as a path (``./owner/name``, ``owner/name/``; in the API, a ``Path``) is a path, never an id.

Imports huggingface_hub lazily (transformers depends on it); reads the environment at each call, so a variable
set after import is honoured.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.tokenizer import TOKENIZER_FILES
from trtllm_medusa_ports.machine import log

#: ``owner/name`` as the Hub spells repository ids (huggingface_hub's ``validate_repo_id``: letters, digits,
#: ``-``, ``_``, ``.``, at most 96 characters, no ``--`` or ``..``, not starting or ending with ``-`` or ``.``)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,94}/[A-Za-z0-9][\w.-]{0,94}")
#: a tokenizer's files (files/tokenizer.py), the chat template files beside them, and the configs AutoTokenizer reads
_TOKENIZER = [*TOKENIZER_FILES, "*.tiktoken", "chat_template*", "config.json", "generation_config.json"]
#: what each kind of input's readers open (the rest of a repository - other precisions, ONNX, GGUF - is left there)
FILES = {
    "base": ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", *_TOKENIZER],
    "heads": ["*.json", "*.safetensors", "*.pt", "*.pth", "*.bin"],
    "tokenizer": _TOKENIZER,
}
#: the fields (and flags) that take a directory or a Hub id, and the kind of input each is
HUB_INPUTS = {"model_dir": "base", "medusa_model_dir": "heads", "tokenizer_dir": "tokenizer"}
#: a base repository without safetensors: its PyTorch weights (the readers load them with weights_only=True)
BASE_BIN = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
_TRUE = ("1", "ON", "YES", "TRUE")


def is_hub_id(value: str | os.PathLike) -> bool:
    """Whether ``value`` is read as a Hub id: a string (a ``Path`` is a local path, always: ``Path("./acme/x")``
    and ``Path("acme/x/")`` both print as ``acme/x``), no local path of that name, and the Hub's ``owner/name`` form
    (so ``./acme/x``, ``acme/x/`` and ``/acme/x`` are paths)."""
    if not isinstance(value, str):
        return False
    text = value
    return (not Path(text).expanduser().exists() and HUB_ID.fullmatch(text) is not None
            and "--" not in text and ".." not in text and not text.endswith((".", "-")))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def cache_dir() -> Path:
    """The Hub cache the environment names now, resolved in huggingface_hub's own order (huggingface_hub/constants.py,
    which reads it once, at import): ``HF_HUB_CACHE``, else the older ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME``/hub,
    else ``XDG_CACHE_HOME``/huggingface/hub, else ~/.cache/huggingface/hub; ``~`` and ``$VARS`` expanded."""
    def expand(p: str) -> str:
        return os.path.expandvars(os.path.expanduser(p))

    home = expand(os.environ.get("HF_HOME")
                  or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"))
    return Path(expand(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                       or os.path.join(home, "hub")))


def local_dir(value: str | os.PathLike, kind: str, *, flag: str, revision: str | None = None) -> Path:
    """``value`` as a local directory: itself where it is a local path (or not a Hub id: the caller's own check
    names it then), else the Hub snapshot of the files ``kind`` (:data:`FILES`) reads."""
    if not is_hub_id(value):
        return Path(value)
    repo = os.fspath(value)
    path = _snapshot(repo, FILES[kind], flag=flag, revision=revision)
    if kind == "base" and not any(path.glob("*.safetensors")):
        path = _snapshot(repo, FILES[kind] + BASE_BIN, flag=flag, revision=revision)
    return path


def _snapshot(repo: str, patterns: list[str], *, flag: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    where = f"{flag} {repo}" + (f" (revision {revision})" if revision else "")
    try:  # its progress bars are on stderr, as ours
        with timed_requests():
            path = Path(snapshot_download(repo, revision=revision, cache_dir=str(cache_dir()),
                                          allow_patterns=patterns, local_files_only=offline()))
    except Exception as exc:  # noqa: BLE001  (huggingface_hub's error classes moved between releases: by name)
        what, fix = _why(exc, repo, revision)
        raise ModelError(what, where=where, fix=fix) from None
    # the snapshot's folder is named by the commit a ref file holds (refs/main): a ref or a link in the cache that
    # leads out of the repository's folder there is refused, never read
    repo_dir = (cache_dir() / ("models--" + repo.replace("/", "--"))).resolve()
    if not path.resolve().is_relative_to(repo_dir):
        raise ModelError(f"the snapshot of {repo} resolves to {path.resolve()}, outside its folder in the Hub cache "
                         f"({repo_dir}): a ref (refs/{revision or 'main'}) or a link there leads out of it",
                         where=where, fix=f"delete the repository from the cache (hf cache delete, or remove {repo_dir}) "
                                          "and download it again")
    return path


def request_timeout() -> float:
    """Seconds a Hub request may wait to connect or for its next byte: ``HF_HUB_ETAG_TIMEOUT`` where set (the
    variable huggingface_hub's file requests honour), else their default, 10."""
    try:
        value = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or DEFAULT_TIMEOUT)
    except ValueError:
        value = DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


#: huggingface_hub's own default for its file requests (constants.py DEFAULT_ETAG_TIMEOUT)
DEFAULT_TIMEOUT = 10.0


def _with_timeouts(request) -> None:
    """An httpx request hook: each of the request's timeouts that is unset (wait forever) becomes
    :func:`request_timeout`; one the caller set stays."""
    limits = dict(request.extensions.get("timeout") or {})
    given = request_timeout()
    request.extensions["timeout"] = {k: (given if limits.get(k) is None else limits[k])
                                     for k in ("connect", "read", "write", "pool")}


@contextlib.contextmanager
def timed_requests() -> Iterator[None]:
    """Inside, every request of huggingface_hub's shared HTTP session has a timeout: its repository listing (the
    first request ``snapshot_download`` makes) passes none and waited forever on an endpoint that never answers.
    huggingface_hub 1.x (httpx: a request hook on its public ``get_session()``) and 0.x (requests, TensorRT-LLM
    1.2's pins: an adapter mounted on its session), each put back after."""
    import huggingface_hub

    session = huggingface_hub.get_session()
    hooks = getattr(session, "event_hooks", None)
    if isinstance(hooks, dict):  # httpx
        session.event_hooks = {**hooks, "request": [*hooks.get("request", []), _with_timeouts]}
        try:
            yield
        finally:
            now = session.event_hooks
            session.event_hooks = {**now, "request": [h for h in now.get("request", []) if h is not _with_timeouts]}
        return
    adapters = getattr(session, "adapters", None)
    if not hasattr(session, "mount") or not isinstance(adapters, dict):
        yield  # a session of another kind (a caller's own factory): its own timeouts
        return
    before = dict(adapters)
    for prefix in ("https://", "http://"):
        session.mount(prefix, _timed_adapter(session.get_adapter(prefix)))
    try:
        yield
    finally:
        adapters.clear()
        adapters.update(before)


def _timed_adapter(inner):
    """A requests adapter sending through ``inner`` with :func:`request_timeout` where a request has no timeout."""
    from requests.adapters import BaseAdapter

    class Timed(BaseAdapter):
        def send(self, request, timeout=None, **kw):
            return inner.send(request, timeout=request_timeout() if timeout is None else timeout, **kw)

        def close(self):
            inner.close()

    return Timed()


def _why(exc: Exception, repo: str, revision: str | None) -> tuple[str, str]:
    """(message, fix) for a snapshot that could not be made; the class names are huggingface_hub's."""
    names = {c.__name__ for c in type(exc).__mro__}
    cache = cache_dir()
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "GatedRepoError" in names:
        return (f"{repo} is a gated repository on the Hugging Face Hub: its files need an accepted license and a "
                "login", f"accept its license on https://huggingface.co/{repo}, then log in (hf auth login, or set "
                "HF_TOKEN), or pass a local directory")
    if "RevisionNotFoundError" in names:
        return (f"{repo} has no revision {revision!r} on the Hugging Face Hub",
                "pass a branch, tag or commit of the repository with --revision, or leave it out for main")
    if "RepositoryNotFoundError" in names:
        return (f"no local directory {repo}, and no model repository {repo} on the Hugging Face Hub (or it is "
                "private)", "pass an existing local directory, or a Hub id (owner/name) you can read (log in for a "
                "private one: hf auth login, or HF_TOKEN)")
    if offline() or "LocalEntryNotFoundError" in names or "OfflineModeIsEnabled" in names:
        return (f"no local directory {repo}, and {repo} is not in the local Hub cache ({cache})"
                + (" while HF_HUB_OFFLINE is set" if offline() else ", and the Hub could not be reached"),
                f"download it once where the Hub is reachable (hf download {repo}, with the same cache: {cache}), or pass a "
                "local directory")
    return (f"{repo} could not be fetched from the Hugging Face Hub into {cache}: {type(exc).__name__}: {first}",
            "check the network and the id, or pass a local directory")



def resolved_inputs(holder, label: str) -> dict[str, Path]:
    """Each field of :data:`HUB_INPUTS` that ``holder`` (options or parsed flags) gives as a Hub id, and its local
    snapshot: ``model_dir`` at ``holder.revision``, the others at main; errors name ``label`` + the field."""
    out = {}
    revision = getattr(holder, "revision", None)
    for field, kind in HUB_INPUTS.items():
        value = getattr(holder, field, None)
        if value and is_hub_id(value):
            out[field] = local_dir(value, kind, flag=f"{label}{field}",
                                   revision=revision if field == "model_dir" else None)
        elif value and field == "model_dir" and revision:
            log.get(__name__).warning(f"{label}revision {revision} is not used: {label}model_dir {os.fspath(value)} is "
                                      "a local path, read as it is (a revision picks a Hub id's snapshot)")
    return out


def hub_inputs(opts):
    """An options dataclass with its Hub ids replaced by their local snapshots (:func:`resolved_inputs`); ``opts``
    itself where it holds none."""
    import dataclasses

    changes = resolved_inputs(opts, f"{type(opts).__name__}.")
    return dataclasses.replace(opts, **changes) if changes else opts
