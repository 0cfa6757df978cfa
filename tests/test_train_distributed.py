"""train-heads across processes (torchrun, gloo on the CPU) and bfloat16 only where the device computes it fast.

Two ranks train the heads a one-process run trains (the same global batch: within float32 tolerance), a state
saved at one world size resumes at another, and a rank that dies or hangs ends the job with an error naming it,
the training state whole and no heads written. The ranks of most tests are forked from this process (torch and
transformers already imported: a second each); one test goes through torchrun itself."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_base

from trtllm_medusa_ports import api
from trtllm_medusa_ports.files.prompts import Item
from trtllm_medusa_ports.fixtures.synthetic import tiny_config


def _shared_checks():
    """scripts/torchrun_checks.py: the flags and comparisons this file shares with scripts/validate_torchrun.py."""
    spec = importlib.util.spec_from_file_location(
        "torchrun_checks", Path(__file__).resolve().parents[1] / "scripts" / "torchrun_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECKS = _shared_checks()
ARCH, FLAGS = CHECKS.ARCH, CHECKS.FLAGS


def _fit(**kw) -> api.FitOptions:
    return api.FitOptions(**{**CHECKS.FIT, **kw})


def _opts(setup, out: Path, **kw) -> api.TrainOptions:
    return api.TrainOptions(**{"model_dir": setup["base"], "output_dir": out, "prompts": api.PromptInputs(
        data=setup["data"]), **CHECKS.TRAIN, "fit": _fit(), **kw})


@pytest.fixture(scope="module")
def setup(store, tmp_path_factory):
    """A tiny base, 12 prompts of one length (no padding: the ranks' batches compute what one batch does) and the
    heads of an uninterrupted one-process run."""
    root = tmp_path_factory.mktemp("dist")
    base = tiny_base(store, ARCH)
    data = CHECKS.write_prompts(root / "data.jsonl", tiny_config(ARCH).vocab_size)
    s = {"base": base, "data": data, "root": root}
    s["ref"] = api.train_heads(_opts(s, root / "ref"))
    assert s["ref"].world_size == 1 and s["ref"].output_dir == root / "ref"
    return s


def _tensors(x: api.TrainResult | Path) -> dict[str, torch.Tensor]:
    """The heads by their names in FasterDecoding's file (a written directory, or a result's heads)."""
    if isinstance(x, Path):
        return CHECKS.heads_file(x)
    h, out = x.heads, {}
    for k, row in enumerate(h.blocks):
        for layer, (w, b) in enumerate(row):
            out[f"{k}.{layer}.linear.weight"], out[f"{k}.{layer}.linear.bias"] = w, b
        if h.lm_heads is not None:
            out[f"{k}.{len(row)}.weight"] = h.lm_heads[k]
    return out


def _max_diff(a: api.TrainResult | Path, b: api.TrainResult | Path) -> float:
    ta, tb = _tensors(a), _tensors(b)
    assert len(ta) == 6, sorted(ta)
    return CHECKS.heads_max_diff(ta, tb)  # infinite where the names or shapes differ


def _same_history(a: list[dict], b: list[dict]) -> None:
    """The same steps recorded, the losses and top-1s equal but for the last digit kept (float sums' order)."""
    assert CHECKS.history_differences(a, b) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_env(rank: int, world: int, port: int, logs: Path, torchrun: bool) -> dict[str, str]:
    """What a launcher gives rank ``rank``: the variables heads/distributed.py reads (any launcher's; rank 0 then
    hosts the TCPStore the ranks meet at), or with ``torchrun`` all that ``torchrun --nproc_per_node W
    --master_port P`` gives: torch/distributed/elastic/agent/server/local_elastic_agent.py (_start_workers,
    _set_local_rank_env), TORCHELASTIC_ERROR_FILE from torch/distributed/elastic/multiprocessing/api.py and
    TORCHELASTIC_SIGNALS_TO_HANDLE from torch/distributed/launcher/api.py (launch_agent), the run id, role and address
    torch/distributed/run.py defaults to, OMP_NUM_THREADS 1 as run.py sets it for several processes. Its
    TORCHELASTIC_USE_AGENT_STORE=True makes every rank a client of the store the launcher's agent hosts
    (torch/distributed/rendezvous.py _create_c10d_store), where without it rank 0 hosts one."""
    env = dict(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torchrun:
        env.update(GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default", GROUP_WORLD_SIZE="1",
                   ROLE_WORLD_SIZE=str(world), TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCH_NCCL_ASYNC_ERROR_HANDLING=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
                   TORCHELASTIC_ERROR_FILE=str(logs / "none_0" / "attempt_0" / str(rank) / "error.json"),
                   TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT", OMP_NUM_THREADS="1")
    return env


def _agent_store():
    """The TCPStore torchrun's agent hosts for its ranks (static rendezvous, one node:
    torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py next_rendezvous), on a free port. Not
    multi-tenant, as the agent's is: a forked rank inherits this process's registry of multi-tenant servers, and rank
    0 would then take this one for its own without TORCHELASTIC_USE_AGENT_STORE (where now it fails: the port is
    taken), so the test could not tell the two ways of joining apart."""
    import datetime

    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=120))


def _rank_main(rank: int, env: dict[str, str], argv: list[str], logs: Path, hook) -> None:
    """One forked rank: its launcher's environment, the command's output in logs/rank<R>.{out,err}, its exit
    status."""
    os.environ.update(env)
    out, err = open(logs / f"rank{rank}.out", "w"), open(logs / f"rank{rank}.err", "w")  # noqa: SIM115
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout, sys.stderr = out, err
    torch.set_num_threads(1)
    rc = 1
    try:
        if hook is not None:
            hook(rank)
        from trtllm_medusa_ports.cli import main

        rc = main(argv)
    except BaseException:  # an uncaught error: its traceback, as a crashing rank prints it
        import traceback

        traceback.print_exc()
    finally:
        out.flush()
        err.flush()
        os._exit(rc)


def _ranks(world: int, argv: list[str], logs: Path, hook=None, kill_after: float | None = None, agent=None):
    """Run ``world`` forked ranks of the command; their exit codes and outputs (``kill_after``: seconds after rank 0
    ends when the others still running are killed, a hung rank; ``agent``: the store of :func:`_agent_store`, the
    ranks started as torchrun starts them)."""
    logs.mkdir(parents=True, exist_ok=True)
    port = agent.port if agent is not None else _free_port()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_main, args=(r, _launch_env(r, world, port, logs, agent is not None), argv, logs,
                                                  hook)) for r in range(world)]
    for p in procs:
        p.start()
    procs[0].join(120)
    for p in procs[1:]:
        p.join(kill_after if kill_after is not None else 120)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    assert procs[0].exitcode is not None, "rank 0 did not finish"
    return ([p.exitcode for p in procs], [(logs / f"rank{r}.out").read_text() for r in range(world)],
            [(logs / f"rank{r}.err").read_text() for r in range(world)])


def _argv(setup, out: Path, *extra: str) -> list[str]:
    return ["train-heads", "--model_dir", str(setup["base"]), "--output_dir", str(out), "--data", str(setup["data"]),
            *FLAGS, *extra]


# -- two ranks train the heads one process trains ---------------------------------------------------------------
def test_torchrun_two_ranks_train_the_heads_one_process_trains(setup, tmp_path):
    """``torchrun --nproc_per_node 2 --master_port P -m trtllm_medusa_ports train-heads``: the corpus split across
    the ranks and merged into the one file a single process writes, the heads equal within float32 tolerance, rank
    0 alone printing and writing. The two ranks are forked from this process, which stands in for torchrun's
    launcher: it hosts the TCPStore torchrun's agent hosts and gives each rank the environment torchrun gives
    (:func:`_launch_env`), so heads/distributed.py joins as under torchrun (every rank a client of the agent's
    store). What the fork leaves out, the launcher's own processes (a fresh interpreter per rank, its agent and
    monitoring), ``scripts/validate_torchrun.py`` runs: real torchrun, the same checks."""
    out = tmp_path / "heads"
    agent = _agent_store()
    codes, outs, errs = _ranks(2, [*_argv(setup, out), "--json"], tmp_path / "logs", agent=agent)
    assert codes == [0, 0], errs
    assert outs[1] == "" and errs[1] == ""  # rank 1 printed nothing
    printed = json.loads(outs[0])  # one JSON document
    assert printed["world_size"] == 2 and printed["steps"] == 8 and printed["output_dir"] == str(out)
    assert printed["dtype"] == printed["fit_dtype"] == "float32"
    assert agent.num_keys() > 1  # the ranks met at the agent's store (rank 0 hosted none: its port was taken)
    diff = _max_diff(out, setup["ref"])
    assert diff < CHECKS.HEADS_ATOL, diff
    _same_history(printed["history"], setup["ref"].history)
    # the shares merged into the one corpus.pt a single process writes, none left behind
    assert CHECKS.corpus_differences(tmp_path / "heads.train", setup["root"] / "ref.train") == []


@pytest.mark.parametrize("how", ["killed", "raises"])
def test_a_rank_lost_mid_run_ends_the_job_and_the_state_resumes_at_one_process(setup, tmp_path, how):
    """Rank 1 dies in step 5 (SIGKILL, or an exception of its own): rank 0 stops with an error naming what it
    waited for, saves exactly the 4 steps before it, writes no heads; one process resumes and ends with the
    uninterrupted run's heads."""
    out = tmp_path / "heads"

    def hook(rank):
        import trtllm_medusa_ports.heads.fit as fit_mod

        real = fit_mod.lr_at

        def lr_at(step, opts):
            if rank == 1 and step == 4:
                if how == "killed":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("rank 1 broke down")
            return real(step, opts)

        fit_mod.lr_at = lr_at

    codes, outs, errs = _ranks(2, _argv(setup, out), tmp_path / "logs", hook)
    assert codes[0] == 1 and codes[1] == (-signal.SIGKILL if how == "killed" else 1), (codes, errs)
    assert "rank 0 of 2: the gradient all-reduce failed: another rank stopped" in errs[0], errs[0]
    assert "after 4 whole steps; the training state holds exactly those 4 steps" in errs[0], errs[0]
    assert "--resume" in errs[0] and "Traceback" not in errs[0]
    if how == "raises":
        assert "rank 1 broke down" in errs[1]
    assert outs == ["", ""] and not out.exists()  # no heads, not even half of them
    state = tmp_path / "heads.train" / "state.pt"
    assert torch.load(state, weights_only=True)["step"] == 4
    resumed = api.train_heads(_opts(setup, out, resume=True))
    assert resumed.steps == 8 and resumed.world_size == 1 and resumed.output_dir == out
    _same_history(resumed.history, setup["ref"].history)  # a whole run's: the ranks' sums, then one process's
    assert _max_diff(resumed, setup["ref"]) < CHECKS.HEADS_ATOL


def test_a_rank_whose_own_exchange_fails_names_itself_and_the_other_blames_it(setup, tmp_path):
    """Rank 1's gradient all-reduce fails on rank 1 (an error gloo raises there, not a lost peer): rank 1 says the
    exchange failed on this rank, with the error; rank 0, whose peer went away, says another rank stopped
    (issue 57, 7)."""
    out = tmp_path / "heads"

    def hook(rank):
        import torch.distributed as dist

        real = dist.all_reduce

        def all_reduce(tensor, *a, **kw):
            if rank == 1 and tensor.is_floating_point():
                raise RuntimeError("[enforce fail at gloo/allreduce.cc:42] inputs differ in size")
            return real(tensor, *a, **kw)

        dist.all_reduce = all_reduce

    codes, _, errs = _ranks(2, _argv(setup, out), tmp_path / "logs", hook)
    assert codes == [1, 1], errs
    assert "rank 1 of 2: the gradient all-reduce failed on this rank ([enforce fail at gloo/allreduce.cc:42] " \
        "inputs differ in size)" in errs[1], errs[1]
    assert "another rank" not in errs[1] and "this rank's own error" in errs[1]
    assert "rank 0 of 2: the gradient all-reduce failed: another rank stopped" in errs[0], errs[0]
    assert not out.exists()


def _join_with(env: dict[str, str], timeout_s: float, q) -> None:
    os.environ.update(env)
    from trtllm_medusa_ports.heads.distributed import join

    t0 = time.monotonic()
    try:
        group, _ = join("cpu", timeout_s)
        group.barrier("the test's barrier")
        group.close()
        q.put((int(env["RANK"]), "joined", time.monotonic() - t0))
    except Exception as exc:  # noqa: BLE001  (the error each rank reports)
        q.put((int(env["RANK"]), f"{type(exc).__name__}: {exc}", time.monotonic() - t0))


@pytest.mark.parametrize("sizes", [(2, 3), (3, 2)])
def test_ranks_that_disagree_on_the_world_size_fail_at_once_naming_both(sizes, tmp_path):
    """Rank 0 and rank 1 started with different WORLD_SIZE, as torchrun starts them (issue 57, 7): the ranks compare
    their world sizes on the rendezvous store before gloo meshes them (gloo's connect timeout is its own, far past
    --dist_timeout: rank 0 waited 111 s at --dist_timeout 20), so both fail as soon as the other's size is there."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    agent = _agent_store()
    timeout_s = 30.0
    procs = [ctx.Process(target=_join_with, args=(_launch_env(r, w, agent.port, tmp_path, True), timeout_s, q))
             for r, w in enumerate(sizes)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, said, seconds = q.get(timeout=120)
        got[rank] = (said, seconds)
    for p in procs:
        p.join(30)
    first, second = sizes
    assert f"PortError: WORLD_SIZE: rank 1 was started with WORLD_SIZE {second}, rank 0 with {first}" in got[0][0], got
    assert f"PortError: WORLD_SIZE: rank 0 was started with WORLD_SIZE {first}, rank 1 with {second}" in got[1][0], got
    assert all("one --nnodes and --nproc_per_node" in said for said, _ in got.values())
    # both stopped on the store's comparison (the message), never in gloo's connect; its time is not asserted (it
    # would depend on the machine's load)


def test_a_one_process_state_resumes_on_two_ranks(setup, tmp_path):
    out = tmp_path / "heads"
    stopped = api.train_heads(_opts(setup, out, stop_after=3))
    assert stopped.output_dir is None and stopped.steps == 3 and not out.exists()
    codes, outs, errs = _ranks(2, _argv(setup, out, "--resume"), tmp_path / "logs")
    assert codes == [0, 0], errs
    assert "wrote" in outs[0] and "8 steps on 2 ranks" in outs[0] and outs[1] == ""
    assert _max_diff(out, setup["ref"]) < CHECKS.HEADS_ATOL


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(setup, tmp_path):
    """SIGTERM reaches rank 1 alone during step 4: the ranks agree to stop before step 5 (none is left waiting in
    an exchange), rank 0 saves exactly 4 steps and says so; one process resumes to the uninterrupted heads."""
    out = tmp_path / "heads"

    def hook(rank):
        import trtllm_medusa_ports.heads.fit as fit_mod

        real = fit_mod.lr_at

        def lr_at(step, opts):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return real(step, opts)

        fit_mod.lr_at = lr_at

    codes, outs, errs = _ranks(2, _argv(setup, out), tmp_path / "logs", hook)
    assert codes == [128 + signal.SIGTERM] * 2, errs
    assert "interrupted after step 4; the training state holds exactly those steps" in errs[0]
    assert errs[1] == "" and outs == ["", ""] and not out.exists()
    assert torch.load(tmp_path / "heads.train" / "state.pt", weights_only=True)["step"] == 4
    resumed = api.train_heads(_opts(setup, out, resume=True))
    assert resumed.steps == 8 and _max_diff(resumed, setup["ref"]) < CHECKS.HEADS_ATOL


def test_a_hung_rank_ends_the_job_at_the_timeout(setup, tmp_path):
    """Rank 1 stops answering (SIGSTOP) in step 3: rank 0 gives up after --dist_timeout with the reason."""
    out = tmp_path / "heads"

    def hook(rank):
        import trtllm_medusa_ports.heads.fit as fit_mod

        real = fit_mod.lr_at

        def lr_at(step, opts):
            if rank == 1 and step == 2:
                os.kill(os.getpid(), signal.SIGSTOP)
            return real(step, opts)

        fit_mod.lr_at = lr_at

    t0 = time.monotonic()
    codes, _, errs = _ranks(2, _argv(setup, out, "--dist_timeout", "1"), tmp_path / "logs", hook, kill_after=0)
    assert codes[0] == 1 and "another rank stopped answering" in errs[0], errs[0]
    assert "after 2 whole steps" in errs[0] and "--dist_timeout, 1 s" in errs[0]
    assert time.monotonic() - t0 < 60 and not out.exists()
    assert torch.load(tmp_path / "heads.train" / "state.pt", weights_only=True)["step"] == 2


def test_an_error_one_rank_can_explain_stops_every_rank_with_it(setup, tmp_path):
    """A rank's own error (here rank 1's share of the corpus cannot be saved) reaches every rank: all stop at
    once with it, named by rank, instead of waiting for the one that stopped."""
    from trtllm_medusa_ports.errors import HeadsError

    out = tmp_path / "heads"

    def hook(rank):
        import trtllm_medusa_ports.heads.train as train_mod

        real = train_mod.save_corpus

        def save_corpus(corpus, path):
            if rank == 1:
                raise HeadsError("could not write the corpus cache (ENOSPC: No space left on device)",
                                 where=str(path), fix="free space")
            return real(corpus, path)

        train_mod.save_corpus = save_corpus

    codes, _, errs = _ranks(2, _argv(setup, out), tmp_path / "logs", hook)
    assert codes == [1, 1], errs
    assert "rank 1 stopped: could not write the corpus cache (ENOSPC" in errs[0]
    assert "corpus.rank1-of-2.pt" in errs[0] and "fix: free space" in errs[0]
    assert not out.exists() and not (tmp_path / "heads.train" / "corpus.pt").exists()
    assert not (tmp_path / "heads.train" / "corpus.rank1-of-2.pt").exists()


# -- the pieces ---------------------------------------------------------------------------------------------------
def test_shares_merge_into_the_corpus_one_build_writes(store):
    """Rank shares of sequences of several lengths (some too short to learn from, one rank with none) merge into
    the one build's corpus: the same sequences, rows and order."""
    from trtllm_medusa_ports.heads.distributed import share
    from trtllm_medusa_ports.heads.train import build_corpus, build_shard, merge_shards
    from trtllm_medusa_ports.huggingface.model import load_base

    model = load_base(tiny_base(store, ARCH))
    g = torch.Generator().manual_seed(1)
    lengths = [9, 2, 6, 12, 4, 7, 1, 9, 5]
    vocab = tiny_config(ARCH).vocab_size
    items = [Item(torch.randint(1, vocab, (n,), generator=g).tolist(), continue_it=False) for n in lengths]
    whole = build_corpus(model, items, 4, "k")
    for world in (2, 3, 12):
        parts = [share(len(items), r, world) for r in range(world)]
        assert parts[0][0] == 0 and parts[-1][1] == len(items)
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
        merged = merge_shards([build_shard(model, items[lo:hi], 4, "k") for lo, hi in parts], "k")
        assert merged.seqs == whole.seqs and merged.starts == whole.starts
        assert torch.equal(merged.index, whole.index), world
        assert torch.allclose(merged.hidden, whole.hidden, atol=1e-5)
    assert whole.index[:, 0].unique_consecutive().tolist() == [4, 8, 2, 5, 0, 7, 3]  # by length, ties in order
    from trtllm_medusa_ports.errors import ModelError

    with pytest.raises(ModelError, match="no text to learn from"):
        merge_shards([build_shard(model, items[1:2], 4, "k"), build_shard(model, [], 4, "k")], "k")


def test_shares_and_gpu_blocks():
    from trtllm_medusa_ports.heads.distributed import Group, rank_device, share
    from trtllm_medusa_ports.machine.devices import rank_gpus

    assert [share(10, r, 3) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [share(1, r, 3) for r in range(3)] == [(0, 1), (1, 1), (1, 1)]
    assert [rank_gpus(r, 2, 8) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rank_gpus(0, 1, 2) == [0, 1] and rank_gpus(2, 4, 2) == [0] and rank_gpus(0, 2, 0) == []
    assert rank_device("cuda", 1) == "cuda:1" and rank_device("cuda:3", 1) == "cuda:3"
    assert rank_device("cpu", 1) == "cpu" and rank_device("cuda", 1, 2, 8, spread=True) == "cuda:4"
    one = Group()  # no torchrun: every collective is this process's own value
    assert one.gather(5, "x") == [5] and one.max_int(3, "x") == 3 and one.span(7) == (0, 7)
    with pytest.raises(ValueError, match="mine"):
        one.agree(ValueError("mine"), "x")


def test_torchrun_environment_without_a_master_is_refused(monkeypatch):
    from trtllm_medusa_ports.errors import PortError
    from trtllm_medusa_ports.heads.distributed import join

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(PortError, match="WORLD_SIZE is 2 but MASTER_ADDR and MASTER_PORT is not set") as e:
        join("cpu")
    assert "torchrun" in e.value.fix
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(PortError, match="RANK='two' is not an integer"):
        join("cpu")
    # issue 76 (tr_world_size_mismatch_reversed): rank 1 told WORLD_SIZE 1 would train alone and write the output
    # while rank 0 waits for it; it stops at once, naming both (a WORLD_SIZE 1 on RANK 0 is one process, as before)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(PortError, match="RANK 1 is not below WORLD_SIZE 1: this process was started as one rank of "
                                        "several") as e:
        join("cpu")
    assert e.value.where == "WORLD_SIZE" and "the same torchrun command" in e.value.fix
    monkeypatch.setenv("RANK", "0")
    group, device = join("cpu")
    assert (group.world, group.rank, device) == (1, 0, "cpu")


# -- bfloat16 only where the hardware has it ----------------------------------------------------------------------
def test_dtype_choice_follows_the_measured_bfloat16_speed():
    from trtllm_medusa_ports.machine.devices import choose_dtype

    assert choose_dtype("auto", "cpu", "--fit_dtype", slowdown=42.0) == ("float32", None)
    assert choose_dtype("auto", "cpu", "--fit_dtype", slowdown=0.4) == ("bfloat16", None)
    assert choose_dtype("auto", "cpu", "--fit_dtype", slowdown=1.0) == ("float32", None)  # not clearly faster
    dtype, warning = choose_dtype("bfloat16", "cpu", "--fit_dtype", slowdown=42.0)
    assert dtype == "bfloat16" and "--fit_dtype bfloat16 on cpu: a bfloat16 matmul measured 42.0x slower" in warning
    assert "--fit_dtype float32" in warning
    assert choose_dtype("bfloat16", "cpu", "--dtype", slowdown=1.5) == ("bfloat16", None)  # slower, not much
    assert choose_dtype("float32", "cpu", "--dtype", slowdown=42.0) == ("float32", None)
    assert choose_dtype("float16", "cpu", "--dtype", slowdown=0.1) == ("float16", None)


def test_probe_measures_once_per_device():
    from trtllm_medusa_ports.machine.devices import bfloat16_slowdown

    first = bfloat16_slowdown("cpu")
    assert first > 0 and bfloat16_slowdown("cpu") == first  # cached: the same value, not a second timing


@pytest.mark.parametrize("slowdown, want", [(42.0, "float32"), (0.3, "bfloat16")])
def test_train_heads_defaults_follow_the_probe_and_an_explicit_bfloat16_warns(setup, tmp_path, monkeypatch, capsys,
                                                                              slowdown, want):
    import trtllm_medusa_ports.machine.devices as devices
    from trtllm_medusa_ports.cli import build_parser

    monkeypatch.setattr(devices, "bfloat16_slowdown", lambda device: slowdown)
    ns = build_parser().parse_args(["train-heads", "--model_dir", "m", "--output_dir", "o"])
    assert ns.dtype == ns.fit_dtype == "auto" and api.TrainOptions(Path("m"), Path("o")).dtype == "auto"
    fit = _fit(steps=2)
    fit.matmul_dtype = "auto"
    res = api.train_heads(_opts(setup, tmp_path / "a", dtype="auto", fit=fit))
    assert (res.dtype, res.fit_dtype, res.warnings) == (want, want, [])
    assert res.to_dict()["fit_dtype"] == want and "warning" not in capsys.readouterr().err
    fit = _fit(steps=2)
    fit.matmul_dtype = "bfloat16"
    from trtllm_medusa_ports.machine import log

    with log.shown():  # the CLI's log on stderr (an API caller's logging configuration shows the same record)
        res = api.train_heads(_opts(setup, tmp_path / "b", fit=fit))
    assert res.fit_dtype == "bfloat16"
    if slowdown > 3:
        assert len(res.warnings) == 1 and "measured 42.0x slower than float32" in res.warnings[0]
        assert f"warning: {res.warnings[0]}" in capsys.readouterr().err  # said at the start, not after the run
    else:
        assert res.warnings == []


def test_gloos_connection_lines_leave_a_ranks_stdout(capfd):
    """torch 2.9's gloo prints "[Gloo] Rank N is connected to M peer ranks..." on the C-level stdout of every rank as
    it joins (TensorRT-LLM 1.2's environment; no switch turns it off): joining drops those lines and keeps the rest,
    so rank 0's --json stays one JSON document."""
    import os

    from trtllm_medusa_ports.heads.distributed import gloo_connection_lines_dropped

    with gloo_connection_lines_dropped():
        os.write(1, b"[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n")
        os.write(1, b"kept line\n")
        os.write(1, b"[Gloo] Rank 0 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3\n")
        os.write(1, b"[Gloo] said something else\n")
    assert capfd.readouterr().out == "kept line\n[Gloo] said something else\n"
