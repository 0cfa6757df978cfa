"""Streaming a planned conversion into its rank files: the byte moves in lanes (one thread per rank file), the
whole tensors beside them (at most ``--workers`` in memory), the first failure stopping every lane, config.json
last, the directory swapped in whole (``write_checkpoint``).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trtllm_medusa_ports.conversion.plan import Job, job_inputs, shard_for
from trtllm_medusa_ports.errors import HeadsError, ModelError
from trtllm_medusa_ports.files import byte_moves
from trtllm_medusa_ports.files.byte_moves import (
    ByteMover,
    MoveKind,
    MovePlan,
    NonFinite,
)
from trtllm_medusa_ports.files.checkpoint import (
    StreamingSafetensorsFile,
    atomic_output_dir,
    write_config,
)
from trtllm_medusa_ports.machine.progress import progress

#: byte moves of fewer bytes than this in all run on the calling thread alone: a second thread's start and the handoffs
#: of the interpreter lock between the two cost more than moving the bytes side by side saves (a tiny base's
#: conversion: ~11 ms on two threads, ~8 ms on one; a 16 MiB move takes a few ms either way)
TWO_LANES_MIN_BYTES = 16 << 20


def lane_threads(moves: list[MovePlan], workers: int) -> int:
    """How many threads write a conversion's byte moves: ``--workers``, and at least two (one per rank file, copies
    into two files side by side) once the moves are worth a second thread (:data:`TWO_LANES_MIN_BYTES`)."""
    moved = sum(m.source_bytes for m in moves if m.kind is not MoveKind.TENSOR)
    return max(workers, 2 if moved >= TWO_LANES_MIN_BYTES else 1)


def write_lanes(fast: list[tuple[Job, MovePlan]], ranks: list[int], threads: int
           ) -> list[list[tuple[Job, MovePlan, int | None]]]:
    """Split the byte-moving jobs into ``threads`` task lists that run side by side.

    With several rank files, rank r's pieces of every job go to lane ``r % threads`` (one writer per
    file). With one rank file, whole jobs are dealt out to balance the bytes.
    """
    if not fast:
        return []
    if len(ranks) > 1:
        n = min(threads, len(ranks))
        lanes: list[list] = [[] for _ in range(n)]
        for job, move in fast:
            for rank in sorted({r for r, _ in job.targets}):
                lanes[ranks.index(rank) % n].append((job, move, rank))
        return lanes
    lanes = [[] for _ in range(threads)]
    load = [0] * threads
    for job, move in sorted(fast, key=lambda jm: -jm[1].source_bytes):
        i = load.index(min(load))
        lanes[i].append((job, move, None))
        load[i] += move.source_bytes
    return [lane for lane in lanes if lane]


def non_finite_error(job: Job, dtype: str) -> Exception:
    """The error for a job whose values hold NaN/Inf in the checkpoint dtype."""
    err = HeadsError if job.label.startswith("medusa_heads") else ModelError
    return err(
        f"tensor for {job.label} holds NaN/Inf after casting to {dtype}"
        + (f" (from {', '.join(job.sources)})" if job.sources else ""),
        fix="the source holds NaN/Inf (damaged weights: save them again)" if dtype == "float32" else
            f"the source holds NaN/Inf, or its values overflow {dtype}: try --dtype bfloat16 or float32",
    )


class RankWriter:
    """The jobs' tensors streamed into open rank files: byte moves in lanes (one thread per rank file), whole
    tensors beside them, at most ``workers`` of those in memory; the first failure stops every lane."""

    def __init__(self, files: dict, mover: ByteMover, cfg: dict, dtype: str, workers: int, bar):
        self.files, self.mover, self.cfg, self.dtype, self.bar = files, mover, cfg, dtype, bar
        self.workers = workers
        self.whole_tensors = threading.Semaphore(workers)
        self.failed = threading.Event()

    def run_tensor(self, job: Job) -> None:
        from trtllm_medusa_ports.files.finite import all_finite

        with self.whole_tensors:  # at most --workers whole tensors in memory
            job, inputs = job_inputs(job, self.dtype)
            for t in inputs:
                if not all_finite(t):
                    raise non_finite_error(job, self.dtype)
            for rank, name in job.targets:
                shard = shard_for(job, inputs, self.cfg, rank)
                self.files[rank].write(name, job.post(shard) if job.post is not None else shard)
        self.bar.update(len(job.targets))

    def run_lane(self, tasks: list[tuple[Job, MovePlan, int | None]]) -> None:
        for job, move, rank in tasks:
            if self.failed.is_set():
                return
            try:
                self.mover.run(move, rank)
            except NonFinite:
                self.failed.set()
                raise non_finite_error(job, self.dtype) from None
            except BaseException:
                self.failed.set()  # the other lanes stop at their next tensor
                raise
            done = [(r, name) for r, name in job.targets if rank is None or r == rank]
            for r, name in done:
                self.files[r].written(name)
            self.bar.update(len(done))

    def run(self, jobs: list[Job], moves: list[MovePlan], ranks: list[int]) -> None:
        # Byte moves spend their time in the kernel and in numpy (the GIL released), so even with
        # --workers 1 two threads run them, where they move enough bytes (lane_threads). Each rank file is
        # written by one thread (a "lane"): copies into one file serialise on its lock, copies into two files
        # run side by side.
        fast = [(j, m) for j, m in zip(jobs, moves, strict=True) if m.kind is not MoveKind.TENSOR]
        tensor_jobs = [j for j, m in zip(jobs, moves, strict=True) if m.kind is MoveKind.TENSOR]
        threads = lane_threads(moves, self.workers)
        lanes = write_lanes(fast, ranks, threads)
        if threads == 1:
            for lane in lanes:
                self.run_lane(lane)
            for j in tensor_jobs:
                self.run_tensor(j)
            return
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(self.run_lane, lane) for lane in lanes]
            futures += [pool.submit(self.run_tensor, j) for j in tensor_jobs]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                self.failed.set()
                for f in futures:
                    f.cancel()
                raise


def _write_config(tmp: Path, cfg: dict, warnings: list[str], durable: bool) -> None:
    """config.json (with the conversion's warnings); with ``durable``, it and the directory's entries are on
    disk before the directory is swapped in."""
    cfg["medusa_ports"]["warnings"] = warnings
    write_config(tmp, cfg, durable)


def write_checkpoint(output_dir: Path, jobs: list[Job], moves: list[MovePlan], entries: dict, cfg: dict, dtype: str,
                     warnings: list[str], inputs: dict[str, Path], *, overwrite: bool, fsync: bool, workers: int,
                     quiet: bool) -> int:
    """Stream every job into the rank files of a new output directory (swapped in whole: files/checkpoint.py
    ``atomic_output_dir``); the bytes written."""
    replacing = output_dir.exists()
    with atomic_output_dir(output_dir, overwrite=overwrite, inputs=inputs) as tmp:
        durable = fsync or replacing
        files = {r: StreamingSafetensorsFile(tmp / f"rank{r}.safetensors", entries[r], durable=durable)
                 for r in entries}
        torch_casts = byte_moves.torch_casts_pay(moves, lanes=min(len(entries), lane_threads(moves, workers)))
        mover = ByteMover(lambda rank, name: files[rank].slots[name].offset, lambda rank: files[rank].fd,
                          torch_casts=torch_casts)
        try:
            bar = progress(sum(len(j.targets) for j in jobs), quiet)
            if torch_casts or any(m.kind is MoveKind.TENSOR or m.needs_torch for m in moves):
                import torch  # noqa: F401  (tensors or casts ahead: imported once, before the threads start)
            RankWriter(files, mover, cfg, dtype, workers, bar).run(jobs, moves, sorted(entries))
            bar.close()
            for f in files.values():
                f.close()
        except BaseException:
            for f in files.values():
                f.abort()
            raise
        finally:
            mover.close()
        _write_config(tmp, cfg, warnings, durable)
    return sum(f.total for f in files.values())
