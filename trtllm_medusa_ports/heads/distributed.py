"""``train-heads`` across processes: which rank this process is, and the few collectives the training needs.

``torchrun --nproc_per_node N -m trtllm_medusa_ports train-heads ...`` starts N processes with ``WORLD_SIZE``,
``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in their environment
(torch/distributed/run.py in pytorch/pytorch lists them); :func:`join` reads them and joins the process group
(gloo on CPUs, NCCL on GPUs, where the barriers and small exchanges still go through a gloo group of their own).
Without them (or with ``WORLD_SIZE`` 1) it returns the one-process group, whose collectives do nothing, so the
training code is the same in both.

Every collective is bounded by ``timeout_s``: a rank that dies is noticed by gloo at once ("Connection closed by
peer"), one that stops answering after the timeout; both are one :class:`RankLost` naming this rank and what it was
waiting for. An error a rank can explain (a :class:`PortError`) is shared with the others by :meth:`Group.agree`,
so every rank stops with it instead of waiting for the one that stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field

from trtllm_medusa_ports.errors import HeadsError, PortError

#: seconds a rank waits for the others at one collective (``train-heads --dist_timeout``)
DEFAULT_TIMEOUT_S = 1800


#: what gloo and NCCL say when the other side of an exchange went away or stopped answering (gloo's tcp pair:
#: "Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting ..."; a store's
#: "timeout"); any other error of a collective is this rank's own
PEER_LOST = re.compile(r"by peer|broken pipe|connection (reset|refused|closed)|timed out|timeout|NCCL communicator "
                       r"was aborted|remote process exited", re.IGNORECASE)


class RankLost(HeadsError):
    """A collective failed: another rank died, stopped answering, or raised an error of its own."""


def env_rank() -> int:
    """This process's rank as torchrun set it (0 without torchrun)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous ``[lo, hi)`` of ``n`` items rank ``rank`` of ``world`` takes (the first ranks one more)."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


@dataclass
class Group:
    """The ranks of one run (``world`` 1: this process alone, every collective a no-op)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    created: bool = False  # joined here (and left by close), not by the caller
    control: object = field(default=None, repr=False)  # the gloo group of the barriers and exchanges

    @property
    def main(self) -> bool:
        return self.rank == 0

    def span(self, n: int) -> tuple[int, int]:
        return share(n, self.rank, self.world)

    def _lost(self, what: str, exc: BaseException) -> RankLost:
        text = " ".join(str(exc).split())[:240]
        if not PEER_LOST.search(text):  # gloo / NCCL said nothing of a peer: the exchange failed on this rank
            return RankLost(f"rank {self.rank} of {self.world}: {what} failed on this rank ({text})",
                            where=f"rank {self.rank}",
                            fix="this rank's own error, above; fix it and run the same command with --resume: the "
                                "training state in --work_dir is whole")
        why = "stopped answering" if "imed out" in text or "timeout" in text.lower() else "stopped"
        return RankLost(f"rank {self.rank} of {self.world}: {what} failed: another rank {why} ({text})",
                        where=f"rank {self.rank}",
                        fix="read the first failing rank's own error above (torchrun names it); fix that and run "
                            "the same command with --resume: the training state in --work_dir is whole "
                            f"(a rank waits --dist_timeout, {self.timeout_s:g} s, for the others)")

    def _call(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except RuntimeError as exc:  # gloo / NCCL: DistBackendError, DistNetworkError, "Connection closed by peer"
            raise self._lost(what, exc) from None

    def gather(self, value, what: str) -> list:
        """Every rank's ``value`` (picklable), in rank order."""
        if self.world == 1:
            return [value]
        import torch.distributed as dist

        out: list = [None] * self.world
        self._call(what, dist.all_gather_object, out, value, group=self.control)
        return out

    def agree(self, error: Exception | None, what: str) -> None:
        """Raise on every rank when any rank had an error: its own, or the first other rank's (as a PortError)."""
        if error is not None and self.world == 1:
            raise error
        told = self.gather(None if error is None else _portable(error), what)
        if error is not None:
            raise error
        for r, e in enumerate(told):
            if e is not None:
                raise PortError(f"rank {r} stopped: {e['what']}", where=e["where"], fix=e["fix"])

    def same(self, value, what: str) -> None:
        """Refuse to go on when the ranks hold different ``value`` (e.g. the step a saved state resumes from)."""
        seen = self.gather(value, what)
        if any(v != seen[0] for v in seen):
            raise HeadsError(f"the ranks disagree on {what}: " + ", ".join(f"rank {r} {v}" for r, v in enumerate(seen)),
                             where=f"rank {self.rank}",
                             fix="give every rank the same --work_dir on one shared filesystem, and the same flags")

    def max_int(self, value: int, what: str) -> int:
        """The largest ``value`` of all ranks (a stop signal any rank received)."""
        if self.world == 1:
            return value
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.long)
        self._call(what, dist.all_reduce, t, op=dist.ReduceOp.MAX, group=self.control)
        return int(t[0])

    def sum_(self, tensor, what: str):
        """``tensor`` summed over the ranks in place: through the run's backend on a GPU, gloo on the CPU."""
        if self.world > 1:
            import torch.distributed as dist

            group = None if tensor.is_cuda or self.backend == "gloo" else self.control
            self._call(what, dist.all_reduce, tensor, group=group)
        return tensor

    def barrier(self, what: str) -> None:
        if self.world > 1:
            self.gather(None, what)

    def close(self) -> None:
        """Leave the process group joined here (a caller's own group stays, less the gloo group made for it)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            if self.created:
                dist.destroy_process_group()
            elif self.control is not None:
                dist.destroy_process_group(self.control)
        self.created, self.control = False, None


def _portable(error: Exception) -> dict:
    if isinstance(error, PortError):
        return {"what": error.what, "where": error.where, "fix": error.fix}
    return {"what": f"{type(error).__name__}: {error}", "where": None, "fix": None}


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None and default is not None:
        return default
    try:
        return int(raw or "")
    except ValueError:
        raise PortError(f"the environment's {name}={raw!r} is not an integer", where=name,
                        fix="start the command with torchrun --nproc_per_node N, which sets it") from None


def rank_device(device: str, local_rank: int, local_world: int = 1, gpus: int = 0, spread: bool = False) -> str:
    """The device of a rank: ``cuda`` without an index becomes ``cuda:LOCAL_RANK`` (one GPU per rank, as NCCL wants),
    or with ``spread`` (``--device_map auto``) the first GPU of the rank's block (devices.rank_gpus); an explicit
    index and ``cpu`` are kept."""
    if device != "cuda":
        return device
    if spread:
        from trtllm_medusa_ports.machine.devices import rank_gpus

        block = rank_gpus(local_rank, local_world, gpus)
        return f"cuda:{block[0] if block else local_rank}"
    return f"cuda:{local_rank}"


JOIN_FIX = ("start every rank with the same torchrun command (one --nnodes and --nproc_per_node: every rank's "
            "WORLD_SIZE the same)")


def _same_world_size(store, rank: int, world: int, timeout_s: float) -> None:
    """Every other rank below ``world`` says the same world size on the rendezvous store (keys per torchrun restart:
    an agent's store outlives one attempt), or a :class:`PortError` naming the rank that differs, as soon as its
    key is there; a rank that never arrives is a :class:`RankLost` after ``timeout_s``."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    def key(r: int) -> str:
        return f"world_size/{attempt}/{r}"

    store.set(key(rank), str(world))
    for r in range(world):
        if r == rank:
            continue
        try:
            store.wait([key(r)], datetime.timedelta(seconds=timeout_s))
        except RuntimeError:
            raise RankLost(f"rank {rank} of {world}: rank {r} did not arrive within --dist_timeout ({timeout_s:g} s)",
                           where=f"rank {rank}", fix=JOIN_FIX) from None
        theirs = store.get(key(r)).decode()
        if theirs != str(world):
            raise PortError(f"rank {r} was started with WORLD_SIZE {theirs}, rank {rank} with {world}: the ranks "
                            "must agree on how many they are", where="WORLD_SIZE", fix=JOIN_FIX)


def join(device: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, spread: bool = False) -> tuple[Group, str]:
    """This process's :class:`Group` and device under torchrun (the one-process group without it); ``spread``: the
    rank's base is spread over a block of the node's GPUs (``--device_map auto``)."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        # a RANK past 0 says the launcher started others: this one would train alone and write the output while
        # they wait for it (WORLD_SIZE 1 on rank 1 of 2: the reversed mismatch)
        if _env_int("RANK", 0) != 0:
            raise PortError(f"RANK {_env_int('RANK')} is not below WORLD_SIZE {world}: this process was started as "
                            "one rank of several but told it is alone", where="WORLD_SIZE", fix=JOIN_FIX)
        return Group(timeout_s=timeout_s), device
    rank, local = _env_int("RANK"), _env_int("LOCAL_RANK", _env_int("RANK"))
    if not 0 <= rank < world:
        raise PortError(f"RANK {rank} is not below WORLD_SIZE {world}", where="RANK", fix="start with torchrun")
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if device == "cuda" else 0
    device = rank_device(device, local, _env_int("LOCAL_WORLD_SIZE", 1), gpus, spread)
    cuda = torch.device(device).type == "cuda"
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    created = not dist.is_initialized()
    if created:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if missing:
            raise PortError(f"WORLD_SIZE is {world} but {' and '.join(missing)} is not set", where=missing[0],
                            fix="start the command with torchrun --nproc_per_node N, which sets them")
        if cuda:
            torch.cuda.set_device(torch.device(device))
        try:
            # the env:// rendezvous init_process_group makes by itself (torchrun's agent store or one rank 0 hosts),
            # made here so that the ranks compare their world sizes on it before gloo connects them: gloo meshes
            # ranks that disagree only after a connect timeout of its own, far past --dist_timeout
            store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
            store.set_timeout(timeout)
            _same_world_size(dist.PrefixStore("medusa_ports", store), rank, world, timeout_s)
            with gloo_connection_lines_dropped():
                dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        except RuntimeError as exc:
            raise RankLost(f"rank {rank} of {world}: could not join the other ranks ({' '.join(str(exc).split())[:200]})",
                           where=f"rank {rank}", fix=JOIN_FIX) from None
    else:
        backend = dist.get_backend()
        if dist.get_world_size() != world or dist.get_rank() != rank:
            raise PortError(f"the process group (rank {dist.get_rank()} of {dist.get_world_size()}) is not the "
                            f"environment's (RANK {rank}, WORLD_SIZE {world})", where="WORLD_SIZE",
                            fix="initialise torch.distributed from torchrun's environment, or leave it to train-heads")
    control = None
    if backend != "gloo":
        with gloo_connection_lines_dropped():
            control = dist.new_group(backend="gloo", timeout=timeout)
    return Group(rank, world, local, backend, timeout_s, created, control), device


#: what torch's gloo (2.9, as TensorRT-LLM 1.2 pins it) prints on every rank's C-level stdout as it connects, with no
#: switch to turn it off (neither TORCH_CPP_LOG_LEVEL nor a gloo variable): on rank 0 it would come before
#: ``train-heads --json``'s one JSON document
GLOO_CONNECTED = re.compile(rb"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of connected peer "
                            rb"ranks is : \d+\n?")


@contextlib.contextmanager
def gloo_connection_lines_dropped():
    """The block's output to file descriptor 1 is held back and written after it, less gloo's connection lines
    (:data:`GLOO_CONNECTED`); where descriptor 1 cannot be duplicated, the block runs as it is."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            held.seek(0)
            rest = GLOO_CONNECTED.sub(b"", held.read())
            if rest:
                os.write(1, rest)
