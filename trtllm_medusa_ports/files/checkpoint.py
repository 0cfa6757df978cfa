"""TensorRT-LLM checkpoint directories: ``config.json`` + ``rank{N}.safetensors``.

Writing is streaming and atomic:

* every rank file's header (names, dtypes, shapes, offsets) is known before any
  tensor is computed, so tensors are written one by one at their offsets and
  never held together in memory;
* everything goes into a temporary directory beside the output, renamed into
  place only when all ranks are complete. On an error or Ctrl-C the temporary
  directory is removed and ``output_dir`` is untouched.

The file format is the safetensors format (8-byte little-endian header length,
JSON header, raw little-endian data), written here by hand so that tensors can
be streamed; ``safetensors.safe_open`` reads the result.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_medusa_ports.errors import CheckpointError, ConversionError
from trtllm_medusa_ports.files import interrupts
from trtllm_medusa_ports.files.checkpoint_schema import check_types
from trtllm_medusa_ports.files.dtypes import BY_NAME, CHECKPOINT_DTYPES, itemsize, name_of
from trtllm_medusa_ports.files.jsonfile import is_int, read_json
from trtllm_medusa_ports.files.lazy_tensors import LazyTensor, read_safetensors

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str  # by name (files/dtypes.py)
    shape: tuple[int, ...]
    offset: int  # absolute offset of the data in the file

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * itemsize(self.dtype)


class StreamingSafetensorsFile:
    """A safetensors file whose layout is fixed up front and whose tensors arrive one by one.

    ``write`` may be called from several threads (``os.pwrite`` at fixed offsets).
    """

    def __init__(self, path: Path, entries: list[tuple[str, str, tuple[int, ...]]], *, durable: bool = True):
        """``entries``: (tensor name, dtype name, shape) in file order. ``durable``: the data is on disk
        (written back as tensors finish, ``fsync`` on close) before :meth:`close` returns."""
        self.path = path
        self.durable = durable
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        rel: dict[str, tuple[int, int]] = {}
        for name, dtype, shape in entries:
            if name in rel:
                raise AssertionError(f"tensor {name} planned twice in {path.name}")
            n = 1
            for s in shape:
                n *= s
            size = n * itemsize(dtype)
            rel[name] = (offset, offset + size)
            header[name] = {"dtype": BY_NAME[dtype].safetensors, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # safetensors aligns the data start to 8 bytes
        self.data_start = 8 + len(blob)
        self.slots = {
            name: TensorSlot(name, dtype, tuple(shape), self.data_start + rel[name][0])
            for name, dtype, shape in entries
        }
        self.total = self.data_start + offset
        self.pending = set(self.slots)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, len(blob).to_bytes(8, "little") + blob, 0)
        os.ftruncate(self.fd, self.total)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        slot = self.slots[name]
        if name_of(tensor.dtype) != slot.dtype or tuple(tensor.shape) != slot.shape:
            raise AssertionError(
                f"{name}: planned {slot.dtype} {list(slot.shape)}, got {name_of(tensor.dtype)} {list(tensor.shape)}"
            )
        import torch  # a tensor was made: torch is loaded already

        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        view = memoryview(data)
        pos = slot.offset
        while len(view):
            written = os.pwrite(self.fd, view, pos)
            view = view[written:]
            pos += written
        self.written(name)

    def written(self, name: str) -> None:
        """Tensor ``name`` is complete (written by :meth:`write`, or its bytes moved into its slot)."""
        if name not in self.slots:
            raise AssertionError(f"{name} is not planned in {self.path.name}")
        self.pending.discard(name)
        slot = self.slots[name]
        if self.durable:
            _start_writeback(self.fd, slot.offset, slot.nbytes)

    def close(self) -> None:
        if self.pending:
            raise AssertionError(f"{self.path.name}: tensors never written: {sorted(self.pending)[:5]}")
        if self.durable:
            os.fsync(self.fd)
        os.close(self.fd)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing a finished tensor's pages to disk now (Linux ``sync_file_range``), so that the
    ``fsync`` before the output is committed finds little left to do; a no-op elsewhere."""
    if _SYNC_FILE_RANGE is not None and nbytes:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def guard_output_dir(output_dir: Path, inputs: dict[str, Path]) -> Path:
    """The resolved output directory, refused when it would touch an input or the working directory.

    Paths are resolved with symlinks followed: an output that is an input, lies inside one, or
    contains one could overwrite it or (with --overwrite) remove it.
    """
    out = Path(output_dir).resolve()
    for flag, path in inputs.items():
        src = Path(path).resolve()
        if _is_within(out, src) or _is_within(src, out):
            how = "is" if out == src else "lies inside" if _is_within(out, src) else "contains"
            raise ConversionError(
                f"--output_dir {output_dir} {how} the input {flag} {path}: writing there could overwrite "
                "or remove your input",
                where=str(output_dir),
                fix=f"choose an --output_dir outside {flag}",
            )
    if _is_within(Path.cwd().resolve(), out):
        raise ConversionError(
            f"--output_dir {output_dir} is the working directory or one of its parents",
            where=str(output_dir),
            fix="choose a new directory for the checkpoint, e.g. --output_dir ./ckpt",
        )
    return out


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: the longest output name kept whole in the hidden names beside it (``.<name>.partial-XXXXXXXX`` must stay
#: within the 255 bytes a file name may have on Linux file systems)
HIDDEN_STEM_BYTES = 200


def hidden_stem(name: str) -> str:
    """``name``, or for a name too long to carry a hidden suffix, its first bytes and a digest of the whole."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= HIDDEN_STEM_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[: HIDDEN_STEM_BYTES - 17].decode("utf-8", "ignore") + "-" + digest


@contextlib.contextmanager
def atomic_output_dir(output_dir: Path, *, overwrite: bool,
                      inputs: dict[str, Path] | None = None) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``output_dir`` only if the block succeeds.

    * inputs are never touched: see :func:`guard_output_dir`;
    * one writer at a time: an exclusive lock on ``.<name>.lock`` beside the output (``<name>`` shortened by
      :func:`hidden_stem` where the output's own name is near the file-name limit), so a second
      conversion into the same directory stops instead of replacing the first one's output;
    * ``--overwrite`` swaps the new directory in with one atomic exchange where the system has it,
      so the output is never missing, even if the process is killed;
    * partial directories of earlier killed runs (``.<name>.partial-*``) are removed;
    * the result has the permissions of a directory made under the current umask.
    """
    output_dir = guard_output_dir(output_dir, inputs or {})
    parent = output_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        stem = hidden_stem(output_dir.name)
        lock_path = parent / f".{stem}.lock"
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConversionError(f"cannot create the output directory ({exc.strerror})", where=str(output_dir),
                              fix="choose a writable --output_dir") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(lock).st_ino != os.stat(lock_path).st_ino:  # a finishing run unlinked it meanwhile
                raise OSError(errno.EAGAIN, "lock file replaced")
        except OSError:
            raise ConversionError("another trtllm-medusa convert is writing this directory",
                                  where=str(output_dir), fix="wait for it, or choose another --output_dir") from None
        _check_target(output_dir, overwrite)
        for stale in parent.glob(f".{stem}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)  # ours, left by a killed run (we hold the lock)
        tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.partial-", dir=parent))
        try:
            yield tmp
            os.chmod(tmp, 0o777 & ~_umask())
            _swap_in(tmp, output_dir, overwrite=overwrite, stem=stem)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        with contextlib.suppress(OSError):
            lock_path.unlink()
        os.close(lock)


def _swap_in(tmp: Path, output_dir: Path, *, overwrite: bool, stem: str) -> None:
    """``tmp`` becomes ``output_dir`` (the old one, if any, removed), with SIGINT / SIGTERM held back meanwhile
    (files/interrupts.py): a signal received before, even one whose ``KeyboardInterrupt`` Python swallowed, or during
    the swap leaves the old output exactly as it was (the swap undone) and raises ``KeyboardInterrupt``; ``tmp``
    then holds the new one, for the caller to remove."""
    with interrupts.deferred() as mark:
        interrupts.honour()
        _check_target(output_dir, overwrite)
        if not output_dir.exists():
            os.rename(tmp, output_dir)
            if interrupts.arrived_since(mark):
                os.rename(output_dir, tmp)
                raise KeyboardInterrupt
        elif _exchange(tmp, output_dir):  # tmp now holds the old output
            if interrupts.arrived_since(mark):
                _exchange(tmp, output_dir)
                raise KeyboardInterrupt
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{stem}.old-", dir=output_dir.parent))
            os.rename(output_dir, old / "x")
            os.rename(tmp, output_dir)
            if interrupts.arrived_since(mark):
                os.rename(output_dir, tmp)
                os.rename(old / "x", output_dir)
                old.rmdir()
                raise KeyboardInterrupt
            shutil.rmtree(old, ignore_errors=True)


def _check_target(output_dir: Path, overwrite: bool) -> None:
    if not output_dir.exists() and not output_dir.is_symlink():
        return
    if not output_dir.is_dir():
        raise ConversionError("exists and is not a directory", where=str(output_dir), fix="choose another --output_dir")
    if any(output_dir.iterdir()) and not overwrite:
        raise ConversionError("output directory is not empty", where=str(output_dir),
                              fix="pass --overwrite to replace it, or choose another --output_dir")


# -- reading ---------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A TensorRT-LLM checkpoint on disk: config and lazily read rank files."""

    path: Path
    config: dict
    ranks: list[dict[str, LazyTensor]]

    @property
    def tp_size(self) -> int:
        return int(self.config.get("mapping", {}).get("tp_size", 1))

    @property
    def pp_size(self) -> int:
        return int(self.config.get("mapping", {}).get("pp_size", 1))

    def tensor(self, rank: int, name: str) -> torch.Tensor:
        try:
            return self.ranks[rank][name].load()
        except KeyError:
            raise CheckpointError(
                f"tensor {name!r} is missing",
                where=str(self.path / f"rank{rank}.safetensors"),
                fix="the checkpoint is incomplete or was written for another architecture",
            ) from None

    def has(self, rank: int, name: str) -> bool:
        return name in self.ranks[rank]


def no_config(path: Path) -> str:
    """What is wrong with a checkpoint directory that has no config.json, as every reader says it."""
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "not a directory"
    return "no config.json: not a TensorRT-LLM checkpoint directory"


def read_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(
            no_config(path),
            where=str(path),
            fix="pass the --output_dir of `trtllm-medusa convert` (or convert_checkpoint.py)",
        )
    config = read_json(cfg_path, CheckpointError, fix="pass the --output_dir of `trtllm-medusa convert`")
    mapping = config.get("mapping") or {}
    try:
        tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
        world = int(mapping.get("world_size", tp * pp))
        if not isinstance(mapping, dict) or min(tp, pp, world) < 1 or world != tp * pp:
            raise ValueError
    except (TypeError, ValueError, AttributeError):
        raise CheckpointError(f"mapping {mapping!r} is not a valid tensor/pipeline layout", where=str(cfg_path),
                              fix="convert again: mapping needs positive tp_size, pp_size, world_size = tp x pp") from None
    missing = [k for k in ("architecture", "dtype", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "vocab_size") if k not in config]
    if missing:
        raise CheckpointError(f"config.json lacks {', '.join(missing)}", where=str(cfg_path),
                              fix="convert again with trtllm-medusa convert")
    ranks = []
    for r in range(world):
        f = path / f"rank{r}.safetensors"
        if not f.is_file():
            raise CheckpointError(
                f"rank file rank{r}.safetensors is missing (mapping.world_size = {world})",
                where=str(path),
                fix="the conversion did not finish; convert again",
            )
        ranks.append(read_safetensors(f, CheckpointError))
    ckpt = Checkpoint(path, config, ranks)
    check_config(ckpt)
    return ckpt


_CONFIG_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
_RANK_FILE = re.compile(r"rank(\d+)\.safetensors")


def positive_int(v) -> bool:
    return is_int(v, 1)


def check_config(ckpt: Checkpoint) -> None:
    """config.json's sizes typed and in range, its mapping against the rank files present, and its experts against
    the rank files' expert tensors (:func:`check_experts`): the one validation of a checkpoint's config, run by
    :func:`read_checkpoint` for every reader (add-heads, verify, inspect)."""
    cfg, where = ckpt.config, str(ckpt.path / "config.json")
    fix = "config.json must be the one written beside these rank files (the converter's or the quantizing tool's)"
    check_types(cfg, where)
    for k in _CONFIG_SIZES:
        if not positive_int(cfg.get(k)):
            raise CheckpointError(f"{k} is {json.dumps(cfg.get(k))}, not a positive integer", where=where, fix=fix)
    kv = cfg.get("num_key_value_heads")
    if kv is not None and not positive_int(kv):
        raise CheckpointError(f"num_key_value_heads is {json.dumps(kv)}, not a positive integer", where=where, fix=fix)
    if cfg["dtype"] not in CHECKPOINT_DTYPES:
        raise CheckpointError(f"dtype {json.dumps(cfg['dtype'])} is not float16, bfloat16 or float32", where=where,
                              fix="pass a TensorRT-LLM checkpoint: dtype is its float dtype (of the embedding and "
                                  "the norms), whatever its quantization")
    mapping = cfg.get("mapping") or {}
    for k in ("tp_size", "pp_size", "world_size"):
        if k in mapping and not positive_int(mapping[k]):
            raise CheckpointError(f"mapping.{k} is {json.dumps(mapping[k])}, not a positive integer", where=where, fix=fix)
    world = len(ckpt.ranks)
    extra = sorted(int(m.group(1)) for f in ckpt.path.iterdir()
                   if (m := _RANK_FILE.fullmatch(f.name)) and int(m.group(1)) >= world)
    if extra:
        raise CheckpointError(
            f"mapping says world_size {world} (tp_size {ckpt.tp_size} x pp_size {ckpt.pp_size}), but the directory "
            f"also holds {', '.join(f'rank{r}.safetensors' for r in extra)}: the rank files were split for another "
            "mapping", where=where,
            fix="config.json's mapping must be the one the rank files were written for (tp_size x pp_size = the "
                "number of rank files)")
    check_stages(ckpt)
    check_experts(ckpt)
    check_medusa_excluded(ckpt)
    check_medusa_heads(ckpt)


_LAYER = re.compile(r"transformer\.layers\.(\d+)\.")


def check_stages(ckpt: Checkpoint) -> None:
    """Each rank file where the mapping puts it (rank r is tp rank r mod tp_size of pipeline stage r // tp_size, as
    tensorrt_llm/mapping.py numbers them): the first stage's files hold the embedding
    (``transformer.vocab_embedding.weight``), the last stage's and only theirs ``lm_head.weight``, and the stages'
    decoder layers add up to ``num_hidden_layers``. Rank files renamed or swapped between stages are refused here,
    by every reader, before a bundle or an engine is made of them."""
    cfg, where = ckpt.config, str(ckpt.path / "config.json")
    tp, pp = ckpt.tp_size, ckpt.pp_size
    fix = ("the rank files must keep the names the conversion gave them (rank<r>.safetensors, r = stage x tp_size + "
           "tp rank) beside the config.json written with them; convert again")
    layers = 0
    for r, tensors in enumerate(ckpt.ranks):
        stage, name = r // tp, f"rank{r}.safetensors"
        if not tensors:
            raise CheckpointError("the rank file holds no tensors", where=str(ckpt.path / name),
                                  fix="the checkpoint is damaged: write it again (convert, or the quantizing tool)")
        if stage == 0 and "transformer.vocab_embedding.weight" not in tensors:
            raise CheckpointError(f"{name} is of the first pipeline stage (tp_size {tp}, pp_size {pp}) but holds no "
                                  "transformer.vocab_embedding.weight", where=str(ckpt.path / name), fix=fix)
        last = stage == pp - 1
        if pp > 1 and last != ("lm_head.weight" in tensors):
            held = "holds lm_head.weight" if not last else "holds no lm_head.weight"
            raise CheckpointError(f"{name} is of pipeline stage {stage} of {pp} (tp_size {tp}) but {held}, which "
                                  "the last stage alone holds", where=str(ckpt.path / name), fix=fix)
        if r % tp == 0:
            layers += len({m.group(1) for t in tensors if (m := _LAYER.match(t))})
    declared = cfg.get("num_hidden_layers")
    if pp > 1 and layers != declared:
        raise CheckpointError(f"num_hidden_layers is {declared}, but the {pp} pipeline stages' rank files hold "
                              f"{layers} decoder layers together", where=where, fix=fix)


_MEDUSA_PART = re.compile(r"medusa_heads\.(\d+)\.(?:medusa_layers\.(\d+)\.)?")


def check_medusa_heads(ckpt: Checkpoint) -> None:
    """config.json's ``num_medusa_heads`` / ``num_medusa_layers`` against the heads the rank files hold
    (``medusa_heads.H.``, ``medusa_heads.H.medusa_layers.L.``): the one judge of that fact for every reader (deploy
    writes the tree and the LLM API's options from the config; the build declares that many heads, which the load
    then finds missing or too many)."""
    cfg, where = ckpt.config, str(ckpt.path / "config.json")
    declared = {k: cfg.get(k) for k in ("num_medusa_heads", "num_medusa_layers")}
    heads, layers = set(), set()
    for tensors in ckpt.ranks:
        for name in tensors:
            if m := _MEDUSA_PART.match(name):
                heads.add(int(m.group(1)))
                if m.group(2) is not None:
                    layers.add(int(m.group(2)))
    for key, held, what, names in (("num_medusa_heads", heads, "head(s)", "medusa_heads.H"),
                                   ("num_medusa_layers", layers, "ResBlock layer(s) per head",
                                    "medusa_heads.H.medusa_layers.L")):
        value = declared[key]
        if not value or (key == "num_medusa_layers" and not heads):
            continue  # none declared: not a Medusa checkpoint (compat's not-medusa rule says so where one is needed)
        if len(held) != value or held != set(range(value)):  # the length first: a count of 10**12 builds no set
            numbers = ", ".join(map(str, sorted(held)[:8])) + (", ..." if len(held) > 8 else "")
            found = f"{len(held)} {what} numbered {numbers}" if held else f"no {what}"
            raise CheckpointError(f"{key} is {value}, but the rank files hold {found} ({names}, numbered from 0)",
                                  where=where,
                                  fix="config.json must be the one written beside these rank files; convert again, or "
                                      f"set {key} to what the rank files hold")


#: tensorrt_llm/quantization/quantize.py ``quantize_layers``: the exclusions it uses where config.json's
#: ``quantization.exclude_modules`` is missing (None; an empty list excludes nothing); every other
#: linear module becomes a quantized layer, whatever dtype its stored weight has
QUANTIZE_LAYERS_DEFAULT_EXCLUDE = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding",
                                   "*block_embedding", "*shared_expert_gate")
_MEDUSA_LINEAR = re.compile(r"(medusa_heads\.\d+\.(medusa_layers\.\d+\.linear|lm_head))\.weight")


def check_medusa_excluded(ckpt: Checkpoint) -> None:
    """With a ``quant_algo``, every Medusa linear (``medusa_heads.H.medusa_layers.L.linear``, ``medusa_heads.H.lm_head``)
    must be matched by ``exclude_modules`` (fnmatch on the module's dotted name, as quantize_layers matches): the
    heads are stored float, and a head the build quantizes would be a quantized layer over float weights.
    examples/quantization/quantize_by_modelopt.py ``combine_medusa_weight`` adds ``*medusa_heads*`` for this."""
    q = ckpt.config.get("quantization") or {}
    if not isinstance(q, dict) or not q.get("quant_algo"):
        return
    exclude = q.get("exclude_modules")
    where = str(ckpt.path / "config.json")
    if exclude is not None and (not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude)):
        raise CheckpointError(f"quantization.exclude_modules is {json.dumps(exclude)[:200]}, not a list of module "
                              "patterns", where=where, fix='write a list of fnmatch patterns, e.g. ["*lm_head", '
                                                            '"*medusa_heads*"]')
    patterns = list(QUANTIZE_LAYERS_DEFAULT_EXCLUDE) if exclude is None else exclude
    for r, tensors in enumerate(ckpt.ranks):
        for name in tensors:
            m = _MEDUSA_LINEAR.fullmatch(name)
            if m and not any(fnmatch.fnmatchcase(m.group(1), p) for p in patterns):
                said = (f"exclude_modules {json.dumps(exclude)}" if exclude else
                        "an empty exclude_modules (which excludes nothing)" if exclude == [] else
                        "no exclude_modules (so quantize_layers' defaults, which name no Medusa module)")
                raise CheckpointError(
                    f"quant_algo {q['quant_algo']} with {said}: the Medusa linear {m.group(1)} (rank{r}.safetensors) "
                    "would be built as a quantized layer (tensorrt_llm/quantization/quantize.py quantize_layers) over "
                    "the float weights stored for it", where=where,
                    fix='add "*medusa_heads*" to quantization.exclude_modules (as examples/quantization/'
                        "quantize_by_modelopt.py combine_medusa_weight does), or convert again")


#: an MoE layer's tensors in the rank files (tensorrt_llm/layers/moe.py ``MOE``: the router ``[experts, hidden]``
#: in float32 and never split, ``fc`` ``[experts of the rank, 2 x inter / moe_tp_size, hidden]``, ``proj``
#: ``[experts of the rank, hidden, inter / moe_tp_size]``; Qwen2-MoE's ``SharedMoE`` adds a shared expert ``MLP``
#: split tp_size ways and its gate ``[1, hidden]``: tensorrt_llm/models/qwen/model.py)
_EXPERT_TENSOR = re.compile(
    r"transformer\.layers\.\d+\.mlp\.(router|fc|proj|shared_expert\.fc|shared_expert\.proj|shared_expert_gate)"
    r"\.weight")
_EXPERT_FIX = ("config.json and the rank files must come from one conversion: convert again, or restore the "
               "config.json written beside these rank files")


def nonnegative_int(v) -> bool:
    return is_int(v, 0)


def moe_counts(cfg: dict, where: str) -> tuple[int, int]:
    """config.json's ``moe.num_experts`` and ``moe.top_k``, typed and in range: non-negative integers (0, the
    default of each, when absent), both or neither 0 (tensorrt_llm/layers/moe.py ``MoeConfig.validate``), and with
    experts (``num_experts > 1``: ``MoeConfig.has_moe``) a top-k of at most the expert count."""
    moe = cfg.get("moe")
    if moe is None:
        return 0, 0
    if not isinstance(moe, dict):
        raise CheckpointError(f"moe is {json.dumps(moe)}, not an object of TensorRT-LLM's MoeConfig fields",
                              where=where, fix=_EXPERT_FIX)
    counts = []
    for k in ("num_experts", "top_k"):
        v = moe.get(k, 0)
        if not nonnegative_int(v):
            raise CheckpointError(f"moe.{k} is {json.dumps(v)}, not a non-negative integer", where=where,
                                  fix=_EXPERT_FIX)
        counts.append(v)
    experts, top_k = counts
    if (experts == 0) != (top_k == 0) or top_k > max(experts, 1):
        raise CheckpointError(f"moe.top_k is {top_k} with moe.num_experts {experts}: the experts each token is "
                              "routed to are 1 to num_experts (both 0 without experts; tensorrt_llm/layers/moe.py "
                              "MoeConfig.validate)", where=where, fix=_EXPERT_FIX)
    return experts, top_k


def _positive_field(cfg: dict, key: str, where: str) -> int:
    v = (cfg.get("mapping") or {}).get(key.split(".", 1)[1]) if key.startswith("mapping.") else cfg.get(key)
    if not positive_int(v):
        raise CheckpointError(f"{key} is {json.dumps(v)}, not a positive integer (the expert tensors' sizes read "
                              "it)", where=where, fix=_EXPERT_FIX)
    return v


def expert_shapes(cfg: dict, experts: int, where: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each expert tensor's shape on every rank, and the config.json fields it comes from; ``mapping``'s
    ``moe_tp_size`` x ``moe_ep_size`` must be ``tp_size`` (tensorrt_llm/mapping.py; ``moe_ep_size`` 1 and
    ``moe_tp_size`` tp_size where absent) and divide the intermediate size and the experts."""
    mapping = cfg.get("mapping") or {}
    tp = int(mapping.get("tp_size", 1))
    ep = _positive_field(cfg, "mapping.moe_ep_size", where) if "moe_ep_size" in mapping else 1
    moe_tp = _positive_field(cfg, "mapping.moe_tp_size", where) if "moe_tp_size" in mapping else tp // ep
    inter_key = "moe_intermediate_size" if "moe_intermediate_size" in cfg else "intermediate_size"
    inter, hidden = _positive_field(cfg, inter_key, where), cfg["hidden_size"]
    if moe_tp * ep != tp or experts % ep or inter % moe_tp:
        raise CheckpointError(f"mapping.moe_tp_size {moe_tp} x mapping.moe_ep_size {ep} must be tp_size {tp} and "
                              f"divide {inter_key} {inter} and moe.num_experts {experts} respectively", where=where,
                              fix=_EXPERT_FIX)
    per_rank = f"moe.num_experts {experts} / mapping.moe_ep_size {ep}"
    cut = f"{inter_key} {inter} / mapping.moe_tp_size {moe_tp}"
    shapes = {"router": ((experts, hidden), f"moe.num_experts {experts}, hidden_size {hidden}"),
              "fc": ((experts // ep, 2 * inter // moe_tp, hidden), f"{per_rank}, 2 x {cut}, hidden_size {hidden}"),
              "proj": ((experts // ep, hidden, inter // moe_tp), f"{per_rank}, hidden_size {hidden}, {cut}")}
    shared = cfg.get("moe_shared_expert_intermediate_size")
    if positive_int(shared) and shared % tp == 0:
        cut = f"moe_shared_expert_intermediate_size {shared} / mapping.tp_size {tp}"
        shapes.update({"shared_expert.fc": ((2 * shared // tp, hidden), f"2 x {cut}, hidden_size {hidden}"),
                       "shared_expert.proj": ((hidden, shared // tp), f"hidden_size {hidden}, {cut}"),
                       "shared_expert_gate": ((1, hidden), f"hidden_size {hidden}")})
    return shapes


def check_experts(ckpt: Checkpoint) -> None:
    """``moe`` (:func:`moe_counts`) and the rank files' expert tensors against it, from the safetensors headers
    (nothing is loaded): every layer's router, fc and proj (and shared expert) the shapes :func:`expert_shapes`
    gives - for a quantized (non-float) tensor its expert axis only - and no expert tensor in a checkpoint whose
    config has no experts (TensorRT-LLM would build a dense MLP there)."""
    where = str(ckpt.path / "config.json")
    experts, _ = moe_counts(ckpt.config, where)
    shapes = expert_shapes(ckpt.config, experts, where) if experts > 1 else {}
    for rank, tensors in enumerate(ckpt.ranks):
        for name, t in tensors.items():
            m = _EXPERT_TENSOR.fullmatch(name)
            if m is None or (not shapes and m.group(1) not in ("router", "fc")):
                continue
            file, got = f"rank{rank}.safetensors", tuple(t.shape)
            if not shapes:
                if m.group(1) == "router" or len(got) == 3:
                    raise CheckpointError(
                        f"{name} in {file} is an MoE expert tensor {list(got)}, but config.json's moe.num_experts is "
                        f"{experts}: TensorRT-LLM builds a dense MLP there (tensorrt_llm/layers/moe.py "
                        "MoeConfig.has_moe: num_experts > 1)", where=str(ckpt.path / file), fix=_EXPERT_FIX)
                continue
            want, fields = shapes.get(m.group(1), (None, ""))
            if want is None:
                continue
            same = got == want if t.dtype_name in CHECKPOINT_DTYPES else got[:1] == want[:1] and len(got) == len(want)
            if not same:
                raise CheckpointError(f"{name} is {list(got)} in {file}, but config.json implies {list(want)} "
                                      f"({fields})", where=str(ckpt.path / file), fix=_EXPERT_FIX)


def write_config(directory: Path, cfg: dict, durable: bool) -> None:
    """``directory/config.json``; with ``durable``, it and the directory's entries are on disk (fsync) before the
    directory is swapped in (the writers of a new checkpoint: convert and add-heads)."""
    (directory / "config.json").write_text(json.dumps(cfg, indent=4) + "\n")
    if durable:
        for path in (directory / "config.json", directory):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

