"""The Hugging Face base in bounded memory: one module's weights at a time (``verify --streaming``; train-heads'
bounded memory can use it the same way).

:func:`load_streamed` lets transformers load the model as it always does - its own key renaming, weight
conversions (a mixture of experts' stacked ``gate_up_proj``), tied weights and buffers - but every parameter
it sets is written to a :class:`WeightStore` (one unlinked temporary file, in the smallest float dtype that
holds the value exactly) and replaced by a placeholder on the ``meta`` device
(``torch.nn.modules.module.register_module_parameter_registration_hook``, a public torch hook: transformers 5
sets each loaded parameter with ``setattr``; transformers 4.57, the version TensorRT-LLM 1.2 pins, with
``load_state_dict(assign=True)``, which sets it the same way). The model then holds its buffers (RoPE frequencies,
masks) and no weight; a parameter set any other way is refused by name when the units are made.

Each *unit* - a decoder layer (an element of the model's top-level ``ModuleList``), or any other module that
owns parameters (embedding, final norm, lm_head) - gets a forward pre-hook that reads its parameters back
(through ``value``, e.g. verify's rounding to the checkpoint dtype) and a forward hook that drops them
again, so that a forward pass holds one unit's weights at a time, plus the activations and the KV cache of
the sequences. The module code that runs is transformers' own, on the values transformers loaded: the results
are those of the model loaded in memory, bit for bit. Code that reads weights outside a forward pass (a
quantization emulation editing them, an lm_head read as a matrix) wraps it in :meth:`StreamedWeights.materialized`;
an edit that must outlive the unit's eviction is kept with :meth:`StreamedWeights.persist`.

A weight read outside both - a placeholder on ``meta`` - fails loudly in torch (no silent zeros).

Below ``huggingface``; imports the file layer and errors only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtllm_medusa_ports.errors import ModelError
from trtllm_medusa_ports.files.hf_model import transformers_load_kwargs

#: the dtypes a captured weight may be kept in, smallest first: the first that holds it exactly is used
_EXACT_DTYPES = (torch.bfloat16, torch.float16)
#: values a weight is checked, converted and written in at a time (4 MB of float32)
_CHUNK = 1 << 20


class WeightStore:
    """Tensors appended to one temporary file that is unlinked at once (nothing is left behind, whatever
    happens), read back with ``pread``. ``directory``: where the file is made (default: the system's temporary
    directory - pass one on a disk, not a RAM-backed tmpfs, for a model larger than memory)."""

    def __init__(self, directory: str | Path | None = None):
        where = str(directory) if directory is not None else tempfile.gettempdir()
        try:
            fd, path = tempfile.mkstemp(prefix="trtllm-medusa-weights-", suffix=".bin", dir=where)
            os.unlink(path)
        except OSError as exc:
            raise ModelError(f"cannot make the streaming weight file ({exc.strerror})", where=where,
                             fix="pass a writable directory on a disk (--offload_dir)") from None
        self.directory = where
        self._fd = fd
        self._end = 0
        self._index: dict[str, tuple[int, int, torch.dtype, tuple[int, ...]]] = {}
        self._alignment: dict[str, int] = {}
        self._finalizer = weakref.finalize(self, os.close, fd)

    @property
    def nbytes(self) -> int:
        """Bytes written to the file (a rewritten tensor of another size takes new bytes)."""
        return self._end

    def put(self, key: str, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` (a float tensor; kept in bfloat16 or float16 where that holds it exactly), and where its
        data sat against a 64-byte boundary (:meth:`alignment`). Checked, converted and written
        :data:`_CHUNK` values at a time: no second copy of a weight is made."""
        self._alignment[key] = tensor.data_ptr() % _ALIGN
        flat = tensor.detach().to("cpu").reshape(-1)
        pieces = range(0, flat.numel(), _CHUNK)
        dtype = flat.dtype
        if dtype == torch.float32:
            dtype = next((d for d in _EXACT_DTYPES if all(torch.equal(flat[i:i + _CHUNK].to(d).float(),
                                                                      flat[i:i + _CHUNK]) for i in pieces)), dtype)
        nbytes = flat.numel() * torch.empty(0, dtype=dtype).element_size()
        old = self._index.get(key)
        offset = old[0] if old is not None and old[1] == nbytes else self._end
        done = 0
        try:
            for i in pieces:
                view = memoryview(flat[i:i + _CHUNK].to(dtype).contiguous().view(torch.uint8).numpy()).cast("B")
                written = 0
                while written < len(view):
                    written += os.pwrite(self._fd, view[written:], offset + done + written)
                done += written
        except OSError as exc:
            hint = " (the disk is full)" if exc.errno == errno.ENOSPC else ""
            raise ModelError(f"cannot write the streaming weight file ({exc.strerror}){hint}", where=self.directory,
                             fix="pass --offload_dir on a disk with room for the base in its own dtype") from None
        self._index[key] = (offset, nbytes, dtype, tuple(tensor.shape))
        self._end = max(self._end, offset + nbytes)

    def get(self, key: str) -> torch.Tensor:
        """The tensor kept under ``key``, in float32 (the exact value that was put)."""
        return self.get_stored(key).to(torch.float32)

    def get_stored(self, key: str) -> torch.Tensor:
        """The tensor kept under ``key`` in the dtype it is kept in (the put value, exactly)."""
        offset, nbytes, dtype, shape = self._index[key]
        if nbytes == 0:
            return torch.zeros(shape, dtype=dtype, device="cpu")
        buf = bytearray(nbytes)
        view, done = memoryview(buf), 0
        while done < nbytes:
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise ModelError("the streaming weight file ended early", where=self.directory,
                                 fix="run again; the temporary file was changed while in use")
            done += n
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)

    def alignment(self, key: str) -> int:
        """The put tensor's data address modulo 64 bytes. Matrix kernels pick their code path by it (a float32
        weight transformers maps from a safetensors file sits wherever the file's header put it), and two paths
        round differently: a weight is read back at the same offset (:func:`placed`)."""
        return self._alignment[key]

    def close(self) -> None:
        self._finalizer()


#: the boundary kernels align to (a cache line; torch's CPU and CUDA allocators give at least this)
_ALIGN = 64


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` (any float dtype) holds exactly ``b``'s values, compared :data:`_CHUNK` values at a time."""
    if a.shape != b.shape:
        return False
    fa, fb = a.reshape(-1), b.reshape(-1)
    return all(torch.equal(fa[i:i + _CHUNK].to(fb.dtype), fb[i:i + _CHUNK]) for i in range(0, fb.numel(), _CHUNK))


def placed(t: torch.Tensor, alignment: int, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` copied (as ``dtype``, default its own) onto ``device`` with its data ``alignment`` bytes past a 64-byte
    boundary (see :meth:`WeightStore.alignment`)."""
    dtype = dtype or t.dtype
    item = torch.empty(0, dtype=dtype).element_size()
    if alignment % item:
        return t.to(device=device, dtype=dtype)
    pad = _ALIGN // item
    buf = torch.empty(t.numel() + pad, dtype=dtype, device=device)
    shift = ((alignment - buf.data_ptr()) % _ALIGN) // item
    out = buf[shift:shift + t.numel()].view(t.shape)
    out.copy_(t)
    return out


@dataclass
class _Entry:
    owner: torch.nn.Module
    attr: str
    key: str
    #: the parameter's first name in ``named_parameters()`` (a tied weight's other names share it)
    name: str


@dataclass
class _Unit:
    name: str
    module: torch.nn.Module
    entries: list[_Entry] = field(default_factory=list)
    depth: int = 0


class StreamedWeights:
    """The weights of a model loaded by :func:`load_streamed` (``streamed_weights(model)``)."""

    def __init__(self, model: torch.nn.Module, store: WeightStore, placeholders: dict[str, torch.nn.Parameter],
                 value: Callable[[str, torch.Tensor], torch.Tensor] | None, device: str | torch.device):
        self.model = model
        self.store = store
        self.device = torch.device(device)
        self._value = value
        self._placeholders = placeholders
        self._final: set[str] = set()
        #: how many times a unit's weights were read (each forward pass reads every unit once)
        self.loads = 0
        self.units = _units(model, {id(p): k for k, p in placeholders.items()})
        self._handles = []
        for unit in self.units:
            self._handles.append(unit.module.register_forward_pre_hook(
                lambda _m, _a, u=unit: self._enter(u), prepend=True))
            self._handles.append(unit.module.register_forward_hook(
                lambda _m, _a, _o, u=unit: self._leave(u), always_call=True))

    def _read(self, entry: _Entry) -> torch.Tensor:
        """A weight in float32 where transformers had it (its device, its alignment), through ``value``: the kept
        bytes, one float32 copy and ``value``'s result at most at once."""
        # on the CPU where transformers' weight sat against a cache line; elsewhere (a GPU) where its allocator puts
        # a weight the model is moved there with: at the start of a block
        align = self.store.alignment(entry.key) if self.device.type == "cpu" else 0
        out = placed(self.store.get_stored(entry.key), align, self.device, torch.float32)
        if self._value is not None and entry.key not in self._final:
            with torch.no_grad():
                v = self._value(entry.name, out)
                if _same(v, out):  # ``value`` keeps this weight as it is (a bfloat16 base verified in bfloat16):
                    self._final.add(entry.key)  # the same input gives the same output, so never again
                else:
                    out.copy_(v)
        return out

    def _enter(self, unit: _Unit) -> None:
        unit.depth += 1
        if unit.depth > 1:
            return
        self.loads += 1
        read: dict[str, torch.nn.Parameter] = {}
        for e in unit.entries:
            if e.key not in read:
                read[e.key] = torch.nn.Parameter(self._read(e), requires_grad=False)
            setattr(e.owner, e.attr, read[e.key])

    def _leave(self, unit: _Unit) -> None:
        unit.depth -= 1
        if unit.depth:
            return
        for e in unit.entries:
            setattr(e.owner, e.attr, self._placeholders[e.key])

    def _units_of(self, modules: tuple[torch.nn.Module, ...]) -> list[_Unit]:
        if not modules:
            return list(self.units)
        names = {id(m): n for n, m in self.model.named_modules()}
        wanted = [names[id(m)] for m in modules]
        return [u for u in self.units
                if any(w == u.name or w.startswith(u.name + ".") or u.name.startswith(w + ".") or w == ""
                       for w in wanted)]

    @contextlib.contextmanager
    def materialized(self, *modules: torch.nn.Module) -> Iterator[None]:
        """The weights of the units holding ``modules`` (or inside them; none given: every unit - the whole
        model, for small models only) in place for the block."""
        units = self._units_of(modules)
        for u in units:
            self._enter(u)
        try:
            yield
        finally:
            for u in units:
                self._leave(u)

    def persist(self, *modules: torch.nn.Module) -> None:
        """Keep the current values of the units holding ``modules`` (materialized, possibly edited in place) as
        their weights from now on; ``value`` is not applied to them again."""
        for u in self._units_of(modules):
            if not u.depth:
                raise ModelError(f"{u.name}'s weights are not in place: nothing to keep",
                                 fix="call persist inside materialized(...) of the same modules")
            for e in u.entries:
                self.store.put(e.key, getattr(e.owner, e.attr).detach())
                self._final.add(e.key)

    @property
    def largest_unit_bytes(self) -> int:
        """Float32 bytes of the largest unit: what one forward pass holds of the weights at a time."""
        def size(u: _Unit) -> int:
            return 4 * sum(self._placeholders[k].numel() for k in {e.key for e in u.entries})
        return max((size(u) for u in self.units), default=0)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.store.close()


def _units(model: torch.nn.Module, key_of: dict[int, str]) -> list[_Unit]:
    """The model's units (see the module doc), each with its parameters' owners, keys and first names."""
    first_name: dict[int, str] = {id(p): n for n, p in model.named_parameters()}
    units: list[tuple[_Unit, bool]] = []  # (unit, with the parameters of its submodules)
    covered: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(c + ".") for c in covered):
            continue
        if isinstance(module, torch.nn.ModuleList):  # the decoder layers: each with everything inside it
            units += [(_Unit(f"{name}.{i}", child), True) for i, child in enumerate(module)]
            covered.append(name)
        elif any(True for _ in module.parameters(recurse=False)):
            units.append((_Unit(name, module), False))
    for unit, recurse in units:
        for rel, p in unit.module.named_parameters(recurse=recurse, remove_duplicate=False):
            owner_name, _, attr = rel.rpartition(".")
            if id(p) not in key_of:
                raise ModelError(f"parameter {unit.name}.{rel} was not loaded through the streaming loader",
                                 fix="load this base in memory (verify without --streaming)")
            owner = unit.module.get_submodule(owner_name) if owner_name else unit.module
            unit.entries.append(_Entry(owner, attr, key_of[id(p)], first_name[id(p)]))
    return [u for u, _ in units if u.entries]


#: glibc's mallopt parameter for the size from which a block is mapped on its own (and unmapped when freed)
_M_MMAP_THRESHOLD = -3


def bound_the_allocator(threshold: int = 128 * 1024) -> bool:
    """Make glibc's malloc map every block of ``threshold`` bytes or more on its own and unmap it when freed.

    By default glibc raises that threshold to the size of each large block freed (up to 32 MB), after which
    blocks of weight-sized tensors come from its heap and, freed between interleaved small allocations, are
    never returned: streaming a model's weights through it grows the resident memory by most of the model
    (measured: 320 MB over a 400 MB float32 base's load, flat with the threshold fixed). A process-wide
    setting; False where the C library has no ``mallopt`` (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


def _from_pretrained_one_by_one(auto, model_dir: str | Path):
    """``auto.from_pretrained`` in float32, with its loading info, one weight at a time: transformers 5
    materializes every weight ahead in a thread pool unless told not to (core_model_loading.py
    convert_and_load_state_dict_in_model reads HF_DEACTIVATE_ASYNC_LOAD, set for the call and restored); its
    failures named."""
    before = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
    try:
        return auto.from_pretrained(str(model_dir), dtype=torch.float32, output_loading_info=True,
                                    **transformers_load_kwargs(model_dir))
    except ModelError:
        raise
    except Exception as exc:  # transformers raises many types; keep the message
        raise ModelError(f"transformers could not load the base model ({type(exc).__name__}: {str(exc)[:300]})",
                         where=str(model_dir),
                         fix="pass the Hugging Face model directory the checkpoint was converted from") from None
    finally:
        if before is None:
            os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = before


def load_streamed(model_dir: str | Path, *, value: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
                  device: str | torch.device = "cpu", offload_dir: str | Path | None = None):
    """The transformers model of ``model_dir`` (float32) with its weights streamed (see the module doc).

    ``value(name, weight)``: applied to each weight (float32, where it computes) each time it is read, ``name`` its
    first name in ``named_parameters()``; it returns the values to use, in any float dtype that holds them (they
    are copied into the float32 weight). ``device``: where the read weights are put. Returns the model
    (``streamed_weights(model)`` gives its :class:`StreamedWeights`)."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers5 = int(transformers.__version__.split(".")[0]) >= 5
    bound_the_allocator()
    store = WeightStore(offload_dir)
    placeholders: dict[str, torch.nn.Parameter] = {}

    def capture(_module, _name, param):
        if param is None or param.device.type == "meta":
            return None
        key = str(len(placeholders))
        store.put(key, param)
        meta = torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
        if transformers5:  # a loaded weight, never initialised again (transformers 4 copies a parameter's attributes
            meta._is_hf_initialized = True  # into Parameter(...) as keywords: it marks loaded modules instead)
        placeholders[key] = meta
        return meta

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(capture)
    try:
        model, info = _from_pretrained_one_by_one(AutoModelForCausalLM, model_dir)
    finally:
        handle.remove()
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        store.close()
        raise ModelError(f"the base's weight files lack {len(missing)} weight(s) the model has ({missing[0]}, ...)",
                         where=str(model_dir), fix="pass a complete Hugging Face model directory")
    if torch.device(device).type != "cpu":  # the buffers (RoPE frequencies, masks) live where the weights go
        for module in model.modules():
            for name, buf in module._buffers.items():
                if buf is not None:
                    module._buffers[name] = buf.to(device)
    streamed = StreamedWeights(model, store, placeholders, value, device)
    model._medusa_streamed = streamed  # noqa: SLF001 - where streamed_weights finds it
    return model.eval()


def streamed_weights(model) -> StreamedWeights | None:
    """The :class:`StreamedWeights` of a model :func:`load_streamed` made, else None (a model in memory)."""
    return getattr(model, "_medusa_streamed", None)


def to_dtype(model, dtype: torch.dtype):
    """``model.to(dtype)``, for a model :func:`load_streamed` made too: its buffers and placeholders are cast, and
    each unit's weights are cast as they are read (after ``value``), so that it computes as the model loaded in
    float32 and cast in memory does - the same values, the same products. Returns the model."""
    model = model.to(dtype)
    streamed = streamed_weights(model)
    if streamed is None:
        return model

    def cast(unit: _Unit) -> None:
        for e in unit.entries:
            w = getattr(e.owner, e.attr)
            if w.device.type != "meta" and w.dtype != dtype:
                setattr(e.owner, e.attr, torch.nn.Parameter(w.detach().to(dtype), requires_grad=False))

    for unit in streamed.units:  # after the hook that reads the weights (registered first, with prepend)
        streamed._handles.append(unit.module.register_forward_pre_hook(lambda _m, _a, u=unit: cast(u)))
    return model
