"""The conversion's fast path: move bytes, not tensors.

A tensor-parallel split along dim 0, a vocabulary pad and the q/k/v concatenation
take contiguous byte ranges of the source file to contiguous byte ranges of a rank
file. Where the checkpoint dtype is the source's, those ranges are copied by the
kernel (``os.copy_file_range``, falling back to ``pread``/``pwrite``) straight to their
planned offsets in the rank files; no tensor is made. A split along dim 1 (row-parallel
weights) takes a column slice of every row: it is read once in bounded row chunks and
cut with numpy. A dtype change between float32, float16 and bfloat16 is cast chunk by chunk
with numpy, bit for bit what torch's cast (the tensor path's ``t.to(dtype)``) gives
(files/dtypes.py ``cast_bits``, tested on every 16-bit pattern); other casts use torch's, the
only step here that imports it. So a conversion of safetensors inputs runs without torch.

FP8 weights (quantized checkpoints, trtllm_medusa_ports/quant) take the same pieces in two
passes: :meth:`ByteMover.amax` reads what the pieces take once, in chunks, for the per-tensor
scale (the largest magnitude, found on the values' bits); then the pieces are cast chunk by chunk
to float8_e4m3fn with that scale, through torch's own ops (the tensor path's
``quant.fp8_weight``, op for op), so no whole weight is ever in memory.

Which bytes go where is not worked out a second time here: the job's own combine and
split rule run on small integer *stand-ins* (numpy int64 arrays, one value per source row
and column chunk, naming the source, the row and the chunk; see trtllm_medusa_ports/weights/arrays.py),
so the layout is the one the tensor path computes by construction. Jobs that change values (Gemma's ``w + 1``), pickled
sources and layouts the stand-ins cannot follow keep going through the tensor path.

Every job is classified before anything is written (:class:`MoveKind`), so a test can
assert which path a tensor takes.
"""

from __future__ import annotations

import enum
import errno
import mmap
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtllm_medusa_ports.files.dtypes import (
    BY_NAME,
    can_cast_without_torch,
    cast_bits,
    itemsize,
    scratch,
    to_torch,
)

#: bytes of source read per chunk on the strided and converting paths (per thread)
CHUNK_BYTES = 2 << 20
#: source GB/s of one thread casting CHUNK_BYTES chunks, numpy's exact cast (files/dtypes.py
#: ``cast_bits``) and torch's, per (source, checkpoint) dtype pair; measured by benchmarks/casts.py
#: (benchmarks/results/casts.json)
CAST_RATES = {
    ("bfloat16", "float16"): (3.32, 4.58),
    ("bfloat16", "float32"): (0.92, 16.13),
    ("float32", "float16"): (1.48, 19.56),
    ("float32", "bfloat16"): (5.04, 18.99),
    ("float16", "float32"): (1.11, 15.70),
    ("float16", "bfloat16"): (0.80, 2.08),
}
#: seconds a conversion spends importing torch (and its ~200 MB of libraries), benchmarks/casts.py
TORCH_IMPORT_S = 0.87


def torch_casts_pay(plans: Sequence[MovePlan], lanes: int = 1, torch_loaded: bool | None = None) -> bool:
    """Whether a conversion should cast with torch: the time torch's faster casts save, spread over the ``lanes``
    that cast side by side, is more than importing torch costs. A conversion that only moves bytes, or casts little,
    stays without torch; so does bfloat16 -> float16 up to about 21 GB of casts on two lanes (numpy's route there
    is 0.7x torch's speed, not 0.1x). Where torch is already loaded (``torch_loaded``; default: whether this process
    has imported it - a pipeline that checked or calibrated first) the import costs nothing, and any cast torch does
    faster takes torch's (1.4x to 17x numpy's per pair: benchmarks/results/casts.json)."""
    saved = 0.0
    for plan in plans:
        if not plan.casts:
            continue
        for s in plan.sources:
            rates = CAST_RATES.get((s.dtype, plan.dtype))
            if rates is not None:
                saved += s.nbytes / 1e9 * (1 / rates[0] - 1 / rates[1])
    loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    return saved > 0 and saved / max(1, lanes) > (0.0 if loaded else TORCH_IMPORT_S)


#: bytes of a source mapped at a time for the NaN/Inf check of a byte copy. Checking through a
#: mapping and copying with ``os.copy_file_range`` beat 1 MB rounds of pread, check and pwrite
#: through one buffer: 0.68x against 0.61x of ``copy_file_range`` alone on one thread, 0.82x
#: against 0.24-0.72x on two (benchmarks/copies.py, benchmarks/results/copies.json)
CHECK_WINDOW = 4 << 20

_SRC_BITS, _ROW_BITS, _COL_BITS = 40, 32, 8
_ROW_MASK = (1 << _ROW_BITS) - 1
_COL_MASK = (1 << _COL_BITS) - 1

#: integer view and exponent mask of each float dtype (by name): a value is NaN/Inf exactly when
#: every exponent bit is set (files/finite.py checks tensors the same way)
_EXPONENT = {d.name: (np.dtype(d.bits), d.exponent) for d in BY_NAME.values() if d.bits}


class MoveKind(str, enum.Enum):
    """How one conversion job reaches the rank files."""

    BYTE_COPY = "byte-copy"  # same dtype, whole rows: the kernel copies byte ranges
    STRIDED = "strided"  # same dtype, column slices (dim-1 splits): chunked reads, numpy slicing
    CONVERT = "convert"  # dtype change of a pure layout: chunked reads, cast per chunk (numpy; torch for float64)
    FP8 = "fp8-cast"  # FP8 weight of a pure layout: chunked reads, scaled cast per chunk (torch), see Fp8Cast
    #: per-expert matrices written transposed (DBRX's down-projection): each expert block's rows read in chunks
    #: into a bounded tile of its columns, transposed, cast where the dtype changes, checked and written
    TRANSPOSED = "transposed"
    TENSOR = "tensor"  # value transforms, pickles, generated tensors: the whole-tensor path


@dataclass(frozen=True)
class Source:
    """A source tensor as a byte range of a file; ``dtype`` by name (files/dtypes.py)."""

    path: Path
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def rows(self) -> int:
        """Rows of the tensor seen as a matrix: a 3-D ``[experts, rows, width]`` tensor (row-major) is the
        matrix ``[experts * rows, width]`` byte for byte."""
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else self.shape[0]

    @property
    def width(self) -> int:
        """Elements per row (1 for a vector); the last dimension otherwise."""
        return self.shape[-1] if len(self.shape) > 1 else 1

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def row_bytes(self) -> int:
        return self.width * self.itemsize

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class Piece:
    """Rows ``[row_start, row_end)``, columns ``[col_start, col_end)`` of one source, landing
    contiguously at ``dest_offset`` bytes into tensor ``name`` of rank ``rank``."""

    source: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    rank: int
    name: str
    dest_offset: int

    def whole_rows(self, width: int) -> bool:
        return self.col_start == 0 and self.col_end == width


@dataclass
class Fp8Cast:
    """How an FP8 plan's values are made: rounded to the checkpoint dtype ``via`` (as the tensor path's
    sources are), then ``(w / scale)`` in float32, saturated to +-448 and rounded to float8_e4m3fn
    (quant.fp8_weight). ``scale`` is set once the amax pass has measured the tensor's scale group."""

    via: str
    scale: float | None = None


@dataclass
class MovePlan:
    kind: MoveKind
    sources: list[Source] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    targets: list[tuple[int, str]] = field(default_factory=list)
    dtype: str = "float32"  # the stored dtype, by name (the checkpoint dtype, or float8_e4m3fn)
    why: str = ""  # for TENSOR: why the fast path does not apply
    fp8: Fp8Cast | None = None  # for FP8
    #: for TRANSPOSED: source rows per expert block; each block of the untransposed layout ``[rows, width]`` is
    #: written as ``[width, rows]`` at the same place
    block_rows: int = 0

    @property
    def source_bytes(self) -> int:
        """The bytes its sources hold (what the move reads)."""
        return sum(s.nbytes for s in self.sources)

    @property
    def casts(self) -> bool:
        """Values change dtype on the way (CONVERT, or a TRANSPOSED plan between dtypes)."""
        return self.kind is MoveKind.CONVERT or (self.kind is MoveKind.TRANSPOSED
                                                 and any(s.dtype != self.dtype for s in self.sources))

    @property
    def needs_torch(self) -> bool:
        """A cast numpy does not do here (float64 sources, FP8): torch's own."""
        if self.kind is MoveKind.FP8:
            return True
        return self.casts and not all(can_cast_without_torch(s.dtype, self.dtype) for s in self.sources)

    def as_fp8(self, via: str) -> MovePlan:
        """This plan (traced with dtype float8_e4m3fn) as the FP8 cast of values in checkpoint dtype ``via``;
        a TENSOR plan stays one."""
        if self.kind is MoveKind.TENSOR:
            return self
        if self.kind is MoveKind.TRANSPOSED:
            return MovePlan(MoveKind.TENSOR, targets=self.targets, dtype=self.dtype,
                            why="an FP8 cast of a transposed layout is made on the tensor path")
        assert self.dtype == "float8_e4m3fn", self.dtype
        return MovePlan(MoveKind.FP8, self.sources, self.pieces, self.targets, self.dtype, fp8=Fp8Cast(via))


def standin(index: int, shape: tuple[int, ...], tp_size: int) -> np.ndarray:
    """One int64 per row (vector) or per row and column chunk (matrix): source, row + 1, chunk.

    A numpy array: the split rules and layout combines run on it as on a tensor (arrays.py). A 3-D
    source (fused stacked experts) is numbered as its matrix view (``Source.rows``) and shaped back.
    """
    n = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
    rows = ((np.arange(n, dtype=np.int64) + 1) << _COL_BITS) | np.int64(index << _SRC_BITS)
    if len(shape) == 1:
        return rows
    return (rows[:, None] | np.arange(tp_size, dtype=np.int64)[None, :]).reshape(tuple(shape[:-1]) + (tp_size,))


def _target_pieces(v: np.ndarray, shape: tuple[int, ...], sources: Sequence[Source], chunk: int, matrix: bool,
                   rank: int, name: str, out_itemsize: int) -> list[Piece] | str:
    """The pieces that make one target from its traced stand-in ``v`` (planned ``shape``): runs of consecutive
    source rows in consecutive destination rows, one column range; why not (a string) where the layout is no
    such set."""
    out: list[Piece] = []
    if v.ndim == 3 and len(shape) == 3:  # stacked MoE experts: rows of [experts * rows, width], row-major
        v = v.reshape(-1, v.shape[-1])
        shape = (shape[0] * shape[1], shape[2])
    if v.ndim == 1:
        v = v[:, None]
        if len(shape) != 1 or v.shape[0] != shape[0]:
            return "traced shape differs from the plan"
        dest_width = 1
    else:
        if len(shape) != 2 or v.shape[0] != shape[0] or v.shape[1] * chunk != shape[1]:
            return "traced shape differs from the plan"
        dest_width = shape[1]
    pad = (v == 0).all(axis=1)
    real = v[~pad]
    if (real == 0).any():
        return "padding inside a row"
    src = real >> _SRC_BITS
    row = ((real >> _COL_BITS) & _ROW_MASK) - 1
    col = real & _COL_MASK
    if real.shape[0]:
        if not ((src == src[:, :1]).all() and (row == row[:, :1]).all()):
            return "a row mixes sources or rows"
        pattern = col[0]
        if not ((col == pattern).all() and (np.diff(pattern) == 1).all()):
            return "columns are not one contiguous range"
        if v.shape[1] > 1 and len(sources[0].shape) == 1:
            return "vector traced as a matrix"
        col_start = int(pattern[0]) * chunk if matrix else 0
        col_end = col_start + dest_width
        s_all, r_all = src[:, 0], row[:, 0]
        if (s_all >= len(sources)).any() or (r_all < 0).any() or \
                (r_all >= np.array([s.rows for s in sources])[s_all]).any():
            return "stand-in values out of range"
    # runs of consecutive source rows in consecutive destination rows
    s_full = np.full(v.shape[0], -1, dtype=np.int64)
    r_full = np.full(v.shape[0], -2, dtype=np.int64)
    if real.shape[0]:
        s_full[~pad], r_full[~pad] = s_all, r_all
    brk = np.ones(v.shape[0], dtype=bool)
    if v.shape[0] > 1:
        brk[1:] = (s_full[1:] != s_full[:-1]) | (r_full[1:] != r_full[:-1] + 1) | pad[1:] | pad[:-1]
    starts = np.flatnonzero(brk).tolist() + [v.shape[0]]
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        if pad[a]:
            continue  # zeros: the rank file is created zero-filled
        r0 = int(r_full[a])
        out.append(Piece(int(s_full[a]), r0, r0 + (b - a), col_start, col_end, rank, name,
                         a * dest_width * out_itemsize))
    return out


def trace(
    sources: Sequence[Source],
    targets: Sequence[tuple[int, str]],
    shard: Callable[[list[np.ndarray], int], np.ndarray],
    planned_shape: Callable[[int, str], tuple[int, ...]],
    dtype: str,
    tp_size: int,
) -> MovePlan:
    """The byte moves that make every target of one job, found by sharding stand-ins.

    ``shard(inputs, rank)`` is the job's own combine + split; ``planned_shape`` the shape in the
    rank file's header. Returns a TENSOR plan (with the reason) where the layout is not a set of
    row ranges with one column range per rank.
    """
    def tensor(why: str) -> MovePlan:
        return MovePlan(MoveKind.TENSOR, list(sources), [], list(targets), dtype, why)

    ndims = {len(s.shape) for s in sources}
    if len(ndims) != 1 or ndims.pop() not in (1, 2, 3):
        return tensor("only vectors, matrices and stacked experts move as bytes")
    widths = {s.width for s in sources}
    if len(widths) != 1:
        return tensor("sources of different widths")
    width = widths.pop()
    if len(sources) >= 1 << (63 - _SRC_BITS) or tp_size > _COL_MASK or max(s.rows for s in sources) >= _ROW_MASK:
        return tensor("too large to trace")
    matrix = len(sources[0].shape) > 1
    chunk = width // tp_size if matrix and width % tp_size == 0 else width
    standins = [standin(i, s.shape, tp_size) for i, s in enumerate(sources)]
    out_itemsize = itemsize(dtype)
    pieces: list[Piece] = []
    for rank, name in targets:
        found = _target_pieces(np.asarray(shard(standins, rank)), tuple(planned_shape(rank, name)), sources, chunk,
                               matrix, rank, name, out_itemsize)
        if isinstance(found, str):
            return tensor(found)
        pieces += found
    if any(s.dtype != dtype for s in sources):
        kind = MoveKind.CONVERT
    elif all(p.whole_rows(sources[p.source].width) for p in pieces):
        kind = MoveKind.BYTE_COPY
    else:
        kind = MoveKind.STRIDED
    return MovePlan(kind, list(sources), pieces, list(targets), dtype)


def as_transposed(plan: MovePlan, block_rows: int) -> MovePlan:
    """``plan`` (traced on the untransposed layout: each expert's ``block_rows`` rows of the source's width, whole
    rows) as the TRANSPOSED plan that writes each block as ``[width, block_rows]`` in its place; a TENSOR plan
    where the pieces do not fall on whole blocks."""
    if plan.kind is MoveKind.TENSOR:
        return plan
    for p in plan.pieces:
        s = plan.sources[p.source]
        block_bytes = block_rows * s.width * itemsize(plan.dtype)
        if block_rows < 1 or not p.whole_rows(s.width) or (p.row_end - p.row_start) % block_rows or \
                p.row_start % block_rows or p.dest_offset % block_bytes:
            return MovePlan(MoveKind.TENSOR, list(plan.sources), [], list(plan.targets), plan.dtype,
                            "a transposed layout whose pieces are not whole expert blocks")
    return MovePlan(MoveKind.TRANSPOSED, plan.sources, plan.pieces, plan.targets, plan.dtype, block_rows=block_rows)


# -- execution ----------------------------------------------------------------------------
#: bytes of one transposed tile (an expert block's columns, all its rows): a larger block is transposed in several
#: passes over its rows, each read again in CHUNK_BYTES chunks (from the page cache after the first)
TRANSPOSE_TILE_BYTES = 32 << 20

#: elements per block of :func:`_non_finite` (whose one temporary is reused, never fresh memory):
#: large, since two lanes check side by side and each numpy call takes the GIL (two threads on
#: 2 cores: 7.3 GB/s in all with 2^14-element blocks, 11.1 with 2^16, 24.6 with 2^20;
#: benchmarks/casts.py, benchmarks/results/casts.json)
_CHECK_BLOCK = 1 << 20


def _non_finite(bits: np.ndarray, mask: int) -> bool:
    """Whether any value has every exponent bit set (NaN or Inf), in blocks through one temporary."""
    if bits.size == 0:
        return False
    temp = scratch("non-finite", min(bits.size, _CHECK_BLOCK), bits.dtype)
    m = bits.dtype.type(mask)
    for i in range(0, bits.size, _CHECK_BLOCK):
        block = bits[i:i + _CHECK_BLOCK]
        t = temp[: block.size]
        np.bitwise_and(block, m, out=t)
        if t.max() == m:
            return True
    return False


class NonFinite(Exception):
    """A source holds NaN/Inf (after the cast, for CONVERT)."""


def _pread_into(fd: int, view: memoryview, offset: int, path: Path) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise OSError(errno.EIO, f"unexpected end of file at byte {offset + got}", str(path))
        got += n


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


_NO_COPY_FILE_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.ETXTBSY}


class ByteMover:
    """Runs :class:`MovePlan` s into open rank files; source files are opened once each."""

    def __init__(self, slot_offset: Callable[[int, str], int], rank_fd: Callable[[int], int], *,
                 torch_casts: bool = False):
        """``torch_casts``: cast with torch even where numpy can (where it pays, see :func:`torch_casts_pay`)."""
        self.slot_offset = slot_offset
        self.torch_casts = torch_casts
        self.rank_fd = rank_fd
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()
        self.kernel_copy = hasattr(os, "copy_file_range")

    def _fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY)
            return self._fds[path]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def run(self, plan: MovePlan, rank: int | None = None) -> None:
        """Write the plan's pieces for ``rank`` (every rank where None).

        Each rank's pieces can run in its own thread: they write only that rank's file, so two ranks
        never wait on one file's lock, and the NaN/Inf check of what a rank writes runs beside the
        other rank's copies. Every written byte is checked once: a byte copy checks the source rows
        its pieces take that no lower rank's pieces take (a replicated tensor is read once); the
        chunked paths check what they write, after the cast.
        """
        pieces = [p for p in plan.pieces if rank is None or p.rank == rank]
        if plan.kind is MoveKind.BYTE_COPY:
            for index, ranges in _rows_to_check(plan, rank).items():
                for a, b in ranges:
                    self._check_bytes(plan.sources[index], a, b)
            for p in pieces:
                s = plan.sources[p.source]
                self._copy(s, self._fd(s.path), p.row_start * s.row_bytes, self.rank_fd(p.rank),
                           self.slot_offset(p.rank, p.name) + p.dest_offset, (p.row_end - p.row_start) * s.row_bytes)
        elif plan.kind in (MoveKind.STRIDED, MoveKind.CONVERT, MoveKind.FP8):
            if plan.kind is MoveKind.FP8 and plan.fp8.scale is None:
                raise AssertionError("an FP8 plan runs before its scale is measured")
            for p in pieces:
                self._chunked(plan, p)
        elif plan.kind is MoveKind.TRANSPOSED:
            for p in pieces:
                self._transposed(plan, p)
        else:
            raise AssertionError(plan.kind)

    def _check_bytes(self, s: Source, row_start: int, row_end: int) -> None:
        """NaN/Inf in rows ``[row_start, row_end)`` of a source, read through bounded memory-mapped
        windows (no copy)."""
        spec = _EXPONENT.get(s.dtype)
        if spec is None or row_end <= row_start:
            return
        np_dtype, mask = spec
        item = np.dtype(np_dtype).itemsize
        fd = self._fd(s.path)
        rel, end = row_start * s.row_bytes, row_end * s.row_bytes
        while rel < end:
            length = min(CHECK_WINDOW, end - rel)
            absolute = s.offset + rel
            start = absolute - absolute % mmap.ALLOCATIONGRANULARITY
            lo = absolute - start
            with mmap.mmap(fd, lo + length, offset=start, access=mmap.ACCESS_READ) as m:
                bits = np.frombuffer(m, dtype=np_dtype, count=length // item, offset=lo)
                bad = _non_finite(bits, mask)
                del bits
            if bad:
                raise NonFinite(s.path)
            rel += length

    def _copy(self, s: Source, src_fd: int, rel: int, dst_fd: int, dst: int, n: int) -> None:
        src = s.offset + rel
        while n > 0 and self.kernel_copy:
            try:
                k = os.copy_file_range(src_fd, dst_fd, n, src, dst)
            except OSError as exc:
                if exc.errno not in _NO_COPY_FILE_RANGE:
                    raise
                self.kernel_copy = False  # e.g. across file systems on old kernels: copy by hand
                break
            if k <= 0:
                raise OSError(errno.EIO, f"unexpected end of file at byte {src}", str(s.path))
            src, dst, n = src + k, dst + k, n - k
        if n > 0:
            buf = bytearray(min(n, CHUNK_BYTES))
            while n > 0:
                k = min(n, len(buf))
                view = memoryview(buf)[:k]
                _pread_into(src_fd, view, src, s.path)
                _pwrite_all(dst_fd, view, dst)
                src, dst, n = src + k, dst + k, n - k

    def _chunked(self, plan: MovePlan, p: Piece) -> None:
        """Read the piece's source rows once, in bounded chunks; cut its columns, cast them where the
        dtype changes, check and write them, through the lane's reused buffers (files/dtypes.py
        ``scratch``)."""
        s = plan.sources[p.source]
        fd = self._fd(s.path)
        rows_per = max(1, CHUNK_BYTES // max(1, s.row_bytes))
        buf = scratch("chunk-read", min(p.row_end - p.row_start, rows_per) * s.row_bytes, np.uint8)
        out_item = itemsize(plan.dtype)
        convert = s.dtype != plan.dtype and plan.kind is not MoveKind.FP8
        by_numpy = can_cast_without_torch(s.dtype, plan.dtype) and not self.torch_casts
        out_spec = _EXPONENT.get(plan.dtype)
        whole = p.whole_rows(s.width)
        dest = self.slot_offset(p.rank, p.name) + p.dest_offset
        dest_row = (p.col_end - p.col_start) * out_item
        fd_out = self.rank_fd(p.rank)
        for a in range(p.row_start, p.row_end, rows_per):
            b = min(p.row_end, a + rows_per)
            view = memoryview(buf)[: (b - a) * s.row_bytes]
            _pread_into(fd, view, s.offset + a * s.row_bytes, s.path)
            if whole:
                part = view
            else:  # this piece's columns of every row read
                rows = np.frombuffer(view, dtype=np.uint8).reshape(b - a, s.row_bytes)
                cols = rows[:, p.col_start * s.itemsize : p.col_end * s.itemsize]
                part = scratch("chunk-columns", cols.size, np.uint8).reshape(cols.shape)
                np.copyto(part, cols)
            if plan.kind is MoveKind.FP8:
                bits = _fp8_bits(part, s.dtype, plan.fp8)
            elif convert:  # element by element what the tensor path's t.to(dtype) gives
                bits = self._cast(part, s, plan.dtype, by_numpy)
            else:
                bits = np.frombuffer(part, dtype=out_spec[0]) if out_spec is not None else None
            if out_spec is not None and _non_finite(bits, out_spec[1]):
                raise NonFinite(s.path)
            _pwrite_all(fd_out, bits if bits is not None else part, dest + (a - p.row_start) * dest_row)


    def _cast(self, part, s: Source, dtype: str, by_numpy: bool):
        """``part`` (a writable buffer of ``s``'s values) cast to ``dtype``, as the bits of its values: numpy's exact
        cast into this thread's reused buffer, or torch's."""
        if by_numpy:
            out = scratch("chunk-cast", part.nbytes // s.itemsize, _EXPONENT[dtype][0])
            return cast_bits(part, s.dtype, dtype, out=out)
        import torch

        bits = torch.frombuffer(part, dtype=to_torch(s.dtype)).to(to_torch(dtype))
        return bits.view(torch.uint8).numpy().view(_EXPONENT[dtype][0])

    def _transposed(self, plan: MovePlan, p: Piece) -> None:
        """The piece's expert blocks (``plan.block_rows`` source rows each) written transposed, ``[width, rows]``,
        where the untransposed block would go: per block, tiles of its columns (at most TRANSPOSE_TILE_BYTES), each
        filled from the block's rows read in CHUNK_BYTES chunks, transposed, cast, checked and written as
        contiguous destination rows."""
        s = plan.sources[p.source]
        fd, fd_out = self._fd(s.path), self.rank_fd(p.rank)
        block, width, src_bits = plan.block_rows, s.width, _EXPONENT[s.dtype][0]
        out_item, convert = itemsize(plan.dtype), s.dtype != plan.dtype
        by_numpy = can_cast_without_torch(s.dtype, plan.dtype) and not self.torch_casts
        tile_cols = max(1, min(width, TRANSPOSE_TILE_BYTES // (block * max(s.itemsize, out_item))))
        rows_per = max(1, min(block, CHUNK_BYTES // max(1, s.row_bytes)))
        buf = scratch("chunk-read", rows_per * s.row_bytes, np.uint8)
        base = self.slot_offset(p.rank, p.name) + p.dest_offset
        for b0 in range(p.row_start, p.row_end, block):
            dest_block = base + (b0 - p.row_start) * width * out_item
            for c0 in range(0, width, tile_cols):
                c1 = min(width, c0 + tile_cols)
                tile = scratch("transpose-tile", block * (c1 - c0), src_bits).reshape(block, c1 - c0)
                for a in range(b0, b0 + block, rows_per):
                    e = min(b0 + block, a + rows_per)
                    view = memoryview(buf)[: (e - a) * s.row_bytes]
                    _pread_into(fd, view, s.offset + a * s.row_bytes, s.path)
                    tile[a - b0 : e - b0] = np.frombuffer(view, dtype=src_bits).reshape(e - a, width)[:, c0:c1]
                flipped = scratch("transpose-out", tile.size, src_bits).reshape(c1 - c0, block)
                np.copyto(flipped, tile.T)
                flat = flipped.reshape(-1)
                bits = self._cast(flat.view(np.uint8), s, plan.dtype, by_numpy) if convert else flat
                if _non_finite(bits, _EXPONENT[plan.dtype][1]):
                    raise NonFinite(s.path)
                _pwrite_all(fd_out, bits, dest_block + c0 * block * out_item)

    # -- FP8: the amax pass ---------------------------------------------------------------------
    def amax(self, plan: MovePlan) -> float:
        """The largest magnitude among the values ``plan``'s pieces take (every rank), in the sources'
        dtype, read once in bounded chunks; :class:`NonFinite` where one of them is NaN/Inf.

        Found on the bits: with the sign bit cleared, a float's bit pattern orders as its magnitude
        (finite values below every NaN/Inf pattern), so the largest masked pattern is the amax.
        """
        best = 0.0
        for index, r0, r1, c0, c1 in amax_regions(plan):
            s = plan.sources[index]
            bits_dtype, exponent = _EXPONENT[s.dtype]
            top = self._max_magnitude_bits(s, r0, r1, c0, c1, np.dtype(bits_dtype))
            if top & exponent == exponent:
                raise NonFinite(s.path)
            best = max(best, _bits_value(top, s.dtype))
        return best

    def _max_magnitude_bits(self, s: Source, r0: int, r1: int, c0: int, c1: int, bits_dtype: np.dtype) -> int:
        fd = self._fd(s.path)
        rows_per = max(1, CHUNK_BYTES // max(1, s.row_bytes))
        buf = scratch("amax-read", min(r1 - r0, rows_per) * s.row_bytes, np.uint8)
        sign_cleared = bits_dtype.type((1 << (8 * bits_dtype.itemsize - 1)) - 1)
        top = 0
        for a in range(r0, r1, rows_per):
            b = min(r1, a + rows_per)
            view = memoryview(buf)[: (b - a) * s.row_bytes]
            _pread_into(fd, view, s.offset + a * s.row_bytes, s.path)
            bits = np.frombuffer(view, dtype=bits_dtype).reshape(b - a, s.width)[:, c0:c1]
            if bits.size == 0:
                continue
            temp = scratch("amax-bits", bits.size, bits_dtype).reshape(bits.shape)
            np.bitwise_and(bits, sign_cleared, out=temp)
            top = max(top, int(temp.max()))
        return top


def _bits_value(bits: int, dtype: str) -> float:
    """The float a non-negative bit pattern of ``dtype`` (float32, float16, bfloat16) stands for."""
    if dtype == "bfloat16":
        return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])
    np_bits, _ = _EXPONENT[dtype]
    return float(np.array([bits], dtype=np_bits).view({"float32": np.float32, "float16": np.float16,
                                                       "float64": np.float64}[dtype])[0])


def amax_regions(plan: MovePlan) -> list[tuple[int, int, int, int, int]]:
    """``(source, row_start, row_end, col_start, col_end)`` rectangles covering exactly the elements the
    plan's pieces take: one rectangle per source where its pieces tile one (every rank's column slice
    of the same rows, q/k/v's row ranges), else each distinct piece (a replicated piece is read once)."""
    out = []
    for index in sorted({p.source for p in plan.pieces}):
        rects = sorted({(p.row_start, p.row_end, p.col_start, p.col_end) for p in plan.pieces if p.source == index})
        rows = sorted({r for a, b, _, _ in rects for r in (a, b)})
        cols = sorted({c for _, _, c, d in rects for c in (c, d)})
        if len(rows) * len(cols) * len(rects) <= 1 << 16 and all(
                any(a <= r0 and r1 <= b and c <= c0 and c1 <= d for a, b, c, d in rects)
                for r0, r1 in zip(rows, rows[1:]) for c0, c1 in zip(cols, cols[1:])):
            out.append((index, rows[0], rows[-1], cols[0], cols[-1]))
        else:
            out.extend((index, *r) for r in rects)
    return out


#: elements per block of :func:`_fp8_bits`: its index temporary stays in the core's cache, and each block's
#: two calls (their Python side holds the GIL) are few enough for two lanes to cast side by side. Float16 ->
#: FP8 on two lanes of 2 cores: 2.2 GB/s of source by table in 2^18-element blocks (1.7 in 2^16); torch's own
#: chain of float32 ops (widen, divide, clamp, convert) gave 1.69 at best, its float32 -> FP8 step being slow
_FP8_BLOCK = 1 << 18


_tables = threading.local()
#: FP8 tables a lane keeps (its pieces come plan by plan, so the last few are all it reuses)
_TABLES_KEPT = 4


def _fp8_table(cast: Fp8Cast):
    """uint8 ``[65536]``: the FP8 bits quant.fp8_weight makes of every 16-bit pattern of ``cast.via`` with
    ``cast.scale`` (the tensor path's own function, so every element is by construction what it writes).
    Each lane keeps its last few tables, never one per weight of the model."""
    import torch

    from trtllm_medusa_ports.quant import fp8_weight

    kept = getattr(_tables, "kept", None)
    if kept is None:
        kept = _tables.kept = {}
    key = (cast.via, cast.scale)
    if key not in kept:
        while len(kept) >= _TABLES_KEPT:
            kept.pop(next(iter(kept)))
        patterns = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16)).view(to_torch(cast.via))
        kept[key] = fp8_weight(patterns, cast.scale).view(torch.uint8).contiguous()
    return kept[key]


def _fp8_bits(part, src: str, cast: Fp8Cast) -> np.ndarray:
    """float8_e4m3fn bits of one chunk of ``src`` values, as quant.fp8_weight makes them from the tensor
    path's shard: rounded to ``cast.via`` (the checkpoint dtype, 16-bit: numpy's exact cast, files/dtypes.py
    ``cast_bits``), then looked up in :func:`_fp8_table`; in cache-sized blocks through this thread's buffers."""
    import torch

    if itemsize(cast.via) != 2:  # no table: torch's chain, op for op quant.fp8_weight (the checkpoint is 16-bit)
        from trtllm_medusa_ports.quant import fp8_weight

        x = torch.frombuffer(part, dtype=to_torch(src)).to(to_torch(cast.via))
        return fp8_weight(x, cast.scale).view(torch.uint8).numpy()
    n = len(part) // itemsize(src) if isinstance(part, memoryview) else part.nbytes // itemsize(src)
    if src == cast.via:
        bits = np.frombuffer(part, dtype=np.uint16)
    else:
        bits = cast_bits(part, src, cast.via, out=scratch("fp8-via", n, np.uint16))
    table = _fp8_table(cast)
    out = scratch("fp8-out", n, np.uint8)
    out_t = torch.from_numpy(out)
    index = scratch("fp8-index", min(n, _FP8_BLOCK), np.int32)
    index_t = torch.from_numpy(index)
    for a in range(0, n, _FP8_BLOCK):
        b = min(n, a + _FP8_BLOCK)
        np.copyto(index[: b - a], bits[a:b], casting="safe")
        torch.index_select(table, 0, index_t[: b - a], out=out_t[a:b])
    return out


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _rows_to_check(plan: MovePlan, rank: int | None) -> dict[int, list[tuple[int, int]]]:
    """Per source: the row ranges that ``rank``'s pieces write and no lower rank's pieces write
    (for ``rank`` None: every written row). Each written source row is checked exactly once."""
    out: dict[int, list[tuple[int, int]]] = {}
    for index in {p.source for p in plan.pieces if rank is None or p.rank == rank}:
        own = _merged([(p.row_start, p.row_end) for p in plan.pieces
                       if p.source == index and (rank is None or p.rank == rank)])
        lower = [] if rank is None else _merged([(p.row_start, p.row_end) for p in plan.pieces
                                                  if p.source == index and p.rank < rank])
        left: list[tuple[int, int]] = []
        for a, b in own:
            for la, lb in lower:
                if lb <= a or la >= b:
                    continue
                if la > a:
                    left.append((a, la))
                a = max(a, lb)
                if a >= b:
                    break
            if a < b:
                left.append((a, b))
        out[index] = left
    return out


def same_bytes(a: Source, b: Source) -> bool:
    """Whether two sources hold the same dtype, shape and bytes (read in chunks; no tensor made)."""
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return False
    fa, fb = os.open(a.path, os.O_RDONLY), os.open(b.path, os.O_RDONLY)
    try:
        buf_a, buf_b = bytearray(min(a.nbytes, CHUNK_BYTES)), bytearray(min(a.nbytes, CHUNK_BYTES))
        for rel in range(0, a.nbytes, CHUNK_BYTES):
            n = min(CHUNK_BYTES, a.nbytes - rel)
            va, vb = memoryview(buf_a)[:n], memoryview(buf_b)[:n]
            _pread_into(fa, va, a.offset + rel, a.path)
            _pread_into(fb, vb, b.offset + rel, b.path)
            if va != vb:
                return False
        return True
    finally:
        os.close(fa)
        os.close(fb)
