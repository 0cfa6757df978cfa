"""Lazy tensors: shapes and dtypes from file headers, data read only on ``load()``.

Reads safetensors files (single or sharded with ``*.safetensors.index.json``;
the format - 8-byte little-endian header length, JSON header, raw data - is read
here directly)
and PyTorch pickles (``.bin`` / ``.pt``, always ``torch.load(weights_only=True)``,
memory-mapped where the file format allows it).
"""

from __future__ import annotations

import functools
import os
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import PortError
from trtllm_medusa_ports.files.dtypes import BY_SAFETENSORS, itemsize, name_of, to_torch
from trtllm_medusa_ports.files.jsonfile import is_int, parse_json, read_json, require_regular_file

if TYPE_CHECKING:
    import torch


@dataclass
class LazyTensor:
    """A tensor in a file: its name, shape and dtype are known, its data is not read yet.

    The dtype is kept by name (``dtype_name``, e.g. ``"bfloat16"``): indexing files and planning a
    conversion never import torch; ``dtype`` and ``load()`` do.
    """

    name: str
    file: Path
    shape: tuple[int, ...]
    dtype_name: str
    _loader: Callable[[], torch.Tensor] = field(repr=False)
    #: where the raw little-endian data starts in ``file`` (safetensors only; None: not a byte range,
    #: e.g. a pickle), so that a conversion can move the bytes without making a tensor
    offset: int | None = field(default=None, repr=False)

    def load(self) -> torch.Tensor:
        return self._loader()

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (imports torch)."""
        return to_torch(self.dtype_name)

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * itemsize(self.dtype_name)

    def where(self) -> str:
        return f"{self.file} [{self.name}]"


def _read_header(path: Path, error: type[PortError], bad) -> tuple[dict, int, int]:
    """A safetensors file's JSON header, where its data starts and the file's size; the file refused by name where
    its header length or header cannot be read."""
    require_regular_file(path, error, "point at the weight files the model was saved with")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad("not a readable safetensors file (shorter than its 8-byte header length)")
            n = int.from_bytes(head, "little")
            if n <= 1 or 8 + n > size:
                raise bad(f"not a readable safetensors file (header of {n} bytes in a {size}-byte file)")
            raw = f.read(n)
    except OSError as exc:
        raise error(f"cannot read ({exc.strerror})", where=str(path), fix="check the path and permissions") from None
    header = parse_json(raw, error, where=str(path), fix="the file is truncated or corrupt; download or save it again")
    return header, 8 + n, size


def _pread_tensor(path: Path, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...], name: str,
                  bad) -> torch.Tensor:
    """One tensor read with ``pread`` into its own buffer (no mapping: resident memory stays one tensor)."""
    import torch

    torch_dtype = to_torch(dtype)
    if nbytes == 0:
        return torch.empty(shape, dtype=torch_dtype)
    buf = bytearray(nbytes)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)  # a bare descriptor: no buffered file object for one pread (a third of the cost)
    try:
        got = 0
        while got < nbytes:
            chunk = os.preadv(fd, [view[got:]], offset + got)
            if chunk <= 0:
                raise bad(f"unexpected end of file while reading tensor {name!r}")
            got += chunk
    finally:
        os.close(fd)
    return torch.frombuffer(buf, dtype=torch_dtype).reshape(shape)


def read_safetensors(path: Path, error: type[PortError]) -> dict[str, LazyTensor]:
    """Index a safetensors file from its header; each ``load()`` reads one tensor with ``pread``.

    Reading with ``pread`` instead of memory-mapping keeps the process's resident
    memory at one tensor at a time (a mapped file's pages count as resident until
    unmapped), which is what lets a conversion stream a model larger than RAM.
    The header is checked against the file size, so a truncated file is reported
    when it is opened, not halfway through a conversion.
    """
    def bad(what: str) -> PortError:
        return error(what, where=str(path), fix="the file is truncated or corrupt; download or save it again")

    header, data_start, size = _read_header(path, error, bad)
    out: dict[str, LazyTensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            code, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not (isinstance(code, str) and isinstance(shape, list) and _ints(shape, 0) and _ints([begin, end], 0)):
                raise TypeError
            shape = tuple(shape)
        except (KeyError, TypeError, ValueError):
            raise bad(f"not a readable safetensors file (bad header entry for {name!r}: dtype, shape and "
                      "data_offsets must be a string, non-negative integers and two offsets)") from None
        info = BY_SAFETENSORS.get(code)
        if info is None:
            raise error(
                f"tensor {name!r} has dtype {code}, which this toolkit does not read",
                where=str(path),
                fix="save the weights as float32, float16 or bfloat16",
            )
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * info.itemsize or begin > end or data_start + end > size:
            raise bad(f"tensor {name!r} lies outside the file or has the wrong byte size (truncated?)")
        spans.append((begin, end, name))

        loader = functools.partial(_pread_tensor, path, data_start + begin, end - begin, info.name, shape, name, bad)
        out[name] = LazyTensor(name, path, shape, info.name, loader, offset=data_start + begin)
    spans.sort()
    for (_b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:], strict=False):
        if b1 < e0 and e1 > b1:  # two tensors share bytes: one would silently read the other's data
            raise bad(f"tensors {n0!r} and {n1!r} overlap in the file (bytes {b1}..{min(e0, e1)})")
    end_of_data = max((e for _, e, _ in spans), default=0)
    if data_start + end_of_data != size:  # the safetensors library (and TensorRT-LLM's loader) refuse it
        raise bad(f"{size - data_start - end_of_data} byte(s) after the last tensor, which no header entry accounts "
                  "for (the safetensors library refuses such a file)")
    return out


def _ints(values: list, minimum: int) -> bool:
    return all(is_int(v, minimum) for v in values)


def read_pickle(path: Path, error: type[PortError]) -> dict[str, LazyTensor]:
    """A PyTorch state dict, loaded with ``weights_only=True`` (never executes code).

    With ``mmap=True`` (zip-format files) tensor data stays on disk until touched.
    """
    import torch

    require_regular_file(path, error, "point at the weight files the model was saved with")
    try:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            # Legacy (non-zip) pickles cannot be memory-mapped.
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except __import__("pickle").UnpicklingError as exc:
        raise error(
            "refused to unpickle: the file holds objects other than tensors "
            f"(weights_only=True stopped at: {str(exc).splitlines()[0][:200]})",
            where=str(path),
            fix="re-save the weights as a plain dict of tensors, or as safetensors",
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        raise error(
            f"not a readable PyTorch weights file ({type(exc).__name__}: {str(exc)[:200]})",
            where=str(path),
            fix="the file is truncated or corrupt; download or save it again",
        ) from None
    if not isinstance(obj, dict):
        raise error(
            f"expected a dict of tensors, found a {type(obj).__name__}",
            where=str(path),
            fix="save with torch.save(model.state_dict(), ...)",
        )
    out: dict[str, LazyTensor] = {}
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise error(
                f"entry {name!r} is a {type(value).__name__}, not a tensor",
                where=str(path),
                fix="save a flat dict of tensors (a state_dict), nothing else",
            )
        out[str(name)] = LazyTensor(str(name), path, tuple(value.shape), name_of(value.dtype), lambda v=value: v)
    return out


def read_tensor_file(path: Path, error: type[PortError]) -> dict[str, LazyTensor]:
    if path.suffix == ".safetensors":
        return read_safetensors(path, error)
    if path.suffix in (".bin", ".pt", ".pth"):
        return read_pickle(path, error)
    raise error(
        f"unknown weights file type {path.suffix!r}",
        where=str(path),
        fix="use .safetensors, .bin or .pt files",
    )


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a Hugging Face model directory, following index files."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.exists():
            fix = "the index must be JSON with a 'weight_map' object of tensor name -> shard file name"
            weight_map = read_json(index, PortError, fix=fix).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise PortError(f"weight_map is {type(weight_map).__name__}, not an object of names",
                                where=str(index), fix=fix)
            files = sorted(set(weight_map.values()))
            root = directory.resolve()
            for f in files:
                target = (directory / f).resolve()
                if Path(f).is_absolute() or root not in target.parents:
                    raise PortError(f"the index names {f!r}, outside the model directory", where=str(index),
                                    fix="shard paths must be file names inside the directory")
            missing = [f for f in files if not (directory / f).is_file()]
            if missing:
                raise PortError(
                    f"the index names shard(s) that are not there: {', '.join(missing)}",
                    where=str(index),
                    fix="copy every shard listed in the index into the directory",
                )
            return [directory / f for f in files]
    st = sorted(directory.glob("*.safetensors"))
    if st:
        return st
    return sorted(p for p in directory.glob("*.bin") if p.name.startswith("pytorch_model"))


def read_tensor_files(files: Iterable[Path], error: type[PortError]) -> dict[str, LazyTensor]:
    out: dict[str, LazyTensor] = {}
    for f in files:
        for name, t in read_tensor_file(f, error).items():
            if name in out:
                raise error(
                    f"tensor {name!r} appears in two files: {out[name].file.name} and {f.name}",
                    where=str(f.parent),
                    fix="remove the duplicate shard",
                )
            out[name] = t
    return out
